#pragma once
// Q8_0: blocks of 32 int8 values with one f16 scale (34 bytes), as in GGUF.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "clover/quant/half.hpp"

namespace clover::quant {

struct block_q8_0 {
    f16_bits d;
    std::int8_t qs[32];
};
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must match the GGUF layout");

// x: [n] floats, n % 32 == 0 -> n/32 blocks. The scale is 127/amax and ties round to even,
// as the peer's vectorised activation quantizer does (so Q8_0 logits match it closely).
inline void quantize_row_q8_0(const float* x, block_q8_0* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / 32; ++b) {
        const float* xb = x + b * 32;
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / 127.f;
        const float id = amax != 0.f ? 127.f / amax : 0.f;
        y[b].d = f32_to_f16(d);
        for (int i = 0; i < 32; ++i) y[b].qs[i] = std::int8_t(std::nearbyint(xb[i] * id));
    }
}

inline void dequantize_row_q8_0(const block_q8_0* x, float* y, std::int64_t n) {
    for (std::int64_t b = 0; b < n / 32; ++b) {
        const float d = f16_to_f32(x[b].d);
        for (int i = 0; i < 32; ++i) y[b * 32 + i] = d * float(x[b].qs[i]);
    }
}

// The exact integer dot product of one block pair's codes (scales not applied).
inline std::int32_t block_dot_q8_0(const block_q8_0& a, const block_q8_0& b) {
    std::int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += std::int32_t(a.qs[i]) * std::int32_t(b.qs[i]);
    return s;
}

// Reference dot product of two Q8_0 rows of n elements: integer sums per block, then scaled.
inline float vec_dot_q8_0_ref(const block_q8_0* a, const block_q8_0* b, std::int64_t n) {
    float sum = 0;
    for (std::int64_t k = 0; k < n / 32; ++k) sum += float(block_dot_q8_0(a[k], b[k])) * (f16_to_f32(a[k].d) * f16_to_f32(b[k].d));
    return sum;
}

}  // namespace clover::quant
