#pragma once
// The matrix-product driver of backend::cpu: activation preparation (quantize to the weight's
// partner type, in the layout the kernels read) and tiled products over row and token ranges.
// Everything here is serial and reentrant (callers pass their own scratch), so the same code
// serves one product split over the pool and many small products (MoE experts) run inside one
// parallel region.
//
// Tiles: products with one activation row (decode) read the weights from DRAM, so what matters
// is what the hardware prefetcher can follow: two rows far apart (r and r + half of the chunk),
// each a purely sequential stream. Two distant streams read faster than one, while two or four
// ADJACENT rows per tile (interleaved 1.7 KB apart) read several times slower; software prefetch
// of the next rows did not help, and prefetching the row pair 4 rows ahead in the decode loop
// sped up bench_kernels' gemv but slowed `clover bench` tg128, so it is not used (the figures:
// docs/performance.md, "Measurements behind code choices"). Prefill uses R = 2 × C = 4 (each unpacked
// weight super-block serves 4 tokens; 24 of the 32 vector registers hold accumulators and
// operands), where the weight chunk is reused from L2.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "clover/backend/cpu/kernels_avx2.hpp"
#include "clover/backend/cpu/kernels_avx512.hpp"
#include "clover/backend/cpu/kernels_avx512_x16.hpp"
#include "clover/backend/cpu/kernels_float.hpp"
#include "clover/backend/cpu/simd.hpp"
#include "clover/core/error.hpp"
#include "clover/quant/rows.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend::cpu_detail {

// 64-byte aligned, grow-only byte buffer (the kernels use aligned vector loads).
class aligned_buffer {
public:
    std::byte* get(std::size_t n) {
        if (n > cap_) {
            p_.reset(static_cast<std::byte*>(::operator new(n, std::align_val_t(64))));
            cap_ = n;
        }
        return p_.get();
    }

private:
    struct del {
        void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t(64)); }
    };
    std::unique_ptr<std::byte, del> p_;
    std::size_t cap_ = 0;
};

using tile_fn = void (*)(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                         std::int64_t ldy);

// Scalar twin as a tile: the reference dot product per (row, token) on standard blocks.
template <dtype T, int R, int C>
void ref_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
              std::int64_t ldy) {
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = quant::vec_dot_ref(T, w + std::size_t(r) * ws, a + std::size_t(c) * as, K);
}

// Scalar twin of k512::q8_0_lanes_tile (the fast Q8_0 product of several tokens). It differs
// from quant::vec_dot_q8_0_ref only in the last step of each block: the block's exact int32 dot
// enters the sum through one fused multiply-add, acc = fma(float(dot), d_w·d_a, acc), over the
// blocks in order. a: standard Q8_0 blocks (quant::quantize_row_q8_0).
inline float q8_0_blockwise_ref(const std::byte* w, const std::byte* a, std::int64_t K) {
    const auto* wb = reinterpret_cast<const quant::block_q8_0*>(w);
    const auto* ab = reinterpret_cast<const quant::block_q8_0*>(a);
    float acc = 0.f;
    for (std::int64_t b = 0; b < K / 32; ++b)
        acc = std::fma(float(quant::block_dot_q8_0(wb[b], ab[b])), quant::f16_to_f32(wb[b].d) * quant::f16_to_f32(ab[b].d), acc);
    return acc;
}

// Scalar twin of k512::q6_k_lanes_rows: per super-block the exact int32 Σ sc·(q − 32)·a, then
// acc = fma(float(isum), d_w·d_a, acc) over the super-blocks in order (quant::vec_dot_q6_k_ref
// adds float(isum)·d_a·d_w instead). a: standard Q8_K blocks (quant::quantize_row_q8_k).
inline float q6_k_blockwise_ref(const std::byte* w, const std::byte* a, std::int64_t K) {
    const auto* wb = reinterpret_cast<const quant::block_q6_k*>(w);
    const auto* ab = reinterpret_cast<const quant::block_q8_k*>(a);
    float acc = 0.f;
    for (std::int64_t b = 0; b < K / 256; ++b)
        acc = std::fma(float(quant::block_dot_q6_k(wb[b], ab[b])), quant::f16_to_f32(wb[b].d) * ab[b].d, acc);
    return acc;
}

// Scalar twin of k512::q4_k_lanes_rows: per super-block the exact int32 parts of
// quant::block_dot_q4_k, then the mins term and the scaled sum, each as one fused step:
// acc = fma(−float(msum), dmin_w·d_a, acc), acc = fma(float(isum), d_w·d_a, acc).
inline float q4_k_blockwise_ref(const std::byte* w, const std::byte* a, std::int64_t K) {
    const auto* wb = reinterpret_cast<const quant::block_q4_k*>(w);
    const auto* ab = reinterpret_cast<const quant::block_q8_k*>(a);
    float acc = 0.f;
    for (std::int64_t b = 0; b < K / 256; ++b) {
        std::int32_t isum, msum;
        quant::block_dot_q4_k(wb[b], ab[b], isum, msum);
        acc = std::fma(-float(msum), quant::f16_to_f32(wb[b].dmin) * ab[b].d, acc);
        acc = std::fma(float(isum), quant::f16_to_f32(wb[b].d) * ab[b].d, acc);
    }
    return acc;
}

// How one weight type is computed with this build's ISA.
// Decode loop: rows w + i·ws and w + i·ws + stream_off for i < n, one activation row; outputs
// y0[i] and y1[i]. The 2 × 1 tile is inlined into the loop (no call and reduction barrier per
// row pair: that per-call tail was 4% of a decode step, perf).
using gemv2_fn = void (*)(const std::byte* w, std::size_t ws, std::size_t stream_off, std::int64_t n, const std::byte* a,
                          std::int64_t K, float* y0, float* y1);

// A 2-row tile that also prefetches the rows pfd bytes further on while it computes (the
// streaming small-batch path below).
using stream_tile_fn = void (*)(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                                std::int64_t ldy, std::ptrdiff_t pfd);

struct kernel_set {
    tile_fn tiles[3][4] = {};  // [R = 1, 2, 4][C = 1..4]
    // R = 2 × C = 5..8 for the small-batch path (5–8 sequences decoding together): each weight
    // row pair is unpacked and read once for all the tokens. Null where it does not pay (the
    // K-quant tiles keep an int32 sum besides the float one per (row, token), and 2 × 8 of them
    // spill, which slowed 8 streaming tokens down; docs/performance.md).
    tile_fn wide[4] = {};
    // R = 2 × C = 1..8 (C > 4 where `wide`) with the next row pair's prefetch spread over the
    // super-block loop; null where the build has none (the driver then prefetches in one burst).
    stream_tile_fn stream[8] = {};
    // 16 weight rows × C = 1..8 tokens, not row-exact (k512::q8_0_lanes_tile, q4_k_lanes_rows,
    // q6_k_lanes_rows): for batches that are not row-exact, from lanes_from tokens on; null where
    // the build has none. lanes16_rows read the prepared activation rows; lanes16 (Q8_0 only) reads tokens
    // packed per block (a8_lane), which the small batch uses where the set has it.
    using lanes_fn = void (*)(const std::byte* w, std::size_t ws, const a8_lane* a, std::int64_t K, float* y, std::int64_t ldy,
                              const std::byte* prefetch_next);
    using lanes_rows_fn = void (*)(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                                   std::int64_t ldy, const std::byte* prefetch_next);
    lanes_fn lanes16[8] = {};
    lanes_rows_fn lanes16_rows[8] = {};
    int lanes_from = 0;
    // Matrices rearranged at load into groups of 16 rows (weight_layout::rows16): `repack`
    // writes one group of 16 file rows into that layout; x16_rows / x16_packed compute a group
    // × C = 1..8 tokens from prepared rows / packed tokens (Q8_0 only), y[c·ldy + r]; g is the
    // group's first byte, pf a group to prefetch or null. Every (row, token) is the blockwise
    // twin's (q8_0_blockwise_ref, q4_k_blockwise_ref, q6_k_blockwise_ref) at any C, so these forms are row-exact
    // and serve every token count. Null where the build has none (the matrices stay as filed).
    using repack_fn = void (*)(const std::byte* w, std::size_t ws, std::int64_t K, std::byte* out);
    using x16_rows_fn = void (*)(const std::byte* g, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                                 const std::byte* pf);
    using x16_packed_fn = void (*)(const std::byte* g, const a8_lane* a, std::int64_t K, float* y, std::int64_t ldy,
                                   const std::byte* pf);
    repack_fn repack = nullptr;
    x16_rows_fn x16_rows[8] = {};
    x16_packed_fn x16_packed[8] = {};
    int x16_pf_from = 1;  // tokens from which each group prefetches the one two groups on
    // > 0: instead, each group prefetches its own stream this many bytes ahead (pf = the group's
    // first byte + x16_pf_ahead, running on into the next group): Q6_K and Q4_K
    std::size_t x16_pf_ahead = 0;
    gemv2_fn gemv2 = nullptr;
    int gemm_r = 2, gemm_c = 4;
    enum class prep { f32_exact, f16_round, bf16_round, bf16_raw, q8_0_std, q8_0_pair, q8_k_std, q8_k_ext } act{};
    tile_fn tile(int R, int C) const { return tiles[R == 4 ? 2 : R - 1][C - 1]; }
    tile_fn wide_tile(int C) const { return C >= 5 && C <= 8 ? wide[C - 5] : nullptr; }
    stream_tile_fn stream_tile(int C) const { return C >= 1 && C <= 8 ? stream[C - 1] : nullptr; }
    lanes_fn lanes_tile(int C) const { return C >= 1 && C <= 8 ? lanes16[C - 1] : nullptr; }
    lanes_rows_fn lanes_rows_tile(int C) const { return C >= 1 && C <= 8 ? lanes16_rows[C - 1] : nullptr; }
};

template <template <int, int> class K>
void gemv2_loop(const std::byte* w, std::size_t ws, std::size_t stream_off, std::int64_t n, const std::byte* a, std::int64_t Kd,
                float* y0, float* y1) {
    constexpr tile_fn f = K<2, 1>::f;
    for (std::int64_t i = 0; i < n; ++i) {
        float two[2];
        f(w + std::size_t(i) * ws, stream_off, a, 0, Kd, two, 1);
        y0[i] = two[0];
        y1[i] = two[1];
    }
}

template <template <int, int> class K>
constexpr void fill_tiles(kernel_set& ks) {
    ks.gemv2 = gemv2_loop<K>;
    ks.tiles[0][0] = K<1, 1>::f; ks.tiles[0][1] = K<1, 2>::f; ks.tiles[0][2] = K<1, 3>::f; ks.tiles[0][3] = K<1, 4>::f;
    ks.tiles[1][0] = K<2, 1>::f; ks.tiles[1][1] = K<2, 2>::f; ks.tiles[1][2] = K<2, 3>::f; ks.tiles[1][3] = K<2, 4>::f;
    ks.tiles[2][0] = K<4, 1>::f; ks.tiles[2][1] = K<4, 2>::f; ks.tiles[2][2] = K<4, 3>::f; ks.tiles[2][3] = K<4, 4>::f;
}

template <template <int, int> class K>
constexpr void fill_wide_tiles(kernel_set& ks) {
    ks.wide[0] = K<2, 5>::f; ks.wide[1] = K<2, 6>::f; ks.wide[2] = K<2, 7>::f; ks.wide[3] = K<2, 8>::f;
}
template <template <int, int> class K>
constexpr void fill_stream_tiles(kernel_set& ks) {  // C > 4 only where the set has wide tiles
    ks.stream[0] = K<2, 1>::f; ks.stream[1] = K<2, 2>::f; ks.stream[2] = K<2, 3>::f; ks.stream[3] = K<2, 4>::f;
    if (ks.wide[0]) { ks.stream[4] = K<2, 5>::f; ks.stream[5] = K<2, 6>::f; ks.stream[6] = K<2, 7>::f; ks.stream[7] = K<2, 8>::f; }
}

// table[C − 1] = kernel<C> for C = 1..8, the kernel named by a template lambda:
// fill8(ks.x16_rows, []<int C> { return k512::q4_k_x16_tile<C>; }).
template <class Fn, class Kernel>
constexpr void fill8(Fn (&table)[8], Kernel kernel) {
    [&]<int... I>(std::integer_sequence<int, I...>) {
        ((table[I] = kernel.template operator()<I + 1>()), ...);
    }(std::make_integer_sequence<int, 8>{});
}

#define CLOVER_TILE_ADAPTER(NAME, EXPR)            \
    template <int R, int C>                        \
    struct NAME {                                  \
        static constexpr tile_fn f = EXPR<R, C>;   \
    };

template <dtype T>
struct ref_k {
    template <int R, int C>
    struct k {
        static constexpr tile_fn f = ref_tile<T, R, C>;
    };
};
template <class P, wfloat T>
struct float_k_isa {
    template <int R, int C>
    struct k {
        static constexpr tile_fn f = float_tile<P, T, R, C>;
    };
};
template <wfloat T>
using float_k = float_k_isa<native, T>;
#if CLOVER_CPU_AVX512
CLOVER_TILE_ADAPTER(q8_0_512, k512::q8_0_tile)
CLOVER_TILE_ADAPTER(q4_k_512, k512::q4_k_tile)
CLOVER_TILE_ADAPTER(q5_k_512, k512::q5_k_tile)
CLOVER_TILE_ADAPTER(q6_k_512, k512::q6_k_tile)
#define CLOVER_STREAM_ADAPTER(NAME, EXPR)            \
    template <int R, int C>                          \
    struct NAME {                                    \
        static constexpr stream_tile_fn f = EXPR<R, C>; \
    };
CLOVER_STREAM_ADAPTER(q8_0_512_pf, k512::q8_0_tile_pf)
CLOVER_STREAM_ADAPTER(q4_k_512_pf, k512::q4_k_tile_pf)
CLOVER_STREAM_ADAPTER(q5_k_512_pf, k512::q5_k_tile_pf)
CLOVER_STREAM_ADAPTER(q6_k_512_pf, k512::q6_k_tile_pf)
#undef CLOVER_STREAM_ADAPTER
#if CLOVER_CPU_AVX512_BF16
CLOVER_TILE_ADAPTER(bf16_512, k512::bf16_tile)
#endif
#endif
#if CLOVER_CPU_AVX2
CLOVER_TILE_ADAPTER(q8_0_256, k256::q8_0_tile)
CLOVER_TILE_ADAPTER(q4_k_256, k256::q4_k_tile)
CLOVER_TILE_ADAPTER(q5_k_256, k256::q5_k_tile)
CLOVER_TILE_ADAPTER(q6_k_256, k256::q6_k_tile)
#endif
#undef CLOVER_TILE_ADAPTER

// The kernels this build uses for weight type t (the widest compiled ISA; reference loops
// when none). `reference` forces the scalar twins (tests).
inline const kernel_set& kernels_for(dtype t, bool reference = false) {
    using P = kernel_set::prep;
    auto make = [](dtype t, bool ref) {
        kernel_set ks;
        if (ref) {
            switch (t) {
                case dtype::f32: fill_tiles<ref_k<dtype::f32>::k>(ks); ks.act = P::f32_exact; break;
                case dtype::f16: fill_tiles<ref_k<dtype::f16>::k>(ks); ks.act = P::f16_round; break;
                case dtype::bf16: fill_tiles<ref_k<dtype::bf16>::k>(ks); ks.act = P::bf16_round; break;
                case dtype::q8_0: fill_tiles<ref_k<dtype::q8_0>::k>(ks); ks.act = P::q8_0_std; break;
                case dtype::q4_k: fill_tiles<ref_k<dtype::q4_k>::k>(ks); ks.act = P::q8_k_std; break;
                case dtype::q5_k: fill_tiles<ref_k<dtype::q5_k>::k>(ks); ks.act = P::q8_k_std; break;
                case dtype::q6_k: fill_tiles<ref_k<dtype::q6_k>::k>(ks); ks.act = P::q8_k_std; break;
                default: break;
            }
            return ks;
        }
        switch (t) {
            case dtype::f32: fill_tiles<float_k<wfloat::f32>::k>(ks); ks.act = P::f32_exact; break;
            case dtype::f16: fill_tiles<float_k<wfloat::f16>::k>(ks); ks.act = P::f16_round; break;
            case dtype::bf16:
#if CLOVER_CPU_AVX512_BF16
                fill_tiles<bf16_512>(ks); ks.act = P::bf16_raw;
#else
                fill_tiles<float_k<wfloat::bf16>::k>(ks); ks.act = P::bf16_round;
#endif
                break;
#if CLOVER_CPU_AVX512
            // R = 4 for Q8_0: its tile keeps only float accumulators, and 4 rows × 4 tokens beat
            // 2 × 4 in L2; the K-quant tiles spill at 4 × 4 (slower per super-block and row), so
            // they stay at 2 × 4. Q8_0's 2 × 8 tile holds 16 float accumulators: one 2 × 8 call per
            // row pair beats two 2 × 4 calls for 8 streaming tokens, and the stream tiles beat the
            // burst before each pair (bench_kernels' batch8 method, clover bench tg64x8; the
            // figures: docs/performance.md, "Measurements behind code choices").
            case dtype::q8_0:
                fill_tiles<q8_0_512>(ks); fill_wide_tiles<q8_0_512>(ks); fill_stream_tiles<q8_0_512_pf>(ks);
                ks.act = P::q8_0_pair; ks.gemm_r = 4;
#if CLOVER_CPU_AVX512_VNNI
                fill8(ks.lanes16, []<int C> { return k512::q8_0_lanes_packed<C>; });
                fill8(ks.lanes16_rows, []<int C> { return k512::q8_0_lanes_rows<C>; });
                ks.lanes_from = 6;
                // The group prefetch pays from 3 tokens; at 1 and 2 it cost time (bench_repack, and
                // tg128 on the 8-layer Q8_0 file; docs/performance.md).
                ks.x16_pf_from = 3;
                ks.repack = k512::repack_q8_0_group;
                fill8(ks.x16_rows, []<int C> { return k512::q8_0_x16_rows<C>; });
                fill8(ks.x16_packed, []<int C> { return k512::q8_0_x16_packed<C>; });
#endif
                break;
            case dtype::q4_k:
                fill_tiles<q4_k_512>(ks); fill_stream_tiles<q4_k_512_pf>(ks); ks.act = P::q8_k_ext;
#if CLOVER_CPU_AVX512_VNNI
                fill8(ks.lanes16_rows, []<int C> { return k512::q4_k_lanes_rows<C>; });
                // Q8_0's break-even. For Q4_K and Q6_K, end to end on the 8-layer Q4_K_M file: the
                // forms from 6 tokens were even with the row tiles at 6 and 7 tokens and a little
                // ahead at 8; from 4 tokens they lost (docs/performance.md).
                ks.lanes_from = 6;
                ks.repack = k512::repack_q4_k_group;
                fill8(ks.x16_rows, []<int C> { return k512::q4_k_x16_tile<C>; });
                ks.x16_pf_ahead = k512::q4_k_x16_pf_ahead;
#endif
                break;
            case dtype::q5_k: fill_tiles<q5_k_512>(ks); fill_stream_tiles<q5_k_512_pf>(ks); ks.act = P::q8_k_ext; break;
            case dtype::q6_k:
                fill_tiles<q6_k_512>(ks); fill_stream_tiles<q6_k_512_pf>(ks); ks.act = P::q8_k_ext;
#if CLOVER_CPU_AVX512_VNNI
                fill8(ks.lanes16_rows, []<int C> { return k512::q6_k_lanes_rows<C>; });
                ks.lanes_from = 6;
                ks.repack = k512::repack_q6_k_group;
                fill8(ks.x16_rows, []<int C> { return k512::q6_k_x16_tile<C>; });
                ks.x16_pf_ahead = k512::q6_k_x16_pf_ahead;
#endif
                break;
#elif CLOVER_CPU_AVX2
            case dtype::q8_0: fill_tiles<q8_0_256>(ks); ks.act = P::q8_0_std; break;
            case dtype::q4_k: fill_tiles<q4_k_256>(ks); ks.act = P::q8_k_ext; break;
            case dtype::q5_k: fill_tiles<q5_k_256>(ks); ks.act = P::q8_k_ext; break;
            case dtype::q6_k: fill_tiles<q6_k_256>(ks); ks.act = P::q8_k_ext; break;
#else
            case dtype::q8_0: fill_tiles<ref_k<dtype::q8_0>::k>(ks); ks.act = P::q8_0_std; break;
            case dtype::q4_k: fill_tiles<ref_k<dtype::q4_k>::k>(ks); ks.act = P::q8_k_std; break;
            case dtype::q5_k: fill_tiles<ref_k<dtype::q5_k>::k>(ks); ks.act = P::q8_k_std; break;
            case dtype::q6_k: fill_tiles<ref_k<dtype::q6_k>::k>(ks); ks.act = P::q8_k_std; break;
#endif
            default: break;
        }
        return ks;
    };
    static const kernel_set table[2][7] = {
        {make(dtype::f32, false), make(dtype::f16, false), make(dtype::bf16, false), make(dtype::q8_0, false),
         make(dtype::q4_k, false), make(dtype::q5_k, false), make(dtype::q6_k, false)},
        {make(dtype::f32, true), make(dtype::f16, true), make(dtype::bf16, true), make(dtype::q8_0, true),
         make(dtype::q4_k, true), make(dtype::q5_k, true), make(dtype::q6_k, true)}};
    int i;
    switch (t) {
        case dtype::f32: i = 0; break;
        case dtype::f16: i = 1; break;
        case dtype::bf16: i = 2; break;
        case dtype::q8_0: i = 3; break;
        case dtype::q4_k: i = 4; break;
        case dtype::q5_k: i = 5; break;
        case dtype::q6_k: i = 6; break;
        default: fail("matmul: tensor type ", dtype_name(t), " is not supported yet");
    }
    return table[reference ? 1 : 0][i];
}

// Bytes of one prepared activation row of K values (a multiple of 64).
inline std::size_t act_row_bytes(kernel_set::prep p, std::int64_t K) {
    using P = kernel_set::prep;
    std::size_t b = 0;
    switch (p) {
        case P::f32_exact: case P::f16_round: case P::bf16_round: b = std::size_t(K) * 4; break;
        case P::bf16_raw: b = std::size_t((K + 31) / 32 * 32) * 2; break;
        case P::q8_0_std: b = std::size_t(K / 32) * sizeof(quant::block_q8_0); break;
        case P::q8_0_pair: b = std::size_t((K / 32 + 1) / 2) * sizeof(a8_pair); break;
        case P::q8_k_std: b = std::size_t(K / 256) * sizeof(quant::block_q8_k); break;
        case P::q8_k_ext: b = std::size_t(K / 256) * sizeof(a8k_block); break;
    }
    return (b + 63) / 64 * 64;
}

struct prep_scratch {
    std::vector<quant::block_q8_0> q8;
    std::vector<quant::block_q8_k> q8k;
};

// One activation row x[K] -> dst (act_row_bytes(p, K) bytes).
inline void prepare_row(kernel_set::prep p, const float* x, std::byte* dst, std::int64_t K, prep_scratch& s) {
    using P = kernel_set::prep;
    switch (p) {
        case P::f32_exact: std::memcpy(dst, x, std::size_t(K) * 4); return;
        case P::f16_round: {
            auto* o = reinterpret_cast<float*>(dst);
            for (std::int64_t i = 0; i < K; ++i) o[i] = quant::f16_to_f32(quant::f32_to_f16(x[i]));
            return;
        }
        case P::bf16_round: {
            auto* o = reinterpret_cast<float*>(dst);
            for (std::int64_t i = 0; i < K; ++i) o[i] = quant::bf16_to_f32(quant::f32_to_bf16(x[i]));
            return;
        }
        case P::bf16_raw: {
            auto* o = reinterpret_cast<quant::bf16_bits*>(dst);
            std::int64_t i = 0;
            for (; i < K; ++i) o[i] = quant::f32_to_bf16(x[i]);
            for (; i % 32; ++i) o[i] = 0;
            return;
        }
        case P::q8_0_std: quant::quantize_row_q8_0(x, reinterpret_cast<quant::block_q8_0*>(dst), K); return;
        case P::q8_0_pair: {
            const std::int64_t nb = K / 32;
            s.q8.resize(std::size_t(nb));
            quant::quantize_row_q8_0(x, s.q8.data(), K);
            auto* o = reinterpret_cast<a8_pair*>(dst);
            for (std::int64_t q = 0; q < (nb + 1) / 2; ++q) prep_a8_pair(&s.q8[2 * q], 2 * q + 1 < nb ? &s.q8[2 * q + 1] : nullptr, o[q]);
            return;
        }
        case P::q8_k_std: quant::quantize_row_q8_k(x, reinterpret_cast<quant::block_q8_k*>(dst), K); return;
        case P::q8_k_ext: {
            const std::int64_t nb = K / 256;
            s.q8k.resize(std::size_t(nb));
            quant::quantize_row_q8_k(x, s.q8k.data(), K);
            auto* o = reinterpret_cast<a8k_block*>(dst);
            for (std::int64_t b = 0; b < nb; ++b) prep_a8k(s.q8k[b], o[b]);
            return;
        }
    }
}

// Prepared activation rows: n rows of `stride` bytes.
struct act_view {
    const std::byte* data = nullptr;
    std::size_t stride = 0;
    std::int64_t n = 0;
    const std::byte* row(std::int64_t t) const { return data + std::size_t(t) * stride; }
};

// A few activation rows (2–8 sequences decoding together) still read the weights once from DRAM,
// so they keep the decode access pattern: two distant sequential streams, rows r0 + i and
// r0 + half + i, the 2-row tile given the distance as its row stride; each row pair serves every
// token (groups of C) while it is in L1. The prefill tiling (adjacent row pairs, 32-row chunks)
// made 2 sequences decode slower in aggregate than one alone (docs/performance.md). Exactness
// holds: a tile's (row, token) result does not depend on R, C or the row stride.
inline constexpr std::int64_t small_batch_tokens = 8;
// From 8 rows on, the weights of the next row pair are prefetched into L1 while this pair
// computes. At 8 rows a pair costs ~8x the multiply-adds of a decode row per byte, and the
// hardware prefetcher no longer keeps the streams ahead: the prefetch speeds up bench_kernels'
// batch8 and `clover bench --parallel 8`. With 2 or 4 rows it lost (as at one row: the tile is
// memory-bound and the prefetches only compete with the hardware's), hence the threshold (the
// figures: docs/performance.md, "Measurements behind code choices"). Where the build has stream
// tiles (AVX-512, quantized weights) the prefetches are spread over the first tile call's
// super-block loop instead of issued in one burst before it (perf had two thirds of the driver
// loop's samples on that burst's prefetch instruction, tg64x8, 8-layer Q8_0), and from 2 tokens
// on, where they paid at 2 and 4 sequences and were even at 8 (clover bench tg64xN;
// docs/performance.md). The threshold below is for the burst.
inline constexpr std::int64_t small_batch_prefetch_from = 8;

inline void small_batch_block(const kernel_set& ks, const weight& w, std::int64_t r0, std::int64_t r1, const act_view& a,
                              std::int64_t t0, std::int64_t t1, float* y, std::int64_t ldy) {
    const std::int64_t K = w.cols;
    const std::size_t ws = w.row_bytes;
    const std::int64_t half = (r1 - r0) / 2;
    const tile_fn wide = ks.wide_tile(int(t1 - t0));
    const int C = wide ? int(t1 - t0) : ks.gemm_c;  // ≤ 8
    float two[2 * 8];                                // [c][row of the pair]
    const bool prefetch = t1 - t0 >= small_batch_prefetch_from;
    const stream_tile_fn stream = ks.stream_tile(std::min<int>(C, int(t1 - t0)));
    for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t ra = r0 + i, rb = r0 + half + i;
        std::int64_t t = t0;
        if (stream) {  // the first token group prefetches the next pair (itself at the last pair)
            const int c = int(std::min<std::int64_t>(C, t1 - t));
            stream(w.row(ra), std::size_t(half) * ws, a.row(t), a.stride, K, two, 2, i + 1 < half ? std::ptrdiff_t(ws) : 0);
            for (int k = 0; k < c; ++k) {
                y[(t + k) * ldy + ra] = two[2 * k];
                y[(t + k) * ldy + rb] = two[2 * k + 1];
            }
            t += c;
        } else if (prefetch && i + 1 < half) {
            const char* pa = reinterpret_cast<const char*>(w.row(ra + 1));
            const char* pb = reinterpret_cast<const char*>(w.row(rb + 1));
            for (std::size_t o = 0; o < ws; o += 64) {
                __builtin_prefetch(pa + o, 0, 3);
                __builtin_prefetch(pb + o, 0, 3);
            }
        }
        for (; t < t1; t += C) {
            const int c = int(std::min<std::int64_t>(C, t1 - t));
            (wide ? wide : ks.tile(2, c))(w.row(ra), std::size_t(half) * ws, a.row(t), a.stride, K, two, 2);
            for (int k = 0; k < c; ++k) {
                y[(t + k) * ldy + ra] = two[2 * k];
                y[(t + k) * ldy + rb] = two[2 * k + 1];
            }
        }
    }
    if ((r1 - r0) % 2)
        for (std::int64_t t = t0; t < t1; t += ks.gemm_c) {
            const int c = int(std::min<std::int64_t>(ks.gemm_c, t1 - t));
            ks.tile(1, c)(w.row(r1 - 1), ws, a.row(t), a.stride, K, y + t * ldy + r1 - 1, ldy);
        }
}

// A small batch's tokens [t0, t1) (at most small_batch_tokens; K ≤ lanes_max_k) packed once per
// block (a8_lane), then group(r, packed, c) for each 16-row group [r, r + 16) of [r0, end): the
// shape shared by the fast form's small batch and the rearranged Q8_0 decode (x16_block). Out of
// line, so that its 40 KB buffer is on the stack only while it runs, not in the frame of every
// gemm_block call it would otherwise be inlined into (one-row decode products included).
inline constexpr std::int64_t lanes_max_k = 4096;  // packed: the widest input of the 35B-A3B model
template <class Group>
[[gnu::noinline]] void packed_groups(const act_view& a, std::int64_t t0, std::int64_t t1, std::int64_t K, std::int64_t r0,
                                     std::int64_t end, Group group) {
    if (t1 - t0 > small_batch_tokens || K > lanes_max_k) fail("matmul: ", t1 - t0, " tokens of ", K, " past the packed small batch");
    alignas(64) a8_lane packed[small_batch_tokens * (lanes_max_k / 32)];
    const int c = int(t1 - t0);
    pack_a8_lanes(a.row(t0), a.stride, c, K / 32, packed);
    for (std::int64_t r = r0; r < end; r += 16) group(r, packed, c);
}

// The fast form's small batch (decode steps: at most small_batch_tokens tokens), rows
// [r0, end) with end − r0 a multiple of 16: each 16-row group prefetches the next while it
// computes, since the weights stream from DRAM once.
inline void lanes_small_batch(const kernel_set& ks, const weight& w, std::int64_t r0, std::int64_t end, const act_view& a,
                              std::int64_t t0, std::int64_t t1, float* y, std::int64_t ldy) {
    packed_groups(a, t0, t1, w.cols, r0, end, [&](std::int64_t r, const a8_lane* packed, int c) {
        const std::byte* next = r + 16 < end ? w.row(r + 16) : nullptr;
        ks.lanes_tile(c)(w.row(r), w.row_bytes, packed, w.cols, y + t0 * ldy + r, ldy, next);
    });
}

// The fast form where it applies (ks.lanes16_rows: a batch that need not be row-exact, at least
// ks.lanes_from tokens): rows in groups of 16, tokens in groups of 8. Prefill chunks read the
// prepared rows; a small batch packs them where the type has a packed form (Q8_0:
// lanes_small_batch, K ≤ lanes_max_k) and reads the rows otherwise (Q4_K, Q6_K). Returns the
// first row it left to the row-exact tiles (r1 when none).
inline std::int64_t lanes_block(const kernel_set& ks, const weight& w, std::int64_t r0, std::int64_t r1, const act_view& a,
                                std::int64_t t0, std::int64_t t1, float* y, std::int64_t ldy) {
    // (the kernels gather each row's scale at lane_row · row_bytes + < 256: an int32 offset)
    if (!ks.lanes_rows_tile(1) || t1 - t0 < ks.lanes_from || w.row_bytes * 16 > std::size_t(INT32_MAX)) return r0;
    const std::int64_t end = r0 + (r1 - r0) / 16 * 16;
    if (t1 - t0 > small_batch_tokens) {  // prefill: the chunk's rows stay in L1/L2 across the token groups
        // The first token group prefetches the next 16 rows: a prompt's expert products have
        // ~16 tokens each (two groups), so their weights come from DRAM as a decode step's do.
        for (std::int64_t r = r0; r < end; r += 16)
            for (std::int64_t t = t0; t < t1; t += 8) {
                const int c = int(std::min<std::int64_t>(8, t1 - t));
                const std::byte* next = t == t0 && r + 16 < end ? w.row(r + 16) : nullptr;
                ks.lanes_rows_tile(c)(w.row(r), w.row_bytes, a.row(t), a.stride, w.cols, y + t * ldy + r, ldy, next);
            }
        return end;
    }
    if (ks.lanes_tile(1)) {  // packed tokens
        if (w.cols > lanes_max_k) return r0;
        lanes_small_batch(ks, w, r0, end, a, t0, t1, y, ldy);
        return end;
    }
    // the activation rows themselves (Q6_K: 8 tokens × 384 bytes per super-block), each 16-row
    // group prefetching the next
    const kernel_set::lanes_rows_fn tile = ks.lanes_rows_tile(int(t1 - t0));
    for (std::int64_t r = r0; r < end; r += 16)
        tile(w.row(r), w.row_bytes, a.row(t0), a.stride, w.cols, y + t0 * ldy + r, ldy, r + 16 < end ? w.row(r + 16) : nullptr);
    return end;
}

// Rows [r0, r1) of a rearranged matrix (weight_layout::rows16; r0 on a group): its full groups
// with the repacked forms, each group prefetching the one two groups on (bench_repack measured
// two ahead best; docs/performance.md; Q8_0 from 3 tokens: kernel_set::x16_pf_from) or, for
// Q6_K and Q4_K, its own stream 2 super-blocks ahead
// (kernel_set::x16_pf_ahead).
// Small batches (decode) read Q8_0 tokens packed per block, as lanes_small_batch does; prefill
// chunks the prepared rows. Returns the first row it left to the row tiles (the rows past the
// last full group, which kept the file's layout).
inline std::int64_t x16_block(const kernel_set& ks, const weight& w, std::int64_t r0, std::int64_t r1,
                                                const act_view& a, std::int64_t t0, std::int64_t t1, float* y, std::int64_t ldy) {
    const std::int64_t end = std::min(r1, w.rows / 16 * 16);
    if (r0 >= end) return r0;
    const bool prefetch = t1 - t0 >= ks.x16_pf_from;
    auto pf = [&](std::int64_t r) -> const std::byte* {
        if (!prefetch) return nullptr;
        if (ks.x16_pf_ahead) return w.row(r) + ks.x16_pf_ahead;  // may run past the matrix: a prefetch never faults
        return r + 32 < end ? w.row(r + 32) : nullptr;
    };
    if (ks.x16_packed[0] && t1 - t0 <= small_batch_tokens && w.cols <= lanes_max_k) {
        packed_groups(a, t0, t1, w.cols, r0, end, [&](std::int64_t r, const a8_lane* packed, int c) {
            ks.x16_packed[c - 1](w.row(r), packed, w.cols, y + t0 * ldy + r, ldy, pf(r));
        });
        return end;
    }
    for (std::int64_t r = r0; r < end; r += 16)
        for (std::int64_t t = t0; t < t1; t += 8) {
            const int c = int(std::min<std::int64_t>(8, t1 - t));
            ks.x16_rows[c - 1](w.row(r), a.row(t), a.stride, w.cols, y + t * ldy + r, ldy, t == t0 ? pf(r) : nullptr);
        }
    return end;
}

// y[t·ldy + r] for rows [r0, r1) of w and prepared rows [t0, t1) of a. row_exact: every
// (row, token) computed as a one-row product would be (otherwise the fast form may run).
inline void gemm_block(const kernel_set& ks, const weight& w, std::int64_t r0, std::int64_t r1, const act_view& a,
                       std::int64_t t0, std::int64_t t1, float* y, std::int64_t ldy, bool row_exact) {
    if (w.layout == weight_layout::rows16) {
        if (!ks.x16_rows[0]) fail("matmul: ", w.name, " was rearranged for kernels this build lacks");
        if ((r0 = x16_block(ks, w, r0, r1, a, t0, t1, y, ldy)) == r1) return;
        row_exact = true;  // the rows past the last group: row tiles, as at any token count
    }
    if (!row_exact && (r0 = lanes_block(ks, w, r0, r1, a, t0, t1, y, ldy)) == r1) return;
    const std::int64_t K = w.cols;
    const std::size_t ws = w.row_bytes;
    if (t1 - t0 == 1) {  // decode: two sequential streams, rows r0 + i and r0 + half + i (see the top)
        const std::int64_t half = (r1 - r0) / 2;
        float* yt = y + t0 * ldy;
        ks.gemv2(w.row(r0), ws, std::size_t(half) * ws, half, a.row(t0), K, yt + r0, yt + r0 + half);
        if ((r1 - r0) % 2) ks.tile(1, 1)(w.row(r1 - 1), ws, a.row(t0), a.stride, K, yt + r1 - 1, ldy);
        return;
    }
    if (t1 - t0 <= small_batch_tokens) {  // a few sequences decoding together: still streaming
        small_batch_block(ks, w, r0, r1, a, t0, t1, y, ldy);
        return;
    }
    const int R = ks.gemm_r, C = ks.gemm_c;
    for (std::int64_t t = t0; t < t1; t += C) {
        const int c = int(std::min<std::int64_t>(C, t1 - t));
        std::int64_t r = r0;
        for (; r + R <= r1; r += R) ks.tile(R, c)(w.row(r), ws, a.row(t), a.stride, K, y + t * ldy + r, ldy);
        for (; r < r1; ++r) ks.tile(1, c)(w.row(r), ws, a.row(t), a.stride, K, y + t * ldy + r, ldy);
    }
}

}  // namespace clover::backend::cpu_detail
