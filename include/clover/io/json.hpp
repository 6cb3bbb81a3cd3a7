#pragma once
// A small strict JSON reader (RFC 8259) for the HF files the loader reads: safetensors headers,
// config.json, model.safetensors.index.json. Why our own and not nlohmann (which the tokenizer
// uses): a safetensors header is up to 100 MB of untrusted text, and we want duplicate keys and
// absurd nesting refused with the byte offset in the message, bounded recursion, and a header
// that costs little to compile. Every error is one clover::error naming the source.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"

namespace clover::io::json {

enum class kind : std::uint8_t { null, boolean, number, string, array, object };

constexpr std::string_view kind_name(kind k) {
    constexpr std::string_view n[] = {"null", "boolean", "number", "string", "array", "object"};
    return n[int(k)];
}

struct value {
    kind k = kind::null;
    bool b = false;
    double num = 0;           // every number, as a double
    bool integral = false;    // written without fraction or exponent and fits int64
    std::int64_t i = 0;       // the integer when integral
    std::string s;
    // Arrays: the items. Objects: the values, in file order, with keys[i] naming items[i]
    // (keys unique). Two vectors rather than pairs: a vector of an incomplete value type is
    // allowed, a pair of one is not (clang refuses it).
    std::vector<value> items;
    std::vector<std::string> keys;

    bool is_null() const { return k == kind::null; }
    bool is_object() const { return k == kind::object; }
    bool is_array() const { return k == kind::array; }
    bool is_string() const { return k == kind::string; }
    bool is_number() const { return k == kind::number; }
    bool is_bool() const { return k == kind::boolean; }

    std::size_t size() const { return items.size(); }
    const value* find(std::string_view key) const {
        for (std::size_t i = 0; i < keys.size(); ++i)
            if (keys[i] == key) return &items[i];
        return nullptr;
    }
};

namespace detail {

struct parser {
    std::string_view text;
    std::string_view source;
    std::size_t max_depth;
    std::size_t max_values;  // a memory bound: "[0,0,0,…]" must not turn 100 MB into gigabytes
    std::size_t pos = 0;
    std::size_t n_values = 0;

    [[noreturn]] void error(std::string_view what) const {
        fail(source, ": invalid JSON at byte ", pos, ": ", what);
    }
    void skip_ws() {
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) ++pos;
    }
    bool eat(char c) {
        skip_ws();
        if (pos < text.size() && text[pos] == c) { ++pos; return true; }
        return false;
    }
    void expect(char c, const char* what) {
        if (!eat(c)) error(what);
    }

    static void put_utf8(std::string& out, std::uint32_t cp) {
        if (cp < 0x80) out += char(cp);
        else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
        else {
            out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F));
            out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
        }
    }
    std::uint32_t hex4() {
        if (text.size() - pos < 4) error("truncated \\u escape");
        std::uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
            char c = text[pos++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= std::uint32_t(c - '0');
            else if (c >= 'a' && c <= 'f') v |= std::uint32_t(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= std::uint32_t(c - 'A' + 10);
            else error("bad hex digit in \\u escape");
        }
        return v;
    }
    std::string string_body() {  // after the opening quote
        std::string out;
        for (;;) {
            if (pos >= text.size()) error("unterminated string");
            char c = text[pos++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
            if (c != '\\') { out += c; continue; }
            if (pos >= text.size()) error("unterminated escape");
            char e = text[pos++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    std::uint32_t cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate needs its low half
                        if (text.size() - pos < 2 || text[pos] != '\\' || text[pos + 1] != 'u') error("lone surrogate in \\u escape");
                        pos += 2;
                        std::uint32_t lo = hex4();
                        if (lo < 0xDC00 || lo >= 0xE000) error("bad low surrogate in \\u escape");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp < 0xE000) {
                        error("lone surrogate in \\u escape");
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: error("bad escape");
            }
        }
    }
    value number() {
        const std::size_t start = pos;
        if (pos < text.size() && text[pos] == '-') ++pos;
        auto digits = [&] {
            std::size_t d0 = pos;
            while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
            return pos - d0;
        };
        const std::size_t int_start = pos;
        if (digits() == 0) error("expected a value");
        if (text[int_start] == '0' && pos - int_start > 1) error("leading zero in number");
        bool plain = true;
        if (pos < text.size() && text[pos] == '.') {
            ++pos;
            plain = false;
            if (digits() == 0) error("expected digits after '.'");
        }
        if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
            ++pos;
            plain = false;
            if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) ++pos;
            if (digits() == 0) error("expected digits in exponent");
        }
        value v;
        v.k = kind::number;
        const std::string tok(text.substr(start, pos - start));
        v.num = std::strtod(tok.c_str(), nullptr);
        if (plain) {
            // Exact integer parsing (strtod would round above 2^53).
            const bool neg = tok[0] == '-';
            std::uint64_t mag = 0;
            bool fits = true;
            for (std::size_t q = neg ? 1 : 0; q < tok.size(); ++q) {
                const std::uint64_t d = std::uint64_t(tok[q] - '0');
                if (mag > (std::numeric_limits<std::uint64_t>::max() - d) / 10) { fits = false; break; }
                mag = mag * 10 + d;
            }
            const std::uint64_t lim = neg ? std::uint64_t(std::numeric_limits<std::int64_t>::max()) + 1
                                          : std::uint64_t(std::numeric_limits<std::int64_t>::max());
            if (fits && mag <= lim) {
                v.integral = true;
                v.i = neg ? (mag == lim ? std::numeric_limits<std::int64_t>::min() : -std::int64_t(mag)) : std::int64_t(mag);
            }
        }
        return v;
    }
    bool literal(std::string_view word) {
        if (text.substr(pos, word.size()) != word) return false;
        pos += word.size();
        return true;
    }
    value parse_value(std::size_t depth) {
        skip_ws();
        if (pos >= text.size()) error("unexpected end of input");
        if (++n_values > max_values) error("too many values (more than " + std::to_string(max_values) + ")");
        value v;
        const char c = text[pos];
        if (c == '{' || c == '[') {
            if (depth >= max_depth) error("nesting too deep (more than " + std::to_string(max_depth) + " levels)");
            ++pos;
            if (c == '{') {
                v.k = kind::object;
                if (eat('}')) return v;
                std::unordered_set<std::string> seen;  // used once the object is large
                do {
                    skip_ws();
                    if (pos >= text.size() || text[pos] != '"') error("expected a string key");
                    ++pos;
                    std::string key = string_body();
                    bool dup = false;
                    if (v.keys.size() < 16) {
                        for (const auto& k : v.keys) dup = dup || k == key;
                    } else {
                        if (seen.empty())
                            for (const auto& k : v.keys) seen.insert(k);
                        dup = !seen.insert(key).second;
                    }
                    if (dup) error("duplicate key \"" + key.substr(0, 80) + "\"");
                    expect(':', "expected ':'");
                    v.items.push_back(parse_value(depth + 1));
                    v.keys.push_back(std::move(key));
                } while (eat(','));
                expect('}', "expected ',' or '}'");
            } else {
                v.k = kind::array;
                if (eat(']')) return v;
                do v.items.push_back(parse_value(depth + 1));
                while (eat(','));
                expect(']', "expected ',' or ']'");
            }
            return v;
        }
        if (c == '"') {
            ++pos;
            v.k = kind::string;
            v.s = string_body();
            return v;
        }
        if (literal("true")) { v.k = kind::boolean; v.b = true; return v; }
        if (literal("false")) { v.k = kind::boolean; return v; }
        if (literal("null")) return v;
        if (c == '-' || (c >= '0' && c <= '9')) return number();
        error("expected a value");
    }
};

}  // namespace detail

// The deepest nesting any caller may ask for: the parser recurses once per level (and so does
// destroying a value), so this bounds its stack use (a few hundred bytes a level).
inline constexpr std::size_t max_depth_limit = 512;

// Parses one JSON document (whitespace around it allowed, nothing else). Time is linear in the
// text (duplicate keys are found with a hash set once an object has more than 16 keys); depth
// is limited (max_depth, never more than max_depth_limit), so recursion is bounded; so is the
// number of values (memory).
inline value parse(std::string_view text, std::string_view source, std::size_t max_depth = 64,
                   std::size_t max_values = std::size_t(1) << 22) {
    detail::parser p{text, source, std::min(max_depth, max_depth_limit), max_values};
    value v = p.parse_value(0);
    p.skip_ws();
    if (p.pos != text.size()) p.error("trailing characters after the document");
    return v;
}

}  // namespace clover::io::json
