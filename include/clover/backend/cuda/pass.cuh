#pragma once
// The kernels of a device-resident pass that the older .cuh files do not have (backend/cuda/
// cuda.hpp calls them; each has a CPU twin test in cuda/tests/test_pass.cu):
//   embed_rows      token_embd rows dequantized for every weight format (quant::dequantize_row)
//   split_qg        per head [query | gate] -> q, gate
//   kv_store        the K/V rows of commit/verify rows into the sequence's pages (F16 or F32)
//   paged_attention causal rows over their sequence's pages; preview rows over the pages and
//                   their block's fresh rows; GQA (a KV head's keys read once for its query
//                   heads); split-K over the keys with a merge kernel; the sigmoid gate fused
//   gdn_gates       β = σ(b), g = A·softplus(α + dt) in place
// Rows find their sequence through a per-row descriptor (row_info) uploaded once per pass.
#include <algorithm>
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
static __global__ void __launch_bounds__(256) embed_rows_kernel(const std::uint8_t* w, std::size_t row_bytes, const int* ids, float* h,
                                                                std::int64_t cols) {
    CLOVER_LAUNCH_BOUND(256);
    const std::uint8_t* row = w + std::size_t(ids[blockIdx.x]) * row_bytes;
    float* out = h + std::int64_t(blockIdx.x) * cols;
    for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[i] = dequant_elem<T>(row, i);
}

inline void embed_rows(dtype t, const std::uint8_t* w, std::size_t row_bytes, const int* ids, float* h, std::int64_t n,
                       std::int64_t cols, cudaStream_t s) {
    if (n <= 0) return;
    const unsigned g = grid_x("embed_rows", n);
    switch (t) {
        case dtype::f32: launch(embed_rows_kernel<dtype::f32>, "embed_rows_kernel<dtype::f32>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
        case dtype::f16: launch(embed_rows_kernel<dtype::f16>, "embed_rows_kernel<dtype::f16>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
        case dtype::bf16: launch(embed_rows_kernel<dtype::bf16>, "embed_rows_kernel<dtype::bf16>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
        case dtype::q8_0: launch(embed_rows_kernel<dtype::q8_0>, "embed_rows_kernel<dtype::q8_0>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
        case dtype::q4_k: launch(embed_rows_kernel<dtype::q4_k>, "embed_rows_kernel<dtype::q4_k>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
        case dtype::q5_k: launch(embed_rows_kernel<dtype::q5_k>, "embed_rows_kernel<dtype::q5_k>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
        case dtype::q6_k: launch(embed_rows_kernel<dtype::q6_k>, "embed_rows_kernel<dtype::q6_k>", g, 256, 0, s, w, row_bytes, ids, h, cols); break;
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
static __global__ void __launch_bounds__(256) split_qg_kernel(const float* qg, float* q, float* gate, std::int64_t total, std::int64_t hd) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const std::int64_t head = i / hd, d = i % hd;
    q[i] = qg[head * 2 * hd + d];
    gate[i] = qg[head * 2 * hd + hd + d];
}
inline void split_qg(const float* qg, float* q, float* gate, std::int64_t n_heads_total, std::int64_t hd, cudaStream_t s) {
    const std::int64_t total = n_heads_total * hd;
    if (total <= 0) return;
    launch(split_qg_kernel, "split_qg_kernel", blocks_for("split_qg", total, 256), 256, 0, s, qg, q, gate, total, hd);
    check_launch("split_qg");
}

// K/V rows [n, kvw] into the pages of non-preview rows, rounded to F16 when the pages are F16.
static __global__ void __launch_bounds__(128) kv_store_kernel(const float* k, const float* v, const row_info* rows, kv_layout L, std::int64_t kvw,
                                                              bool f16) {
    CLOVER_LAUNCH_BOUND(128);
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
    launch(kv_store_kernel, "kv_store_kernel", grid_x("kv_store", n), 128, 0, s, k, v, rows, L, kvw, f16);
    check_launch("kv_store");
}

// ---- paged attention: split-K over the keys, one block per (row, KV head, split) ----------------
//
// Flash-decoding: one decode row over a long context is 2 KV heads of work for Clover-35B-A3B,
// far too few blocks for a GPU, and the 8 query heads of a KV head would each read its K/V again.
// So kernel 1 (paged_attention_kernel) gives every block one row, one KV head and one split: the
// keys [z·S, min((z+1)·S, n)) of the row's n keys (its cache rows through the page table, then
// a preview block's fresh rows). A tile of keys is staged in shared memory once and used by all G
// query heads of the group; each head keeps an online softmax (running max m, sum l, weighted
// values acc). A row with more than one split leaves (m, l, acc) per (head, split) in scratch and
// kernel 2 (paged_attention_merge_kernel) merges them in split order; a row with one split
// (n <= S) writes its output, gated, from kernel 1 and kernel 2 skips it.
//
// Row-exactness (verify rows equal the same rows computed alone, whatever the batch): S is a
// fixed number of keys, tiles start at the split's first key, and the merge runs in split order,
// so a row's bits depend only on its own inputs and key count — never on the batch's other rows
// or on grid.z (the pass's most splits; a block past its row's keys exits at once).

inline constexpr int sattn_split = 256;  // S: keys per split (a decode over 32K keys: 128 blocks per KV head)
inline constexpr int sattn_tile = 32;    // keys per shared-memory tile: one key per lane for the scores
inline constexpr int sattn_warps = 4;
inline constexpr int pattn_dims_per_lane = 8;  // head_dim <= 256: value dims lane + 32·x, x < 8
// Partials one launch may write (64 MiB); a pass with more rows runs in launches of fewer rows
// (a prefill chunk over a long cache has many splits per row).
inline constexpr std::size_t sattn_scratch_floats = std::size_t(16) << 20;

struct paged_attn_args {
    const float* q;     // [n, H, hd]
    const float* gate;  // [n, H, hd]
    const float* k;     // [n, Hkv, hd] this pass's rows (preview blocks read theirs from here)
    const float* v;
    float* out;         // [n, H, hd]
    float* part;        // [rows of the launch, H, splits, hd + 2]: m, l, acc[hd] (multi-split rows)
    const row_info* rows;
    kv_layout L;
    std::int64_t H, Hkv, hd;
    float scale;
    bool f16;
    std::int64_t row0 = 0;  // the launch's first row
    std::int64_t splits = 1;
};

template <bool F16>
__device__ inline float kv_at(const std::byte* row, std::int64_t i) {
    if constexpr (F16) return f16_to_f32(reinterpret_cast<const std::uint16_t*>(row)[i]);
    else return reinterpret_cast<const float*>(row)[i];
}

// Kernel 1's dynamic shared memory: the group's queries and accumulators [G, hd] each, m and l
// [G] each, and a tile of keys [tile, hd | 1] and values [tile, hd]. The keys' row stride is odd
// so that the 32 lanes, one key each, read one dimension from 32 different banks.
inline std::size_t split_attention_smem(std::int64_t group, std::int64_t hd) {
    return std::size_t(2 * group * hd + 2 * group + sattn_tile * ((hd | 1) + hd)) * sizeof(float);
}
// True when the kernels take H query heads over Hkv KV heads of hd dims on a device whose
// blocks may opt in to max_smem bytes of shared memory.
inline bool split_attention_fits(std::int64_t H, std::int64_t Hkv, std::int64_t hd, int max_smem) {
    return hd >= 1 && hd <= 32 * pattn_dims_per_lane && Hkv >= 1 && H >= Hkv && H % Hkv == 0 &&
           split_attention_smem(H / Hkv, hd) <= std::size_t(max_smem);
}
inline int pattn_smem_optin(int device) {
    int v = 0;
    CLOVER_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return v;
}

// How a pass's attention is launched: host-known from the batch (its rows' largest key count).
struct split_attn_plan {
    std::int64_t splits = 1;           // grid.z
    std::int64_t rows_per_launch = 0;  // rows of one kernel 1 + kernel 2 launch pair
    std::size_t scratch_floats = 0;    // partials of one launch (0: every row has one split)
    std::size_t smem = 0;              // kernel 1's dynamic shared memory
};
inline split_attn_plan plan_split_attention(std::int64_t n_rows, std::int64_t max_keys, std::int64_t H, std::int64_t Hkv,
                                            std::int64_t hd) {
    split_attn_plan p;
    p.splits = std::max<std::int64_t>(1, (max_keys + sattn_split - 1) / sattn_split);
    const std::int64_t per_row = H * p.splits * (hd + 2);
    p.rows_per_launch = p.splits == 1 ? n_rows : std::clamp<std::int64_t>(std::int64_t(sattn_scratch_floats) / per_row, 1, n_rows);
    p.scratch_floats = p.splits == 1 ? 0 : std::size_t(p.rows_per_launch * per_row);
    p.smem = split_attention_smem(H / Hkv, hd);
    return p;
}

// grid (launch rows · Hkv, 1, splits), sattn_warps warps. Warps load the tile's keys (one key
// per warp at a time, lanes over dimensions), then warp w updates heads w, w + 4, ...: lane j
// scores key j, the tile's probabilities go to every lane by shuffles for the values (lanes own
// dims lane + 32·x). With G < 4 (not Clover-35B-A3B's 8) some warps only load.
// Not yet tuned (no GPU where it was written): the scores read q and k from shared memory, two
// loads per FMA, and a tile is loaded and then used with no overlap; tensor-core scores (the
// group's heads as the M dimension of an mma) and double-buffered tiles are the next steps.
template <bool F16>
static __global__ void __launch_bounds__(sattn_warps * 32) paged_attention_kernel(paged_attn_args a) {
    CLOVER_LAUNCH_BOUND(sattn_warps * 32);
    CLOVER_DYNAMIC_SHARED(float, smem);
    const int hd = int(a.hd), G = int(a.H / a.Hkv), kst = hd | 1;
    const std::int64_t tl = blockIdx.x / a.Hkv, t = a.row0 + tl;
    const int kvh = int(blockIdx.x % a.Hkv);
    const row_info ri = a.rows[t];
    const std::int64_t na = ri.n_cache, n = na + ri.blk_n;
    const std::int64_t j0 = std::int64_t(blockIdx.z) * sattn_split;
    if (j0 >= n) return;  // past this row's keys: the whole block leaves before any barrier
    const std::int64_t j1 = j0 + sattn_split < n ? j0 + sattn_split : n;
    smem_ptr<float> qs = smem;                   // [G, hd]
    smem_ptr<float> accs = qs + G * hd;          // [G, hd]
    smem_ptr<float> ms = accs + G * hd;          // [G]
    smem_ptr<float> ls = ms + G;                 // [G]
    smem_ptr<float> ks = ls + G;                 // [tile, kst]
    smem_ptr<float> vs = ks + sattn_tile * kst;  // [tile, hd]
    const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
    const std::int64_t head0 = t * a.H + std::int64_t(kvh) * G;  // the group's first head: contiguous in q, gate, out
    for (int i = int(threadIdx.x); i < G * hd; i += int(blockDim.x)) {
        qs[i] = a.q[head0 * hd + i];
        accs[i] = 0.f;
    }
    for (int h = int(threadIdx.x); h < G; h += int(blockDim.x)) {
        ms[h] = -INFINITY;
        ls[h] = 0.f;
    }
    const std::size_t kv_off = std::size_t(kvh) * std::size_t(hd) * (F16 ? 2 : 4);
    const std::int64_t kvw = a.Hkv * a.hd;
    for (std::int64_t b0 = j0; b0 < j1; b0 += sattn_tile) {
        const int nt = int(j1 - b0 < sattn_tile ? j1 - b0 : sattn_tile);
        __syncthreads();  // the last tile's readers are done (first time: qs and the state are set)
        for (int j = warp; j < nt; j += sattn_warps) {
            const std::int64_t key = b0 + j;
            smem_ptr<float> kd = ks + j * kst;
            smem_ptr<float> vd = vs + j * hd;
            if (key < na) {
                const std::byte* kr = a.L.row(ri, key, 0) + kv_off;
                const std::byte* vr = a.L.row(ri, key, 1) + kv_off;
                for (int i = lane; i < hd; i += 32) {
                    kd[i] = kv_at<F16>(kr, i);
                    vd[i] = kv_at<F16>(vr, i);
                }
            } else {  // a preview block's fresh row
                const std::int64_t src = (ri.blk_row0 + (key - na)) * kvw + std::int64_t(kvh) * hd;
                for (int i = lane; i < hd; i += 32) {
                    kd[i] = a.k[src + i];
                    vd[i] = a.v[src + i];
                }
            }
        }
        __syncthreads();
        for (int h = warp; h < G; h += sattn_warps) {
            float s = -INFINITY;
            if (lane < nt) {
                smem_ptr<const float> qh = qs + h * hd;
                smem_ptr<const float> kj = ks + lane * kst;
                // Four running sums: one chain of hd dependent FMAs would stall on each one.
                float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
                int d = 0;
                for (; d + 4 <= hd; d += 4) {
                    d0 += qh[d] * kj[d];
                    d1 += qh[d + 1] * kj[d + 1];
                    d2 += qh[d + 2] * kj[d + 2];
                    d3 += qh[d + 3] * kj[d + 3];
                }
                for (; d < hd; ++d) d0 += qh[d] * kj[d];
                s = ((d0 + d1) + (d2 + d3)) * a.scale;
            }
            const float m_old = ms[h], l_old = ls[h];
            const float m_new = fmaxf(m_old, warp_max(s));  // finite: the tile has a key
            const float corr = expf(m_old - m_new);           // 0 on the first tile (m_old = -inf)
            const float p = lane < nt ? expf(s - m_new) : 0.f;
            const float psum = warp_sum(p);
            smem_ptr<float> acc = accs + h * hd;
            float o[pattn_dims_per_lane];
#pragma unroll
            for (int x = 0; x < pattn_dims_per_lane; ++x) {
                const int i = lane + 32 * x;
                o[x] = i < hd ? acc[i] * corr : 0.f;
            }
            for (int j = 0; j < nt; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                smem_ptr<const float> vj = vs + j * hd;
#pragma unroll
                for (int x = 0; x < pattn_dims_per_lane; ++x) {
                    const int i = lane + 32 * x;
                    if (i < hd) o[x] += pj * vj[i];
                }
            }
#pragma unroll
            for (int x = 0; x < pattn_dims_per_lane; ++x) {
                const int i = lane + 32 * x;
                if (i < hd) acc[i] = o[x];  // each lane keeps its own dims: no other lane reads them
            }
            __syncwarp();  // every lane has read ms[h] and ls[h] before lane 0 replaces them
            if (lane == 0) {
                ms[h] = m_new;
                ls[h] = l_old * corr + psum;
            }
        }
    }
    __syncwarp();  // lane 0's last m and l are seen by its warp
    const bool whole = n <= sattn_split;  // the row's only split: its output is final here
    for (int h = warp; h < G; h += sattn_warps) {
        smem_ptr<const float> acc = accs + h * hd;
        if (whole) {
            const float l = ls[h];
            const std::int64_t o0 = (head0 + h) * hd;
            for (int i = lane; i < hd; i += 32) a.out[o0 + i] = acc[i] / l * sigmoid(a.gate[o0 + i]);
        } else {
            float* rec = a.part + ((tl * a.H + std::int64_t(kvh) * G + h) * a.splits + blockIdx.z) * (hd + 2);
            if (lane == 0) {
                rec[0] = ms[h];
                rec[1] = ls[h];
            }
            for (int i = lane; i < hd; i += 32) rec[2 + i] = acc[i];
        }
    }
}

// grid (launch rows · H): the splits of one (row, head) merged in split order, then the gate.
// Rows with one split were finished by kernel 1.
static __global__ void __launch_bounds__(128) paged_attention_merge_kernel(paged_attn_args a) {
    CLOVER_LAUNCH_BOUND(128);
    const std::int64_t tl = blockIdx.x / a.H, t = a.row0 + tl, h = blockIdx.x % a.H;
    const row_info ri = a.rows[t];
    const std::int64_t n = std::int64_t(ri.n_cache) + ri.blk_n, ns = (n + sattn_split - 1) / sattn_split;
    if (ns <= 1) return;
    const std::int64_t rs = a.hd + 2;
    const float* rec = a.part + std::int64_t(blockIdx.x) * a.splits * rs;  // blockIdx.x = tl·H + h
    float M = -INFINITY;
    for (std::int64_t z = 0; z < ns; ++z) M = fmaxf(M, rec[z * rs]);
    float L = 0.f;
    for (std::int64_t z = 0; z < ns; ++z) L += rec[z * rs + 1] * expf(rec[z * rs] - M);
    const std::int64_t o0 = (t * a.H + h) * a.hd;
    for (std::int64_t i = threadIdx.x; i < a.hd; i += blockDim.x) {
        float v = 0.f;
        for (std::int64_t z = 0; z < ns; ++z) v += rec[z * rs + 2 + i] * expf(rec[z * rs] - M);
        a.out[o0 + i] = v / L * sigmoid(a.gate[o0 + i]);
    }
}

// Attention of a pass's n_rows rows; max_keys: the most keys any row attends (commit/verify:
// pos + 1, preview: pos0 + its block). scratch: the pass's partials, grow-only.
inline void paged_attention(paged_attn_args a, std::int64_t n_rows, std::int64_t max_keys, device_buffer& scratch,
                            cudaStream_t s) {
    if (n_rows <= 0) return;
    int dev = 0;
    CLOVER_CUDA_CHECK(cudaGetDevice(&dev));
    const int max_smem = pattn_smem_optin(dev);
    if (!split_attention_fits(a.H, a.Hkv, a.hd, max_smem))
        fail("cuda paged_attention: ", a.H, " query heads over ", a.Hkv, " KV heads of ", a.hd,
             " dims are outside the kernel's limits (head_dim 1..", 32 * pattn_dims_per_lane, ", heads grouped evenly, ",
             split_attention_smem(a.Hkv >= 1 ? a.H / a.Hkv : 0, a.hd), " bytes of shared memory of the device's ", max_smem, ")");
    const split_attn_plan p = plan_split_attention(n_rows, max_keys, a.H, a.Hkv, a.hd);
    const unsigned gz = grid_yz("paged_attention", p.splits);
    if (p.scratch_floats > 0) {
        // Rounded up to a power of two: a decode's splits grow by one every S keys, and every
        // reallocation frees the old buffer (a device-wide wait).
        const std::size_t bytes = p.scratch_floats * sizeof(float);
        std::size_t r = 1;
        while (r < bytes) r <<= 1;
        scratch.reserve(std::max(bytes, std::min(r, sattn_scratch_floats * sizeof(float))));
        a.part = scratch.get<float>();
    }
    a.splits = p.splits;
    // The cap raised to the device's limit, not to this launch's need: the attribute belongs to
    // the kernel, and another thread launching another shape (a second model) must never lower
    // it between this call and this launch.
    if (a.f16) CLOVER_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    else CLOVER_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    for (std::int64_t r0 = 0; r0 < n_rows; r0 += p.rows_per_launch) {
        const std::int64_t nr = std::min(p.rows_per_launch, n_rows - r0);
        a.row0 = r0;
        const dim3 grid(grid_x("paged_attention", nr * a.Hkv), 1, gz);
        if (a.f16) launch(paged_attention_kernel<true>, "paged_attention_kernel<true>", grid, sattn_warps * 32, p.smem, s, a);
        else launch(paged_attention_kernel<false>, "paged_attention_kernel<false>", grid, sattn_warps * 32, p.smem, s, a);
        check_launch("paged_attention");
        // Launched even when no row has a second split (its blocks exit at once): a decode's
        // node list then stays the same when its context passes S keys, so a captured CUDA
        // graph (graph.cuh) is updated in place rather than instantiated again.
        launch(paged_attention_merge_kernel, "paged_attention_merge_kernel", grid_x("paged_attention_merge", nr * a.H), 128, 0, s, a);
        check_launch("paged_attention_merge");
    }
}

// ---- Gated DeltaNet gates ----------------------------------------------------------------------

// beta [n, Hv] <- σ(beta); alpha [n, Hv] <- A[h]·softplus(alpha + dt[h]) (gdn_mix's first loop).
static __global__ void __launch_bounds__(256) gdn_gates_kernel(float* beta, float* alpha, const float* A, const float* dt, std::int64_t total,
                                                               std::int64_t Hv) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const std::int64_t h = i % Hv;
    beta[i] = sigmoid(beta[i]);
    alpha[i] = A[h] * softplus(alpha[i] + dt[h]);
}
inline void gdn_gates(float* beta, float* alpha, const float* A, const float* dt, std::int64_t n, std::int64_t Hv,
                      cudaStream_t s) {
    if (n * Hv <= 0) return;
    launch(gdn_gates_kernel, "gdn_gates_kernel", blocks_for("gdn_gates", n * Hv, 256), 256, 0, s, beta, alpha, A, dt, n * Hv, Hv);
    check_launch("gdn_gates");
}

}  // namespace clover::backend::cuda_detail
