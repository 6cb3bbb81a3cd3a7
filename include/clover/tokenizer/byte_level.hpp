#pragma once
// The GPT-2 byte-level alphabet: each of the 256 byte values is written as one printable code
// point (bytes that are printable Latin-1 stand for themselves, the other 68 are shifted to
// U+0100..U+0143), so that vocabularies can be stored as text. Token strings in tokenizer.json
// and in GGUF `tokenizer.ggml.tokens` use this alphabet; the tokenizer itself works on the raw
// bytes and converts only at load and export time.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "clover/tokenizer/utf8.hpp"

namespace clover::tok::byte_level {

namespace detail {
inline constexpr bool printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}
inline constexpr std::array<char16_t, 256> byte_to_cp = [] {
    std::array<char16_t, 256> t{};
    unsigned next = 0x100;
    for (unsigned b = 0; b < 256; ++b) t[b] = char16_t(printable(b) ? b : next++);
    return t;
}();
inline constexpr std::array<std::int16_t, 0x144> cp_to_byte = [] {
    std::array<std::int16_t, 0x144> t{};
    for (auto& x : t) x = -1;
    for (unsigned b = 0; b < 256; ++b) t[byte_to_cp[b]] = std::int16_t(b);
    return t;
}();
}  // namespace detail

inline char32_t code_point_of(unsigned char b) { return detail::byte_to_cp[b]; }

// Raw bytes -> byte-level text.
inline std::string encode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) utf8::append(out, detail::byte_to_cp[b]);
    return out;
}

// Byte-level text -> raw bytes; nullopt when the text has a code point outside the alphabet
// (such strings are not byte-level, e.g. an added token's literal text).
inline std::optional<std::string> decode(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
        char32_t cp;
        i += std::size_t(utf8::decode(text, i, cp));
        if (cp >= detail::cp_to_byte.size() || detail::cp_to_byte[cp] < 0) return std::nullopt;
        out += char(detail::cp_to_byte[cp]);
    }
    return out;
}

}  // namespace clover::tok::byte_level
