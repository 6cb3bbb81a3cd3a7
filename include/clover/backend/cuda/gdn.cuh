#pragma once
// Gated DeltaNet on the device (architecture.md §2.4, layers/gated_deltanet.hpp and
// layers/gdn_kernels.hpp are the CPU twins):
//   conv_silu        causal depthwise conv over [ring ; rows] (+ look-ahead taps for preview), SiLU
//   advance_ring     the ring after consuming the rows
//   l2norm_qk        per-head L2 norm of q and k (q also scaled)
//   gdn_scan         the fused recurrent step: gates from the raw β/α projections, decay,
//                    kv = Sᵀk, δ = β(v − kv), S += kδᵀ, o = Sᵀq, and the gated RMSNorm of o,
//                    token after token (decode: one token; also the verify/rollback replay)
//   gdn_chunked      the chunked WY/UT form for prefill, one block per V head
//   block_softmax    the preview pass's block softmax with a history slot
// State S is [Hv][dk][dv] fp32 (row = key index), as in the session.
#include <climits>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "clover/backend/cuda/runtime.cuh"

namespace clover::backend::cuda_detail {

// Where the heads of one conv-output row y [C] are: q at qk*dk, k at Hk*dk + qk*dk, v at
// 2*Hk*dk + h*dv; the QK head of V head h is h / (Hv/Hk) (grouped) or h % Hk (hparams).
struct gdn_layout {
    std::int64_t C, Hk, Hv, dk, dv;
    bool grouped;
    __host__ __device__ std::int64_t qk_of(std::int64_t h) const { return grouped ? h / (Hv / Hk) : h % Hk; }
};

// y[t, c] = silu(Σ_i wc[c, i] · in(t-K+1+i, c) + Σ_d right[c, d-1] · m[t+d, c]) over [ring ; m].
static __global__ void __launch_bounds__(256) conv_silu_kernel(const float* ring, const float* m, const float* wc, const float* right, float* y,
                                                        std::int64_t n, std::int64_t C, int K) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= n * C) return;
    const std::int64_t t = id / C, c = id % C;
    float s = 0.f;
    for (int i = 0; i < K; ++i) {
        const std::int64_t tau = t - K + 1 + i;
        s += wc[c * K + i] * (tau < 0 ? ring[(tau + K - 1) * C + c] : m[tau * C + c]);
    }
    if (right)
        for (int d = 1; d < K && t + d < n; ++d) s += right[c * (K - 1) + d - 1] * m[(t + d) * C + c];
    y[id] = silu(s);
}

// new_ring[r] = row n-(K-1)+r of [ring ; m]; written to a separate buffer (rows move backwards).
static __global__ void __launch_bounds__(256) advance_ring_kernel(const float* ring, const float* m, float* out, std::int64_t n, std::int64_t C, int K) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= std::int64_t(K - 1) * C) return;
    const std::int64_t r = id / C, c = id % C, tau = n - (K - 1) + r;
    out[id] = tau < 0 ? ring[(tau + K - 1) * C + c] : m[tau * C + c];
}

inline void conv_silu(const float* ring, const float* m, const float* wc, const float* right, float* y, std::int64_t n,
                      std::int64_t C, int K, cudaStream_t s) {
    if (n * C <= 0) return;
    launch(conv_silu_kernel, "conv_silu_kernel", blocks_for("conv_silu_kernel", n * C, 256), 256, 0, s, ring, m, wc, right, y, n, C, K);
    check_launch("conv_silu");
}
inline void advance_ring(const float* ring, const float* m, float* out, std::int64_t n, std::int64_t C, int K,
                         cudaStream_t s) {
    if (K <= 1) return;
    launch(advance_ring_kernel, "advance_ring_kernel", blocks_for("advance_ring_kernel", (K - 1) * C, 256), 256, 0, s, ring, m, out, n, C, K);
    check_launch("advance_ring");
}

// One block of 128 per (row, q-or-k head): x / sqrt(Σx² + eps) (math::l2_norm, double sum),
// q heads also times q_scale.
static __global__ void __launch_bounds__(128) l2norm_qk_kernel(float* y, gdn_layout L, float eps, float q_scale) {
    CLOVER_LAUNCH_BOUND(128);
    using reduce = cub::BlockReduce<double, 128>;
    CLOVER_SHARED(typename reduce::TempStorage, tmp);
    CLOVER_SHARED(float, scale);
    const std::int64_t t = blockIdx.x / (2 * L.Hk), hh = blockIdx.x % (2 * L.Hk);
    float* x = y + t * L.C + hh * L.dk;  // hh < Hk: q heads; then the k heads follow contiguously
    double ss = 0;
    for (std::int64_t i = threadIdx.x; i < L.dk; i += 128) ss += double(x[i]) * double(x[i]);
    ss = reduce(tmp).Sum(ss);
    if (threadIdx.x == 0) scale = 1.f / sqrtf(float(ss) + eps);
    __syncthreads();
    const bool is_q = hh < L.Hk;
    for (std::int64_t i = threadIdx.x; i < L.dk; i += 128) {
        float v = x[i] * scale;
        if (is_q && q_scale != 1.f) v *= q_scale;
        x[i] = v;
    }
}

inline void l2norm_qk(float* y, std::int64_t n, const gdn_layout& L, float eps, float q_scale, cudaStream_t s) {
    if (n <= 0) return;
    launch(l2norm_qk_kernel, "l2norm_qk_kernel", grid_x("l2norm_qk_kernel", n * 2 * L.Hk), 128, 0, s, y, L, eps, q_scale);
    check_launch("l2norm_qk");
}

struct gdn_scan_args {
    float* S;                 // [Hv][dk][dv], updated in place
    const float* y;           // [n, C] post-conv, normalised rows
    const float* beta;        // [n, Hv]: raw projections when A != null, else sigmoid(β) already
    const float* g;           // [n, Hv]: raw α projections when A != null, else log-decay g
    const float* A = nullptr; // ssm_a and dt_bias: gates computed here (β = σ(b), g = A·softplus(α + dt))
    const float* dt_bias = nullptr;
    float* o;                 // [n, Hv*dv]
    const float* norm_w = nullptr;  // non-null: o ← RMSNorm_dv(o)·w ⊙ silu(z), fused
    const float* z = nullptr;       // [n, Hv*dv]
    float eps = 1e-6f;
    std::int64_t n;
};

// One block per V head, one thread per value column j. Column j of S is touched only by thread
// j, so the recurrence needs no reduction across threads; q_t and k_t sit in shared memory. The
// per-element operation order is the CPU's (gdn_recurrent), so results agree to fp32 rounding.
// S stays in global memory (L2-resident between the two passes of a token); gdn_scan_reg_kernel
// below holds the column in registers instead and is what gdn_scan launches when dk <= 128.
// ptxas -warn-spills reports a small spill here (~44 bytes): registers saved around the IEEE
// double division ss / dv of the fused norm, a called subroutine on the GPU. It is kept because
// it is the CPU's formula bit for bit (math::rms_norm), run once per token by one thread.
template <int MaxThreads = 256>
static __global__ void __launch_bounds__(MaxThreads) gdn_scan_kernel(gdn_scan_args a, gdn_layout L) {
    CLOVER_LAUNCH_BOUND(MaxThreads);
    CLOVER_DYNAMIC_SHARED(float, sh);  // q[dk], k[dk]
    using reduce = cub::BlockReduce<double, MaxThreads>;
    CLOVER_SHARED(typename reduce::TempStorage, tmp);
    CLOVER_SHARED(float, nscale);
    const std::int64_t h = blockIdx.x, kh = L.qk_of(h), dk = L.dk, dv = L.dv, inner = L.Hv * dv;
    float* S = a.S + h * dk * dv;
    smem_ptr<float> qs = sh;
    smem_ptr<float> ks = sh + dk;
    for (std::int64_t t = 0; t < a.n; ++t) {
        const float* yr = a.y + t * L.C;
        for (std::int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = yr[kh * dk + i];
            ks[i] = yr[L.Hk * dk + kh * dk + i];
        }
        __syncthreads();
        float beta = a.beta[t * L.Hv + h], g = a.g[t * L.Hv + h];
        if (a.A) {
            beta = sigmoid(beta);
            g = a.A[h] * softplus(g + a.dt_bias[h]);
        }
        const float decay = expf(g);
        for (std::int64_t j = threadIdx.x; j < dv || j == threadIdx.x; j += blockDim.x) {
            float o = 0.f;
            if (j < dv) {
                float kv = 0.f;
                for (std::int64_t i = 0; i < dk; ++i) {
                    const float s = S[i * dv + j] * decay;
                    S[i * dv + j] = s;
                    kv += s * ks[i];
                }
                const float d = beta * (yr[2 * L.Hk * dk + h * dv + j] - kv);
                for (std::int64_t i = 0; i < dk; ++i) {
                    const float s = S[i * dv + j] + ks[i] * d;
                    S[i * dv + j] = s;
                    o += s * qs[i];
                }
            }
            if (!a.norm_w) {
                if (j < dv) a.o[t * inner + h * dv + j] = o;
                continue;
            }
            // Fused gated RMSNorm: needs every column of this head (dv <= blockDim, checked at launch).
            const double ss = reduce(tmp).Sum(j < dv ? double(o) * double(o) : 0.0);
            if (threadIdx.x == 0) nscale = 1.f / sqrtf(float(ss / double(dv)) + a.eps);
            __syncthreads();
            if (j < dv) {
                const float zz = a.z[t * inner + h * dv + j];
                a.o[t * inner + h * dv + j] = o * nscale * a.norm_w[j] * silu(zz);
            }
        }
        __syncthreads();  // q/k of the next token overwrite shared memory
    }
}

// The same step with thread j's column of S in registers for the whole segment: S is read from
// global memory once and written once per launch (gdn_scan_kernel reads it three times and writes
// it twice per token). Every float operation is gdn_scan_kernel's, in the same order (the column's
// loops are unrolled over a compile-time bound DK >= dk with `i < dk` guards, so `col[i]` stays in
// registers), hence the same bits. Needs dv <= MaxThreads (one column per thread) and dk <= DK.
// Unmeasured: no GPU was lent while this was written; for the 35B-A3B shape (dk = dv = 128, one
// decode token) it removes 4 of the 5 passes over the head's 64 KiB of state.
template <int DK, int MaxThreads = 256>
static __global__ void __launch_bounds__(MaxThreads) gdn_scan_reg_kernel(gdn_scan_args a, gdn_layout L) {
    CLOVER_LAUNCH_BOUND(MaxThreads);
    CLOVER_DYNAMIC_SHARED(float, sh);  // q[dk], k[dk]
    using reduce = cub::BlockReduce<double, MaxThreads>;
    CLOVER_SHARED(typename reduce::TempStorage, tmp);
    CLOVER_SHARED(float, nscale);
    const std::int64_t h = blockIdx.x, kh = L.qk_of(h), dk = L.dk, dv = L.dv, inner = L.Hv * dv;
    const std::int64_t j = threadIdx.x;
    float* S = a.S + h * dk * dv;
    smem_ptr<float> qs = sh;
    smem_ptr<float> ks = sh + dk;
    float col[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = (i < dk && j < dv) ? S[i * dv + j] : 0.f;
    for (std::int64_t t = 0; t < a.n; ++t) {
        const float* yr = a.y + t * L.C;
        for (std::int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = yr[kh * dk + i];
            ks[i] = yr[L.Hk * dk + kh * dk + i];
        }
        __syncthreads();
        float beta = a.beta[t * L.Hv + h], g = a.g[t * L.Hv + h];
        if (a.A) {
            beta = sigmoid(beta);
            g = a.A[h] * softplus(g + a.dt_bias[h]);
        }
        const float decay = expf(g);
        float o = 0.f;
        if (j < dv) {
            float kv = 0.f;
#pragma unroll
            for (int i = 0; i < DK; ++i)
                if (i < dk) {
                    col[i] = col[i] * decay;
                    kv += col[i] * ks[i];
                }
            const float d = beta * (yr[2 * L.Hk * dk + h * dv + j] - kv);
#pragma unroll
            for (int i = 0; i < DK; ++i)
                if (i < dk) {
                    col[i] = col[i] + ks[i] * d;
                    o += col[i] * qs[i];
                }
        }
        if (!a.norm_w) {
            if (j < dv) a.o[t * inner + h * dv + j] = o;
        } else {
            const double ss = reduce(tmp).Sum(j < dv ? double(o) * double(o) : 0.0);
            if (threadIdx.x == 0) nscale = 1.f / sqrtf(float(ss / double(dv)) + a.eps);
            __syncthreads();
            if (j < dv) {
                const float zz = a.z[t * inner + h * dv + j];
                a.o[t * inner + h * dv + j] = o * nscale * a.norm_w[j] * silu(zz);
            }
        }
        __syncthreads();  // q/k of the next token overwrite shared memory
    }
    if (j < dv) {
#pragma unroll
        for (int i = 0; i < DK; ++i)
            if (i < dk) S[i * dv + j] = col[i];
    }
}

// force_global: the S-in-global-memory kernel whatever the shape (the twin test of the register
// form compares the two bit for bit).
inline void gdn_scan(const gdn_scan_args& a, const gdn_layout& L, cudaStream_t s, bool force_global = false) {
    if (a.n <= 0) return;
    constexpr int T = 256;
    if (a.norm_w && L.dv > T) fail("gdn_scan: the fused norm needs dv <= ", T, " (dv is ", L.dv, ")");
    const std::size_t smem = std::size_t(2 * L.dk) * 4;  // q and k of a token: past 48 KB only for the global kernel (dk > 128)
    const unsigned grid = grid_x("gdn_scan_kernel", L.Hv);
    if (!force_global && L.dv <= T && L.dk <= 128) {
        if (L.dk <= 32) launch(gdn_scan_reg_kernel<32, T>, "gdn_scan_reg_kernel<32, T>", grid, T, smem, s, a, L);
        else if (L.dk <= 64) launch(gdn_scan_reg_kernel<64, T>, "gdn_scan_reg_kernel<64, T>", grid, T, smem, s, a, L);
        else launch(gdn_scan_reg_kernel<128, T>, "gdn_scan_reg_kernel<128, T>", grid, T, smem, s, a, L);
    } else {
        dynamic_smem(gdn_scan_kernel<T>, "gdn_scan_kernel", smem, " (q and k of head dim ", L.dk, ")");
        launch(gdn_scan_kernel<T>, "gdn_scan_kernel<T>", grid, T, smem, s, a, L);
    }
    check_launch("gdn_scan");
}

// o: [rows, Hv, dv] in place ← RMSNorm per head (shared weight w[dv]) ⊙ silu(z) (gated_norm_out
// before its projection). One block per (row, head).
static __global__ void __launch_bounds__(128) gated_norm_kernel(float* o, const float* z, const float* w, std::int64_t dv, float eps) {
    CLOVER_LAUNCH_BOUND(128);
    using reduce = cub::BlockReduce<double, 128>;
    CLOVER_SHARED(typename reduce::TempStorage, tmp);
    CLOVER_SHARED(float, scale);
    float* oh = o + std::int64_t(blockIdx.x) * dv;
    const float* zh = z + std::int64_t(blockIdx.x) * dv;
    double ss = 0;
    for (std::int64_t j = threadIdx.x; j < dv; j += 128) ss += double(oh[j]) * double(oh[j]);
    ss = reduce(tmp).Sum(ss);
    if (threadIdx.x == 0) scale = 1.f / sqrtf(float(ss / double(dv)) + eps);
    __syncthreads();
    for (std::int64_t j = threadIdx.x; j < dv; j += 128) oh[j] = oh[j] * scale * w[j] * silu(zh[j]);
}

inline void gated_norm(float* o, const float* z, const float* w, std::int64_t rows_heads, std::int64_t dv, float eps,
                       cudaStream_t s) {
    if (rows_heads <= 0) return;
    launch(gated_norm_kernel, "gated_norm_kernel", grid_x("gated_norm_kernel", rows_heads), 128, 0, s, o, z, w, dv, eps);
    check_launch("gated_norm");
}

// Chunked WY form (gdn_kernels.hpp gdn_chunked, same chunk length => same arithmetic per
// element up to fma contraction): per chunk, A and the decayed q·k in shared memory, the forward
// substitution column by column (column c of U/W depends only on earlier rows of the same
// column, so each thread owns its columns and no barrier is needed inside it), Δ = U − W S0,
// outputs, then the state update — each step a parallel loop over the block. One block per V
// head; gates must already be applied (β in (0,1), g = log-decay).
template <int Threads = 256>
static __global__ void __launch_bounds__(Threads) gdn_chunked_kernel(float* S_all, const float* y, const float* beta_all,
                                                              const float* g_all, float* o_all, gdn_layout L,
                                                              std::int64_t n, int chunk) {
    CLOVER_LAUNCH_BOUND(Threads);
    CLOVER_DYNAMIC_SHARED(float, sh);
    const std::int64_t h = blockIdx.x, kh = L.qk_of(h), dk = L.dk, dv = L.dv, inner = L.Hv * dv, C = L.C;
    float* S = S_all + h * dk * dv;
    // 32-bit element indices (dk·dv and chunk·dk checked on the host): a 64-bit division is a
    // called subroutine on the GPU, whose saved registers ptxas reports as spills.
    const int dki = int(dk), dvi = int(dv);
    const int Lc = chunk;
    smem_ptr<float> q = sh;                       // [Lc, dk]
    smem_ptr<float> k = q + Lc * dk;              // [Lc, dk]
    smem_ptr<float> U = k + Lc * dk;              // [Lc, dv]  (becomes Δ)
    smem_ptr<float> W = U + Lc * dv;              // [Lc, dk]
    smem_ptr<float> A = W + Lc * dk;              // [Lc, Lc]
    smem_ptr<float> QK = A + Lc * Lc;             // [Lc, Lc]
    smem_ptr<float> gm = QK + Lc * Lc;            // [Lc] cumulative g
    smem_ptr<float> bt = gm + Lc;                 // [Lc] β
    smem_ptr<float> dec = bt + Lc;                // [Lc] e^{γ_L − γ_s}
    for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
        const int Ln = int(n - c0 < chunk ? n - c0 : chunk);
        for (int id = threadIdx.x; id < Ln * dki; id += Threads) {
            const int t = id / dki, i = id % dki;
            const float* yr = y + (c0 + t) * C;
            q[id] = yr[kh * dk + i];
            k[id] = yr[L.Hk * dk + kh * dk + i];
        }
        if (threadIdx.x == 0) {
            float acc = 0.f;
            for (int t = 0; t < Ln; ++t) {
                acc += g_all[(c0 + t) * L.Hv + h];
                gm[t] = acc;
                bt[t] = beta_all[(c0 + t) * L.Hv + h];
            }
            for (int t = 0; t < Ln; ++t) dec[t] = expf(gm[Ln - 1] - gm[t]);
        }
        __syncthreads();
        for (int id = threadIdx.x; id < Ln * Ln; id += Threads) {
            const int t = id / Ln, s2 = id % Ln;
            float kk = 0.f, qk = 0.f;
            if (s2 <= t)
                for (std::int64_t i = 0; i < dk; ++i) {
                    kk += k[t * dk + i] * k[s2 * dk + i];
                    qk += q[t * dk + i] * k[s2 * dk + i];
                }
            const float dd = s2 <= t ? expf(gm[t] - gm[s2]) : 0.f;
            A[id] = s2 < t ? bt[t] * dd * kk : 0.f;
            QK[id] = s2 <= t ? dd * qk : 0.f;
        }
        __syncthreads();
        // U_t = βv_t − Σ_{s<t} A_ts U_s;  W_t = β e^{γ_t} k_t − Σ_{s<t} A_ts W_s  (column-owned)
        for (std::int64_t c = threadIdx.x; c < dv + dk; c += Threads) {
            for (int t = 0; t < Ln; ++t) {
                float v;
                if (c < dv) v = bt[t] * y[(c0 + t) * C + 2 * L.Hk * dk + h * dv + c];
                else v = bt[t] * expf(gm[t]) * k[t * dk + (c - dv)];
                for (int s2 = 0; s2 < t; ++s2) {
                    const float av = A[t * Ln + s2];
                    if (av == 0.f) continue;
                    v -= av * (c < dv ? U[s2 * dv + c] : W[s2 * dk + (c - dv)]);
                }
                if (c < dv) U[t * dv + c] = v;
                else W[t * dk + (c - dv)] = v;
            }
        }
        __syncthreads();
        // Δ = U − W S0
        for (int id = threadIdx.x; id < Ln * dvi; id += Threads) {
            const int t = id / dvi, j = id % dvi;
            float u = U[id];
            for (std::int64_t i = 0; i < dk; ++i) u -= W[t * dk + i] * S[i * dv + j];
            U[id] = u;
        }
        __syncthreads();
        // O_t = e^{γ_t} q_t S0 + Σ_{s≤t} QK_ts Δ_s  (reads S0: before the update)
        for (int id = threadIdx.x; id < Ln * dvi; id += Threads) {
            const int t = id / dvi, j = id % dvi;
            const float eg = expf(gm[t]);
            float o = 0.f;
            for (std::int64_t i = 0; i < dk; ++i) o += (q[t * dk + i] * eg) * S[i * dv + j];
            for (std::int64_t s2 = 0; s2 <= t; ++s2) o += QK[t * Ln + s2] * U[s2 * dv + j];
            o_all[(c0 + t) * inner + h * dv + j] = o;
        }
        __syncthreads();
        const float eL = expf(gm[Ln - 1]);
        for (int id = threadIdx.x; id < dki * dvi; id += Threads) {
            const int i = id / dvi, j = id % dvi;
            float s = S[id] * eL;
            for (int s2 = 0; s2 < Ln; ++s2) s += (k[s2 * dk + i] * dec[s2]) * U[s2 * dv + j];
            S[id] = s;
        }
        __syncthreads();
    }
}

inline std::size_t gdn_chunked_smem(const gdn_layout& L, int chunk) {
    return std::size_t(4) * std::size_t(chunk * (3 * L.dk + L.dv) + 2 * chunk * chunk + 3 * chunk);
}

// 32-row chunks keep the shared footprint at ~72 KiB for dk = dv = 128 (64 would need 160 KiB).
inline void gdn_chunked(float* S, const float* y, const float* beta, const float* g, float* o, const gdn_layout& L,
                        std::int64_t n, cudaStream_t s, int chunk = 32) {
    if (n <= 0) return;
    if (L.dk * L.dv > INT_MAX || std::int64_t(chunk) * (L.dk + L.dv) > INT_MAX)
        fail("cuda gdn_chunked: head dims ", L.dk, " x ", L.dv, " exceed the kernel's int indices");
    // The cap goes to the device's limit (dynamic_smem), never to this call's size: another
    // model's thread may be between raising it for a larger head and launching.
    const std::size_t smem = gdn_chunked_smem(L, chunk);
    dynamic_smem(gdn_chunked_kernel<256>, "gdn_chunked_kernel", smem, " (dk ", L.dk, ", dv ", L.dv, ", chunk ", chunk, ")");
    launch(gdn_chunked_kernel<256>, "gdn_chunked_kernel<256>", grid_x("gdn_chunked_kernel", L.Hv), 256, smem, s, S, y, beta, g, o, L, n, chunk);
    check_launch("gdn_chunked");
}

// Preview block softmax with history slot (gated_deltanet::block_softmax_mix), one block per
// (row t, V head h): r = Sᵀ(q̂_t/√dk); logits {b} ∪ {λ q̂_t·k̂_s}; o = w★ c r + Σ_s w_s v_s.
static __global__ void __launch_bounds__(128) block_softmax_kernel(const float* S_all, const float* y, float* o_all, gdn_layout L,
                                                            std::int64_t B, const float* lambda, const float* hist_b,
                                                            const float* hist_c) {
    CLOVER_LAUNCH_BOUND(128);
    CLOVER_DYNAMIC_SHARED(float, sh);  // q[dk], logits[B + 1]
    const std::int64_t t = blockIdx.x / L.Hv, h = blockIdx.x % L.Hv, kh = L.qk_of(h), dk = L.dk, dv = L.dv;
    const std::int64_t inner = L.Hv * dv;
    smem_ptr<float> q = sh;
    smem_ptr<float> lg = sh + dk;
    const float* yt = y + t * L.C;
    for (std::int64_t i = threadIdx.x; i < dk; i += blockDim.x) q[i] = yt[kh * dk + i];
    __syncthreads();
    for (std::int64_t s = threadIdx.x; s < B; s += blockDim.x) {
        const float* ks = y + s * L.C + L.Hk * dk + kh * dk;
        float dot = 0.f;
        for (std::int64_t i = 0; i < dk; ++i) dot += q[i] * ks[i];
        lg[1 + s] = lambda[h] * dot;
    }
    if (threadIdx.x == 0) lg[0] = hist_b[h];
    __syncthreads();
    if (threadIdx.x == 0) {  // B + 1 values: a serial softmax is cheaper than a block reduction
        float m = lg[0];
        for (std::int64_t i = 1; i <= B; ++i) m = fmaxf(m, lg[i]);
        double sum = 0;
        for (std::int64_t i = 0; i <= B; ++i) {
            lg[i] = expf(lg[i] - m);
            sum += lg[i];
        }
        const float inv = float(1.0 / sum);
        for (std::int64_t i = 0; i <= B; ++i) lg[i] *= inv;
    }
    __syncthreads();
    const float qs = 1.f / sqrtf(float(dk));
    const float* S = S_all + h * dk * dv;
    for (std::int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
        float r = 0.f;
        for (std::int64_t i = 0; i < dk; ++i) r += S[i * dv + j] * (q[i] * qs);
        float o = lg[0] * hist_c[h] * r;
        for (std::int64_t s = 0; s < B; ++s) o += lg[1 + s] * y[s * L.C + 2 * L.Hk * dk + h * dv + j];
        o_all[t * inner + h * dv + j] = o;
    }
}

inline void block_softmax(const float* S, const float* y, float* o, const gdn_layout& L, std::int64_t B,
                          const float* lambda, const float* hist_b, const float* hist_c, cudaStream_t s) {
    if (B <= 0) return;
    // q [dk] and the B + 1 logits: past 48 KB from ~12K block rows.
    const std::size_t smem = std::size_t(L.dk + B + 1) * 4;
    dynamic_smem(block_softmax_kernel, "block_softmax_kernel", smem, " (head dim ", L.dk, ", ", B, " block rows)");
    launch(block_softmax_kernel, "block_softmax_kernel", grid_x("block_softmax_kernel", B * L.Hv), 128, smem, s, S, y, o, L, B, lambda, hist_b, hist_c);
    check_launch("block_softmax");
}

}  // namespace clover::backend::cuda_detail
