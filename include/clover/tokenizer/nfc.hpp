#pragma once
// Unicode NFC (canonical decomposition, canonical ordering, canonical composition, UAX #15),
// over the tables generated from the same ICU the JavaScript oracle uses.
//
// Almost all text is already NFC, so the work is a scan: a code point that is a safe boundary
// (combining class 0 and NFC_QC = Yes; every code point below U+0300 is one) is copied as is.
// Only the stretch from the last safe boundary before an unsafe code point to the next safe
// boundary after it is decomposed and recomposed; NFC of a string is the concatenation of the
// NFC of such stretches. Ill-formed UTF-8 is passed through byte for byte and counts as a
// boundary, so the tokenizer can still encode (and round-trip) arbitrary bytes.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "clover/tokenizer/unicode.hpp"
#include "clover/tokenizer/utf8.hpp"

namespace clover::tok {

namespace nfc_detail {

inline constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
inline constexpr char32_t l_count = 19, v_count = 21, t_count = 28, n_count = v_count * t_count,
                          s_count = l_count * n_count;

inline bool is_boundary(char32_t cp) {
    return cp < 0x300 || cp == utf8::invalid || !(unicode::flags(cp) & unicode::nfc_unsafe);
}

// NFC of one stretch of well-formed code points, appended to out as UTF-8.
inline void normalize_stretch(const std::vector<char32_t>& in, std::vector<char32_t>& d,
                              std::vector<unsigned>& cls, std::string& out) {
    d.clear();
    for (char32_t c : in) {
        if (c >= s_base && c < s_base + s_count) {
            char32_t s = c - s_base;
            d.push_back(l_base + s / n_count);
            d.push_back(v_base + (s % n_count) / t_count);
            if (s % t_count) d.push_back(t_base + s % t_count);
        } else if (auto dec = unicode::decomposition(c); !dec.empty()) {
            d.insert(d.end(), dec.begin(), dec.end());
        } else {
            d.push_back(c);
        }
    }
    cls.resize(d.size());
    for (std::size_t i = 0; i < d.size(); ++i) cls[i] = unicode::ccc(d[i]);
    // Canonical ordering: a stable sort by class of each run of non-starters. Long runs (a
    // hostile input of a million marks) use a stable n·log n sort instead of insertion.
    for (std::size_t i = 0; i < d.size();) {
        if (cls[i] == 0) { ++i; continue; }
        std::size_t j = i;
        while (j < d.size() && cls[j] != 0) ++j;
        if (j - i > 1) {
            if (j - i <= 32) {
                for (std::size_t a = i + 1; a < j; ++a)
                    for (std::size_t b = a; b > i && cls[b - 1] > cls[b]; --b) {
                        std::swap(cls[b - 1], cls[b]);
                        std::swap(d[b - 1], d[b]);
                    }
            } else {
                std::vector<std::pair<unsigned, char32_t>> tmp;
                for (std::size_t k = i; k < j; ++k) tmp.emplace_back(cls[k], d[k]);
                std::stable_sort(tmp.begin(), tmp.end(), [](auto& x, auto& y) { return x.first < y.first; });
                for (std::size_t k = i; k < j; ++k) { cls[k] = tmp[k - i].first; d[k] = tmp[k - i].second; }
            }
        }
        i = j;
    }
    // Canonical composition, in place: `w` is the write position, `starter` the last starter
    // written, `last` the class of the last code point written after it.
    std::size_t w = 0, starter = std::size_t(-1);
    unsigned last = 0;
    for (std::size_t i = 0; i < d.size(); ++i) {
        char32_t c = d[i];
        unsigned k = cls[i];
        if (starter != std::size_t(-1) && (last < k || (last == 0 && w == starter + 1))) {
            char32_t s = d[starter], comp = 0;
            if (s >= l_base && s < l_base + l_count && c >= v_base && c < v_base + v_count)
                comp = s_base + ((s - l_base) * v_count + (c - v_base)) * t_count;
            else if (s >= s_base && s < s_base + s_count && (s - s_base) % t_count == 0 && c > t_base &&
                     c < t_base + t_count)
                comp = s + (c - t_base);
            else
                comp = unicode::compose(s, c);
            if (comp) { d[starter] = comp; continue; }
        }
        if (k == 0) { starter = w; last = 0; } else last = k;
        d[w] = c;
        cls[w] = k;
        ++w;
    }
    for (std::size_t i = 0; i < w; ++i) utf8::append(out, d[i]);
}

}  // namespace nfc_detail

// True when s is certainly NFC already (the fast path of nfc()).
inline bool is_nfc_quick(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        if (static_cast<unsigned char>(s[i]) < 0xCC) { ++i; continue; }  // lead bytes below U+0300
        char32_t cp;
        i += std::size_t(utf8::decode(s, i, cp));
        if (!nfc_detail::is_boundary(cp)) return false;
    }
    return true;
}

// Appends NFC(s) to out. Returns false (and appends nothing) when s is already NFC, so that
// callers can keep using s itself.
inline bool nfc_append(std::string_view s, std::string& out) {
    std::size_t copied = 0;    // s[0, copied) is already in out
    std::size_t boundary = 0;  // start of the last safe boundary seen (or of the text)
    bool changed = false;
    std::vector<char32_t> stretch, d;
    std::vector<unsigned> cls;
    for (std::size_t i = 0; i < s.size();) {
        unsigned char b = static_cast<unsigned char>(s[i]);
        if (b < 0x80) { boundary = i++; continue; }
        char32_t cp;
        auto len = std::size_t(utf8::decode(s, i, cp));
        if (nfc_detail::is_boundary(cp)) { boundary = i; i += len; continue; }
        // An unsafe code point: normalise from the last boundary to the next one.
        std::size_t j = i + len;
        while (j < s.size()) {
            char32_t c2;
            auto l2 = std::size_t(utf8::decode(s, j, c2));
            if (nfc_detail::is_boundary(c2)) break;
            j += l2;
        }
        stretch.clear();
        for (std::size_t k = boundary; k < j;) {
            char32_t c3;
            k += std::size_t(utf8::decode(s, k, c3));
            stretch.push_back(c3);
        }
        if (!changed) { out.reserve(out.size() + s.size() + 16); changed = true; }
        out.append(s.data() + copied, boundary - copied);
        nfc_detail::normalize_stretch(stretch, d, cls, out);
        copied = j;
        boundary = j;
        i = j;
    }
    if (!changed) return false;
    out.append(s.data() + copied, s.size() - copied);
    return true;
}

inline std::string nfc(std::string_view s) {
    std::string out;
    if (!nfc_append(s, out)) out.assign(s);
    return out;
}

}  // namespace clover::tok
