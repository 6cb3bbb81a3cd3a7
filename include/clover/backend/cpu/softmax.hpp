#pragma once
// The softmax of attention scores (architecture.md §2.2): `softmax_plain` is the definition and
// the scalar twin, `softmax_rows` the vector form; the two give the same bits on every machine.
//
// Why not math::softmax (std::exp per score, one double sum in order): after the attention
// kernel of attend.hpp it was about a third of CPU attention on small heads (perf,
// bench_server --conversation on the bundled model: the expf calls, the spills around them and a
// 4-cycle chain of double adds per score). glibc's expf cannot be vectorised without changing its
// bits, so the exponential here is our own, written with explicit FMAs only (nothing for the
// compiler to contract), and the sum runs in 16 double lanes (score i into lane i mod 16) closed
// by a fixed tree. Both forms do exactly these operations, so a row's probabilities never depend
// on the ISA's width, on G or on the batch.
//
// exp: x clamped to [-87.3, 88.3] (softmax inputs are ≤ 0; below -87.3 the result is < 1.2e-38
// of the largest term), n = nearest(x·log2 e), r = x − n·ln2 in two FMAs (Cody–Waite), a degree-5
// polynomial for e^r on |r| ≤ ln2/2 (Cephes' expf coefficients), times 2^n built in the exponent
// bits. Within ~1 ulp of the true value (tests/quant checks it against double exp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "clover/backend/cpu/simd.hpp"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wall reports as
// uninitialised once they are inlined here (GCC PR 105593; fixed in later releases).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace clover::backend::cpu_detail {

namespace softmax_detail {

inline constexpr float exp_lo = -87.3f, exp_hi = 88.3f, log2e = 1.44269504088896341f, ln2_hi = 0.693359375f,
                       ln2_lo = -2.12194440e-4f;
inline constexpr float poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                                  5.0000001201e-1f};

inline float exp_one(float x) {
    x = std::min(std::max(x, exp_lo), exp_hi);
    const float t = x * log2e;
    const float n = std::nearbyint(t);
    float r = std::fma(-n, ln2_hi, x);
    r = std::fma(-n, ln2_lo, r);
    float p = poly[0];
    for (int k = 1; k < 6; ++k) p = std::fma(p, r, poly[k]);
    const float r2 = r * r;
    float y = std::fma(p, r2, r);
    y = y + 1.f;
    const std::int32_t e = (std::int32_t(n) + 127) << 23;
    float s;
    std::memcpy(&s, &e, 4);
    return y * s;
}

// Σ over 16 partial sums in pairs (k, k+8), (k, k+4), (k, k+2), (0, 1).
inline double close_lanes(double* a) {
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; ++k) a[k] = a[k] + a[k + w];
    return a[0];
}

#if CLOVER_CPU_AVX512
inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(exp_lo)), _mm512_set1_ps(exp_hi));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(log2e));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_lo), r);
    __m512 p = _mm512_set1_ps(poly[0]);
    for (int k = 1; k < 6; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(poly[k]));
    const __m512 r2 = _mm512_mul_ps(r, r);
    __m512 y = _mm512_fmadd_ps(p, r2, r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#elif CLOVER_CPU_AVX2
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(exp_lo)), _mm256_set1_ps(exp_hi));
    const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(log2e));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_lo), r);
    __m256 p = _mm256_set1_ps(poly[0]);
    for (int k = 1; k < 6; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(poly[k]));
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256 y = _mm256_fmadd_ps(p, r2, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

}  // namespace softmax_detail

// The definition (and scalar twin): x[0, n) ← softmax(x), n ≥ 1.
inline void softmax_plain(float* x, std::int64_t n) {
    using namespace softmax_detail;
    float m = x[0];
    for (std::int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    double lane[16] = {};
    for (std::int64_t i = 0; i < n; ++i) {
        x[i] = exp_one(x[i] - m);
        lane[i % 16] += double(x[i]);
    }
    const float inv = float(1.0 / close_lanes(lane));
    for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// The same with this build's vectors (bit-identical to softmax_plain).
inline void softmax_rows(float* x, std::int64_t n) {
    using namespace softmax_detail;
#if CLOVER_CPU_AVX512 || CLOVER_CPU_AVX2
    std::int64_t i = 0;
    float m = x[0];
#if CLOVER_CPU_AVX512
    __m512 mv = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
    m = _mm512_reduce_max_ps(mv);  // max is exact in any order
#else
    __m256 mv = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    alignas(32) float mx[8];
    _mm256_store_ps(mx, mv);
    for (float v : mx) m = std::max(m, v);
#endif
    for (; i < n; ++i) m = std::max(m, x[i]);
    alignas(64) double lane[16];
    i = 0;
#if CLOVER_CPU_AVX512
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();  // lanes 0–7, 8–15
    const __m512 mm = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mm));
        _mm512_storeu_ps(x + i, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    _mm512_store_pd(lane, s0);
    _mm512_store_pd(lane + 8, s1);
#else
    __m256d s[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    const __m256 mm = _mm256_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        for (int h = 0; h < 2; ++h) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * h), mm));
            _mm256_storeu_ps(x + i + 8 * h, e);
            s[2 * h] = _mm256_add_pd(s[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            s[2 * h + 1] = _mm256_add_pd(s[2 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
    }
    for (int k = 0; k < 4; ++k) _mm256_store_pd(lane + 4 * k, s[k]);
#endif
    for (; i < n; ++i) {  // the tail: the same lanes, in scalar
        x[i] = exp_one(x[i] - m);
        lane[i % 16] += double(x[i]);
    }
    const float inv = float(1.0 / close_lanes(lane));
    for (i = 0; i < n; ++i) x[i] *= inv;
#else
    softmax_plain(x, n);
#endif
}

}  // namespace clover::backend::cpu_detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
