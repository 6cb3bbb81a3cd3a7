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
#include "clover/io/regular_file.hpp"
#include "clover/tokenizer/pretokenizer.hpp"
#include "clover/tokenizer/vocab.hpp"

namespace clover::tok {

namespace tj_detail {

using json = nlohmann::json;

// Bounds on untrusted structure: JSON nesting (the DOM is built and copied recursively, so depth
// is stack) and nested normalizer Sequences (read recursively). Real files nest a few levels.
inline constexpr std::size_t max_json_depth = 512;
inline constexpr int max_sequence_depth = 64;

// A regular file only (a FIFO would block), at most 1 GiB.
inline std::string read_file(const std::filesystem::path& p) { return io::read_regular_file(p, std::size_t(1) << 30); }

inline json read_json(const std::filesystem::path& p) {
    const std::string text = read_file(p);
    try {
        return json::parse(text, [](int depth, json::parse_event_t, json&) {
            if (std::size_t(depth) > max_json_depth)
                throw std::runtime_error("nested deeper than " + std::to_string(max_json_depth) + " levels");
            return true;
        });
    } catch (const std::exception& e) {
        fail(p.string(), ": not valid JSON (", e.what(), ")");
    }
}

// SAX reader for tokenizer.json: model.vocab and model.merges (hundreds of thousands of
// entries) go straight into flat vectors; everything else becomes an ordinary DOM. A full DOM
// of a 250k-token file costs several times the parse itself.
struct tokenizer_json_sax : nlohmann::json_sax<json> {
    json root;
    std::vector<std::pair<std::string, std::int64_t>> vocab;
    std::vector<std::string> merges;
    bool have_vocab = false, have_merges = false;

    bool null() override { return value(json(nullptr)); }
    bool boolean(bool b) override { return value(json(b)); }
    bool number_integer(number_integer_t v) override { return number(v, json(v)); }
    bool number_unsigned(number_unsigned_t v) override { return number(std::int64_t(v), json(v)); }
    bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
    bool binary(binary_t&) override { return false; }
    bool string(string_t& v) override {
        if (mode_ == merges_list) { merges.push_back(std::move(v)); return true; }
        if (mode_ == merge_pair) {
            if (pair_n_ == 0) pair_ = v;
            else if (pair_n_ == 1) { pair_ += ' '; pair_ += v; }
            ++pair_n_;
            return true;
        }
        if (mode_ == vocab_map) return false;  // vocab values must be ids
        return value(json(std::move(v)));
    }
    bool start_object(std::size_t) override {
        if (mode_ != dom) return false;  // nothing nested in vocab/merges
        if (path_is("model", "vocab")) { mode_ = vocab_map; have_vocab = true; return true; }
        return open(json::object());
    }
    bool key(string_t& k) override {
        key_ = std::move(k);
        return true;
    }
    bool end_object() override {
        if (mode_ == vocab_map) { mode_ = dom; return true; }
        return close();
    }
    bool start_array(std::size_t) override {
        if (mode_ == merges_list) { mode_ = merge_pair; pair_.clear(); pair_n_ = 0; return true; }
        if (mode_ != dom) return false;
        if (path_is("model", "merges")) { mode_ = merges_list; have_merges = true; return true; }
        return open(json::array());
    }
    bool end_array() override {
        if (mode_ == merge_pair) {
            if (pair_n_ != 2) return false;
            merges.push_back(std::move(pair_));
            mode_ = merges_list;
            return true;
        }
        if (mode_ == merges_list) { mode_ = dom; return true; }
        return close();
    }
    bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
        error = "at byte " + std::to_string(pos) + ": " + e.what();
        return false;
    }
    std::string error;

private:
    enum mode_t { dom, vocab_map, merges_list, merge_pair };
    bool path_is(const char* a, const char* b) const {
        return stack_.size() == 2 && keys_.size() == 2 && keys_[1] == a && key_ == b;
    }
    bool number(std::int64_t id, json v) {
        if (mode_ == vocab_map) { vocab.emplace_back(std::move(key_), id); return true; }
        return value(std::move(v));
    }
    // Places v in the current container (or as the root).
    json* place(json v) {
        if (mode_ != dom) return nullptr;
        if (stack_.empty()) { root = std::move(v); return &root; }
        json& top = *stack_.back();
        if (top.is_object()) return &(top[key_] = std::move(v));
        top.push_back(std::move(v));
        return &top.back();
    }
    bool value(json v) { return place(std::move(v)) != nullptr; }
    bool open(json v) {
        if (stack_.size() >= max_json_depth) {
            error = "nested deeper than " + std::to_string(max_json_depth) + " levels";
            return false;
        }
        std::string k = stack_.empty() ? "" : (stack_.back()->is_object() ? key_ : "[]");
        json* p = place(std::move(v));
        if (!p) return false;
        stack_.push_back(p);
        keys_.push_back(std::move(k));
        return true;
    }
    bool close() {
        if (stack_.empty()) return false;
        stack_.pop_back();
        keys_.pop_back();
        return true;
    }
    mode_t mode_ = dom;
    std::vector<json*> stack_;
    std::vector<std::string> keys_;  // the key (or "[]") each open container sits under
    std::string key_, pair_;
    int pair_n_ = 0;
};

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

inline void read_normalizer(const json& n, tokenizer_spec& s, int depth = 0) {
    if (n.is_null()) return;
    std::string type = str_or_empty(n, "type");
    if (type == "NFC") { s.nfc = true; return; }
    if (type == "Sequence" && n.contains("normalizers")) {
        if (depth >= max_sequence_depth) fail(s.source, ": normalizer Sequence nested deeper than ", max_sequence_depth, " levels");
        for (const auto& x : n["normalizers"]) read_normalizer(x, s, depth + 1);
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
    tj_detail::tokenizer_json_sax sax;
    {
        std::string text = tj_detail::read_file(path);
        bool ok = false;
        try {
            ok = json::sax_parse(text, &sax);
        } catch (const std::exception& e) {
            fail(s.source, ": not valid JSON (", e.what(), ")");
        }
        if (!ok) fail(s.source, ": not a valid tokenizer.json", sax.error.empty() ? std::string() : " (" + sax.error + ")");
    }
    json& j = sax.root;
    if (!j.is_object() || !j.contains("model")) fail(s.source, ": no 'model' object (not a tokenizer.json?)");
    if (!sax.have_vocab) fail(s.source, ": model.vocab is missing or not an object of ids");
    if (!sax.have_merges) fail(s.source, ": model.merges is missing");
    try {
        const json& m = j["model"];
        if (tj_detail::str_or_empty(m, "type") != "BPE")
            fail(s.source, ": model.type '", tj_detail::str_or_empty(m, "type"), "' is not supported (BPE)");
        if (m.value("byte_fallback", false)) fail(s.source, ": model.byte_fallback = true is not supported");
        if (!tj_detail::str_or_empty(m, "continuing_subword_prefix").empty() ||
            !tj_detail::str_or_empty(m, "end_of_word_suffix").empty())
            fail(s.source, ": BPE subword prefixes/suffixes are not supported");
        if (m.contains("dropout") && !m["dropout"].is_null() &&
            (!m["dropout"].is_number() || m["dropout"].get<double>() != 0.0))
            fail(s.source, ": BPE dropout is not supported");
        s.ignore_merges = m.value("ignore_merges", false);

        const json empty = json::array();
        const json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : empty;
        // Ids index a table that holes are padded in: an id far beyond the entries present would
        // make a small file cost gigabytes. Real vocabularies are dense; a few holes are allowed.
        const std::size_t present = sax.vocab.size() + added.size();
        const std::int64_t id_limit = std::int64_t(present + 1024 + present / 16);
        auto check_id = [&](std::int64_t id, const std::string& what) {
            if (id >= id_limit)
                fail(s.source, ": ", what, " has id ", id, ", far beyond the ", present,
                     " entries present (ids must be nearly dense: at most ", id_limit - 1, ")");
        };
        // An id must be a JSON integer: a float such as 1.8e19 converted to an integer is
        // undefined behaviour (the fuzzer found it), and a fractional id means nothing.
        auto added_id = [&](const json& a) -> std::int64_t {
            const auto it = a.find("id");
            if (it == a.end() || !it->is_number_integer())
                fail(s.source, ": added token '", a.value("content", std::string()).substr(0, 80), "' has no integer 'id'");
            if (it->is_number_unsigned() && it->get<std::uint64_t>() > std::uint64_t(INT64_MAX))
                fail(s.source, ": added token id ", it->dump(), " is too large");
            return it->get<std::int64_t>();
        };
        std::int64_t max_id = -1;
        for (const auto& [tok, id] : sax.vocab) {
            if (id < 0) fail(s.source, ": model.vocab['", tok, "'] has a negative id");
            check_id(id, "model.vocab['" + tok.substr(0, 80) + "']");
            max_id = std::max(max_id, id);
        }
        for (const auto& a : added) {
            if (!a.is_object()) fail(s.source, ": added_tokens holds a ", a.type_name(), ", not an object");
            const std::int64_t id = added_id(a);
            check_id(id, "added token '" + a.value("content", std::string()).substr(0, 80) + "'");
            max_id = std::max(max_id, id);
        }
        if (max_id < 0 || max_id > 16'000'000) fail(s.source, ": implausible vocabulary size ", max_id + 1);
        std::size_t n = std::size_t(max_id + 1);
        s.tokens.assign(n, {});
        s.types.assign(n, token_type::undefined);
        for (auto& [tok, id] : sax.vocab) {
            s.tokens[std::size_t(id)] = std::move(tok);
            s.types[std::size_t(id)] = token_type::normal;
        }
        for (const auto& a : added) {
            added_token t;
            t.id = std::int32_t(added_id(a));  // below id_limit (checked above)
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

        s.merges = std::move(sax.merges);

        if (j.contains("normalizer")) tj_detail::read_normalizer(j["normalizer"], s);
        static const json no_pre_tokenizer;  // a reference, not a copy: copying a DOM recurses
        tj_detail::read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : no_pre_tokenizer, s);
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
    if (auto tpl = path.parent_path() / "chat_template.jinja"; s.chat_template.empty() && std::filesystem::exists(tpl))
        s.chat_template = tj_detail::read_file(tpl);
    if (s.add_bos && s.bos < 0) s.add_bos = false;
    return s;
}

}  // namespace clover::tok
