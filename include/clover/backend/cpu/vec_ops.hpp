#pragma once
// Float vector helpers for the host-side parts of a pass (attention scores, GDN chunks), written
// once against the packet traits (simd.hpp). dot() has a fixed summation order for a given n
// (four accumulators of P::lanes, then the tail), whatever the caller, so a row computed in a
// multi-row pass equals the same row computed alone. Twins: the plain loops in tests/quant.
//
// Why: GCC does not vectorise a float reduction without -ffast-math (it must keep the order),
// so `s += a[i] * b[i]` ran one add per 4 cycles; the attention scores of a 256-token prefill
// spent 6% of the pass there (perf, 8-layer Q4_K_M file), growing with the square of the prompt.
#include <cstdint>

#include "clover/backend/cpu/simd.hpp"
#include "clover/quant/half.hpp"

namespace clover::backend::cpu_detail {

template <class P = native>
inline float dot_f32(const float* a, const float* b, std::int64_t n) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    V acc0 = P::zero(), acc1 = P::zero(), acc2 = P::zero(), acc3 = P::zero();
    std::int64_t i = 0;
    for (; i + 4 * L <= n; i += 4 * L) {
        acc0 = P::fma(P::load(a + i), P::load(b + i), acc0);
        acc1 = P::fma(P::load(a + i + L), P::load(b + i + L), acc1);
        acc2 = P::fma(P::load(a + i + 2 * L), P::load(b + i + 2 * L), acc2);
        acc3 = P::fma(P::load(a + i + 3 * L), P::load(b + i + 3 * L), acc3);
    }
    for (; i + L <= n; i += L) acc0 = P::fma(P::load(a + i), P::load(b + i), acc0);
    float s = P::reduce(P::add(P::add(acc0, acc1), P::add(acc2, acc3)));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// The same with b stored as f16 (an F16 KV cache).
template <class P = native>
inline float dot_f32_f16(const float* a, const quant::f16_bits* b, std::int64_t n) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    V acc0 = P::zero(), acc1 = P::zero();
    std::int64_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
        acc0 = P::fma(P::load(a + i), P::load_f16(b + i), acc0);
        acc1 = P::fma(P::load(a + i + L), P::load_f16(b + i + L), acc1);
    }
    for (; i + L <= n; i += L) acc0 = P::fma(P::load(a + i), P::load_f16(b + i), acc0);
    float s = P::reduce(P::add(acc0, acc1));
    for (; i < n; ++i) s += a[i] * quant::f16_to_f32(b[i]);
    return s;
}

// y += a · x
template <class P = native>
inline void axpy(float a, const float* x, float* y, std::int64_t n) {
    constexpr int L = P::lanes;
    const auto av = P::set1(a);
    std::int64_t i = 0;
    for (; i + L <= n; i += L) P::store(y + i, P::fma(av, P::load(x + i), P::load(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

template <class P = native>
inline void axpy_f16(float a, const quant::f16_bits* x, float* y, std::int64_t n) {
    constexpr int L = P::lanes;
    const auto av = P::set1(a);
    std::int64_t i = 0;
    for (; i + L <= n; i += L) P::store(y + i, P::fma(av, P::load_f16(x + i), P::load(y + i)));
    for (; i < n; ++i) y[i] += a * quant::f16_to_f32(x[i]);
}

// y[0, n) = beta·y + Σ_r (alpha·coef[r])·X[r·ld + 0, n), the rows taken in order r = 0..m-1
// (so each element's sum runs in that order, as the plain loop's does). Up to 8 vectors of y
// stay in registers across all m rows, instead of one load and store of y per row: the GDN
// chunk's rank-1 updates (state update, forward substitution, Δ = U − W·S) were load-store
// bound that way (perf: the vmovups of `y[j] += c * x[j]` were the hottest instructions).
template <class P = native>
inline void acc_rows(float* y, float beta, float alpha, const float* coef, const float* X, std::int64_t m, std::int64_t ld,
                     std::int64_t n) {
    using V = typename P::f32v;
    constexpr int L = P::lanes, B = 8;
    const V bv = P::set1(beta);
    std::int64_t j = 0;
    for (; j + B * L <= n; j += B * L) {
        V acc[B];
        for (int v = 0; v < B; ++v) acc[v] = beta == 1.f ? P::load(y + j + v * L) : P::mul(bv, P::load(y + j + v * L));
        for (std::int64_t r = 0; r < m; ++r) {
            const V c = P::set1(alpha * coef[r]);
            const float* xr = X + r * ld + j;
            for (int v = 0; v < B; ++v) acc[v] = P::fma(c, P::load(xr + v * L), acc[v]);
        }
        for (int v = 0; v < B; ++v) P::store(y + j + v * L, acc[v]);
    }
    for (; j + L <= n; j += L) {
        V acc = beta == 1.f ? P::load(y + j) : P::mul(bv, P::load(y + j));
        for (std::int64_t r = 0; r < m; ++r) acc = P::fma(P::set1(alpha * coef[r]), P::load(X + r * ld + j), acc);
        P::store(y + j, acc);
    }
    for (; j < n; ++j) {
        float acc = beta == 1.f ? y[j] : beta * y[j];
        for (std::int64_t r = 0; r < m; ++r) acc += (alpha * coef[r]) * X[r * ld + j];
        y[j] = acc;
    }
}

// y1 += Σ_r c1[r]·X[r], y2 += Σ_r c2[r]·X[r] in one pass over X (rows in order r = 0..m-1):
// the GDN decode step reads its state once for both Sᵀk and Sᵀq.
template <class P = native>
inline void acc_rows2(float* y1, float* y2, const float* c1, const float* c2, const float* X, std::int64_t m,
                      std::int64_t ld, std::int64_t n) {
    using V = typename P::f32v;
    constexpr int L = P::lanes, B = 4;
    std::int64_t j = 0;
    for (; j + B * L <= n; j += B * L) {
        V a1[B], a2[B];
        for (int v = 0; v < B; ++v) {
            a1[v] = P::load(y1 + j + v * L);
            a2[v] = P::load(y2 + j + v * L);
        }
        for (std::int64_t r = 0; r < m; ++r) {
            const V k1 = P::set1(c1[r]), k2 = P::set1(c2[r]);
            const float* xr = X + r * ld + j;
            for (int v = 0; v < B; ++v) {
                const V x = P::load(xr + v * L);
                a1[v] = P::fma(k1, x, a1[v]);
                a2[v] = P::fma(k2, x, a2[v]);
            }
        }
        for (int v = 0; v < B; ++v) {
            P::store(y1 + j + v * L, a1[v]);
            P::store(y2 + j + v * L, a2[v]);
        }
    }
    for (; j < n; ++j) {
        float s1 = y1[j], s2 = y2[j];
        for (std::int64_t r = 0; r < m; ++r) {
            s1 += c1[r] * X[r * ld + j];
            s2 += c2[r] * X[r * ld + j];
        }
        y1[j] = s1;
        y2[j] = s2;
    }
}

// y = a·y + b·x
template <class P = native>
inline void scale_add(float* y, float a, float b, const float* x, std::int64_t n) {
    constexpr int L = P::lanes;
    const auto av = P::set1(a), bv = P::set1(b);
    std::int64_t i = 0;
    for (; i + L <= n; i += L) P::store(y + i, P::fma(bv, P::load(x + i), P::mul(av, P::load(y + i))));
    for (; i < n; ++i) y[i] = b * x[i] + a * y[i];
}

}  // namespace clover::backend::cpu_detail
