#pragma once
// Helpers for the tokenizer tests: a small synthetic byte-level vocabulary, a reference BPE
// written the plain way (to check the fast one against), JSON-ish escaping for messages, and
// the JS-semantics form of the Qwen patterns for PCRE2.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "clover/tokenizer/byte_level.hpp"
#include "clover/tokenizer/vocab.hpp"

namespace toktest {

inline std::string tmp(const std::string& name) { return std::string(CLOVER_TEST_TMP) + "/" + name; }

inline std::string show(std::string_view s) {
    static const char* hex = "0123456789abcdef";
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { out += '\\'; out += char(c); }
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) { out += "\\x"; out += hex[c >> 4]; out += hex[c & 15]; }
        else out += char(c);
    }
    return out + "\"";
}

template <class V>
std::string show_ids(const V& ids) {
    std::string s = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(ids[i]);
    }
    return s + "]";
}

// A byte-level vocabulary: the 256 byte tokens (ids 0..255 in byte order), then merged tokens.
struct mini_vocab {
    clover::tok::tokenizer_spec spec;
    std::map<std::string, std::int32_t> ids;  // raw bytes -> id
    std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, rank order

    mini_vocab() {
        spec.source = "mini";
        spec.pre = "qwen2";
        for (unsigned b = 0; b < 256; ++b) add_token(std::string(1, char(b)));
    }
    std::int32_t add_token(const std::string& raw) {
        if (auto it = ids.find(raw); it != ids.end()) return it->second;
        auto id = std::int32_t(spec.tokens.size());
        spec.tokens.push_back(clover::tok::byte_level::encode(raw));
        spec.types.push_back(clover::tok::token_type::normal);
        ids[raw] = id;
        return id;
    }
    void merge(const std::string& a, const std::string& b) {
        add_token(a + b);
        merges.emplace_back(a, b);
        spec.merges.push_back(clover::tok::byte_level::encode(a) + " " + clover::tok::byte_level::encode(b));
    }
    std::int32_t add_special(const std::string& text, bool control, bool lstrip = false, bool rstrip = false) {
        auto id = std::int32_t(spec.tokens.size());
        spec.tokens.push_back(text);
        spec.types.push_back(control ? clover::tok::token_type::control : clover::tok::token_type::user_defined);
        spec.added.push_back({id, text, control, lstrip, rstrip});
        return id;
    }
    std::int32_t id(const std::string& raw) const { return ids.at(raw); }

    // The textbook algorithm: repeatedly merge the adjacent pair of lowest rank, leftmost first.
    std::vector<std::int32_t> reference_bpe(const std::string& piece) const {
        std::vector<std::string> sym;
        for (char c : piece) sym.emplace_back(1, c);
        std::map<std::pair<std::string, std::string>, std::size_t> rank;
        for (std::size_t r = 0; r < merges.size(); ++r) rank.emplace(merges[r], r);
        for (;;) {
            std::size_t best = sym.size(), best_rank = SIZE_MAX;
            for (std::size_t i = 0; i + 1 < sym.size(); ++i)
                if (auto it = rank.find({sym[i], sym[i + 1]}); it != rank.end() && it->second < best_rank) {
                    best_rank = it->second;
                    best = i;
                }
            if (best == sym.size()) break;
            sym[best] += sym[best + 1];
            sym.erase(sym.begin() + std::ptrdiff_t(best) + 1);
        }
        std::vector<std::int32_t> out;
        for (auto& s : sym) out.push_back(ids.at(s));
        return out;
    }
};

// ECMAScript's \s, spelled for PCRE2.
inline const std::string js_space =
    R"(\t\n\x0B\f\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF})";

// A Qwen pattern rewritten for PCRE2 with the JS oracle's semantics: ASCII-only contractions
// (the oracle's own rewrite of (?i:...)) and ECMAScript white space.
inline std::string js_semantics(std::string p) {
    auto replace_all = [&](const std::string& from, const std::string& to) {
        for (std::size_t at = 0; (at = p.find(from, at)) != std::string::npos; at += to.size()) p.replace(at, from.size(), to);
    };
    replace_all("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])");
    replace_all("[^\\s", "[^" + js_space);
    replace_all("\\s", "[" + js_space + "]");
    replace_all("\\S", "[^" + js_space + "]");
    return p;
}

}  // namespace toktest
