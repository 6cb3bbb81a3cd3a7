#pragma once
// Strict UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). The tokenizer
// works on bytes, so ill-formed input is never an error: decode() reports it as an `invalid`
// unit whose length is the "maximal subpart" (Unicode §3.9, the WHATWG decoder's rule), and
// sanitize() turns each such unit into one U+FFFD, exactly as a browser's TextDecoder does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace clover::tok::utf8 {

inline constexpr char32_t invalid = 0xFFFFFFFFu;  // decode(): an ill-formed unit

// Decodes the unit at p (p < end). Returns its length in bytes (1..4) and sets cp to the code
// point, or to `invalid` when the bytes are ill-formed (then the length is the maximal subpart:
// the longest prefix that could have started a valid sequence, at least 1).
inline int decode(const unsigned char* p, const unsigned char* end, char32_t& cp) {
    unsigned c = p[0];
    if (c < 0x80) { cp = c; return 1; }
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2; cp = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;       // no overlongs
        if (c == 0xED) hi = 0x9F;       // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3; cp = c & 0x07;
        if (c == 0xF0) lo = 0x90;       // no overlongs
        if (c == 0xF4) hi = 0x8F;       // nothing above U+10FFFF
    } else { cp = invalid; return 1; }
    int n = 1;
    for (; n <= need; ++n) {
        if (p + n >= end) { cp = invalid; return n; }
        unsigned b = p[n];
        if (b < lo || b > hi) { cp = invalid; return n; }
        lo = 0x80; hi = 0xBF;
        cp = (cp << 6) | (b & 0x3F);
    }
    return n;
}

inline int decode(std::string_view s, std::size_t pos, char32_t& cp) {
    auto* p = reinterpret_cast<const unsigned char*>(s.data());
    return decode(p + pos, p + s.size(), cp);
}

inline void append(std::string& out, char32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    }
}

inline bool is_valid(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        char32_t cp;
        i += decode(s, i, cp);
        if (cp == invalid) return false;
    }
    return true;
}

// Length of the trailing bytes of s that are the start of a sequence which is still well
// formed so far but not finished (0..3). A streaming consumer holds those back.
inline std::size_t incomplete_tail(std::string_view s) {
    std::size_t n = s.size();
    for (std::size_t k = 1; k <= 3 && k <= n; ++k) {
        unsigned c = static_cast<unsigned char>(s[n - k]);
        if ((c & 0xC0) == 0x80) continue;             // a continuation byte: look further back
        if (c < 0xC2 || c > 0xF4) return 0;           // ASCII or a byte that never starts a unit
        char32_t cp;
        int len = decode(s, n - k, cp);
        // Ill-formed only because the input ends: the unit would need more bytes than are left.
        return (cp == invalid && std::size_t(len) == k) ? k : 0;
    }
    return 0;
}

// Replaces every ill-formed unit with U+FFFD.
inline std::string sanitize(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        char32_t cp;
        int len = decode(s, i, cp);
        if (cp == invalid) out += "\xEF\xBF\xBD";
        else out.append(s.data() + i, std::size_t(len));
        i += std::size_t(len);
    }
    return out;
}

}  // namespace clover::tok::utf8
