#pragma once
// Q5_K, as GGUF stores it: like Q4_K (same 8 sub-blocks, 6-bit scales/mins, f16 d and dmin) with
// a fifth bit per value in qh (176 bytes). Value = d·sc[j]·q − dmin·m[j], q in 0..31, where the
// low nibble comes from qs exactly as in Q4_K and bit 4 of element l of sub-block j is bit j of
// qh[l] (l = 0..31).
#include <cstdint>

#include "clover/quant/q4_k.hpp"

namespace clover::quant {

struct block_q5_k {
    f16_bits d, dmin;
    std::uint8_t scales[12];
    std::uint8_t qh[32];
    std::uint8_t qs[128];
};
static_assert(sizeof(block_q5_k) == 176, "block_q5_k must match the GGUF layout");

inline void quantize_row_q5_k(const float* x, block_q5_k* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        std::uint8_t sc[8], m[8], q[256];
        detail::quantize_superblock_k(x + b * qk_k, 31, y[b].d, y[b].dmin, sc, m, q);
        pack_scales_k4(sc, m, y[b].scales);
        for (int l = 0; l < 32; ++l) {
            std::uint8_t h = 0;
            for (int j = 0; j < 8; ++j) h = std::uint8_t(h | ((q[32 * j + l] >> 4) << j));
            y[b].qh[l] = h;
        }
        for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 32; ++l)
                y[b].qs[32 * c + l] = std::uint8_t((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4));
    }
}

inline int q5_k_code(const block_q5_k& b, int i) {
    const int c = i / 64, l = i % 32, j = i / 32;
    const std::uint8_t v = b.qs[32 * c + l];
    const int lo = (i % 64) < 32 ? (v & 15) : (v >> 4);
    return lo | (((b.qh[l] >> j) & 1) << 4);
}

inline void dequantize_row_q5_k(const block_q5_k* x, float* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        std::uint8_t sc[8], m[8];
        unpack_scales_k4(x[b].scales, sc, m);
        const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
        for (int i = 0; i < qk_k; ++i)
            y[b * qk_k + i] = d * float(sc[i / 32]) * float(q5_k_code(x[b], i)) - dmin * float(m[i / 32]);
    }
}

inline float vec_dot_q5_k_ref(const block_q5_k* w, const block_q8_k* a, std::int64_t n) {
    float sum = 0.f;
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        std::uint8_t sc[8], m[8];
        unpack_scales_k4(w[b].scales, sc, m);
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; ++j) {
            int dot = 0;
            for (int i = 0; i < 32; ++i) dot += q5_k_code(w[b], 32 * j + i) * int(a[b].qs[32 * j + i]);
            isum += int(sc[j]) * dot;
            msum += int(m[j]) * q8_k_sum32(a[b], j);
        }
        sum += a[b].d * (f16_to_f32(w[b].d) * float(isum) - f16_to_f32(w[b].dmin) * float(msum));
    }
    return sum;
}

}  // namespace clover::quant
