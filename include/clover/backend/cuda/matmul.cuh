#pragma once
// Matrix products on the device for every weight format the CPU backend computes with (F32, F16,
// BF16, Q8_0, Q4_K, Q5_K, Q6_K), with the CPU backend's activation semantics (quant/rows.hpp):
// each activation row is first rounded to the weight's partner type (F16, BF16, Q8_0, or Q8_K for
// the K-quants) by the same rules, bit for bit, and the dot product runs on that representation.
// So CUDA and CPU differ only by the order of float additions.
//
// Row-exactness: one warp computes one output element per activation row; lanes walk the row's
// "items" (an element, a Q8_0 block, a K-quant sub-block) in a fixed stride and a fixed butterfly
// tree finishes the sum. Nothing depends on how many rows a launch covers, so a row computed in
// a 32-row verify pass equals the same row computed alone (what exact_rows_scope asks for on CPU).
//
// One kernel serves dense products and the expert-grouped products of MoE (moe.cuh): work comes
// in tiles of up to R rows that share one weight matrix; the weight item is decoded once into
// registers and used for all R rows (R-fold fewer weight reads, which dominate a GEMV).
// Products of 8 rows or more in an integer format run on the tensor-core kernel instead
// (mma_kernel, mma.cuh): the integer dots from int8 mma, the float steps in mm_kernel's order, so
// the same bits per row.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "clover/backend/cuda/mma.cuh"
#include "clover/backend/cuda/quant_dot.cuh"
#include "clover/backend/cuda/runtime.cuh"
#include "clover/core/dtype.hpp"
#include "clover/quant/rows.hpp"

namespace clover::backend::cuda_detail {

inline constexpr int mm_rows = 4;           // R: activation rows per tile
inline constexpr int mm_warps = 8;          // output features per CUDA block (one per warp)


// ---- activation quantization ------------------------------------------------------------------
// The per-block math lives in small functions shared by the plain conversion kernels below and the
// fused epilogues of ops.cuh (RMSNorm + conversion, SwiGLU + conversion): a fused kernel then gives
// the bits of its producer followed by the plain conversion, by construction. The scalar pieces are
// __host__ __device__ so test_fused_epilogue.cu checks them against quant:: without a GPU.

// Round to nearest, ties to even: std::nearbyint in the default rounding mode (the CPU's rule).
__host__ __device__ inline int round_even(float v) {
#if CLOVER_DEVICE_CODE
    return __float2int_rn(v);
#else
    return int(std::nearbyint(v));
#endif
}
__host__ __device__ inline std::uint16_t act_f16(float f) {
#if CLOVER_DEVICE_CODE
    return f32_to_f16(f);
#else
    return quant::f32_to_f16(f);
#endif
}
__host__ __device__ inline std::uint16_t act_bf16(float f) {
#if CLOVER_DEVICE_CODE
    return f32_to_bf16(f);
#else
    return quant::f32_to_bf16(f);
#endif
}

// Q8_0 (quant::quantize_row_q8_0): d = amax/127 stored as f16, q = rne(x · 127/amax).
__host__ __device__ inline float q8_0_inv_scale(float amax) { return amax != 0.f ? 127.f / amax : 0.f; }
__host__ __device__ inline std::uint16_t q8_0_scale_bits(float amax) { return act_f16(amax / 127.f); }
__host__ __device__ inline std::int8_t q8_0_code(float v, float id) { return std::int8_t(round_even(v * id)); }

// Q8_K (quant::quantize_row_q8_k): the element of largest magnitude (the first on ties) maps to
// -127, q = min(127, rne(iscale · x)), d = 1/iscale, bsums per 16. "Larger, or equal and earlier"
// is a total order, so any reduction tree over (magnitude, index) pairs picks the CPU's element.
__host__ __device__ inline bool q8_k_beats(float amax, int idx, float other_amax, int other_idx) {
    return amax > other_amax || (amax == other_amax && idx < other_idx);
}
__host__ __device__ inline float q8_k_iscale(float mx) { return -127.f / mx; }
__host__ __device__ inline std::int8_t q8_k_code(float v, float iscale) {
    const int q = round_even(iscale * v);
    return std::int8_t(q < 127 ? q : 127);
}

// One Q8_0 block by one warp, lane l holding element l: its 34 bytes at blk.
__device__ inline void q8_0_block_warp(float v, int lane, std::uint8_t* blk) {
    const float amax = warp_max(fabsf(v));
    if (lane == 0) {
        const std::uint16_t d = q8_0_scale_bits(amax);
        blk[0] = std::uint8_t(d & 0xff);
        blk[1] = std::uint8_t(d >> 8);
    }
    blk[2 + lane] = std::uint8_t(q8_0_code(v, q8_0_inv_scale(amax)));
}

// One Q8_K super-block of 256 by one warp, lane l holding elements 8l..8l+7: its 292 bytes at blk.
__device__ inline void q8_k_block_warp(const float (&v)[8], int lane, std::uint8_t* blk) {
    float amax = 0.f, mx = 0.f;
    int idx = 1 << 30;
    for (int i = 0; i < 8; ++i)
        if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); mx = v[i]; idx = lane * 8 + i; }
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o), om = __shfl_xor_sync(0xffffffffu, mx, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (q8_k_beats(oa, oi, amax, idx)) { amax = oa; mx = om; idx = oi; }
    }
    auto* qs = reinterpret_cast<std::int8_t*>(blk + 4);
    auto* bsums = reinterpret_cast<std::int16_t*>(blk + 260);
    if (amax == 0.f) {
        for (int i = 0; i < 8; ++i) qs[lane * 8 + i] = 0;
        if (lane < 16) bsums[lane] = 0;
        if (lane == 0) *reinterpret_cast<float*>(blk) = 0.f;
        return;
    }
    const float iscale = q8_k_iscale(mx);
    int s = 0;
    for (int i = 0; i < 8; ++i) {
        const std::int8_t q = q8_k_code(v[i], iscale);
        qs[lane * 8 + i] = q;
        s += q;
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);  // lanes 2g, 2g+1 hold group g of 16
    if (lane % 2 == 0) bsums[lane / 2] = std::int16_t(s);
    if (lane == 0) *reinterpret_cast<float*>(blk) = 1.f / iscale;
}

// What a conversion reads at flat element e of its [n, K] rows: the rows themselves here; ops.cuh
// passes producers computed on the fly (SwiGLU), so the producer's output needs no float copy.
struct rows_src {
    const float* x;
    __device__ float operator()(std::int64_t e) const { return x[e]; }
};

// Element-wise conversions (F32: the value itself, for producers whose consumer reads floats).
template <dtype AT, class Src>
static __global__ void __launch_bounds__(256) act_elems(Src src, void* y, std::int64_t n) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = src(i);
    if constexpr (AT == dtype::f32) static_cast<float*>(y)[i] = v;
    else if constexpr (AT == dtype::f16) static_cast<std::uint16_t*>(y)[i] = act_f16(v);
    else static_cast<std::uint16_t*>(y)[i] = act_bf16(v);
}
// One warp per block (the warp's blocks are consecutive: rows of K % 32 == 0 hold whole blocks).
template <class Src>
static __global__ void __launch_bounds__(256) act_q8_0(Src src, std::uint8_t* y, std::int64_t n_blocks) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t b = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b >= n_blocks) return;  // whole warps leave together: the shuffles below see full warps
    q8_0_block_warp(src(b * 32 + lane), lane, y + b * q8_0_bytes);
}
template <class Src>
static __global__ void __launch_bounds__(256) act_q8_k(Src src, std::uint8_t* y, std::int64_t n_blocks) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t b = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b >= n_blocks) return;
    float v[8];
    for (int i = 0; i < 8; ++i) v[i] = src(b * 256 + lane * 8 + i);
    q8_k_block_warp(v, lane, y + b * q8_k_bytes);
}

// The n·K values of src (rows of K) converted to `at` in y (row stride quant::row_bytes(at, K));
// for F32 the floats themselves are written.
template <class Src>
inline void convert_activations(dtype at, Src src, void* y, std::int64_t n, std::int64_t K, cudaStream_t s) {
    const std::int64_t total = n * K;
    if (total <= 0) return;
    if ((at == dtype::q8_0 && K % 32 != 0) || (at == dtype::q8_k && K % 256 != 0))
        fail("cuda: rows of ", K, " values cannot be converted to ", dtype_name(at), " (whole blocks only)");
    switch (at) {
        case dtype::f32: launch(act_elems<dtype::f32, Src>, "act_elems<dtype::f32>", blocks_for("act_elems", total, 256), 256, 0, s, src, y, total); break;
        case dtype::f16: launch(act_elems<dtype::f16, Src>, "act_elems<dtype::f16>", blocks_for("act_elems", total, 256), 256, 0, s, src, y, total); break;
        case dtype::bf16: launch(act_elems<dtype::bf16, Src>, "act_elems<dtype::bf16>", blocks_for("act_elems", total, 256), 256, 0, s, src, y, total); break;
        case dtype::q8_0:
            launch(act_q8_0<Src>, "act_q8_0", blocks_for("act_q8_0", total / 32, 8), 256, 0, s, src, static_cast<std::uint8_t*>(y), total / 32);
            break;
        case dtype::q8_k:
            launch(act_q8_k<Src>, "act_q8_k", blocks_for("act_q8_k", total / 256, 8), 256, 0, s, src, static_cast<std::uint8_t*>(y), total / 256);
            break;
        default: fail("cuda: no activation conversion to ", dtype_name(at));
    }
    check_launch("convert_activations");
}

// Converts rows x [n, K] to the activation type `at` in y (row stride quant::row_bytes(at, K)).
// For F32 nothing is done: the caller reads x itself.
inline void quantize_activations(dtype at, const float* x, void* y, std::int64_t n, std::int64_t K, cudaStream_t s) {
    if (at == dtype::f32) return;
    convert_activations(at, rows_src{x}, y, n, K, s);
}

// ---- the product kernel -----------------------------------------------------------------------

// A tile: rows [p0, p1) of the output that share matrix `mat` (p1 - p0 <= mm_rows).
struct mm_tile {
    int mat, p0, p1;
};

struct mm_args {
    const std::uint8_t* w;     // matrix 0; matrix e at w + e * mat_bytes
    std::size_t row_bytes, mat_bytes;
    const std::uint8_t* x;     // activation rows (already in the partner type)
    std::size_t x_row_bytes;
    const int* xmap;           // output row p reads activation row xmap[p] (null: p)
    float* y;                  // y[p * ldy + o]
    std::int64_t ldy, N, K;
    std::int64_t n;            // output rows (dense tiling when tiles == null)
    const mm_tile* tiles;      // grouped: the tile list and its length on the device
    const int* n_tiles;
    std::int64_t tile0;        // the tile of blockIdx.y == 0 (set by launch_mm: grid.y <= 65,535)
};

// The tile of this block (blockIdx.y past a.tile0): from the grouped list, or rows
// [rows·t, rows·t + rows) of a dense product. False past the list's device-side length.
__device__ inline bool tile_of(const mm_args& a, int rows, mm_tile& tl) {
    const std::int64_t tile = a.tile0 + blockIdx.y;
    if (a.tiles) {
        if (tile >= *a.n_tiles) return false;
        tl = a.tiles[tile];
    } else {
        tl.mat = 0;
        tl.p0 = int(tile * rows);  // n <= INT_MAX, checked by launch_mm
        tl.p1 = min(int(a.n), tl.p0 + rows);
    }
    return true;
}

template <dtype T>
static __global__ void __launch_bounds__(mm_warps * 32) mm_kernel(mm_args a) {
    CLOVER_LAUNCH_BOUND(mm_warps * 32);
    const int lane = threadIdx.x % 32;
    const std::int64_t o = std::int64_t(blockIdx.x) * mm_warps + threadIdx.x / 32;
    if (o >= a.N) return;
    mm_tile tl;
    if (!tile_of(a, mm_rows, tl)) return;
    const int nr = tl.p1 - tl.p0;
    const std::uint8_t* xr[mm_rows];
    for (int r = 0; r < mm_rows; ++r) {
        const int p = tl.p0 + (r < nr ? r : 0);
        xr[r] = a.x + std::size_t(a.xmap ? a.xmap[p] : p) * a.x_row_bytes;
    }
    const std::uint8_t* w = a.w + std::size_t(tl.mat) * a.mat_bytes + std::size_t(o) * a.row_bytes;
    float acc[mm_rows] = {};
    const std::int64_t n_items = items<T>(a.K);
    for (std::int64_t it = lane; it < n_items; it += 32) item_dot<T, mm_rows>(w, xr, it, acc, nr);
    for (int r = 0; r < mm_rows; ++r) {
        const float s = warp_sum(acc[r]);
        if (r < nr && lane == 0) a.y[std::int64_t(tl.p0 + r) * a.ldy + o] = s;
    }
}

// The tensor-core product (mma.cuh) for products of many rows in an integer format: one warp per
// 16 outputs × 8 rows, the same bits per row as mm_kernel. Dense tiles are rows [8t, 8t+8);
// grouped tiles (a.tiles) may hold up to 8 rows of one matrix.
template <dtype T>
static __global__ void __launch_bounds__(mma_warps * 32) mma_kernel(mm_args a) {
    CLOVER_LAUNCH_BOUND(mma_warps * 32);
    CLOVER_SHARED(mma_stage_buf, buf, [mma_warps]);
    const int wi = threadIdx.x / 32;
    const std::int64_t o0 = (std::int64_t(blockIdx.x) * mma_warps + wi) * mma_m;
    if (o0 >= a.N) return;  // the whole warp (o0 is warp-uniform): mma.sync needs all 32 lanes
    mm_tile tl;
    if (!tile_of(a, mma_n, tl)) return;
    mma_job j;
    j.w = a.w + std::size_t(tl.mat) * a.mat_bytes;
    j.row_bytes = a.row_bytes;
    j.o0 = o0;
    j.N = a.N;
    j.x = a.x;
    j.x_row_bytes = a.x_row_bytes;
    j.xmap = a.xmap;
    j.p0 = tl.p0;
    j.nr = tl.p1 - tl.p0;
    j.y = a.y;
    j.ldy = a.ldy;
    j.n_items = items<T>(a.K);
    mma_device_warp wp{int(threadIdx.x % 32), {}, &buf[wi]};
    mma_tile<T>(j, wp);
}

// Dense products of at least this many rows in an integer format go to mma_kernel: one full mma
// tile. A threshold from the tile shape alone, unmeasured (no GPU was lent while this was written).
// F32/F16/BF16 always stay on mm_kernel: a tensor core's float accumulation order is the
// hardware's, so those rows could not equal the single-row step's bits.
inline constexpr std::int64_t mma_min_rows = mma_n;

// One launch of the product over grid.y tiles from a.tile0.
inline void launch_mm_tiles(dtype t, const mm_args& a, dim3 grid, cudaStream_t s) {
    const unsigned threads = mm_warps * 32;
    switch (t) {
        case dtype::f32: launch(mm_kernel<dtype::f32>, "mm_kernel<dtype::f32>", grid, threads, 0, s, a); break;
        case dtype::f16: launch(mm_kernel<dtype::f16>, "mm_kernel<dtype::f16>", grid, threads, 0, s, a); break;
        case dtype::bf16: launch(mm_kernel<dtype::bf16>, "mm_kernel<dtype::bf16>", grid, threads, 0, s, a); break;
        case dtype::q8_0: launch(mm_kernel<dtype::q8_0>, "mm_kernel<dtype::q8_0>", grid, threads, 0, s, a); break;
        case dtype::q4_k: launch(mm_kernel<dtype::q4_k>, "mm_kernel<dtype::q4_k>", grid, threads, 0, s, a); break;
        case dtype::q5_k: launch(mm_kernel<dtype::q5_k>, "mm_kernel<dtype::q5_k>", grid, threads, 0, s, a); break;
        case dtype::q6_k: launch(mm_kernel<dtype::q6_k>, "mm_kernel<dtype::q6_k>", grid, threads, 0, s, a); break;
        default: fail("cuda: no matmul kernel for weight type ", dtype_name(t));
    }
    check_launch("mm_kernel");
}

// The product on mma_kernel over n_tiles tiles of up to mma_n rows (dense, or a bound on the
// grouped list), in launches of at most 65,535 (grid.y).
inline void launch_mma(dtype t, mm_args a, std::int64_t n_tiles, cudaStream_t s) {
    const unsigned gx = blocks_for("mma_kernel", a.N, mma_m * mma_warps);
    const unsigned threads = mma_warps * 32;
    for (std::int64_t t0 = 0; t0 < n_tiles; t0 += max_grid_yz) {
        a.tile0 = t0;
        const dim3 grid(gx, grid_yz("mma_kernel", std::min(max_grid_yz, n_tiles - t0)));
        switch (t) {
            case dtype::q8_0: launch(mma_kernel<dtype::q8_0>, "mma_kernel<dtype::q8_0>", grid, threads, 0, s, a); break;
            case dtype::q4_k: launch(mma_kernel<dtype::q4_k>, "mma_kernel<dtype::q4_k>", grid, threads, 0, s, a); break;
            case dtype::q5_k: launch(mma_kernel<dtype::q5_k>, "mma_kernel<dtype::q5_k>", grid, threads, 0, s, a); break;
            case dtype::q6_k: launch(mma_kernel<dtype::q6_k>, "mma_kernel<dtype::q6_k>", grid, threads, 0, s, a); break;
            default: fail("cuda: no tensor-core kernel for weight type ", dtype_name(t));
        }
        check_launch("mma_kernel");
    }
}

// n_tiles: the number of tiles (dense) or an upper bound on it (grouped; extra blocks exit).
// Dense integer products of mma_min_rows rows or more run on mma_kernel instead (n_tiles unused);
// mma_tiles: the grouped tiles hold up to mma_n rows, for mma_kernel (integer formats only).
// grid.y is limited to 65,535, so the tiles go in launches of at most that many, each told its
// first tile (mm_args::tile0); a tile's result does not depend on which launch covers it.
inline void launch_mm(dtype t, mm_args a, std::int64_t n_tiles, cudaStream_t s, bool mma_tiles = false) {
    if (n_tiles <= 0 || a.N == 0) return;
    if (a.n > std::int64_t(INT_MAX) || n_tiles > std::int64_t(INT_MAX))
        fail("cuda: kernel mm_kernel: ", a.n, " rows in ", n_tiles, " tiles exceed the int row index (", INT_MAX, ")");
    // item_dot reads codes as 32-bit words (quant_dot.cuh); every block size keeps the alignment
    // of a row's start, so the bases and strides decide it for every row.
    const std::size_t wa = weight_align(t), xa = activation_align(t);
    const auto addr = [](const void* p) { return std::size_t(reinterpret_cast<std::uintptr_t>(p)); };
    if ((addr(a.w) | a.row_bytes | a.mat_bytes) % wa != 0 || (addr(a.x) | a.x_row_bytes) % xa != 0)
        fail("cuda: kernel mm_kernel: ", dtype_name(t), " products need weight rows aligned to ", wa,
             " bytes and activation rows to ", xa, " (got weights at ", addr(a.w) % 16, " mod 16, row stride ", a.row_bytes,
             "; activations at ", addr(a.x) % 16, " mod 16, row stride ", a.x_row_bytes, ")");
    if (mma_tiles && !(mma_format(t) && a.tiles))
        fail("cuda: kernel mma_kernel: tiles of ", mma_n, " rows need a grouped product in an integer format (got ", dtype_name(t),
             a.tiles ? ")" : ", no tile list)");
    if (mma_tiles || (mma_format(t) && !a.tiles && a.n >= mma_min_rows)) {
        launch_mma(t, a, mma_tiles ? n_tiles : (a.n + mma_n - 1) / mma_n, s);
        return;
    }
    const unsigned gx = blocks_for("mm_kernel", a.N, mm_warps);
    for (std::int64_t t0 = 0; t0 < n_tiles; t0 += max_grid_yz) {
        a.tile0 = t0;
        launch_mm_tiles(t, a, dim3(gx, grid_yz("mm_kernel", std::min(max_grid_yz, n_tiles - t0))), s);
    }
}

// A weight resident on the device (one matrix or a stack of expert matrices).
struct device_matrix {
    const std::uint8_t* data = nullptr;
    dtype type = dtype::f32;
    std::int64_t cols = 0, rows = 0, n_mat = 1;
    std::size_t row_bytes = 0;
    std::size_t mat_bytes() const { return std::size_t(rows) * row_bytes; }
};

// Scratch a product needs for its converted activations.
inline std::size_t act_bytes(dtype wt, std::int64_t n, std::int64_t K) {
    return quant::row_bytes(quant::activation_type(wt), K) * std::size_t(n);
}

// y[n, N] = x[n, K] · wᵀ on the device (all pointers device pointers; act: act_bytes() scratch);
// row p of y starts at y + p·ldy (ldy 0: N, packed). With `rows`, y has n_out rows and row p
// reads input row rows[p] (a gather: the LM head over the rows that give logits).
// converted: act already holds x's rows in the partner type (written by a fused epilogue, or
// shared by several products of one input), so they are not converted again; F32 reads x.
inline void matmul(const device_matrix& w, const float* x, float* y, std::int64_t n, void* act, cudaStream_t s,
                   std::int64_t ldy = 0, const int* rows = nullptr, std::int64_t n_out = -1, bool converted = false) {
    const dtype at = quant::activation_type(w.type);
    if (!converted) quantize_activations(at, x, act, n, w.cols, s);
    mm_args a{};
    a.w = w.data;
    a.row_bytes = w.row_bytes;
    a.mat_bytes = w.mat_bytes();
    a.x = at == dtype::f32 ? reinterpret_cast<const std::uint8_t*>(x) : static_cast<const std::uint8_t*>(act);
    a.x_row_bytes = quant::row_bytes(at, w.cols);
    a.xmap = rows;
    a.y = y;
    a.ldy = ldy > 0 ? ldy : w.rows;
    a.N = w.rows;
    a.K = w.cols;
    a.n = rows ? n_out : n;
    launch_mm(w.type, a, (a.n + mm_rows - 1) / mm_rows, s);
}

}  // namespace clover::backend::cuda_detail
