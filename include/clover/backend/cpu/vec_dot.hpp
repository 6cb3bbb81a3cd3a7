#pragma once
// Dot products of one weight row with one activation row (already in the weight's activation
// type, quant/rows.hpp). AVX2 (+F16C) versions where the compiler targets them, else the
// reference loops. Chosen at compile time; tests/quant compares every path with the reference
// on odd sizes.
#include <cstdint>

#include "clover/quant/rows.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define CLOVER_CPU_AVX2 1
#endif

namespace clover::backend::cpu_detail {

#if CLOVER_CPU_AVX2
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Four accumulators hide FMA latency (measured ~2x over one accumulator on long rows).
inline float dot_f32(const float* a, const float* b, std::int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    std::int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

inline float dot_f16(const quant::f16_bits* a, const quant::f16_bits* b, std::int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        auto la = [&](const quant::f16_bits* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
        acc0 = _mm256_fmadd_ps(la(a + i), la(b + i), acc0);
        acc1 = _mm256_fmadd_ps(la(a + i + 8), la(b + i + 8), acc1);
    }
    float s = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += quant::f16_to_f32(a[i]) * quant::f16_to_f32(b[i]);
    return s;
}

inline __m256 load_bf16x8(const quant::bf16_bits* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

inline float dot_bf16(const quant::bf16_bits* a, const quant::bf16_bits* b, std::int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_bf16x8(a + i), load_bf16x8(b + i), acc0);
        acc1 = _mm256_fmadd_ps(load_bf16x8(a + i + 8), load_bf16x8(b + i + 8), acc1);
    }
    float s = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += quant::bf16_to_f32(a[i]) * quant::bf16_to_f32(b[i]);
    return s;
}

// Signed int8 x int8 via maddubs on |a| and sign-transferred b (the usual AVX2 trick).
inline float dot_q8_0(const quant::block_q8_0* a, const quant::block_q8_0* b, std::int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    const std::int64_t nb = n / 32;
    for (std::int64_t k = 0; k < nb; ++k) {
        __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[k].qs));
        __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[k].qs));
        __m256i ax = _mm256_sign_epi8(qa, qa);
        __m256i sy = _mm256_sign_epi8(qb, qa);
        __m256i dot16 = _mm256_maddubs_epi16(ax, sy);
        __m256i dot32 = _mm256_madd_epi16(dot16, _mm256_set1_epi16(1));
        const float d = quant::f16_to_f32(a[k].d) * quant::f16_to_f32(b[k].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(dot32), acc);
    }
    return hsum(acc);
}
#endif

inline float vec_dot(dtype t, const void* w, const void* x, std::int64_t n) {
#if CLOVER_CPU_AVX2
    switch (t) {
        case dtype::f32: return dot_f32(static_cast<const float*>(w), static_cast<const float*>(x), n);
        case dtype::f16: return dot_f16(static_cast<const quant::f16_bits*>(w), static_cast<const quant::f16_bits*>(x), n);
        case dtype::bf16: return dot_bf16(static_cast<const quant::bf16_bits*>(w), static_cast<const quant::bf16_bits*>(x), n);
        case dtype::q8_0: return dot_q8_0(static_cast<const quant::block_q8_0*>(w), static_cast<const quant::block_q8_0*>(x), n);
        default: break;
    }
#endif
    return quant::vec_dot_ref(t, w, x, n);
}

}  // namespace clover::backend::cpu_detail
