#pragma once
// Attention of the G query heads that share one KV head (GQA) over key/value runs: the kernel of
// backend::cpu's attention primitive. `attend_group` is the fast form; `attend_group_ref` is its
// plain twin (per key and head: dot_f32 / dot_f32_f16, softmax_plain, axpy), and the two give
// the same bits (tests/quant/test_fused.cpp) — so the scores of a row never depend on G, on how
// the keys fall into runs and blocks, or on the other rows of a batch.
//
// Why a second form: per key and head the twin converts the F16 key and value rows again (G = 8
// for Clover-35B-A3B) and reduces each dot product across lanes on its own (~7 shuffles and
// adds per 64–256 multiply-adds). Attention was 47 % of a cached conversation turn on the
// bundled model (perf, bench_server --conversation) and ~1 ms per token per 1,000 positions on
// the 8-layer 35B-A3B file. Here each block of P::lanes keys is converted once for all G heads,
// the block's dot products are reduced together (P::reduce_each: the same pairs of lanes), and
// the values are accumulated in registers over all keys for up to 8 heads at a time; the
// softmax is softmax.hpp's vector form. Measured (bench_kernels --attention, one Zen 4 thread,
// one query row): 1.4–1.95x the twin before the softmax change; see the README for after.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "clover/backend/cpu/simd.hpp"
#include "clover/backend/cpu/softmax.hpp"
#include "clover/backend/cpu/vec_ops.hpp"
#include "clover/quant/half.hpp"

namespace clover::backend::cpu_detail {

// A run of key/value rows with a common stride, F32 or F16 bits.
struct kv_run {
    const void* k;
    const void* v;
    std::int64_t stride, n;
    bool f16;
};

// The twin: out[G, hd] from q[G, hd], each head in its own softmax over the keys of all runs in
// order. p: scratch.
inline void attend_group_ref(const float* q, std::int64_t G, const std::vector<kv_run>& runs, std::int64_t hd, float scale,
                             float* out, std::vector<float>& p) {
    std::int64_t n = 0;
    for (const kv_run& r : runs) n += r.n;
    p.resize(std::size_t(G * n));  // [G, n] scores, then probabilities
    std::int64_t j0 = 0;
    for (const kv_run& r : runs) {
        for (std::int64_t j = 0; j < r.n; ++j) {
            if (r.f16) {
                const auto* kj = static_cast<const quant::f16_bits*>(r.k) + j * r.stride;
                for (std::int64_t g = 0; g < G; ++g) p[std::size_t(g * n + j0 + j)] = dot_f32_f16(q + g * hd, kj, hd) * scale;
            } else {
                const float* kj = static_cast<const float*>(r.k) + j * r.stride;
                for (std::int64_t g = 0; g < G; ++g) p[std::size_t(g * n + j0 + j)] = dot_f32(q + g * hd, kj, hd) * scale;
            }
        }
        j0 += r.n;
    }
    for (std::int64_t g = 0; g < G; ++g) softmax_plain(p.data() + g * n, n);
    for (std::int64_t i = 0; i < G * hd; ++i) out[i] = 0.f;
    j0 = 0;
    for (const kv_run& r : runs) {
        for (std::int64_t j = 0; j < r.n; ++j) {
            if (r.f16) {
                const auto* vj = static_cast<const quant::f16_bits*>(r.v) + j * r.stride;
                for (std::int64_t g = 0; g < G; ++g) axpy_f16(p[std::size_t(g * n + j0 + j)], vj, out + g * hd, hd);
            } else {
                const float* vj = static_cast<const float*>(r.v) + j * r.stride;
                for (std::int64_t g = 0; g < G; ++g) axpy(p[std::size_t(g * n + j0 + j)], vj, out + g * hd, hd);
            }
        }
        j0 += r.n;
    }
}

namespace attend_detail {

// The loops over register arrays (acc[KU][NA], acc[GB][W]) must be unrolled for the arrays to
// live in registers; -O3 does it, -O2 did not (the accumulators went to the stack: the fast form
// ran at 0.7x the twin).
#if defined(__CUDACC__)  // nvcc's front end warns on "GCC unroll"; its host pass is -O3 anyway
#define CLOVER_UNROLL
#elif defined(__clang__)
#define CLOVER_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define CLOVER_UNROLL _Pragma("GCC unroll 16")
#else
#define CLOVER_UNROLL
#endif

// The lanes of dot_f32 (NA = 4 accumulators: F32 keys) or dot_f32_f16 (NA = 2: F16 keys, here
// already converted) before their reduction, for KU keys at once: the same FMAs in the same
// order per key, so reduce() of the result is that function's value (hd a multiple of lanes).
template <class P, int NA, int KU>
inline void dot_lanes(const float* q, const float* const* k, std::int64_t hd, typename P::f32v* res) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    V acc[KU][NA];
    CLOVER_UNROLL for (int u = 0; u < KU; ++u)
        CLOVER_UNROLL for (int a = 0; a < NA; ++a) acc[u][a] = P::zero();
    std::int64_t i = 0;
    for (; i + NA * L <= hd; i += NA * L)
        CLOVER_UNROLL for (int a = 0; a < NA; ++a) {
            const V qv = P::load(q + i + a * L);
            CLOVER_UNROLL for (int u = 0; u < KU; ++u) acc[u][a] = P::fma(qv, P::load(k[u] + i + a * L), acc[u][a]);
        }
    for (; i + L <= hd; i += L) {
        const V qv = P::load(q + i);
        CLOVER_UNROLL for (int u = 0; u < KU; ++u) acc[u][0] = P::fma(qv, P::load(k[u] + i), acc[u][0]);
    }
    CLOVER_UNROLL for (int u = 0; u < KU; ++u)
        res[u] = NA == 4 ? P::add(P::add(acc[u][0], acc[u][1]), P::add(acc[u][2], acc[u][3])) : P::add(acc[u][0], acc[u][1]);
}

// Scores of one block of nb ≤ lanes keys (rows k[0..nb), F32) for every head: p[g·n + j0 + t].
template <class P, int NA>
inline void block_scores(const float* q, std::int64_t G, const float* const* k, int nb, std::int64_t hd, float scale, float* p,
                         std::int64_t n, std::int64_t j0) {
    using V = typename P::f32v;
    constexpr int L = P::lanes, KU = L >= 16 ? 4 : 2;
    V lanes_of[L];
    alignas(64) float sums[L];
    for (std::int64_t g = 0; g < G; ++g) {
        const float* qg = q + g * hd;
        int t = 0;
        for (; t + KU <= nb; t += KU) dot_lanes<P, NA, KU>(qg, k + t, hd, lanes_of + t);
        for (; t < nb; ++t) dot_lanes<P, NA, 1>(qg, k + t, hd, lanes_of + t);
        float* dst = p + g * n + j0;
        if (nb == L) {
            P::reduce_each(lanes_of, sums);
            for (int u = 0; u < L; ++u) dst[u] = sums[u] * scale;
        } else {
            for (int u = 0; u < nb; ++u) dst[u] = P::reduce(lanes_of[u]) * scale;
        }
    }
}

// out[g, d0 .. d0 + W·L) = Σ_j p[g, j] · v_j[d0 ..] for GB heads, over the keys of all runs in
// order, each element one FMA per key from 0 (axpy's order), the accumulators in registers.
template <class P, int GB, int W>
inline void values_tile(const float* p, std::int64_t n, const std::vector<kv_run>& runs, std::int64_t d0, float* out,
                        std::int64_t hd) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    V acc[GB][W];
    CLOVER_UNROLL for (int g = 0; g < GB; ++g)
        CLOVER_UNROLL for (int w = 0; w < W; ++w) acc[g][w] = P::zero();
    std::int64_t j0 = 0;
    for (const kv_run& r : runs) {
        for (std::int64_t j = 0; j < r.n; ++j) {
            V vv[W];
            if (r.f16) {
                const auto* vj = static_cast<const quant::f16_bits*>(r.v) + j * r.stride + d0;
                CLOVER_UNROLL for (int w = 0; w < W; ++w) vv[w] = P::load_f16(vj + w * L);
            } else {
                const float* vj = static_cast<const float*>(r.v) + j * r.stride + d0;
                CLOVER_UNROLL for (int w = 0; w < W; ++w) vv[w] = P::load(vj + w * L);
            }
            CLOVER_UNROLL for (int g = 0; g < GB; ++g) {
                const V pg = P::set1(p[g * n + j0 + j]);
                CLOVER_UNROLL for (int w = 0; w < W; ++w) acc[g][w] = P::fma(pg, vv[w], acc[g][w]);
            }
        }
        j0 += r.n;
    }
    CLOVER_UNROLL for (int g = 0; g < GB; ++g)
        CLOVER_UNROLL for (int w = 0; w < W; ++w) P::store(out + g * hd + d0 + w * L, acc[g][w]);
}

template <class P, int GB>
inline void values_heads(const float* p, std::int64_t n, const std::vector<kv_run>& runs, float* out, std::int64_t hd) {
    // Accumulators GB·W plus W value vectors fit the register file (32 with AVX-512, 16 with AVX2).
    constexpr int regs = P::lanes >= 16 ? 16 : 8, wmax = std::max(1, std::min(P::lanes >= 16 ? 8 : 4, regs / GB));
    const std::int64_t chunks = hd / P::lanes;
    for (std::int64_t c = 0; c < chunks;) {
        const std::int64_t d0 = c * P::lanes, left = chunks - c;
        if (wmax >= 8 && left >= 8) { values_tile<P, GB, (wmax >= 8 ? 8 : 1)>(p, n, runs, d0, out, hd); c += 8; }
        else if (wmax >= 4 && left >= 4) { values_tile<P, GB, (wmax >= 4 ? 4 : 1)>(p, n, runs, d0, out, hd); c += 4; }
        else if (wmax >= 2 && left >= 2) { values_tile<P, GB, (wmax >= 2 ? 2 : 1)>(p, n, runs, d0, out, hd); c += 2; }
        else { values_tile<P, GB, 1>(p, n, runs, d0, out, hd); c += 1; }
    }
}

#undef CLOVER_UNROLL

}  // namespace attend_detail

// out[G, hd] from q[G, hd]; bit-identical to attend_group_ref. p: scratch (scores, then
// probabilities, then one block of converted keys).
template <class P = native>
inline void attend_group(const float* q, std::int64_t G, const std::vector<kv_run>& runs, std::int64_t hd, float scale, float* out,
                         std::vector<float>& p) {
    constexpr int L = P::lanes;
    if constexpr (L == 1) {
        return attend_group_ref(q, G, runs, hd, scale, out, p);
    } else {
    if (hd % L != 0) return attend_group_ref(q, G, runs, hd, scale, out, p);
    using namespace attend_detail;
    std::int64_t n = 0;
    for (const kv_run& r : runs) n += r.n;
    p.resize(std::size_t(G * n + L * hd));
    float* kbuf = p.data() + G * n;  // [L, hd] one block of keys as F32
    const float* rows[L];
    std::int64_t j0 = 0;
    for (const kv_run& r : runs) {
        for (std::int64_t j = 0; j < r.n; j += L) {
            const int nb = int(std::min<std::int64_t>(L, r.n - j));
            if (r.f16) {
                for (int t = 0; t < nb; ++t) {
                    const auto* src = static_cast<const quant::f16_bits*>(r.k) + (j + t) * r.stride;
                    float* dst = kbuf + t * hd;
                    for (std::int64_t i = 0; i < hd; i += L) P::store(dst + i, P::load_f16(src + i));
                    rows[t] = dst;
                }
                block_scores<P, 2>(q, G, rows, nb, hd, scale, p.data(), n, j0 + j);
            } else {
                for (int t = 0; t < nb; ++t) rows[t] = static_cast<const float*>(r.k) + (j + t) * r.stride;
                block_scores<P, 4>(q, G, rows, nb, hd, scale, p.data(), n, j0 + j);
            }
        }
        j0 += r.n;
    }
    for (std::int64_t g = 0; g < G; ++g) softmax_rows(p.data() + g * n, n);
    for (std::int64_t g = 0; g < G;) {
        const float* pg = p.data() + g * n;
        float* og = out + g * hd;
        const std::int64_t left = G - g;
        if (left >= 8) { values_heads<P, 8>(pg, n, runs, og, hd); g += 8; }
        else if (left >= 4) { values_heads<P, 4>(pg, n, runs, og, hd); g += 4; }
        else if (left >= 2) { values_heads<P, 2>(pg, n, runs, og, hd); g += 2; }
        else { values_heads<P, 1>(pg, n, runs, og, hd); g += 1; }
    }
    }
}

// The first n keys of runs, as runs (the last one cut short).
inline void first_keys(const std::vector<kv_run>& runs, std::int64_t n, std::vector<kv_run>& out) {
    out.clear();
    for (const kv_run& r : runs) {
        if (n <= 0) break;
        out.push_back(r);
        out.back().n = std::min(r.n, n);
        n -= out.back().n;
    }
}

// R query rows of one sequence, row i attending the first nk[i] keys of runs: out[i][G, hd]
// from q[i][G, hd], each row bit-identical to attend_group (and so to attend_group_ref) over its
// own keys — the same dot products, softmax and order of keys. What the rows share is each block
// of keys: read (and converted from F16) once for all R rows instead of once per row. Why: a
// prefill chunk's rows all read their sequence's whole cache, and per key the kernel slows as the
// keys leave L2 (bench_kernels --attention: 8.5 → 11.4 ns per key from 2,048 to 8,192 keys at 2
// heads of 64). Measured there, 4 rows: 1.36–1.53x at 2 heads of 64; 1.01x at 8 heads of 256,
// where the dot products and the values (still read per row) dominate. p, cut: scratch.
template <class P = native>
inline void attend_rows(const float* const* q, const std::int64_t* nk, int R, std::int64_t G, const std::vector<kv_run>& runs,
                        std::int64_t hd, float scale, float* const* out, std::vector<float>& p, std::vector<kv_run>& cut) {
    constexpr int L = P::lanes;
    if (R == 1 || L == 1 || hd % L != 0) {
        for (int i = 0; i < R; ++i) {
            first_keys(runs, nk[i], cut);
            attend_group<P>(q[i], G, cut, hd, scale, out[i], p);
        }
        return;
    }
    if constexpr (L > 1) {
        using namespace attend_detail;
        std::int64_t n = 0, last = 0;
        for (const kv_run& r : runs) n += r.n;
        for (int i = 0; i < R; ++i) last = std::max(last, std::min(nk[i], n));
        p.resize(std::size_t(std::int64_t(R) * G * n + L * hd));
        float* kbuf = p.data() + std::int64_t(R) * G * n;  // [L, hd] one block of keys as F32
        const float* rows[L];
        std::int64_t j0 = 0;
        for (const kv_run& r : runs) {
            for (std::int64_t j = 0; j < r.n && j0 + j < last; j += L) {
                const int nb = int(std::min<std::int64_t>(L, r.n - j));
                if (r.f16) {
                    const int nc = int(std::min<std::int64_t>(nb, last - (j0 + j)));  // no row reads past `last`
                    for (int t = 0; t < nc; ++t) {
                        const auto* src = static_cast<const quant::f16_bits*>(r.k) + (j + t) * r.stride;
                        float* dst = kbuf + t * hd;
                        for (std::int64_t i = 0; i < hd; i += L) P::store(dst + i, P::load_f16(src + i));
                        rows[t] = dst;
                    }
                } else {
                    for (int t = 0; t < nb; ++t) rows[t] = static_cast<const float*>(r.k) + (j + t) * r.stride;
                }
                for (int i = 0; i < R; ++i) {
                    const int nbi = int(std::min<std::int64_t>(nb, nk[i] - (j0 + j)));
                    if (nbi <= 0) continue;
                    if (r.f16)
                        block_scores<P, 2>(q[i], G, rows, nbi, hd, scale, p.data() + std::int64_t(i) * G * n, n, j0 + j);
                    else
                        block_scores<P, 4>(q[i], G, rows, nbi, hd, scale, p.data() + std::int64_t(i) * G * n, n, j0 + j);
                }
            }
            j0 += r.n;
        }
        for (int i = 0; i < R; ++i) {
            const std::int64_t ni = std::min(nk[i], n);
            for (std::int64_t g = 0; g < G; ++g) softmax_rows(p.data() + (std::int64_t(i) * G + g) * n, ni);
            first_keys(runs, ni, cut);
            for (std::int64_t g = 0; g < G;) {
                const float* pg = p.data() + (std::int64_t(i) * G + g) * n;
                float* og = out[i] + g * hd;
                const std::int64_t left = G - g;
                if (left >= 8) { values_heads<P, 8>(pg, n, cut, og, hd); g += 8; }
                else if (left >= 4) { values_heads<P, 4>(pg, n, cut, og, hd); g += 4; }
                else if (left >= 2) { values_heads<P, 2>(pg, n, cut, og, hd); g += 2; }
                else { values_heads<P, 1>(pg, n, cut, og, hd); g += 1; }
            }
        }
    }
}

}  // namespace clover::backend::cpu_detail
