#pragma once
// The gated delta rule for one value head (architecture.md §2.4.5 and §2.5), in its two exact
// forms: the token-by-token recurrence (decode) and the chunked WY/UT form (prefill), which
// tests prove equal to fp32 rounding. State S is [dk][dv] (row = key index), fp32.
//
// Inputs are strided views: row t of q is q + t*q_stride (likewise k, v, o); g and β likewise
// with g_stride. q is L2-normalised and scaled by 1/sqrt(dk); k is L2-normalised.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "clover/backend/cpu/vec_ops.hpp"

namespace clover::backend::cpu_detail {

struct gdn_head_io {
    const float* q; const float* k; const float* v; const float* g; const float* beta;
    float* o;
    std::int64_t q_stride, k_stride, v_stride, g_stride, o_stride;
};

// S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq   — per token. Computed as
//   kv = Sᵀk, sq = Sᵀq (one read of the old S);  δ = β (v − e^g kv);  o = e^g sq + (k·q) δ;
//   S ← e^g S + k δᵀ (one read-and-write),
// which is the same algebra with two passes over the state instead of four reads and two
// writes: the state (2 MiB per GDN layer of the real model) is what a decode step touches most
// after the weights.
inline void gdn_recurrent(float* S, const gdn_head_io& io, std::int64_t n, std::int64_t dk, std::int64_t dv,
                          std::vector<float>& tmp) {
    namespace vo = backend::cpu_detail;
    tmp.resize(std::size_t(2 * dv));
    float* kv = tmp.data();
    float* sq = tmp.data() + dv;
    for (std::int64_t t = 0; t < n; ++t) {
        const float* q = io.q + t * io.q_stride;
        const float* k = io.k + t * io.k_stride;
        const float* v = io.v + t * io.v_stride;
        const float decay = std::exp(io.g[t * io.g_stride]);
        const float beta = io.beta[t * io.g_stride];
        for (std::int64_t j = 0; j < dv; ++j) kv[j] = sq[j] = 0.f;
        vo::acc_rows2(kv, sq, k, q, S, dk, dv, dv);
        const float kq = vo::dot_f32(k, q, dk);
        float* o = io.o + t * io.o_stride;
        for (std::int64_t j = 0; j < dv; ++j) {
            kv[j] = beta * (v[j] - decay * kv[j]);  // δ
            o[j] = decay * sq[j] + kq * kv[j];
        }
        for (std::int64_t i = 0; i < dk; ++i) vo::scale_add(S + i * dv, decay, k[i], kv, dv);
    }
}

// Chunked (WY) form over chunks of `chunk` tokens. Per chunk with state S0 and γ = cumsum(g):
//   A_ts = β_t e^{γ_t−γ_s} k_t·k_s (s<t);  U = (I+A)⁻¹ βV;  W = (I+A)⁻¹ (β e^γ K);  Δ = U − W S0
//   O_t = e^{γ_t} q_t S0 + Σ_{s≤t} e^{γ_t−γ_s} (q_t·k_s) Δ_s;   S ← e^{γ_L} S0 + Σ_s e^{γ_L−γ_s} k_s Δ_sᵀ
// The triangular solve is a forward substitution. Work per chunk is O(L²(dk+dv) + L dk dv)
// instead of the recurrence's L sequential rank-1 updates of the whole state.
struct gdn_chunk_scratch {
    std::vector<float> gamma, A, U, W, QK, KT, kk, qk;
};

inline void gdn_chunked(float* S, const gdn_head_io& io, std::int64_t n, std::int64_t dk, std::int64_t dv,
                        gdn_chunk_scratch& sc, std::int64_t chunk = 64) {
    for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
        const std::int64_t L = std::min(chunk, n - c0);
        sc.gamma.resize(std::size_t(L));
        sc.A.assign(std::size_t(L * L), 0.f);
        sc.QK.assign(std::size_t(L * L), 0.f);
        sc.U.resize(std::size_t(L * dv));
        sc.W.resize(std::size_t(L * dk));
        auto q = [&](std::int64_t t) { return io.q + (c0 + t) * io.q_stride; };
        auto k = [&](std::int64_t t) { return io.k + (c0 + t) * io.k_stride; };
        auto v = [&](std::int64_t t) { return io.v + (c0 + t) * io.v_stride; };
        auto beta = [&](std::int64_t t) { return io.beta[(c0 + t) * io.g_stride]; };
        float acc = 0.f;
        for (std::int64_t t = 0; t < L; ++t) {
            acc += io.g[(c0 + t) * io.g_stride];
            sc.gamma[t] = acc;
        }
        const float* gm = sc.gamma.data();
        // A (strict lower) and the decayed q·k (lower incl. diagonal). The chunk's keys are
        // transposed once (KT[i][s] = k_s[i]) so that row t's products with every earlier key
        // are axpys over s, which the compiler vectorises, instead of one float reduction per
        // (t, s) pair (it cannot vectorise those without -ffast-math; this loop was 14% of a
        // 256-token prefill, perf on the 8-layer Q4_K_M file). Each product still sums over i
        // in order.
        sc.KT.resize(std::size_t(dk * L));
        sc.kk.resize(std::size_t(L));
        sc.qk.resize(std::size_t(L));
        for (std::int64_t s = 0; s < L; ++s)
            for (std::int64_t i = 0; i < dk; ++i) sc.KT[i * L + s] = k(s)[i];
        for (std::int64_t t = 0; t < L; ++t) {
            float* kk = sc.kk.data();
            float* qk = sc.qk.data();
            for (std::int64_t s = 0; s <= t; ++s) kk[s] = qk[s] = 0.f;
            const float *kt = k(t), *qt = q(t);
            for (std::int64_t i = 0; i < dk; ++i) {
                const float ki = kt[i], qi = qt[i];
                const float* kr = sc.KT.data() + i * L;
                for (std::int64_t s = 0; s <= t; ++s) {
                    kk[s] += ki * kr[s];
                    qk[s] += qi * kr[s];
                }
            }
            for (std::int64_t s = 0; s <= t; ++s) {
                const float dec = std::exp(gm[t] - gm[s]);
                if (s < t) sc.A[t * L + s] = beta(t) * dec * kk[s];
                sc.QK[t * L + s] = dec * qk[s];
            }
        }
        // The rank-1 loops below run through acc_rows (backend/cpu/vec_ops.hpp): same sums in
        // the same order, with the destination row held in registers.
        namespace vo = backend::cpu_detail;
        // Forward substitution: U_t = βv_t − Σ_{s<t} A_ts U_s;  W_t = β e^{γ_t} k_t − Σ_{s<t} A_ts W_s.
        for (std::int64_t t = 0; t < L; ++t) {
            float* Ut = sc.U.data() + t * dv;
            float* Wt = sc.W.data() + t * dk;
            const float b = beta(t), be = beta(t) * std::exp(gm[t]);
            for (std::int64_t j = 0; j < dv; ++j) Ut[j] = b * v(t)[j];
            for (std::int64_t i = 0; i < dk; ++i) Wt[i] = be * k(t)[i];
            vo::acc_rows(Ut, 1.f, -1.f, sc.A.data() + t * L, sc.U.data(), t, dv, dv);
            vo::acc_rows(Wt, 1.f, -1.f, sc.A.data() + t * L, sc.W.data(), t, dk, dk);
        }
        // Δ = U − W S0 (in place in U).
        for (std::int64_t t = 0; t < L; ++t) vo::acc_rows(sc.U.data() + t * dv, 1.f, -1.f, sc.W.data() + t * dk, S, dk, dv, dv);
        // Outputs (need S0, so before the state update).
        for (std::int64_t t = 0; t < L; ++t) {
            float* o = io.o + (c0 + t) * io.o_stride;
            for (std::int64_t j = 0; j < dv; ++j) o[j] = 0.f;
            vo::acc_rows(o, 1.f, std::exp(gm[t]), q(t), S, dk, dv, dv);
            vo::acc_rows(o, 1.f, 1.f, sc.QK.data() + t * L, sc.U.data(), t + 1, dv, dv);
        }
        // State update: S_i ← e^{γ_L} S_i + Σ_s (k_s[i] e^{γ_L − γ_s}) Δ_s, row by row.
        const float eL = std::exp(gm[L - 1]);
        sc.kk.resize(std::size_t(L));
        for (std::int64_t s = 0; s < L; ++s) sc.qk[s] = std::exp(gm[L - 1] - gm[s]);  // qk: reused for the decays
        for (std::int64_t i = 0; i < dk; ++i) {
            for (std::int64_t s = 0; s < L; ++s) sc.kk[s] = sc.KT[i * L + s] * sc.qk[s];
            vo::acc_rows(S + i * dv, eL, 1.f, sc.kk.data(), sc.U.data(), L, dv, dv);
        }
    }
}

}  // namespace clover::backend::cpu_detail
