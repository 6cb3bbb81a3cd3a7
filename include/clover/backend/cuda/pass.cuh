#pragma once
// The kernels of a device-resident pass that the older .cuh files do not have (backend/cuda/
// cuda.hpp calls them; each has a CPU twin test in cuda/tests/test_pass.cu):
//   embed_rows      token_embd rows dequantized for every weight format (quant::dequantize_row)
//   split_qg        per head [query | gate] -> q, gate
//   kv_store        the K/V rows of commit/verify rows into the sequence's pages (F16 or F32)
//   paged_attention causal rows over their sequence's pages; preview rows over the pages and
//                   their block's fresh rows; GQA; the sigmoid output gate fused
//   gdn_gates       β = σ(b), g = A·softplus(α + dt) in place
// Rows find their sequence through a per-row descriptor (row_info) uploaded once per pass.
#include <cstddef>
#include <cstdint>

#include "clover/backend/cuda/runtime.cuh"
#include "clover/core/dtype.hpp"

namespace clover::backend::cuda_detail {

// ---- embedding ---------------------------------------------------------------------------------

__device__ inline int k4_scale(const std::uint8_t* b, int j, bool want_min) {
    if (j < 4) return want_min ? (b[j + 4] & 63) : (b[j] & 63);
    return want_min ? ((b[j + 4] >> 4) | ((b[j] >> 6) << 4)) : ((b[j + 4] & 15) | ((b[j - 4] >> 6) << 4));
}

// Element i of a weight row, exactly as quant::dequantize_row computes it (the _rn intrinsics
// keep nvcc from contracting the products into an fma the CPU does not do).
template <dtype T>
__device__ inline float dequant_elem(const std::uint8_t* row, std::int64_t i) {
    if constexpr (T == dtype::f32) {
        return load_f32(row + 4 * i);
    } else if constexpr (T == dtype::f16) {
        return f16_to_f32(load_u16(row + 2 * i));
    } else if constexpr (T == dtype::bf16) {
        return bf16_to_f32(load_u16(row + 2 * i));
    } else if constexpr (T == dtype::q8_0) {
        const std::uint8_t* b = row + (i / 32) * 34;
        return __fmul_rn(f16_to_f32(load_u16(b)), float(std::int8_t(b[2 + i % 32])));
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        constexpr int bb = T == dtype::q4_k ? 144 : 176;
        const std::uint8_t* b = row + (i / 256) * bb;
        const int e = int(i % 256), j = e / 32, l = e % 32;
        const std::uint8_t* qs = b + (T == dtype::q4_k ? 16 : 48) + 32 * (j / 2);
        int q = j % 2 == 0 ? (qs[l] & 15) : (qs[l] >> 4);
        if constexpr (T == dtype::q5_k) q |= ((b[16 + l] >> j) & 1) << 4;
        const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
        const float hi = __fmul_rn(__fmul_rn(d, float(k4_scale(b + 4, j, false))), float(q));
        return __fsub_rn(hi, __fmul_rn(dmin, float(k4_scale(b + 4, j, true))));
    } else if constexpr (T == dtype::q6_k) {
        const std::uint8_t* b = row + (i / 256) * 210;
        const int e = int(i % 256), h = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const std::uint8_t lo = b[64 * h + (k & 1) * 32 + l];
        const int low = k < 2 ? (lo & 15) : (lo >> 4);
        const int code = (low | (((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
        const float d = f16_to_f32(load_u16(b + 208));
        return __fmul_rn(__fmul_rn(d, float(std::int8_t(b[192 + e / 16]))), float(code));
    } else {
        return 0.f;
    }
}

// h[t, :] = row ids[t] of w, dequantized. One block per row.
template <dtype T>
static __global__ void embed_rows_kernel(const std::uint8_t* w, std::size_t row_bytes, const int* ids, float* h,
                                         std::int64_t cols) {
    const std::uint8_t* row = w + std::size_t(ids[blockIdx.x]) * row_bytes;
    float* out = h + std::int64_t(blockIdx.x) * cols;
    for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[i] = dequant_elem<T>(row, i);
}

inline void embed_rows(dtype t, const std::uint8_t* w, std::size_t row_bytes, const int* ids, float* h, std::int64_t n,
                       std::int64_t cols, cudaStream_t s) {
    if (n <= 0) return;
    const unsigned g = grid_x("embed_rows", n);
    switch (t) {
        case dtype::f32: embed_rows_kernel<dtype::f32><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        case dtype::f16: embed_rows_kernel<dtype::f16><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        case dtype::bf16: embed_rows_kernel<dtype::bf16><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        case dtype::q8_0: embed_rows_kernel<dtype::q8_0><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        case dtype::q4_k: embed_rows_kernel<dtype::q4_k><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        case dtype::q5_k: embed_rows_kernel<dtype::q5_k><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        case dtype::q6_k: embed_rows_kernel<dtype::q6_k><<<g, 256, 0, s>>>(w, row_bytes, ids, h, cols); break;
        default: fail("cuda embed_rows: no kernel for token_embd of type ", dtype_name(t));
    }
    check_launch("embed_rows");
}

// ---- attention ---------------------------------------------------------------------------------

// What a row of the pass needs to find its sequence's KV rows.
struct row_info {
    std::int32_t pos;      // its position
    std::int32_t n_cache;  // cache rows it attends: pos + 1 (commit/verify) or pos0 (preview)
    std::int32_t pages;    // offset of its sequence's page ids in the pass's page list
    std::int32_t blk_row0; // preview: the block's first row in the batch and its length
    std::int32_t blk_n;    //          (0: not a preview row; its K/V go to the pages)
};

// Where attention slot a's rows live (state_pool's layout): a row of page g at
// base[g / chunk][which] + ((g % chunk) * page + r) * row_bytes.
struct kv_layout {
    const std::byte* const* base;  // [n_chunks][2] for this slot: K, V
    const std::int32_t* page_ids;  // the pass's page list
    std::int64_t page, chunk;
    std::size_t row_bytes;
    __device__ const std::byte* row(const row_info& ri, std::int64_t pos, int which) const {
        const std::int64_t g = page_ids[ri.pages + pos / page];
        return base[(g / chunk) * 2 + which] + std::size_t((g % chunk) * page + pos % page) * row_bytes;
    }
};

// q/gate from qg [n, H, 2, hd].
static __global__ void split_qg_kernel(const float* qg, float* q, float* gate, std::int64_t total, std::int64_t hd) {
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const std::int64_t head = i / hd, d = i % hd;
    q[i] = qg[head * 2 * hd + d];
    gate[i] = qg[head * 2 * hd + hd + d];
}
inline void split_qg(const float* qg, float* q, float* gate, std::int64_t n_heads_total, std::int64_t hd, cudaStream_t s) {
    const std::int64_t total = n_heads_total * hd;
    if (total <= 0) return;
    split_qg_kernel<<<blocks_for("split_qg", total, 256), 256, 0, s>>>(qg, q, gate, total, hd);
    check_launch("split_qg");
}

// K/V rows [n, kvw] into the pages of non-preview rows, rounded to F16 when the pages are F16.
static __global__ void kv_store_kernel(const float* k, const float* v, const row_info* rows, kv_layout L, std::int64_t kvw,
                                       bool f16) {
    const row_info ri = rows[blockIdx.x];
    if (ri.blk_n > 0) return;  // preview rows never reach the cache
    const float* kr = k + std::int64_t(blockIdx.x) * kvw;
    const float* vr = v + std::int64_t(blockIdx.x) * kvw;
    std::byte* kd = const_cast<std::byte*>(L.row(ri, ri.pos, 0));
    std::byte* vd = const_cast<std::byte*>(L.row(ri, ri.pos, 1));
    for (std::int64_t i = threadIdx.x; i < kvw; i += blockDim.x) {
        if (f16) {
            reinterpret_cast<std::uint16_t*>(kd)[i] = f32_to_f16(kr[i]);
            reinterpret_cast<std::uint16_t*>(vd)[i] = f32_to_f16(vr[i]);
        } else {
            reinterpret_cast<float*>(kd)[i] = kr[i];
            reinterpret_cast<float*>(vd)[i] = vr[i];
        }
    }
}
inline void kv_store(const float* k, const float* v, const row_info* rows, std::int64_t n, const kv_layout& L,
                     std::int64_t kvw, bool f16, cudaStream_t s) {
    if (n <= 0) return;
    kv_store_kernel<<<grid_x("kv_store", n), 128, 0, s>>>(k, v, rows, L, kvw, f16);
    check_launch("kv_store");
}

inline constexpr int pattn_warps = 4;
inline constexpr int pattn_dims_per_lane = 8;  // head_dim <= 256

struct paged_attn_args {
    const float* q;     // [n, H, hd]
    const float* gate;  // [n, H, hd]
    const float* k;     // [n, Hkv, hd] this pass's rows (preview blocks read theirs from here)
    const float* v;
    float* out;         // [n, H, hd]
    const row_info* rows;
    kv_layout L;
    std::int64_t H, Hkv, hd;
    float scale;
    bool f16;
};

template <bool F16>
__device__ inline float kv_at(const std::byte* row, std::int64_t i) {
    if constexpr (F16) return f16_to_f32(reinterpret_cast<const std::uint16_t*>(row)[i]);
    else return reinterpret_cast<const float*>(row)[i];
}

// One block per (row, head); its warps split the keys with an online softmax each, merged at
// the end (the same scheme as attention.cuh), then the output gate. Keys: the row's cache
// positions [0, n_cache) through the page table, then (preview) its block's fresh rows.
template <bool F16>
static __global__ void __launch_bounds__(pattn_warps * 32) paged_attention_kernel(paged_attn_args a) {
    const std::int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H, kvh = h / (a.H / a.Hkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const row_info ri = a.rows[t];
    const float* q = a.q + (t * a.H + h) * a.hd;
    const int per_lane = int((a.hd + 31) / 32);
    float qr[pattn_dims_per_lane], acc[pattn_dims_per_lane];
#pragma unroll
    for (int d = 0; d < pattn_dims_per_lane; ++d) {
        const std::int64_t i = lane + 32 * d;
        qr[d] = d < per_lane && i < a.hd ? q[i] : 0.f;
        acc[d] = 0.f;
    }
    const std::int64_t na = ri.n_cache, n = na + ri.blk_n, kvw = a.Hkv * a.hd;
    float m = -INFINITY, l = 0.f;
    for (std::int64_t j = warp; j < n; j += pattn_warps) {
        float s = 0.f;
        if (j < na) {
            const std::byte* kj = a.L.row(ri, j, 0) + std::size_t(kvh * a.hd) * (F16 ? 2 : 4);
#pragma unroll
            for (int d = 0; d < pattn_dims_per_lane; ++d) {
                const std::int64_t i = lane + 32 * d;
                if (d < per_lane && i < a.hd) s += qr[d] * kv_at<F16>(kj, i);
            }
        } else {
            const float* kj = a.k + (ri.blk_row0 + (j - na)) * kvw + kvh * a.hd;
#pragma unroll
            for (int d = 0; d < pattn_dims_per_lane; ++d) {
                const std::int64_t i = lane + 32 * d;
                if (d < per_lane && i < a.hd) s += qr[d] * kj[i];
            }
        }
        s = warp_sum(s) * a.scale;
        const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        if (j < na) {
            const std::byte* vj = a.L.row(ri, j, 1) + std::size_t(kvh * a.hd) * (F16 ? 2 : 4);
#pragma unroll
            for (int d = 0; d < pattn_dims_per_lane; ++d) {
                const std::int64_t i = lane + 32 * d;
                if (d < per_lane) acc[d] = acc[d] * corr + (i < a.hd ? p * kv_at<F16>(vj, i) : 0.f);
            }
        } else {
            const float* vj = a.v + (ri.blk_row0 + (j - na)) * kvw + kvh * a.hd;
#pragma unroll
            for (int d = 0; d < pattn_dims_per_lane; ++d) {
                const std::int64_t i = lane + 32 * d;
                if (d < per_lane) acc[d] = acc[d] * corr + (i < a.hd ? p * vj[i] : 0.f);
            }
        }
        m = mn;
    }
    __shared__ float sm[pattn_warps], sl[pattn_warps];
    __shared__ float sacc[pattn_warps][pattn_dims_per_lane * 32];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int d = 0; d < pattn_dims_per_lane; ++d)
        if (d < per_lane) sacc[warp][lane + 32 * d] = acc[d];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < pattn_warps; ++w) M = fmaxf(M, sm[w]);
    float Lsum = 0.f;
    for (int w = 0; w < pattn_warps; ++w) Lsum += sm[w] == -INFINITY ? 0.f : sl[w] * expf(sm[w] - M);
    const std::int64_t o0 = (t * a.H + h) * a.hd;
    for (std::int64_t i = threadIdx.x; i < a.hd; i += blockDim.x) {
        float v = 0.f;
        for (int w = 0; w < pattn_warps; ++w)
            if (sm[w] != -INFINITY) v += sacc[w][i] * expf(sm[w] - M);
        a.out[o0 + i] = v / Lsum * sigmoid(a.gate[o0 + i]);
    }
}

inline void paged_attention(const paged_attn_args& a, std::int64_t n_rows, cudaStream_t s) {
    if (n_rows <= 0) return;
    if (a.hd > 32 * pattn_dims_per_lane) fail("cuda paged_attention: head_dim ", a.hd, " exceeds ", 32 * pattn_dims_per_lane);
    if (a.Hkv < 1 || a.H % a.Hkv != 0) fail("cuda paged_attention: ", a.H, " query heads do not group over ", a.Hkv, " KV heads");
    const unsigned g = grid_x("paged_attention", n_rows * a.H);
    if (a.f16) paged_attention_kernel<true><<<g, pattn_warps * 32, 0, s>>>(a);
    else paged_attention_kernel<false><<<g, pattn_warps * 32, 0, s>>>(a);
    check_launch("paged_attention");
}

// ---- Gated DeltaNet gates ----------------------------------------------------------------------

// beta [n, Hv] <- σ(beta); alpha [n, Hv] <- A[h]·softplus(alpha + dt[h]) (gdn_mix's first loop).
static __global__ void gdn_gates_kernel(float* beta, float* alpha, const float* A, const float* dt, std::int64_t total,
                                        std::int64_t Hv) {
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const std::int64_t h = i % Hv;
    beta[i] = sigmoid(beta[i]);
    alpha[i] = A[h] * softplus(alpha[i] + dt[h]);
}
inline void gdn_gates(float* beta, float* alpha, const float* A, const float* dt, std::int64_t n, std::int64_t Hv,
                      cudaStream_t s) {
    if (n * Hv <= 0) return;
    gdn_gates_kernel<<<blocks_for("gdn_gates", n * Hv, 256), 256, 0, s>>>(beta, alpha, A, dt, n * Hv, Hv);
    check_launch("gdn_gates");
}

}  // namespace clover::backend::cuda_detail
