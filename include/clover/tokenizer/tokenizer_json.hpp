#pragma once
// Reads a Hugging Face tokenizer.json (and the tokenizer_config.json next to it, for the chat
// template and the special-token settings) into a tokenizer_spec.
//
// Supported: model BPE (merges as "a b" strings or ["a", "b"] pairs; no byte fallback, no
// subword prefixes), normalizer null / NFC / Sequence of NFC, pre_tokenizer ByteLevel
// (use_regex) or Sequence[Split(Regex, Isolated), ByteLevel(use_regex = false)], decoder
// ByteLevel. Anything else is refused with a message naming the field, rather than giving ids
// that silently differ from the reference.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "clover/core/error.hpp"
#include "clover/tokenizer/pretokenizer.hpp"
#include "clover/tokenizer/vocab.hpp"

namespace clover::tok {

namespace tj_detail {

using json = nlohmann::json;

inline json read_json(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail(p.string(), ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    try {
        return json::parse(ss.str());
    } catch (const std::exception& e) {
        fail(p.string(), ": not valid JSON (", e.what(), ")");
    }
}

inline std::string str_or_empty(const json& j, const char* key) {
    auto it = j.find(key);
    return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

// A special-token setting of tokenizer_config.json: a string or {"content": ...}.
inline std::string token_text(const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object()) return str_or_empty(*it, "content");
    return {};
}

inline void read_normalizer(const json& n, tokenizer_spec& s) {
    if (n.is_null()) return;
    std::string type = str_or_empty(n, "type");
    if (type == "NFC") { s.nfc = true; return; }
    if (type == "Sequence" && n.contains("normalizers")) {
        for (const auto& x : n["normalizers"]) read_normalizer(x, s);
        return;
    }
    fail(s.source, ": normalizer '", type, "' is not supported (only NFC)");
}

inline void read_byte_level(const json& b, tokenizer_spec& s, bool standalone) {
    if (b.value("add_prefix_space", false)) fail(s.source, ": ByteLevel add_prefix_space = true is not supported");
    bool use_regex = b.value("use_regex", true);
    if (standalone && use_regex) s.pre = "gpt2";
    else if (standalone) { s.pre = "regex"; s.pre_regex.clear(); }  // no split at all
    else if (use_regex) fail(s.source, ": a Split followed by ByteLevel(use_regex = true) is not supported");
}

inline void read_pre_tokenizer(const json& p, tokenizer_spec& s) {
    if (p.is_null()) { s.pre = "regex"; s.pre_regex.clear(); return; }
    std::string type = str_or_empty(p, "type");
    if (type == "ByteLevel") { read_byte_level(p, s, true); return; }
    if (type != "Sequence") fail(s.source, ": pre_tokenizer '", type, "' is not supported");
    const json& list = p.at("pretokenizers");
    bool have_split = false, have_byte_level = false;
    for (const auto& x : list) {
        std::string t = str_or_empty(x, "type");
        if (t == "Split" && !have_split && !have_byte_level) {
            const json& pat = x.at("pattern");
            if (!pat.contains("Regex")) fail(s.source, ": Split pattern must be a Regex");
            if (str_or_empty(x, "behavior") != "Isolated" || x.value("invert", false))
                fail(s.source, ": Split behaviour '", str_or_empty(x, "behavior"), "' is not supported (Isolated)");
            s.pre = "regex";
            s.pre_regex = pat["Regex"].get<std::string>();
            have_split = true;
        } else if (t == "ByteLevel" && !have_byte_level) {
            read_byte_level(x, s, !have_split);
            have_byte_level = true;
        } else {
            fail(s.source, ": pre_tokenizer step '", t, "' is not supported here");
        }
    }
    if (!have_byte_level) fail(s.source, ": the pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
}

}  // namespace tj_detail

// path: a tokenizer.json, or a folder that holds one.
inline tokenizer_spec read_tokenizer_json_spec(std::filesystem::path path) {
    using tj_detail::json;
    if (std::filesystem::is_directory(path)) path /= "tokenizer.json";
    tokenizer_spec s;
    s.source = path.string();
    json j = tj_detail::read_json(path);
    if (!j.is_object() || !j.contains("model")) fail(s.source, ": no 'model' object (not a tokenizer.json?)");
    try {
        const json& m = j["model"];
        if (tj_detail::str_or_empty(m, "type") != "BPE")
            fail(s.source, ": model.type '", tj_detail::str_or_empty(m, "type"), "' is not supported (BPE)");
        if (m.value("byte_fallback", false)) fail(s.source, ": model.byte_fallback = true is not supported");
        if (!tj_detail::str_or_empty(m, "continuing_subword_prefix").empty() ||
            !tj_detail::str_or_empty(m, "end_of_word_suffix").empty())
            fail(s.source, ": BPE subword prefixes/suffixes are not supported");
        if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
            fail(s.source, ": BPE dropout is not supported");
        s.ignore_merges = m.value("ignore_merges", false);

        const json& vocab = m.at("vocab");
        if (!vocab.is_object()) fail(s.source, ": model.vocab is not an object");
        std::int64_t max_id = -1;
        for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max<std::int64_t>(max_id, it.value().get<std::int64_t>());
        const json empty = json::array();
        const json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : empty;
        for (const auto& a : added) max_id = std::max<std::int64_t>(max_id, a.at("id").get<std::int64_t>());
        if (max_id < 0 || max_id > 16'000'000) fail(s.source, ": implausible vocabulary size ", max_id + 1);
        std::size_t n = std::size_t(max_id + 1);
        s.tokens.assign(n, {});
        s.types.assign(n, token_type::undefined);
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            auto id = it.value().get<std::int64_t>();
            if (id < 0) fail(s.source, ": model.vocab['", it.key(), "'] has a negative id");
            s.tokens[std::size_t(id)] = it.key();
            s.types[std::size_t(id)] = token_type::normal;
        }
        for (const auto& a : added) {
            added_token t;
            t.id = a.at("id").get<std::int32_t>();
            if (t.id < 0) fail(s.source, ": added token with a negative id");
            t.content = a.at("content").get<std::string>();
            t.special = a.value("special", false);
            t.lstrip = a.value("lstrip", false);
            t.rstrip = a.value("rstrip", false);
            if (t.content.empty()) fail(s.source, ": added token ", t.id, " is empty");
            s.tokens[std::size_t(t.id)] = t.content;
            // As the file marks it (HF: "special"); write_gguf_spec applies llama.cpp's extra rule.
            s.types[std::size_t(t.id)] = t.special ? token_type::control : token_type::user_defined;
            s.added.push_back(std::move(t));
        }
        for (std::size_t i = 0; i < n; ++i)
            if (s.types[i] == token_type::undefined) {
                s.tokens[i] = "[PAD" + std::to_string(i) + "]";
                s.types[i] = token_type::unused;
            }

        const json& merges = m.at("merges");
        s.merges.reserve(merges.size());
        for (std::size_t r = 0; r < merges.size(); ++r) {
            const json& x = merges[r];
            if (x.is_string()) s.merges.push_back(x.get<std::string>());
            else if (x.is_array() && x.size() == 2)
                s.merges.push_back(x[0].get<std::string>() + " " + x[1].get<std::string>());
            else fail(s.source, ": model.merges[", r, "] is neither \"a b\" nor [\"a\", \"b\"]");
        }

        if (j.contains("normalizer")) tj_detail::read_normalizer(j["normalizer"], s);
        tj_detail::read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), s);
        if (j.contains("decoder") && !j["decoder"].is_null() && tj_detail::str_or_empty(j["decoder"], "type") != "ByteLevel")
            fail(s.source, ": decoder '", tj_detail::str_or_empty(j["decoder"], "type"), "' is not supported (ByteLevel)");
        if (s.pre == "regex") {
            // Name the patterns llama.cpp knows, so that the spec can be written to GGUF.
            if (s.pre_regex == qwen2_pattern) s.pre = "qwen2";
            else if (s.pre_regex == qwen35_pattern) s.pre = "qwen35";
            if (s.pre != "regex") s.pre_regex.clear();
        }
        // A post-processor that prepends one special token is a BOS (llama-3 style files).
        if (j.contains("post_processor") && j["post_processor"].is_object() &&
            tj_detail::str_or_empty(j["post_processor"], "type") == "TemplateProcessing") {
            const json& single = j["post_processor"].at("single");
            if (!single.empty() && single[0].contains("SpecialToken")) {
                std::string bos = single[0]["SpecialToken"].at("id").get<std::string>();
                for (const auto& a : s.added)
                    if (a.content == bos) { s.bos = a.id; s.add_bos = true; }
            }
        }
    } catch (const clover::error&) {
        throw;
    } catch (const std::exception& e) {
        fail(s.source, ": unexpected structure (", e.what(), ")");
    }

    // tokenizer_config.json: chat template and special-token settings.
    auto cfg_path = path.parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
        json c = tj_detail::read_json(cfg_path);
        auto find_id = [&](const std::string& text) -> std::int32_t {
            if (text.empty()) return -1;
            for (const auto& a : s.added)
                if (a.content == text) return a.id;
            for (std::size_t i = 0; i < s.tokens.size(); ++i)
                if (s.tokens[i] == text) return std::int32_t(i);
            return -1;
        };
        if (auto id = find_id(tj_detail::token_text(c, "eos_token")); id >= 0) s.eos = id;
        if (auto id = find_id(tj_detail::token_text(c, "bos_token")); id >= 0) s.bos = id;
        if (auto id = find_id(tj_detail::token_text(c, "pad_token")); id >= 0) s.pad = id;
        if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) s.add_bos = c["add_bos_token"].get<bool>();
        if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean()) s.add_eos = c["add_eos_token"].get<bool>();
        if (c.contains("chat_template")) {
            const json& t = c["chat_template"];
            if (t.is_string()) s.chat_template = t.get<std::string>();
            else if (t.is_array())
                for (const auto& x : t)
                    if (tj_detail::str_or_empty(x, "name") == "default") s.chat_template = tj_detail::str_or_empty(x, "template");
        }
    }
    // Newer HF folders keep the template in its own file.
    if (auto tpl = path.parent_path() / "chat_template.jinja"; s.chat_template.empty() && std::filesystem::exists(tpl)) {
        std::ifstream in(tpl, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        s.chat_template = ss.str();
    }
    if (s.add_bos && s.bos < 0) s.add_bos = false;
    return s;
}

}  // namespace clover::tok
