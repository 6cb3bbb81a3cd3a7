#pragma once
// Q8_K: the activation partner of the K-quants (Q4_K, Q5_K, Q6_K), as ggml defines it: blocks of
// 256 int8 values with one f32 scale and the sums of each 16-value group (292 bytes). Activation
// rows are rounded to it before every K-quant product, exactly as the peer does, so our logits on
// Q4_K_M files stay within rounding of llama.cpp's.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace clover::quant {

inline constexpr std::int64_t qk_k = 256;  // elements per K-quant super-block

struct block_q8_k {
    float d;
    std::int8_t qs[256];
    std::int16_t bsums[16];  // bsums[j] = Σ qs[16j .. 16j+15]
};
static_assert(sizeof(block_q8_k) == 292, "block_q8_k must match ggml's block_q8_K");

// ggml's rule (quantize_row_q8_K_ref, which its x86 CPU backend also uses): the element of
// largest magnitude (the first on ties) maps to -127, iscale = -127/max, q = min(127, rne(x·iscale)),
// d = 1/iscale. An all-zero block stores d = 0.
inline void quantize_row_q8_k(const float* x, block_q8_k* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b) {
        const float* xb = x + b * qk_k;
        float amax = 0.f, max = 0.f;
        for (int i = 0; i < qk_k; ++i) {
            const float ax = std::fabs(xb[i]);
            if (ax > amax) { amax = ax; max = xb[i]; }
        }
        block_q8_k& o = y[b];
        if (amax == 0.f) {
            o.d = 0.f;
            std::fill(o.qs, o.qs + qk_k, std::int8_t(0));
            std::fill(o.bsums, o.bsums + 16, std::int16_t(0));
            continue;
        }
        const float iscale = -127.f / max;
        for (int i = 0; i < qk_k; ++i) o.qs[i] = std::int8_t(std::min(127, int(std::nearbyint(iscale * xb[i]))));
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += o.qs[16 * j + i];
            o.bsums[j] = std::int16_t(s);
        }
        o.d = 1.f / iscale;
    }
}

inline void dequantize_row_q8_k(const block_q8_k* x, float* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / qk_k; ++b)
        for (int i = 0; i < qk_k; ++i) y[b * qk_k + i] = x[b].d * float(x[b].qs[i]);
}

// Σ over the 32-value sub-block sb (0..7) of a Q8_K block: the "min" term of Q4_K/Q5_K.
inline int q8_k_sum32(const block_q8_k& a, int sb) { return int(a.bsums[2 * sb]) + int(a.bsums[2 * sb + 1]); }

}  // namespace clover::quant
