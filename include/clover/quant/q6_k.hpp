#pragma once
// Q6_K, as GGUF stores it: super-blocks of 256 values = 16 groups of 16 with a signed 8-bit
// scale each and one f16 d (210 bytes). Value = d·sc[i/16]·(q − 32), q in 0..63. Each half h
// (128 values) uses ql[64h..64h+63] and qh[32h..32h+31]; for l = 0..31 the four values
// 128h + l + 32k (k = 0..3) take their low nibble from ql[64h + l] (k = 0: low, k = 2: high) and
// ql[64h + 32 + l] (k = 1: low, k = 3: high), and their two high bits from bits 2k..2k+1 of
// qh[32h + l]. The quantizer is ours (symmetric per group, 8-bit scales against the block max).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "clover/quant/half.hpp"
#include "clover/quant/q8_k.hpp"

namespace clover::quant {

struct block_q6_k {
    std::uint8_t ql[128];
    std::uint8_t qh[64];
    std::int8_t scales[16];
    f16_bits d;
};
static_assert(sizeof(block_q6_k) == 210, "block_q6_k must match the GGUF layout");

inline void quantize_row_q6_k(const float* x, block_q6_k* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        const float* xb = x + b * qk_k;
        float gs[16], max_s = 0.f;
        for (int g = 0; g < 16; ++g) {
            float amax = 0.f;
            for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xb[16 * g + i]));
            gs[g] = amax / 31.f;
            max_s = std::max(max_s, gs[g]);
        }
        block_q6_k& o = y[b];
        o.d = f32_to_f16(max_s / 127.f);
        const float d = f16_to_f32(o.d);
        std::uint8_t q[256];
        for (int g = 0; g < 16; ++g) {
            o.scales[g] = d > 0.f ? std::int8_t(std::clamp(int(std::nearbyint(gs[g] / d)), 0, 127)) : 0;
            const float es = d * float(o.scales[g]);
            for (int i = 0; i < 16; ++i) {
                const int v = es > 0.f ? int(std::nearbyint(xb[16 * g + i] / es)) : 0;
                q[16 * g + i] = std::uint8_t(std::clamp(v, -32, 31) + 32);
            }
        }
        for (int h = 0; h < 2; ++h)
            for (int l = 0; l < 32; ++l) {
                const int q1 = q[128 * h + l], q2 = q[128 * h + 32 + l], q3 = q[128 * h + 64 + l], q4 = q[128 * h + 96 + l];
                o.ql[64 * h + l] = std::uint8_t((q1 & 15) | ((q3 & 15) << 4));
                o.ql[64 * h + 32 + l] = std::uint8_t((q2 & 15) | ((q4 & 15) << 4));
                o.qh[32 * h + l] = std::uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
    }
}

// The 6-bit code (0..63, before the −32 offset) of element i of a block.
inline int q6_k_code(const block_q6_k& b, int i) {
    const int h = i / 128, r = i % 128, k = r / 32, l = r % 32;
    const std::uint8_t lo = b.ql[64 * h + (k & 1) * 32 + l];
    const int low = k < 2 ? (lo & 15) : (lo >> 4);
    return low | (((b.qh[32 * h + l] >> (2 * k)) & 3) << 4);
}

inline void dequantize_row_q6_k(const block_q6_k* x, float* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        const float d = f16_to_f32(x[b].d);
        for (int i = 0; i < qk_k; ++i) y[b * qk_k + i] = d * float(x[b].scales[i / 16]) * float(q6_k_code(x[b], i) - 32);
    }
}

// The exact integer dot product of one super-block pair, Σ sc[g]·(q − 32)·a (the scales d not
// applied; |result| < 2^28, so any order of summation gives the same int32).
inline std::int32_t block_dot_q6_k(const block_q6_k& w, const block_q8_k& a) {
    std::int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
        std::int32_t dot = 0;
        for (int i = 0; i < 16; ++i) dot += (q6_k_code(w, 16 * g + i) - 32) * std::int32_t(a.qs[16 * g + i]);
        isum += std::int32_t(w.scales[g]) * dot;
    }
    return isum;
}

inline float vec_dot_q6_k_ref(const block_q6_k* w, const block_q8_k* a, std::int64_t n) {
    float sum = 0.f;
    for (std::int64_t b = 0; b < n / qk_k; ++b) sum += a[b].d * f16_to_f32(w[b].d) * float(block_dot_q6_k(w[b], a[b]));
    return sum;
}

}  // namespace clover::quant
