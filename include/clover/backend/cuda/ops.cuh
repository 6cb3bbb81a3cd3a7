#pragma once
// Element-wise and per-row device kernels of a pass: RMSNorm (also per head, strided), the
// interleaved-section partial NEOX rope of layers/rope.hpp, row softmax, SwiGLU, the sigmoid
// output gate and the residual add. Each mirrors the CPU formula in
// core/math.hpp (sums of squares and softmax denominators in double, as there), so the CPU
// functions are their test twins.
//
// Fused epilogues (issue 16): an RMSNorm (with its residual add) that also writes its output rows
// converted to the next product's activation type, and SwiGLU writing the down product's
// activation rows directly. Each shares its formulas with the plain kernels (row_sum_sq,
// rms_row_scale, rms_value, swiglu_value here; the per-block quantizers of matmul.cuh), so it
// gives the bits of the plain kernels run one after the other, with fewer launches and without
// re-reading the rows from memory.
#include <cub/block/block_reduce.cuh>

#include <array>
#include <cstddef>
#include <cstdint>

#include "clover/backend/cuda/matmul.cuh"
#include "clover/backend/cuda/runtime.cuh"
#include "clover/core/dtype.hpp"
#include "clover/quant/rows.hpp"

namespace clover::backend::cuda_detail {

inline constexpr int row_threads = 256;

// The pieces of an RMSNorm row shared by rms_norm_rows and the fused norm_act_rows, so both give
// the same bits: thread t sums the squares of elements t, t + row_threads, ... in double (an
// explicit fma, so the contraction cannot differ between the kernels), a CUB block reduction
// gives 1/sqrt(mean + eps) to every thread (it ends with __syncthreads, so the block's earlier
// global writes are visible after it), and y = x · scale · w.
__device__ inline double row_sum_sq(double ss, float v) { return __fma_rn(double(v), double(v), ss); }
__device__ inline float rms_row_scale(double ss, std::int64_t n, float eps) {
    using reduce = cub::BlockReduce<double, row_threads>;
    CLOVER_SHARED(typename reduce::TempStorage, tmp);
    CLOVER_SHARED(float, scale);
    ss = reduce(tmp).Sum(ss);
    if (threadIdx.x == 0) scale = 1.f / sqrtf(float(ss / double(n)) + eps);
    __syncthreads();
    return scale;
}
__device__ inline float rms_value(float x, float scale, const float* w, std::int64_t i) { return x * scale * (w ? w[i] : 1.f); }

// y_r = x_r / sqrt(mean(x_r²) + eps) · w   for rows r (x row stride xs, y row stride ys; w may be
// null). One block per row; the sum of squares is a CUB block reduction in double.
static __global__ void __launch_bounds__(row_threads) rms_norm_rows(const float* x, std::int64_t xs, const float* w, float* y,
                                                             std::int64_t ys, std::int64_t n, float eps) {
    CLOVER_LAUNCH_BOUND(row_threads);
    const float* xr = x + blockIdx.x * xs;
    double ss = 0;
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) ss = row_sum_sq(ss, xr[i]);
    const float scale = rms_row_scale(ss, n, eps);
    float* yr = y + blockIdx.x * ys;
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) yr[i] = rms_value(xr[i], scale, w, i);
}

inline void rms_norm(const float* x, std::int64_t xs, const float* w, float* y, std::int64_t ys, std::int64_t rows,
                     std::int64_t n, float eps, cudaStream_t s) {
    if (rows <= 0) return;
    launch(rms_norm_rows, "rms_norm_rows", grid_x("rms_norm_rows", rows), row_threads, 0, s, x, xs, w, y, ys, n, eps);
    check_launch("rms_norm_rows");
}

// Rope parameters as layers::rope_params, plus the frequency ratio computed on the host with
// std::pow so the angle recurrence starts from the CPU's very bits.
struct rope_args {
    int n_rot = 0;
    float scale = 1.f;  // theta^(-2/n_rot)
    int sections[4] = {0, 0, 0, 0};
};

// Rotates the first n_rot dims of each head in place. Head r (of `heads` per token) of token
// t = r / heads sits at x + t * ts + (r % heads) * hs and has position pos0 + t. One thread per
// (head, pair); the angle is built by i repeated float multiplications, as rope_cache does.
// ptxas -warn-lmem-usage reports a 32-byte stack frame: the Payne-Hanek slow path of sinf/cosf
// for large angles (|θ| grows with the position) keeps its reduction table in local memory.
// Inherent to full-precision sinf/cosf, which the CPU twin's bits need (__sinf would not match).
static __global__ void __launch_bounds__(256) rope_heads(float* x, std::int64_t ts, std::int64_t hs, std::int64_t heads, std::int64_t n_heads_total,
                                                  std::int64_t pos0, rope_args r) {
    CLOVER_LAUNCH_BOUND(256);
    const int half = r.n_rot / 2;
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= n_heads_total * half) return;
    const std::int64_t hr = id / half, t = hr / heads;
    const int i = int(id % half);
    float th = float(pos0 + t);
    for (int k = 0; k < i; ++k) th *= r.scale;
    const int sect = r.sections[0] + r.sections[1] + r.sections[2] + r.sections[3];
    if (sect > 0) {
        const int s = i % sect;
        const bool t_stream = s % 3 == 0 && s < 3 * r.sections[0];
        const bool h_stream = s % 3 == 1 && s < 3 * r.sections[1];
        const bool w_stream = s % 3 == 2 && s < 3 * r.sections[2];
        if (!(t_stream || h_stream || w_stream)) th = 0.f;  // the "extra" stream: position 0 for text
    }
    const float c = cosf(th), sn = sinf(th);
    float* h = x + t * ts + (hr % heads) * hs;
    const float x0 = h[i], x1 = h[i + half];
    h[i] = x0 * c - x1 * sn;
    h[i + half] = x0 * sn + x1 * c;
}

inline void rope(float* x, std::int64_t ts, std::int64_t hs, std::int64_t heads, std::int64_t n_tokens,
                 std::int64_t pos0, const rope_args& r, cudaStream_t s) {
    const std::int64_t total = n_tokens * heads * (r.n_rot / 2);
    if (total <= 0) return;
    launch(rope_heads, "rope_heads", blocks_for("rope_heads", total, 256), 256, 0, s, x, ts, hs, heads, n_tokens * heads, pos0, r);
    check_launch("rope_heads");
}

// In-place softmax of each row of x [rows, n]: math::softmax (max, exp, sum in double, scale).
static __global__ void __launch_bounds__(row_threads) softmax_rows_kernel(float* x, std::int64_t n) {
    CLOVER_LAUNCH_BOUND(row_threads);
    using fred = cub::BlockReduce<float, row_threads>;
    using dred = cub::BlockReduce<double, row_threads>;
    union reduce_storage {
        typename fred::TempStorage f;
        typename dred::TempStorage d;
    };
    CLOVER_SHARED(reduce_storage, tmp);
    CLOVER_SHARED(float, mx);
    CLOVER_SHARED(float, inv);
    float* xr = x + blockIdx.x * n;
    float m = -INFINITY;
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) m = fmaxf(m, xr[i]);
    m = fred(tmp.f).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
    if (threadIdx.x == 0) mx = m;
    __syncthreads();
    double s = 0;
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) {
        const float e = expf(xr[i] - mx);
        xr[i] = e;
        s += e;
    }
    s = dred(tmp.d).Sum(s);
    if (threadIdx.x == 0) inv = float(1.0 / s);
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) xr[i] *= inv;
}

inline void softmax_rows(float* x, std::int64_t rows, std::int64_t n, cudaStream_t s) {
    if (rows <= 0) return;
    launch(softmax_rows_kernel, "softmax_rows_kernel", grid_x("softmax_rows_kernel", rows), row_threads, 0, s, x, n);
    check_launch("softmax_rows");
}

__device__ inline float swiglu_value(float gate, float up) { return silu(gate) * up; }

// h[p, f] = silu(gu[p, f]) · gu[p, F + f]: SwiGLU over rows holding [gate | up] (ld = 2F).
static __global__ void __launch_bounds__(256) swiglu_kernel(const float* gu, float* h, std::int64_t rows, std::int64_t F) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= rows * F) return;
    const std::int64_t p = id / F, f = id % F;
    h[id] = swiglu_value(gu[p * 2 * F + f], gu[p * 2 * F + F + f]);
}

inline void swiglu(const float* gu, float* h, std::int64_t rows, std::int64_t F, cudaStream_t s) {
    if (rows * F <= 0) return;
    launch(swiglu_kernel, "swiglu_kernel", blocks_for("swiglu_kernel", rows * F, 256), 256, 0, s, gu, h, rows, F);
    check_launch("swiglu");
}

// h += y (residual). (The attention output gate is applied inside paged attention.)
static __global__ void __launch_bounds__(256) add_kernel(float* h, const float* y, std::int64_t n) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) h[i] += y[i];
}
inline void add(float* h, const float* y, std::int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    launch(add_kernel, "add_kernel", blocks_for("add_kernel", n, 256), 256, 0, s, h, y, n);
    check_launch("add");
}

// ---- fused epilogues ---------------------------------------------------------------------------

// An RMSNorm recorded by backend::cuda's rms_norm / add_rms_norm and run by the next primitive:
// fused with the conversion of a product's activations when that primitive's input is `out`,
// plainly otherwise. Its pointers are the pass's scratch, which does not move in between.
struct pending_norm {
    bool on = false;
    float* x = nullptr;          // [rows, xs] the norm's input (the residual h)
    const float* add = nullptr;  // [rows, xs] added to x first (x += add, stored), or null
    const float* w = nullptr;    // [n] the norm weight, or null
    float* out = nullptr;        // [rows, ys] (may be x itself)
    std::int64_t xs = 0, ys = 0, rows = 0, n = 0;
    float eps = 0.f;
};

// One block per row: (x += add), then out = rms_norm(x) · w, and out's row converted to AT in act
// (row stride act_rb; F32: nothing more). The sum of squares is rms_norm_rows' (same threads,
// same order, same reduction), the add is add_kernel's, the conversions are matmul.cuh's per-block
// functions on the very values written to out: the bits of add + rms_norm + quantize_activations.
// After the reduction's barrier a Q8 block is converted by one warp, each lane reading the
// elements it then writes, so out may be x (in place) and the block's h writes are visible.
template <dtype AT>
static __global__ void __launch_bounds__(row_threads) norm_act_rows(pending_norm p, std::uint8_t* act, std::size_t act_rb) {
    CLOVER_LAUNCH_BOUND(row_threads);
    float* xr = p.x + blockIdx.x * p.xs;
    const float* ar = p.add ? p.add + blockIdx.x * p.xs : nullptr;
    double ss = 0;
    for (std::int64_t i = threadIdx.x; i < p.n; i += row_threads) {
        float v = xr[i];
        if (ar) {
            v += ar[i];
            xr[i] = v;
        }
        ss = row_sum_sq(ss, v);
    }
    const float scale = rms_row_scale(ss, p.n, p.eps);
    float* yr = p.out + blockIdx.x * p.ys;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if constexpr (AT == dtype::q8_0) {
        std::uint8_t* ab = act + blockIdx.x * act_rb;
        for (std::int64_t b = warp; b < p.n / 32; b += row_threads / 32) {  // warp-uniform bound
            const std::int64_t i = b * 32 + lane;
            const float v = rms_value(xr[i], scale, p.w, i);
            yr[i] = v;
            q8_0_block_warp(v, lane, ab + b * q8_0_bytes);
        }
    } else if constexpr (AT == dtype::q8_k) {
        std::uint8_t* ab = act + blockIdx.x * act_rb;
        for (std::int64_t b = warp; b < p.n / 256; b += row_threads / 32) {
            float v[8];
            for (int j = 0; j < 8; ++j) {
                const std::int64_t i = b * 256 + lane * 8 + j;
                v[j] = rms_value(xr[i], scale, p.w, i);
                yr[i] = v[j];
            }
            q8_k_block_warp(v, lane, ab + b * q8_k_bytes);
        }
    } else {
        for (std::int64_t i = threadIdx.x; i < p.n; i += row_threads) {
            const float v = rms_value(xr[i], scale, p.w, i);
            yr[i] = v;
            if constexpr (AT == dtype::f16) reinterpret_cast<std::uint16_t*>(act + blockIdx.x * act_rb)[i] = act_f16(v);
            if constexpr (AT == dtype::bf16) reinterpret_cast<std::uint16_t*>(act + blockIdx.x * act_rb)[i] = act_bf16(v);
        }
    }
}

// Runs a pending norm in one kernel, also writing its output rows as `at` into act (row stride
// quant::row_bytes(at, n)); at == F32 writes the norm alone (act unused), one launch where the
// plain path takes two for add_rms_norm.
inline void norm_act(const pending_norm& p, dtype at, void* act, cudaStream_t s) {
    if (p.rows <= 0 || p.n <= 0) return;
    if ((at == dtype::q8_0 && p.n % 32 != 0) || (at == dtype::q8_k && p.n % 256 != 0))
        fail("cuda: a norm over rows of ", p.n, " values cannot write ", dtype_name(at), " rows (whole blocks only)");
    const unsigned g = grid_x("norm_act_rows", p.rows);
    const std::size_t rb = at == dtype::f32 ? 0 : quant::row_bytes(at, p.n);
    auto* a = static_cast<std::uint8_t*>(act);
    switch (at) {
        case dtype::f32: launch(norm_act_rows<dtype::f32>, "norm_act_rows<dtype::f32>", g, row_threads, 0, s, p, a, rb); break;
        case dtype::f16: launch(norm_act_rows<dtype::f16>, "norm_act_rows<dtype::f16>", g, row_threads, 0, s, p, a, rb); break;
        case dtype::bf16: launch(norm_act_rows<dtype::bf16>, "norm_act_rows<dtype::bf16>", g, row_threads, 0, s, p, a, rb); break;
        case dtype::q8_0: launch(norm_act_rows<dtype::q8_0>, "norm_act_rows<dtype::q8_0>", g, row_threads, 0, s, p, a, rb); break;
        case dtype::q8_k: launch(norm_act_rows<dtype::q8_k>, "norm_act_rows<dtype::q8_k>", g, row_threads, 0, s, p, a, rb); break;
        default: fail("cuda: no activation conversion to ", dtype_name(at));
    }
    check_launch("norm_act_rows");
}

// SwiGLU as the source of a conversion: element e of the [rows, F] result, from rows of [gate | up].
struct swiglu_src {
    const float* gu;
    std::int64_t F;
    __device__ float operator()(std::int64_t e) const {
        const std::int64_t p = e / F, f = e % F;
        return swiglu_value(gu[p * 2 * F + f], gu[p * 2 * F + F + f]);
    }
};

// h = silu(gate) · up written straight as the down product's activation rows: `at` rows of F
// values in y (row stride quant::row_bytes(at, F)); F32 writes the floats (swiglu's output).
// One launch instead of swiglu + quantize_activations, and h never goes through memory as floats.
inline void swiglu_act(dtype at, const float* gu, void* y, std::int64_t rows, std::int64_t F, cudaStream_t s) {
    convert_activations(at, swiglu_src{gu, F}, y, rows, F, s);
}

}  // namespace clover::backend::cuda_detail
