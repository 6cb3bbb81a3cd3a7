#pragma once
// Q4_K, as GGUF stores it: super-blocks of 256 values = 8 sub-blocks of 32, each with a 6-bit
// scale and a 6-bit min; the super-block carries f16 d and dmin (144 bytes). Value =
// d·sc[j]·q − dmin·m[j], q in 0..15. Layout of qs: chunk c (0..3) holds sub-blocks 2c (low
// nibbles) and 2c+1 (high nibbles) of 32 bytes each. The 12 scale bytes pack (sc, m) pairs:
//   j < 4 : sc = b[j] & 63,                     m = b[j+4] & 63
//   j >= 4: sc = (b[j+4] & 15) | (b[j-4] >> 6) << 4,  m = (b[j+4] >> 4) | (b[j] >> 6) << 4
// The quantizer is ours (min/max per sub-block, then 6-bit scales against the super-block
// maxima); files it writes are read by llama.cpp like any other Q4_K file.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "clover/quant/half.hpp"
#include "clover/quant/q8_k.hpp"

namespace clover::quant {

struct block_q4_k {
    f16_bits d, dmin;
    std::uint8_t scales[12];
    std::uint8_t qs[128];
};
static_assert(sizeof(block_q4_k) == 144, "block_q4_k must match the GGUF layout");

// The 8 (scale, min) pairs of a K-quant scale field (Q4_K and Q5_K share it).
inline void unpack_scales_k4(const std::uint8_t* b, std::uint8_t* sc, std::uint8_t* m) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = b[j] & 63;
        m[j] = b[j + 4] & 63;
    }
    for (int j = 4; j < 8; ++j) {
        sc[j] = std::uint8_t((b[j + 4] & 15) | ((b[j - 4] >> 6) << 4));
        m[j] = std::uint8_t((b[j + 4] >> 4) | ((b[j] >> 6) << 4));
    }
}

inline void pack_scales_k4(const std::uint8_t* sc, const std::uint8_t* m, std::uint8_t* b) {
    for (int j = 0; j < 4; ++j) {
        b[j] = std::uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
        b[j + 4] = std::uint8_t(m[j] | ((m[j + 4] >> 4) << 6));
        b[j + 8] = std::uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

namespace detail {
// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per sub-block asymmetric ranges, 6-bit scale and
// min codes against the super-block maxima, then codes q[256] in 0..nmax.
inline void quantize_superblock_k(const float* x, int nmax, f16_bits& d16, f16_bits& dmin16, std::uint8_t* sc,
                                  std::uint8_t* m, std::uint8_t* q) {
    float scale[8], mn[8], max_scale = 0.f, max_min = 0.f;
    for (int j = 0; j < 8; ++j) {
        float lo = 0.f, hi = 0.f;  // the min is never positive (m >= 0), as in ggml's files
        for (int i = 0; i < 32; ++i) {
            lo = std::min(lo, x[32 * j + i]);
            hi = std::max(hi, x[32 * j + i]);
        }
        scale[j] = (hi - lo) / float(nmax);
        mn[j] = -lo;
        max_scale = std::max(max_scale, scale[j]);
        max_min = std::max(max_min, mn[j]);
    }
    d16 = f32_to_f16(max_scale / 63.f);
    dmin16 = f32_to_f16(max_min / 63.f);
    const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
    for (int j = 0; j < 8; ++j) {
        sc[j] = d > 0.f ? std::uint8_t(std::clamp(int(std::nearbyint(scale[j] / d)), 0, 63)) : 0;
        m[j] = dmin > 0.f ? std::uint8_t(std::clamp(int(std::nearbyint(mn[j] / dmin)), 0, 63)) : 0;
        const float es = d * float(sc[j]), em = dmin * float(m[j]);
        for (int i = 0; i < 32; ++i) {
            const int v = es > 0.f ? int(std::nearbyint((x[32 * j + i] + em) / es)) : 0;
            q[32 * j + i] = std::uint8_t(std::clamp(v, 0, nmax));
        }
    }
}
}  // namespace detail

inline void quantize_row_q4_k(const float* x, block_q4_k* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        std::uint8_t sc[8], m[8], q[256];
        detail::quantize_superblock_k(x + b * qk_k, 15, y[b].d, y[b].dmin, sc, m, q);
        pack_scales_k4(sc, m, y[b].scales);
        for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 32; ++l) y[b].qs[32 * c + l] = std::uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

// The 4-bit code of element i (0..255) of a block.
inline int q4_k_code(const block_q4_k& b, int i) {
    const int c = i / 64, l = i % 32;
    const std::uint8_t v = b.qs[32 * c + l];
    return (i % 64) < 32 ? (v & 15) : (v >> 4);
}

inline void dequantize_row_q4_k(const block_q4_k* x, float* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        std::uint8_t sc[8], m[8];
        unpack_scales_k4(x[b].scales, sc, m);
        const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
        for (int i = 0; i < qk_k; ++i)
            y[b * qk_k + i] = d * float(sc[i / 32]) * float(q4_k_code(x[b], i)) - dmin * float(m[i / 32]);
    }
}

// The exact integer parts of one super-block pair: isum = Σ sc[j]·(q·a over sub-block j) and
// msum = Σ m[j]·(Σ a over sub-block j) (|isum| < 2^22, |msum| < 2^22: any order gives the same).
inline void block_dot_q4_k(const block_q4_k& w, const block_q8_k& a, std::int32_t& isum, std::int32_t& msum) {
    std::uint8_t sc[8], m[8];
    unpack_scales_k4(w.scales, sc, m);
    isum = 0;
    msum = 0;
    for (int j = 0; j < 8; ++j) {
        std::int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += q4_k_code(w, 32 * j + i) * std::int32_t(a.qs[32 * j + i]);
        isum += std::int32_t(sc[j]) * dot;
        msum += std::int32_t(m[j]) * q8_k_sum32(a, j);
    }
}

// Reference dot product with a Q8_K row: integer sums per sub-block, scaled per super-block.
inline float vec_dot_q4_k_ref(const block_q4_k* w, const block_q8_k* a, std::int64_t n) {
    float sum = 0.f;
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        std::int32_t isum, msum;
        block_dot_q4_k(w[b], a[b], isum, msum);
        sum += a[b].d * (f16_to_f32(w[b].d) * float(isum) - f16_to_f32(w[b].dmin) * float(msum));
    }
    return sum;
}

}  // namespace clover::quant
