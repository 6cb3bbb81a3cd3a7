#pragma once
// Attention over the KV cache (layers/gated_attention.hpp is the CPU twin). One block per
// (query row, query head); its warps split the keys and each keeps an online softmax (running
// max, denominator and weighted value sum), merged across warps at the end — so any context
// length runs in fixed shared memory, in one pass over K and V.
//   causal (commit/verify): row t attends cache keys [0, pos0 + t] (its own row already written)
//   preview: every row attends cache keys [0, p) and all B fresh block rows (no mask in the block)
// GQA: query head h reads KV head h / (H / Hkv). A row with no keys (causal with na0 = 0 at row
// 0, or empty spans) gives zeros, the empty sum (no pass has one: every row attends itself or its
// block; the CPU's attend_group is not defined there).
// K/V rows are F32 or F16 bits per span (sessions hold F16 pages by default, state_options::
// kv_f16, while a preview block's fresh rows are F32): the kernel is a template on each span's
// element type, chosen at the host entry; F16 is widened exactly (f16_to_f32), as the CPU does.
#include <cstdint>

#include "clover/backend/cuda/runtime.cuh"

namespace clover::backend::cuda_detail {

inline constexpr int attn_warps = 4;
inline constexpr int attn_max_dims_per_lane = 16;  // head_dim <= 512

struct attn_args {
    const float* q;        // [n, H, hd]
    float* out;            // [n, H, hd]
    const void* ka;        // span a (the cache): row j at ka + j * stride_a + kvh * hd (elements)
    const void* va;
    std::int64_t stride_a;
    std::int64_t na0;      // span a length for row 0
    bool causal;           // span a length for row t is na0 + t (else na0 for all rows)
    const void* kb = nullptr;  // span b (preview block rows), length nb, same layout
    const void* vb = nullptr;
    std::int64_t stride_b = 0, nb = 0;
    std::int64_t H = 0, Hkv = 0, hd = 0;
    float scale = 1.f;
    bool a_f16 = false;    // span a holds F16 bits (std::uint16_t), else F32
    bool b_f16 = false;    // span b likewise
};

__device__ inline float kv_value(const float* p, std::int64_t i) { return p[i]; }
__device__ inline float kv_value(const std::uint16_t* p, std::int64_t i) { return f16_to_f32(p[i]); }

// KA, KB: the element types of span a and span b (float or std::uint16_t F16 bits).
template <class KA, class KB>
static __global__ void __launch_bounds__(attn_warps * 32) attention_kernel(attn_args a) {
    CLOVER_LAUNCH_BOUND(attn_warps * 32);
    const std::int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H, kvh = h / (a.H / a.Hkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float* q = a.q + (t * a.H + h) * a.hd;
    const int per_lane = int((a.hd + 31) / 32);
    float qr[attn_max_dims_per_lane], acc[attn_max_dims_per_lane];
#pragma unroll
    for (int d = 0; d < attn_max_dims_per_lane; ++d) {
        const std::int64_t i = lane + 32 * d;
        qr[d] = d < per_lane && i < a.hd ? q[i] : 0.f;
        acc[d] = 0.f;
    }
    const std::int64_t na = a.causal ? a.na0 + t : a.na0, n = na + a.nb;
    float m = -INFINITY, l = 0.f;
    const auto* ka = static_cast<const KA*>(a.ka);
    const auto* va = static_cast<const KA*>(a.va);
    const auto* kb = static_cast<const KB*>(a.kb);
    const auto* vb = static_cast<const KB*>(a.vb);
    for (std::int64_t j = warp; j < n; j += attn_warps) {
        const bool in_a = j < na;
        const std::int64_t ra = in_a ? j * a.stride_a + kvh * a.hd : 0, rb = in_a ? 0 : (j - na) * a.stride_b + kvh * a.hd;
        float s = 0.f;
        // Constant trip counts (guarded) keep qr/acc in registers; a loop bounded by per_lane
        // would put them in local memory (ptxas: 128-byte stack frame).
#pragma unroll
        for (int d = 0; d < attn_max_dims_per_lane; ++d) {
            const std::int64_t i = lane + 32 * d;
            if (d < per_lane && i < a.hd) s += qr[d] * (in_a ? kv_value(ka, ra + i) : kv_value(kb, rb + i));
        }
        s = warp_sum(s) * a.scale;
        const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int d = 0; d < attn_max_dims_per_lane; ++d) {
            const std::int64_t i = lane + 32 * d;
            if (d < per_lane)
                acc[d] = acc[d] * corr + (i < a.hd ? p * (in_a ? kv_value(va, ra + i) : kv_value(vb, rb + i)) : 0.f);
        }
        m = mn;
    }
    // Merge the warps' partial softmaxes.
    CLOVER_SHARED(float, sm, [attn_warps]);
    CLOVER_SHARED(float, sl, [attn_warps]);
    CLOVER_SHARED(float, sacc, [attn_warps][attn_max_dims_per_lane * 32]);
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int d = 0; d < attn_max_dims_per_lane; ++d)
        if (d < per_lane) sacc[warp][lane + 32 * d] = acc[d];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < attn_warps; ++w) M = fmaxf(M, sm[w]);
    float Lsum = 0.f;
    for (int w = 0; w < attn_warps; ++w) Lsum += sm[w] == -INFINITY ? 0.f : sl[w] * expf(sm[w] - M);
    float* out = a.out + (t * a.H + h) * a.hd;
    for (std::int64_t i = threadIdx.x; i < a.hd; i += blockDim.x) {
        float v = 0.f;
        for (int w = 0; w < attn_warps; ++w)
            if (sm[w] != -INFINITY) v += sacc[w][i] * expf(sm[w] - M);
        out[i] = Lsum > 0.f ? v / Lsum : 0.f;  // a row with no keys: zeros, not 0/0
    }
}

inline void attention(const attn_args& a, std::int64_t n_rows, cudaStream_t s) {
    if (n_rows <= 0) return;
    if (a.hd > 32 * attn_max_dims_per_lane) fail("cuda attention: head_dim ", a.hd, " exceeds ", 32 * attn_max_dims_per_lane);
    if (a.H <= 0 || a.Hkv <= 0 || a.H % a.Hkv != 0)
        fail("cuda attention: ", a.H, " query heads do not group over ", a.Hkv, " KV heads");
    const unsigned grid = grid_x("attention_kernel", n_rows * a.H), threads = attn_warps * 32;
    using f16 = std::uint16_t;
    if (!a.a_f16 && !a.b_f16) launch(attention_kernel<float, float>, "attention_kernel<float, float>", grid, threads, 0, s, a);
    else if (a.a_f16 && !a.b_f16) launch(attention_kernel<f16, float>, "attention_kernel<f16, float>", grid, threads, 0, s, a);
    else if (!a.a_f16) launch(attention_kernel<float, f16>, "attention_kernel<float, f16>", grid, threads, 0, s, a);
    else launch(attention_kernel<f16, f16>, "attention_kernel<f16, f16>", grid, threads, 0, s, a);
    check_launch("attention_kernel");
}

}  // namespace clover::backend::cuda_detail
