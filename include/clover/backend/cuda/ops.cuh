#pragma once
// Element-wise and per-row device kernels of a pass: RMSNorm (also per head, strided), the
// interleaved-section partial NEOX rope of layers/rope.hpp, row softmax, SwiGLU, the sigmoid
// output gate and the residual add. Each mirrors the CPU formula in
// core/math.hpp (sums of squares and softmax denominators in double, as there), so the CPU
// functions are their test twins.
#include <cub/block/block_reduce.cuh>

#include <array>
#include <cstdint>

#include "clover/backend/cuda/runtime.cuh"

namespace clover::backend::cuda_detail {

inline constexpr int row_threads = 256;

// y_r = x_r / sqrt(mean(x_r²) + eps) · w   for rows r (x row stride xs, y row stride ys; w may be
// null). One block per row; the sum of squares is a CUB block reduction in double.
static __global__ void __launch_bounds__(row_threads) rms_norm_rows(const float* x, std::int64_t xs, const float* w, float* y,
                                                             std::int64_t ys, std::int64_t n, float eps) {
    using reduce = cub::BlockReduce<double, row_threads>;
    __shared__ typename reduce::TempStorage tmp;
    __shared__ float scale;
    const float* xr = x + blockIdx.x * xs;
    double ss = 0;
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) ss += double(xr[i]) * double(xr[i]);
    ss = reduce(tmp).Sum(ss);
    if (threadIdx.x == 0) scale = 1.f / sqrtf(float(ss / double(n)) + eps);
    __syncthreads();
    float* yr = y + blockIdx.x * ys;
    for (std::int64_t i = threadIdx.x; i < n; i += row_threads) yr[i] = xr[i] * scale * (w ? w[i] : 1.f);
}

inline void rms_norm(const float* x, std::int64_t xs, const float* w, float* y, std::int64_t ys, std::int64_t rows,
                     std::int64_t n, float eps, cudaStream_t s) {
    if (rows <= 0) return;
    rms_norm_rows<<<grid_x("rms_norm_rows", rows), row_threads, 0, s>>>(x, xs, w, y, ys, n, eps);
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
static __global__ void rope_heads(float* x, std::int64_t ts, std::int64_t hs, std::int64_t heads, std::int64_t n_heads_total,
                           std::int64_t pos0, rope_args r) {
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
    rope_heads<<<blocks_for("rope_heads", total, 256), 256, 0, s>>>(x, ts, hs, heads, n_tokens * heads, pos0, r);
    check_launch("rope_heads");
}

// In-place softmax of each row of x [rows, n]: math::softmax (max, exp, sum in double, scale).
static __global__ void __launch_bounds__(row_threads) softmax_rows_kernel(float* x, std::int64_t n) {
    using fred = cub::BlockReduce<float, row_threads>;
    using dred = cub::BlockReduce<double, row_threads>;
    __shared__ union {
        typename fred::TempStorage f;
        typename dred::TempStorage d;
    } tmp;
    __shared__ float mx, inv;
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
    softmax_rows_kernel<<<grid_x("softmax_rows_kernel", rows), row_threads, 0, s>>>(x, n);
    check_launch("softmax_rows");
}

// h[p, f] = silu(gu[p, f]) · gu[p, F + f]: SwiGLU over rows holding [gate | up] (ld = 2F).
static __global__ void swiglu_kernel(const float* gu, float* h, std::int64_t rows, std::int64_t F) {
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= rows * F) return;
    const std::int64_t p = id / F, f = id % F;
    h[id] = silu(gu[p * 2 * F + f]) * gu[p * 2 * F + F + f];
}

inline void swiglu(const float* gu, float* h, std::int64_t rows, std::int64_t F, cudaStream_t s) {
    if (rows * F <= 0) return;
    swiglu_kernel<<<blocks_for("swiglu_kernel", rows * F, 256), 256, 0, s>>>(gu, h, rows, F);
    check_launch("swiglu");
}

// a ⊙= sigmoid(gate) (attention output gate), and h += y (residual).
static __global__ void sigmoid_gate_kernel(float* a, const float* gate, std::int64_t n) {
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) a[i] *= sigmoid(gate[i]);
}
static __global__ void add_kernel(float* h, const float* y, std::int64_t n) {
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) h[i] += y[i];
}
inline void sigmoid_gate(float* a, const float* gate, std::int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    sigmoid_gate_kernel<<<blocks_for("sigmoid_gate_kernel", n, 256), 256, 0, s>>>(a, gate, n);
    check_launch("sigmoid_gate");
}
inline void add(float* h, const float* y, std::int64_t n, cudaStream_t s) {
    if (n <= 0) return;
    add_kernel<<<blocks_for("add_kernel", n, 256), 256, 0, s>>>(h, y, n);
    check_launch("add");
}

}  // namespace clover::backend::cuda_detail
