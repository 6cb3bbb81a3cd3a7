#pragma once
// F32 / F16 / BF16 weight tiles written once against packet traits P (simd.hpp): R weight rows
// × C activation rows, y[c·ldy + r]. Activations arrive as f32 rows already rounded to the
// weight's partner type (F16 → F16, BF16 → BF16), which is ggml's semantics, so the products
// equal f16·f16 / bf16·bf16 products accumulated in f32. Twin: quant::vec_dot_ref.
#include <cstddef>
#include <cstdint>

#include "clover/backend/cpu/simd.hpp"
#include "clover/quant/half.hpp"

namespace clover::backend::cpu_detail {

enum class wfloat { f32, f16, bf16 };

template <class P, wfloat T>
inline typename P::f32v load_w(const std::byte* row, std::int64_t k) {
    if constexpr (T == wfloat::f32) return P::load(reinterpret_cast<const float*>(row) + k);
    else if constexpr (T == wfloat::f16) return P::load_f16(reinterpret_cast<const quant::f16_bits*>(row) + k);
    else return P::load_bf16(reinterpret_cast<const quant::bf16_bits*>(row) + k);
}

template <wfloat T>
inline float scalar_w(const std::byte* row, std::int64_t k) {
    if constexpr (T == wfloat::f32) return reinterpret_cast<const float*>(row)[k];
    else if constexpr (T == wfloat::f16) return quant::f16_to_f32(reinterpret_cast<const quant::f16_bits*>(row)[k]);
    else return quant::bf16_to_f32(reinterpret_cast<const quant::bf16_bits*>(row)[k]);
}

template <class P, wfloat T, int R, int C>
void float_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                std::int64_t ldy) {
    using V = typename P::f32v;
    V acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = P::zero();
    std::int64_t k = 0;
    for (; k + P::lanes <= K; k += P::lanes) {
        V wv[R];
        for (int r = 0; r < R; ++r) wv[r] = load_w<P, T>(w + std::size_t(r) * ws, k);
        for (int c = 0; c < C; ++c) {
            const V av = P::load(reinterpret_cast<const float*>(a + std::size_t(c) * as) + k);
            for (int r = 0; r < R; ++r) acc[r][c] = P::fma(wv[r], av, acc[r][c]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) {
            float s = P::reduce(acc[r][c]);
            const float* ac = reinterpret_cast<const float*>(a + std::size_t(c) * as);
            for (std::int64_t i = k; i < K; ++i) s += scalar_w<T>(w + std::size_t(r) * ws, i) * ac[i];
            y[c * ldy + r] = s;
        }
}

}  // namespace clover::backend::cpu_detail
