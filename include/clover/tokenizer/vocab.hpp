#pragma once
// What a tokenizer file says, before anything is built from it: the neutral form that the GGUF
// and tokenizer.json readers produce and that clover::tokenizer is built from, plus the GGUF
// side of it (read and write, with llama.cpp's conventions).
//
// GGUF conventions (llama.cpp convert_hf_to_gguf.py): `tokenizer.ggml.tokens` holds normal
// tokens in the byte-level alphabet and added tokens as their literal text; added tokens are
// CONTROL when HF marks them special or they look special (<|...|>), USER_DEFINED otherwise;
// rows past the real vocabulary are "[PADn]" of type UNUSED. Control and user-defined tokens are
// the ones matched in text before BPE (llama.cpp's special-token partition).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"
#include "clover/io/gguf_writer.hpp"

namespace clover::tok {

// llama.cpp's token types (the values of `tokenizer.ggml.token_type`).
enum class token_type : std::uint8_t {
    undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

struct added_token {
    std::int32_t id = -1;
    std::string content;   // literal text
    bool special = false;  // a control token: parsed only when special parsing is on
    bool lstrip = false, rstrip = false;
};

struct tokenizer_spec {
    std::string source;                  // the file, for messages
    std::vector<std::string> tokens;     // per id, in file form (byte-level text / literal for added)
    std::vector<token_type> types;       // per id
    std::vector<std::string> merges;     // "left right", file form, in rank order
    std::vector<added_token> added;      // matched in the text before BPE
    std::string pre = "qwen2";           // qwen2 | qwen35 | gpt2 | regex
    std::string pre_regex;               // the Split pattern when pre == "regex"
    bool nfc = false;                    // apply the NFC normaliser
    bool ignore_merges = false;          // HF BPE option: a piece that is a token is taken whole
    std::int32_t bos = -1, eos = -1, pad = -1;
    bool add_bos = false, add_eos = false;
    std::string chat_template;
};

// convert_hf_to_gguf.py's does_token_look_special().
inline bool looks_special(std::string_view t) {
    auto wrapped = [&](std::string_view a, std::string_view b) {
        return t.size() >= a.size() + b.size() && t.starts_with(a) && t.ends_with(b);
    };
    return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
           wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

namespace vocab_detail {
inline std::string need_string(const io::gguf_file& f, std::string_view key, std::string_view src) {
    auto v = f.get_string(key);
    if (!v) fail(src, ": tokenizer key '", std::string(key), "' is missing");
    return *v;
}
}  // namespace vocab_detail

inline tokenizer_spec read_gguf_spec(const io::gguf_file& f, std::string source = "gguf") {
    tokenizer_spec s;
    s.source = std::move(source);
    std::string model = vocab_detail::need_string(f, "tokenizer.ggml.model", s.source);
    if (model != "gpt2")
        fail(s.source, ": tokenizer.ggml.model is '", model, "'; only byte-level BPE ('gpt2') is supported");
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (!tokens || tokens->empty()) fail(s.source, ": tokenizer.ggml.tokens is missing or empty");
    s.tokens = std::move(*tokens);
    s.types.assign(s.tokens.size(), token_type::normal);
    if (auto types = f.get_int_array("tokenizer.ggml.token_type")) {
        if (types->size() != s.tokens.size())
            fail(s.source, ": tokenizer.ggml.token_type has ", types->size(), " entries for ", s.tokens.size(), " tokens");
        for (std::size_t i = 0; i < types->size(); ++i) {
            auto t = (*types)[i];
            if (t < 0 || t > 6) fail(s.source, ": tokenizer.ggml.token_type[", i, "] = ", t, " is not a token type");
            s.types[i] = token_type(t);
        }
    }
    auto merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges) fail(s.source, ": tokenizer.ggml.merges is missing (a gpt2 tokenizer needs its merges)");
    s.merges = std::move(*merges);
    s.pre = f.get_string("tokenizer.ggml.pre").value_or("default");
    if (s.pre == "qwen2" || s.pre == "qwen35") {
        // The HF tokenizers of these families declare NFC (llama.cpp skips it; we keep HF's ids).
        s.nfc = true;
    } else if (s.pre == "default" || s.pre == "gpt2") {
        s.pre = "gpt2";
    } else {
        fail(s.source, ": tokenizer.ggml.pre '", s.pre, "' is not supported (qwen2, qwen35, gpt2)");
    }
    auto id = [&](std::string_view key) -> std::int32_t {
        auto v = f.get_int(key);
        if (!v) return -1;
        if (*v < 0 || *v >= std::int64_t(s.tokens.size()))
            fail(s.source, ": ", std::string(key), " = ", *v, " is outside the vocabulary of ", s.tokens.size());
        return std::int32_t(*v);
    };
    s.bos = id("tokenizer.ggml.bos_token_id");
    s.eos = id("tokenizer.ggml.eos_token_id");
    s.pad = id("tokenizer.ggml.padding_token_id");
    s.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
    s.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
    s.chat_template = f.get_string("tokenizer.chat_template").value_or("");
    for (std::size_t i = 0; i < s.tokens.size(); ++i)
        if (s.types[i] == token_type::control || s.types[i] == token_type::user_defined)
            s.added.push_back({std::int32_t(i), s.tokens[i], s.types[i] == token_type::control, false, false});
    return s;
}

// Writes the tokenizer.* keys the way llama.cpp's converter does. n_vocab_padded (the model's
// embedding rows, e.g. 151936 for Qwen3) pads the vocabulary with "[PADn]" UNUSED rows.
inline void write_gguf_spec(const tokenizer_spec& s, io::gguf_writer& w, std::size_t n_vocab_padded = 0) {
    if (s.pre != "qwen2" && s.pre != "qwen35" && s.pre != "gpt2")
        fail(s.source, ": a pre-tokenizer regex has no GGUF name (tokenizer.ggml.pre); only qwen2, qwen35 and gpt2 can be written");
    std::vector<std::string> tokens = s.tokens;
    std::vector<std::int64_t> types;
    types.reserve(s.types.size());
    for (std::size_t i = 0; i < s.types.size(); ++i) {
        auto t = s.types[i];
        // The converter also makes user-defined tokens that look special (<|fim_pad|>) CONTROL.
        if (t == token_type::user_defined && looks_special(s.tokens[i])) t = token_type::control;
        types.push_back(std::int64_t(t));
    }
    if (n_vocab_padded > tokens.size()) {
        for (std::size_t i = tokens.size(); i < n_vocab_padded; ++i) {
            tokens.push_back("[PAD" + std::to_string(i) + "]");
            types.push_back(std::int64_t(token_type::unused));
        }
    }
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", s.pre);
    w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
    w.set_int_array("tokenizer.ggml.token_type", io::gguf_type::i32, std::move(types));
    w.set_string_array("tokenizer.ggml.merges", s.merges);
    if (s.bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", std::uint32_t(s.bos));
    if (s.eos >= 0) w.set_u32("tokenizer.ggml.eos_token_id", std::uint32_t(s.eos));
    if (s.pad >= 0) w.set_u32("tokenizer.ggml.padding_token_id", std::uint32_t(s.pad));
    w.set_bool("tokenizer.ggml.add_bos_token", s.add_bos);
    if (s.add_eos) w.set_bool("tokenizer.ggml.add_eos_token", true);
    if (!s.chat_template.empty()) w.set_string("tokenizer.chat_template", s.chat_template);
}

}  // namespace clover::tok
