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

namespace clover::layers {

struct gdn_head_io {
    const float* q; const float* k; const float* v; const float* g; const float* beta;
    float* o;
    std::int64_t q_stride, k_stride, v_stride, g_stride, o_stride;
};

// S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq   — per token, in that order.
inline void gdn_recurrent(float* S, const gdn_head_io& io, std::int64_t n, std::int64_t dk, std::int64_t dv,
                          std::vector<float>& tmp) {
    tmp.resize(std::size_t(dv));
    float* d = tmp.data();
    for (std::int64_t t = 0; t < n; ++t) {
        const float* q = io.q + t * io.q_stride;
        const float* k = io.k + t * io.k_stride;
        const float* v = io.v + t * io.v_stride;
        const float decay = std::exp(io.g[t * io.g_stride]);
        const float beta = io.beta[t * io.g_stride];
        for (std::int64_t j = 0; j < dv; ++j) d[j] = 0.f;
        for (std::int64_t i = 0; i < dk; ++i) {
            float* Si = S + i * dv;
            const float ki = k[i];
            for (std::int64_t j = 0; j < dv; ++j) {
                Si[j] *= decay;
                d[j] += Si[j] * ki;
            }
        }
        for (std::int64_t j = 0; j < dv; ++j) d[j] = beta * (v[j] - d[j]);
        float* o = io.o + t * io.o_stride;
        for (std::int64_t j = 0; j < dv; ++j) o[j] = 0.f;
        for (std::int64_t i = 0; i < dk; ++i) {
            float* Si = S + i * dv;
            const float ki = k[i], qi = q[i];
            for (std::int64_t j = 0; j < dv; ++j) {
                Si[j] += ki * d[j];
                o[j] += Si[j] * qi;
            }
        }
    }
}

// Chunked (WY) form over chunks of `chunk` tokens. Per chunk with state S0 and γ = cumsum(g):
//   A_ts = β_t e^{γ_t−γ_s} k_t·k_s (s<t);  U = (I+A)⁻¹ βV;  W = (I+A)⁻¹ (β e^γ K);  Δ = U − W S0
//   O_t = e^{γ_t} q_t S0 + Σ_{s≤t} e^{γ_t−γ_s} (q_t·k_s) Δ_s;   S ← e^{γ_L} S0 + Σ_s e^{γ_L−γ_s} k_s Δ_sᵀ
// The triangular solve is a forward substitution. Work per chunk is O(L²(dk+dv) + L dk dv)
// instead of the recurrence's L sequential rank-1 updates of the whole state.
struct gdn_chunk_scratch {
    std::vector<float> gamma, A, U, W, QK;
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
        // A (strict lower) and the decayed q·k (lower incl. diagonal).
        for (std::int64_t t = 0; t < L; ++t) {
            for (std::int64_t s = 0; s <= t; ++s) {
                float kk = 0.f, qk = 0.f;
                const float *kt = k(t), *ks = k(s), *qt = q(t);
                for (std::int64_t i = 0; i < dk; ++i) {
                    kk += kt[i] * ks[i];
                    qk += qt[i] * ks[i];
                }
                const float dec = std::exp(gm[t] - gm[s]);
                if (s < t) sc.A[t * L + s] = beta(t) * dec * kk;
                sc.QK[t * L + s] = dec * qk;
            }
        }
        // Forward substitution: U_t = βv_t − Σ_{s<t} A_ts U_s;  W_t = β e^{γ_t} k_t − Σ_{s<t} A_ts W_s.
        for (std::int64_t t = 0; t < L; ++t) {
            float* Ut = sc.U.data() + t * dv;
            float* Wt = sc.W.data() + t * dk;
            const float b = beta(t), be = beta(t) * std::exp(gm[t]);
            for (std::int64_t j = 0; j < dv; ++j) Ut[j] = b * v(t)[j];
            for (std::int64_t i = 0; i < dk; ++i) Wt[i] = be * k(t)[i];
            for (std::int64_t s = 0; s < t; ++s) {
                const float a = sc.A[t * L + s];
                if (a == 0.f) continue;
                const float* Us = sc.U.data() + s * dv;
                const float* Ws = sc.W.data() + s * dk;
                for (std::int64_t j = 0; j < dv; ++j) Ut[j] -= a * Us[j];
                for (std::int64_t i = 0; i < dk; ++i) Wt[i] -= a * Ws[i];
            }
        }
        // Δ = U − W S0 (in place in U).
        for (std::int64_t t = 0; t < L; ++t) {
            float* Ut = sc.U.data() + t * dv;
            const float* Wt = sc.W.data() + t * dk;
            for (std::int64_t i = 0; i < dk; ++i) {
                const float w = Wt[i];
                const float* Si = S + i * dv;
                for (std::int64_t j = 0; j < dv; ++j) Ut[j] -= w * Si[j];
            }
        }
        // Outputs (need S0, so before the state update).
        for (std::int64_t t = 0; t < L; ++t) {
            float* o = io.o + (c0 + t) * io.o_stride;
            const float eg = std::exp(gm[t]);
            for (std::int64_t j = 0; j < dv; ++j) o[j] = 0.f;
            const float* qt = q(t);
            for (std::int64_t i = 0; i < dk; ++i) {
                const float qi = qt[i] * eg;
                const float* Si = S + i * dv;
                for (std::int64_t j = 0; j < dv; ++j) o[j] += qi * Si[j];
            }
            for (std::int64_t s = 0; s <= t; ++s) {
                const float a = sc.QK[t * L + s];
                const float* Ds = sc.U.data() + s * dv;
                for (std::int64_t j = 0; j < dv; ++j) o[j] += a * Ds[j];
            }
        }
        // State update.
        const float eL = std::exp(gm[L - 1]);
        for (std::int64_t i = 0; i < dk * dv; ++i) S[i] *= eL;
        for (std::int64_t s = 0; s < L; ++s) {
            const float dec = std::exp(gm[L - 1] - gm[s]);
            const float* ks = k(s);
            const float* Ds = sc.U.data() + s * dv;
            for (std::int64_t i = 0; i < dk; ++i) {
                const float kd = ks[i] * dec;
                float* Si = S + i * dv;
                for (std::int64_t j = 0; j < dv; ++j) Si[j] += kd * Ds[j];
            }
        }
    }
}

}  // namespace clover::layers
