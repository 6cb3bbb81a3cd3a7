#pragma once
// Look-ups over the generated Unicode data (unicode_data.hpp): category flags for the
// pre-tokenizer and the canonical data for NFC.
//
// The flags are hit for every code point of every text, so the run list is expanded once into
// a two-stage table (stage 1 per 128 code points, shared 128-byte blocks): about 40 KiB, built
// on first use in well under a millisecond. The NFC data is only read on the slow path (text
// that is not already NFC), where a binary search is cheap enough.
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "clover/tokenizer/unicode_data.hpp"

namespace clover::tok::unicode {

inline constexpr unsigned letter = unicode_data::flag_letter;
inline constexpr unsigned mark = unicode_data::flag_mark;
inline constexpr unsigned number = unicode_data::flag_number;
inline constexpr unsigned space = unicode_data::flag_space;
inline constexpr unsigned nfc_unsafe = unicode_data::flag_nfc_unsafe;
inline constexpr char32_t max_code_point = 0x10FFFF;

namespace detail {

struct flag_table {
    static constexpr unsigned shift = 7, block = 1u << shift;
    std::vector<std::uint16_t> stage1;  // (max_code_point + 1) / block entries
    std::vector<std::uint8_t> stage2;   // blocks of `block` flags

    flag_table() {
        constexpr auto& runs = unicode_data::flag_runs;
        constexpr std::size_t n_runs = std::size(runs);
        stage1.resize((max_code_point + 1) / block);
        std::vector<std::uint8_t> cur(block);
        std::unordered_map<std::string, std::size_t> seen;
        std::size_t r = 0;
        for (std::size_t b = 0; b < stage1.size(); ++b) {
            for (unsigned k = 0; k < block; ++k) {
                char32_t cp = char32_t(b * block + k);
                while (r + 1 < n_runs && (runs[r + 1] >> 8) <= cp) ++r;
                cur[k] = std::uint8_t(runs[r] & 0xFF);
            }
            // Most blocks repeat (unassigned planes, CJK): share identical ones.
            std::string key(cur.begin(), cur.end());
            auto [it, fresh] = seen.try_emplace(std::move(key), stage2.size() / block);
            if (fresh) stage2.insert(stage2.end(), cur.begin(), cur.end());
            std::size_t found = it->second;
            stage1[b] = std::uint16_t(found);
        }
    }
};

inline const flag_table& flags_table() {
    static const flag_table t;
    return t;
}

// Flags of the ASCII range, computed at compile time from the same run list.
inline constexpr std::array<std::uint8_t, 128> ascii_flags = [] {
    std::array<std::uint8_t, 128> a{};
    std::size_t r = 0;
    for (unsigned c = 0; c < 128; ++c) {
        while (r + 1 < std::size(unicode_data::flag_runs) && (unicode_data::flag_runs[r + 1] >> 8) <= c) ++r;
        a[c] = std::uint8_t(unicode_data::flag_runs[r] & 0xFF);
    }
    return a;
}();

}  // namespace detail

// Category flags (letter | mark | number | space | nfc_unsafe) of a code point; 0 above U+10FFFF.
inline unsigned flags(char32_t cp) {
    if (cp < 128) return detail::ascii_flags[cp];
    if (cp > max_code_point) return 0;
    const auto& t = detail::flags_table();
    return t.stage2[std::size_t(t.stage1[cp >> detail::flag_table::shift]) * detail::flag_table::block +
                    (cp & (detail::flag_table::block - 1))];
}

// Rank of the canonical combining class (0 for starters; order-preserving, see unicode_data.hpp).
inline unsigned ccc(char32_t cp) {
    if (cp < 0x300) return 0;
    constexpr auto& runs = unicode_data::ccc_runs;
    auto it = std::upper_bound(std::begin(runs), std::end(runs), cp,
                               [](char32_t c, std::uint32_t run) { return c < (run >> 8); });
    return it == std::begin(runs) ? 0 : (*(it - 1) & 0xFF);
}

// Full canonical decomposition, or an empty span. Hangul syllables are handled by the caller.
inline std::span<const std::uint32_t> decomposition(char32_t cp) {
    constexpr auto& keys = unicode_data::decomp_keys;
    auto it = std::lower_bound(std::begin(keys), std::end(keys), std::uint32_t(cp));
    if (it == std::end(keys) || *it != cp) return {};
    auto i = std::size_t(it - std::begin(keys));
    return {unicode_data::decomp_data + unicode_data::decomp_offsets[i],
            std::size_t(unicode_data::decomp_offsets[i + 1] - unicode_data::decomp_offsets[i])};
}

// Primary composite of (first, second), or 0. Hangul syllables are handled by the caller.
inline char32_t compose(char32_t first, char32_t second) {
    constexpr auto& keys = unicode_data::compose_keys;
    std::uint64_t k = (std::uint64_t(first) << 21) | second;
    auto it = std::lower_bound(std::begin(keys), std::end(keys), k);
    if (it == std::end(keys) || *it != k) return 0;
    return unicode_data::compose_values[it - std::begin(keys)];
}

}  // namespace clover::tok::unicode
