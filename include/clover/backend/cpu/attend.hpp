#pragma once
// Attention of the G query heads that share one KV head (GQA) over key/value runs: the kernel of
// backend::cpu's attention primitive. `attend_group` is the fast form; `attend_group_ref` is its
// plain twin (per key and head: dot_serial, softmax_plain, axpy), and the two give the same
// bits (tests/quant/test_fused.cpp) — so the scores of a row never depend on G, on how the keys
// fall into runs and blocks, or on the other rows of a batch.
//
// The score of a key is defined as one chain of fused multiply-adds over the head dimension in
// order (dot_serial), not as a lane-parallel dot product with a reduction tree: that makes it
// the same whether the lanes of a vector hold dimensions, keys or heads, so the fast form puts
// keys across lanes. A block of P::lanes keys is converted from F16 and transposed once
// (kt[d][key]) for every query vector that reads it — the G heads of a row, and in attend_rows
// the heads of all R rows of a prefill block — and each query vector then takes one FMA per
// dimension for the whole block (its q[d] broadcast), with no reduction across lanes at all.
// The lane-parallel form before it spent ~70 % of a 4-row prefill block in the scores (perf,
// 2 heads of 64): 4 FMAs per key and head, then ~3 shuffles and adds to reduce each dot product.
// The values are accumulated in registers over all keys for up to 8 heads at a time; the
// softmax is softmax.hpp's vector form. Measured (bench_kernels --attention): docs/serving.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// The score's dot product: Σ_d q[d]·k[d] as fused multiply-adds in order d = 0, 1, … from 0.
inline float dot_serial(const float* q, const float* k, std::int64_t hd) {
    float acc = 0.f;
    for (std::int64_t d = 0; d < hd; ++d) acc = std::fma(q[d], k[d], acc);
    return acc;
}
inline float dot_serial(const float* q, const quant::f16_bits* k, std::int64_t hd) {
    float acc = 0.f;
    for (std::int64_t d = 0; d < hd; ++d) acc = std::fma(q[d], quant::f16_to_f32(k[d]), acc);
    return acc;
}

// The twin: out[G, hd] from q[G, hd], each head in its own softmax over the keys of all runs in
// order; score = dot_serial · scale. p: scratch.
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
                for (std::int64_t g = 0; g < G; ++g) p[std::size_t(g * n + j0 + j)] = dot_serial(q + g * hd, kj, hd) * scale;
            } else {
                const float* kj = static_cast<const float*>(r.k) + j * r.stride;
                for (std::int64_t g = 0; g < G; ++g) p[std::size_t(g * n + j0 + j)] = dot_serial(q + g * hd, kj, hd) * scale;
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

// The loops over register arrays (acc[NP], acc[GB][W], a block to transpose) must be unrolled
// for the arrays to live in registers; -O3 does it, -O2 did not (the accumulators went to the
// stack: the fast form ran at 0.7x the twin).
#if defined(__CUDACC__)  // nvcc's front end warns on "GCC unroll"; its host pass is -O3 anyway
#define CLOVER_UNROLL
#elif defined(__clang__)
#define CLOVER_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define CLOVER_UNROLL _Pragma("GCC unroll 16")
#else
#define CLOVER_UNROLL
#endif
// block_scores inlined into attend_rows kept its accumulators on the stack (GCC 12: a store
// and a load per FMA, the 4-row block ran at the speed of the lane-parallel form it replaced);
// compiled on its own they stay in registers.
#if defined(__GNUC__) || defined(__clang__)
#define CLOVER_NOINLINE __attribute__((noinline)) inline
#define CLOVER_ALWAYS_INLINE __attribute__((always_inline))
#else
#define CLOVER_NOINLINE inline
#define CLOVER_ALWAYS_INLINE
#endif

// Keys [j, j + nb) of run r, nb ≤ L, as F32 with keys across lanes: kt[d·L + t] = k_{j+t}[d];
// lanes t ≥ nb are zero. Full groups of L dimensions go through P::transpose, the rest (hd not
// a multiple of L) one value at a time.
template <class P>
inline void key_block(const kv_run& r, std::int64_t j, int nb, std::int64_t hd, float* kt) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    const auto* k16 = static_cast<const quant::f16_bits*>(r.k) + j * r.stride;
    const auto* k32 = static_cast<const float*>(r.k) + j * r.stride;
    // The next block's rows, a line at a time: the transpose reads L rows side by side, L
    // streams the hardware prefetcher did not keep ahead once the keys left L2.
    const std::size_t eb = r.f16 ? 2 : 4, row_bytes = std::size_t(hd) * eb;
    const std::int64_t next = std::min<std::int64_t>(L, r.n - j - L);
    for (std::int64_t t = 0; t < next; ++t) {
        const char* row = static_cast<const char*>(r.k) + std::size_t((j + L + t) * r.stride) * eb;
        for (std::size_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
    }
    std::int64_t d = 0;
    for (; d + L <= hd; d += L) {
        V x[L];
        if (nb == L && r.f16) {  // the common case without a test per key
            CLOVER_UNROLL for (int t = 0; t < L; ++t) x[t] = P::load_f16(k16 + t * r.stride + d);
        } else {
            CLOVER_UNROLL for (int t = 0; t < L; ++t)
                x[t] = t >= nb ? P::zero() : r.f16 ? P::load_f16(k16 + t * r.stride + d) : P::load(k32 + t * r.stride + d);
        }
        P::transpose(x);
        CLOVER_UNROLL for (int e = 0; e < L; ++e) P::store(kt + (d + e) * L, x[e]);
    }
    for (; d < hd; ++d)
        for (int t = 0; t < L; ++t)
            kt[d * L + t] = t >= nb ? 0.f : r.f16 ? quant::f16_to_f32(k16[t * r.stride + d]) : k32[t * r.stride + d];
}

// Walks keys [0, limit) of runs in blocks of up to L (a block never spans two runs), converting
// and transposing each into kt with key_block; when KB blocks wait in kt, and once at the end for
// the rest, flush(nbk, start, count) scores them: block b holds keys [start[b], start[b] +
// count[b]) in global key order. KB ≤ KBmax.
template <class P, int KBmax, class Flush>
inline void for_key_blocks(const std::vector<kv_run>& runs, std::int64_t limit, std::int64_t hd, int KB, float* kt, Flush&& flush) {
    constexpr int L = P::lanes;
    std::int64_t start[KBmax] = {};
    int count[KBmax] = {}, nbk = 0;
    std::int64_t j0 = 0;
    for (const kv_run& r : runs) {
        for (std::int64_t j = 0; j < r.n && j0 + j < limit; j += L) {
            const int nc = int(std::min<std::int64_t>({L, r.n - j, limit - (j0 + j)}));
            key_block<P>(r, j, nc, hd, kt + std::int64_t(nbk) * hd * L);
            start[nbk] = j0 + j;
            count[nbk] = nc;
            if (++nbk == KB) {
                flush(nbk, start, count);
                nbk = 0;
            }
        }
        j0 += r.n;
    }
    if (nbk > 0) flush(nbk, start, count);
}

// Scores of KB key blocks (kt: KB blocks of [hd, L], one after the other) for NP query vectors:
// dst[b·ldd + i][t] = dot_serial(q[i], k_t of block b) · scale for t < cnt[b·ldd + i] (its FMAs
// in dot_serial's order: one chain per lane). KB > 1 is for few query vectors (a decode row with
// 2 heads per KV head): each FMA waits ~4 cycles for its chain, so 2 chains alone ran at ~0.8x
// the lane-parallel form this replaced; KB·NP = 8 chains keep the FMA units busy, and 8
// accumulators and KB key vectors fit every register file.
template <class P, int NP, int KB>
CLOVER_NOINLINE void block_scores(const float* const* q, const float* kt, std::int64_t hd, float scale, float* const* dst,
                                  const int* cnt, int ldd) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    V acc[KB][NP];
    CLOVER_UNROLL for (int b = 0; b < KB; ++b)
        CLOVER_UNROLL for (int i = 0; i < NP; ++i) acc[b][i] = P::zero();
    const std::int64_t bs = hd * L;
    for (std::int64_t d = 0; d < hd; ++d) {
        V kv[KB];
        CLOVER_UNROLL for (int b = 0; b < KB; ++b) kv[b] = P::load(kt + b * bs + d * L);
        CLOVER_UNROLL for (int i = 0; i < NP; ++i) {
            const V qv = P::set1(q[i][d]);
            CLOVER_UNROLL for (int b = 0; b < KB; ++b) acc[b][i] = P::fma(qv, kv[b], acc[b][i]);
        }
    }
    const V sc = P::set1(scale);
    CLOVER_UNROLL for (int b = 0; b < KB; ++b)
        CLOVER_UNROLL for (int i = 0; i < NP; ++i) {
            const int c = cnt[b * ldd + i];
            if (c == L) {
                P::store(dst[b * ldd + i], P::mul(acc[b][i], sc));
            } else {
                alignas(64) float tmp[L];
                P::store(tmp, P::mul(acc[b][i], sc));
                std::memcpy(dst[b * ldd + i], tmp, std::size_t(c) * 4);
            }
        }
}

// block_scores for np query vectors, up to NP (8 / KB unless given) at a time.
template <class P, int KB, int NP = (8 / KB > 0 ? 8 / KB : 1)>
inline void block_scores_n(const float* const* q, int np, const float* kt, std::int64_t hd, float scale, float* const* dst,
                           const int* cnt, int ldd = 0) {
    for (int i = 0; i < np; i += NP) {
        const int c = std::min(np - i, NP);
        if (c == NP) {
            block_scores<P, NP, KB>(q + i, kt, hd, scale, dst + i, cnt + i, ldd);
        } else if constexpr (NP > 1) {
            block_scores_n<P, KB, NP - 1>(q + i, c, kt, hd, scale, dst + i, cnt + i, ldd);
        }
    }
}

// The value sums of NP (row, head) pairs over keys [k0, k1) of runs (global key indices; p[i]
// indexed by them), for the W·L dimensions from d0: every element one FMA per key in key order —
// axpy's order — from 0, or continuing from out[i] (cont). Each value vector is loaded and
// converted once for all NP pairs instead of once per row, and each probability is broadcast
// once for W vectors.
template <class P, int NP, int W>
CLOVER_ALWAYS_INLINE inline void values_pairs_tile(const float* const* p, const std::vector<kv_run>& runs, std::int64_t k0,
                                                   std::int64_t k1, std::int64_t d0, float* const* out, bool cont) {
    using V = typename P::f32v;
    constexpr int L = P::lanes;
    V acc[NP][W];
    CLOVER_UNROLL for (int i = 0; i < NP; ++i)
        CLOVER_UNROLL for (int w = 0; w < W; ++w) acc[i][w] = cont ? P::load(out[i] + d0 + w * L) : P::zero();
    std::int64_t j0 = 0;
    for (const kv_run& r : runs) {
        const std::int64_t a = std::max<std::int64_t>(k0 - j0, 0), b = std::min<std::int64_t>(k1 - j0, r.n);
        for (std::int64_t j = a; j < b; ++j) {
            V vv[W];
            if (r.f16) {
                const auto* vj = static_cast<const quant::f16_bits*>(r.v) + j * r.stride + d0;
                CLOVER_UNROLL for (int w = 0; w < W; ++w) vv[w] = P::load_f16(vj + w * L);
            } else {
                const float* vj = static_cast<const float*>(r.v) + j * r.stride + d0;
                CLOVER_UNROLL for (int w = 0; w < W; ++w) vv[w] = P::load(vj + w * L);
            }
            CLOVER_UNROLL for (int i = 0; i < NP; ++i) {
                const V pv = P::set1(p[i][j0 + j]);
                CLOVER_UNROLL for (int w = 0; w < W; ++w) acc[i][w] = P::fma(pv, vv[w], acc[i][w]);
            }
        }
        j0 += r.n;
        if (j0 >= k1) break;
    }
    CLOVER_UNROLL for (int i = 0; i < NP; ++i)
        CLOVER_UNROLL for (int w = 0; w < W; ++w) P::store(out[i] + d0 + w * L, acc[i][w]);
}

// out[g, :] = Σ_j p[g, j] · v_j over all n keys of runs for GB heads of one row (decode):
// values_pairs_tile with the heads as its pairs, W as wide as the register file allows.
template <class P, int GB>
inline void values_heads(const float* p, std::int64_t n, const std::vector<kv_run>& runs, float* out, std::int64_t hd) {
    // Accumulators GB·W plus W value vectors fit the register file (32 with AVX-512, 16 with AVX2).
    constexpr int regs = P::lanes >= 16 ? 16 : 8, wmax = std::max(1, std::min(P::lanes >= 16 ? 8 : 4, regs / GB));
    const float* ps[GB];
    float* os[GB];
    for (int g = 0; g < GB; ++g) {
        ps[g] = p + g * n;
        os[g] = out + g * hd;
    }
    const std::int64_t chunks = hd / P::lanes;
    for (std::int64_t c = 0; c < chunks;) {
        const std::int64_t d0 = c * P::lanes, left = chunks - c;
        if (wmax >= 8 && left >= 8) { values_pairs_tile<P, GB, (wmax >= 8 ? 8 : 1)>(ps, runs, 0, n, d0, os, false); c += 8; }
        else if (wmax >= 4 && left >= 4) { values_pairs_tile<P, GB, (wmax >= 4 ? 4 : 1)>(ps, runs, 0, n, d0, os, false); c += 4; }
        else if (wmax >= 2 && left >= 2) { values_pairs_tile<P, GB, (wmax >= 2 ? 2 : 1)>(ps, runs, 0, n, d0, os, false); c += 2; }
        else { values_pairs_tile<P, GB, 1>(ps, runs, 0, n, d0, os, false); c += 1; }
    }
}

// values_pairs_tile over the whole head dimension, W vectors at a time where the accumulators
// (NP·W), the value vectors (W) and a broadcast fit the register file. Why W > 1: with one vector
// per pass every FMA came with a broadcast load of its probability, and the loads (9 per 8 FMAs)
// bounded the loop; at W = 4 a broadcast serves 4 FMAs.
template <class P, int NP>
CLOVER_NOINLINE void values_pairs(const float* const* p, const std::vector<kv_run>& runs, std::int64_t k0, std::int64_t k1,
                                  std::int64_t hd, float* const* out, bool cont) {
    constexpr int L = P::lanes, regs = L >= 16 ? 32 : 16;
    constexpr int W = NP * 4 + 4 + 1 <= regs ? 4 : NP * 2 + 2 + 1 <= regs ? 2 : 1;
    std::int64_t d0 = 0;
    for (; d0 + W * L <= hd; d0 += W * L) values_pairs_tile<P, NP, W>(p, runs, k0, k1, d0, out, cont);
    for (; d0 < hd; d0 += L) values_pairs_tile<P, NP, 1>(p, runs, k0, k1, d0, out, cont);
}

// values_pairs for np pairs, up to NP at a time (the rest by the next smaller NP). Six, not 8:
// with AVX-512 six pairs still sum 4 vectors per pass, 8 only 2 (4 would need 37 registers);
// 6 + 2 pairs ran 1.03-1.18x 8 at once (bench_kernels --attention, 4 rows, medians of 4 runs).
template <class P, int NP = 6>
inline void values_pairs_n(const float* const* p, int np, const std::vector<kv_run>& runs, std::int64_t k0, std::int64_t k1,
                           std::int64_t hd, float* const* out, bool cont) {
    for (int i = 0; i < np; i += NP) {
        const int c = std::min(np - i, NP);
        if (c == NP) {
            values_pairs<P, NP>(p + i, runs, k0, k1, hd, out + i, cont);
        } else if constexpr (NP > 1) {
            values_pairs_n<P, NP - 1>(p + i, c, runs, k0, k1, hd, out + i, cont);
        }
    }
}

// N elements on the stack, more on the heap: attend_group's per-call pointer tables (a decode
// row has G·KB ≤ 32 of them) without an allocation per call.
template <class T, std::size_t N>
class small_buffer {
public:
    explicit small_buffer(std::size_t n) : data_(n <= N ? local_ : (heap_.resize(n), heap_.data())) {}
    small_buffer(const small_buffer&) = delete;
    small_buffer& operator=(const small_buffer&) = delete;
    T* data() { return data_; }
    T& operator[](std::size_t i) { return data_[i]; }

private:
    T local_[N];
    std::vector<T> heap_;
    T* data_;
};

#undef CLOVER_UNROLL
#undef CLOVER_NOINLINE
#undef CLOVER_ALWAYS_INLINE

}  // namespace attend_detail

// out[G, hd] from q[G, hd]; bit-identical to attend_group_ref. p: scratch (scores, then
// probabilities, then up to 4 blocks of converted, transposed keys).
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
    // Key blocks per block_scores call: 8 FMA chains where the heads are few.
    const int KB = G >= 8 ? 1 : G >= 3 ? 2 : 4;
    p.resize(std::size_t(G * n + KB * L * hd));
    float* kt = p.data() + G * n;  // KB blocks of [hd, L]: keys across lanes
    const std::size_t ng = std::size_t(G);
    small_buffer<const float*, 16> qs(ng);
    small_buffer<float*, 32> dst(ng * std::size_t(KB));
    small_buffer<int, 32> cnt(ng * std::size_t(KB));
    for (std::int64_t g = 0; g < G; ++g) qs[std::size_t(g)] = q + g * hd;
    for_key_blocks<P, 4>(runs, n, hd, KB, kt, [&](int nbk, const std::int64_t* start, const int* count) {
        for (int b = 0; b < nbk; ++b)
            for (std::int64_t g = 0; g < G; ++g) {
                dst[std::size_t(b * G + g)] = p.data() + g * n + start[b];
                cnt[std::size_t(b * G + g)] = count[b];
            }
        const int ldd = int(G);
        switch (nbk) {
            case 4: block_scores_n<P, 4>(qs.data(), int(G), kt, hd, scale, dst.data(), cnt.data(), ldd); break;
            case 3: block_scores_n<P, 3>(qs.data(), int(G), kt, hd, scale, dst.data(), cnt.data(), ldd); break;
            case 2: block_scores_n<P, 2>(qs.data(), int(G), kt, hd, scale, dst.data(), cnt.data(), ldd); break;
            default: block_scores_n<P, 1>(qs.data(), int(G), kt, hd, scale, dst.data(), cnt.data(), ldd); break;
        }
    });
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
// of keys: read, converted from F16 and transposed once for all R·G query vectors instead of
// once per row. Why: a prefill chunk's rows all read their sequence's whole cache, and per key
// the kernel slows as the keys leave L2 (bench_kernels --attention: 8.5 → 11.4 ns per key from
// 2,048 to 8,192 keys at 2 heads of 64, one row). p, cut: scratch.
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
        // Two blocks of keys per block_scores call: per dimension 2 key vectors and NP broadcasts
        // feed 2·NP FMAs (one block: 1 + NP loads for NP FMAs, which bounded the loop on loads).
        constexpr int KB = 2, NP = L >= 16 ? 8 : 4;  // 2·NP accumulators + 2 keys + a broadcast fit
        p.resize(std::size_t(std::int64_t(R) * G * n + KB * L * hd));
        float* kt = p.data() + std::int64_t(R) * G * n;  // KB blocks of [hd, L]: keys across lanes
        const std::size_t np_max = std::size_t(R * G);
        std::vector<const float*> qs(np_max);  // the query vectors of the pairs that read the blocks
        std::vector<float*> dst(KB * np_max);  // [KB, np_max]
        std::vector<int> cnt(KB * np_max);     // [KB, np_max] keys of the block each pair reads (0: none)
        // No row reads past `last`, so the walk stops there.
        for_key_blocks<P, KB>(runs, last, hd, KB, kt, [&](int nbk, const std::int64_t* start, const int* ncs) {
            int np = 0;
            for (int i = 0; i < R; ++i) {
                if (nk[i] <= start[0]) continue;  // reads none of these keys (causal rows)
                for (std::int64_t g = 0; g < G; ++g, ++np) {
                    float* row = p.data() + (std::int64_t(i) * G + g) * n;
                    qs[std::size_t(np)] = q[i] + g * hd;
                    for (std::int64_t b = 0; b < nbk; ++b) {
                        const int c = int(std::clamp<std::int64_t>(nk[i] - start[b], 0, ncs[b]));
                        dst[std::size_t(b) * np_max + std::size_t(np)] = row + (c > 0 ? start[b] : 0);
                        cnt[std::size_t(b) * np_max + std::size_t(np)] = c;
                    }
                }
            }
            if (nbk == KB) block_scores_n<P, KB, NP>(qs.data(), np, kt, hd, scale, dst.data(), cnt.data(), int(np_max));
            else block_scores_n<P, 1, NP>(qs.data(), np, kt, hd, scale, dst.data(), cnt.data(), int(np_max));
        });
        // Softmax per (row, head); then the values: the keys every row reads for all R·G pairs at
        // once, then each longer row's own last keys, continuing its sums in key order.
        std::int64_t kmin = n;
        for (int i = 0; i < R; ++i) {
            const std::int64_t ni = std::min(nk[i], n);
            kmin = std::min(kmin, ni);
            for (std::int64_t g = 0; g < G; ++g) softmax_rows(p.data() + (std::int64_t(i) * G + g) * n, ni);
        }
        std::vector<const float*> probs(np_max);  // [R·G] probability rows
        std::vector<float*> outs(np_max);
        for (int i = 0; i < R; ++i)
            for (std::int64_t g = 0; g < G; ++g) {
                probs[std::size_t(i * G + g)] = p.data() + (std::int64_t(i) * G + g) * n;
                outs[std::size_t(i * G + g)] = out[i] + g * hd;
            }
        values_pairs_n<P>(probs.data(), int(np_max), runs, 0, kmin, hd, outs.data(), false);
        for (int i = 0; i < R; ++i) {
            const std::int64_t ni = std::min(nk[i], n);
            if (ni > kmin) values_pairs_n<P>(probs.data() + i * G, int(G), runs, kmin, ni, hd, outs.data() + i * G, true);
        }
    }
}

}  // namespace clover::backend::cpu_detail
