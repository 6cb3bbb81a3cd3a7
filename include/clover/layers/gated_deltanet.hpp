#pragma once
// Gated DeltaNet token mixer (architecture.md §2.4): qkv/z/β/α projections, causal depthwise
// conv over a ring of the last K-1 inputs, SiLU, per-head L2 norm, the gated delta rule, gated
// RMSNorm and the output projection. Commit pass: writes the state and the ring.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "clover/backend/cpu/cpu.hpp"
#include "clover/core/math.hpp"
#include "clover/layers/gdn_kernels.hpp"
#include "clover/model/passes.hpp"
#include "clover/model/session.hpp"
#include "clover/model/variants.hpp"
#include "clover/model/weights.hpp"

namespace clover::layers {

template <variant V, class Backend>
struct gated_deltanet {
    // Rows below this use the recurrence; at or above, the chunked form (both exact; the chunked
    // form does the state work as matrix products).
    static constexpr std::int64_t chunked_min_rows = 2;

    // Causal conv over [ring (K-1 rows) ; m (n rows)] then SiLU. m: [n, C] pre-conv qkv.
    // ring: [K-1, C] oldest first. y: [n, C]. With `right` (preview passes only), the K-1
    // look-ahead taps of clover-diffusion.md §3 are added before the SiLU; rows past the block
    // read 0.
    static void conv_silu(const dims<V>& d, const gdn_weights& w, const float* ring, const float* m, float* y,
                          std::int64_t n, const float* right = nullptr) {
        const std::int64_t C = d.conv_channels(), K = d.ssm_conv();
        const float* wc = w.conv.f32();  // [C][K], index 0 = oldest input
        auto in = [&](std::int64_t tau, std::int64_t c) {  // tau in [-(K-1), n)
            return tau < 0 ? ring[(tau + K - 1) * C + c] : m[tau * C + c];
        };
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t c = 0; c < C; ++c) {
                float s = 0.f;
                for (std::int64_t i = 0; i < K; ++i) s += wc[c * K + i] * in(t - K + 1 + i, c);
                if (right)  // [C][K-1], index 0 = nearest future row (t+1)
                    for (std::int64_t dd = 1; dd < K && t + dd < n; ++dd) s += right[c * (K - 1) + dd - 1] * m[(t + dd) * C + c];
                y[t * C + c] = math::silu(s);
            }
    }

    // The ring after consuming rows m[0, n): the last K-1 rows of [ring ; m]. Row r comes from a
    // later row (ring row n+r or m), so filling in increasing r never overwrites a row still to
    // be read.
    static void advance_ring(const dims<V>& d, float* ring, const float* m, std::int64_t n) {
        const std::int64_t C = d.conv_channels(), K = d.ssm_conv();
        for (std::int64_t r = 0; r < K - 1; ++r) {
            const std::int64_t tau = n - (K - 1) + r;
            for (std::int64_t c = 0; c < C; ++c) ring[r * C + c] = tau < 0 ? ring[(tau + K - 1) * C + c] : m[tau * C + c];
        }
    }

    // L2-normalises the q and k heads of conv output rows y [n, C] in place; q is also scaled by
    // q_scale (1/sqrt(dk) for the delta rule; 1 to keep the unit vector).
    static void normalize_qk(const dims<V>& d, float* y, std::int64_t n, float q_scale) {
        const std::int64_t C = d.conv_channels(), Hk = d.qk_heads(), dk = d.dk();
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < Hk; ++h) {
                float* q = y + t * C + h * dk;
                float* k = y + t * C + Hk * dk + h * dk;
                math::l2_norm(q, dk, d.h().rms_eps);
                math::l2_norm(k, dk, d.h().rms_eps);
                if (q_scale != 1.f)
                    for (std::int64_t i = 0; i < dk; ++i) q[i] *= q_scale;
            }
    }

    // Commit and verify passes. x: [n, n_embd] (normed input) -> out: [n, n_embd]. A verify pass
    // runs the recurrence row by row (so each row is bit-identical to AR decoding) and records
    // its rows in st.rec so the decoder can roll back to any prefix without re-reading weights.
    template <class Pass>
        requires(std::is_same_v<Pass, commit_pass> || std::is_same_v<Pass, verify_pass>)
    static void forward(Pass, Backend& be, const dims<V>& d, const gdn_weights& w, gdn_state& st, const float* x,
                        float* out, std::int64_t n, workspace& ws) {
        constexpr bool verify = std::is_same_v<Pass, verify_pass>;
        const std::int64_t C = d.conv_channels(), Hk = d.qk_heads(), Hv = d.v_heads();
        const std::int64_t dk = d.dk(), dv = d.dv(), inner = d.ssm_d_inner();
        float* m = workspace::get(ws.t0, std::size_t(n * C));     // [n, C]
        float* y = workspace::get(ws.t1, std::size_t(n * C));     // [n, C]
        float* z = workspace::get(ws.t2, std::size_t(n * inner)); // [n, inner]
        float* gb = workspace::get(ws.t3, std::size_t(n * 2 * Hv));  // [n, Hv] β then [n, Hv] g
        float* o = workspace::get(ws.t4, std::size_t(n * inner)); // [n, Hv, dv]
        float* beta = gb;
        float* g = gb + n * Hv;
        const backend::matmul_job proj[4] = {{&w.qkv, m}, {&w.z, z}, {&w.beta, beta}, {&w.alpha, g}};
        backend::matmul_all(be, proj, x, n);  // one parallel region, x quantized once
        const float* dt = w.dt_bias.f32();
        const float* A = w.a.f32();
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < Hv; ++h) {
                beta[t * Hv + h] = math::sigmoid(beta[t * Hv + h]);
                g[t * Hv + h] = A[h] * math::softplus(g[t * Hv + h] + dt[h]);
            }
        if constexpr (verify) st.rec.begin(st, m, n, C);
        conv_silu(d, w, st.conv.data(), m, y, n);
        advance_ring(d, st.conv.data(), m, n);
        normalize_qk(d, y, n, 1.f / std::sqrt(float(dk)));
        if constexpr (verify) st.rec.keep(y, g, beta, n, C, Hv);
        be.parallel_for(Hv, 1, [&](std::int64_t h0, std::int64_t h1) {
            std::vector<float> tmp;
            gdn_chunk_scratch sc;
            for (std::int64_t h = h0; h < h1; ++h) {
                const std::int64_t kh = d.h().gdn_qk_head_of(h);
                gdn_head_io io{y + kh * dk, y + Hk * dk + kh * dk, y + 2 * Hk * dk + h * dv, g + h, beta + h,
                               o + h * dv, C, C, C, Hv, inner};
                float* S = st.S.data() + h * dk * dv;
                if (!verify && n >= chunked_min_rows) gdn_chunked(S, io, n, dk, dv, sc);
                else gdn_recurrent(S, io, n, dk, dv, tmp);
            }
        });
        gated_norm_out(be, d, w, o, z, out, n);
    }

    // Rolls a verified layer back to the state after its first `keep` rows: restores the
    // block-start state and replays the recurrence over the recorded rows (no weights read).
    static void rollback(const dims<V>& d, gdn_state& st, std::int64_t keep) {
        auto& r = st.rec;
        const std::int64_t C = d.conv_channels(), Hk = d.qk_heads(), Hv = d.v_heads(), dk = d.dk(), dv = d.dv();
        if (keep < 0 || keep > r.n) fail("gdn rollback: cannot keep ", keep, " of ", r.n, " verified rows");
        st.S = r.S0;
        st.conv = r.ring0;
        advance_ring(d, st.conv.data(), r.m.data(), keep);
        std::vector<float> tmp, o(static_cast<std::size_t>(std::max<std::int64_t>(keep, 1) * dv));
        for (std::int64_t h = 0; h < Hv; ++h) {
            const std::int64_t kh = d.h().gdn_qk_head_of(h);
            const float* y = r.y.data();
            gdn_head_io io{y + kh * dk, y + Hk * dk + kh * dk, y + 2 * Hk * dk + h * dv, r.g.data() + h,
                           r.beta.data() + h, o.data(), C, C, C, Hv, dv};
            gdn_recurrent(st.S.data() + h * dk * dv, io, keep, dk, dv, tmp);
        }
        r.n = 0;
    }

    // Preview pass over the B block rows (clover-diffusion.md §3): reads the clean state S and
    // conv ring, never writes them. Look-ahead conv taps; per V head a block softmax over the
    // history slot and all block rows (block_softmax_mix).
    static void forward(preview_pass, Backend& be, const dims<V>& d, const gdn_weights& w, const gdn_state& st,
                        const float* x, float* out, std::int64_t B, workspace& ws) {
        const std::int64_t C = d.conv_channels(), Hk = d.qk_heads(), Hv = d.v_heads();
        const std::int64_t dk = d.dk(), dv = d.dv(), inner = d.ssm_d_inner();
        float* m = workspace::get(ws.t0, std::size_t(B * C));
        float* y = workspace::get(ws.t1, std::size_t(B * C));
        float* z = workspace::get(ws.t2, std::size_t(B * inner));
        float* o = workspace::get(ws.t4, std::size_t(B * inner));
        const backend::matmul_job proj[2] = {{&w.qkv, m}, {&w.z, z}};
        backend::matmul_all(be, proj, x, B);
        conv_silu(d, w, st.conv.data(), m, y, B, w.conv_right.f32());
        normalize_qk(d, y, B, 1.f);  // unit q̂ and k̂
        const float* lambda = w.bd_scale.f32();
        const float* hist_b = w.bd_bias.f32();
        const float* hist_c = w.bd_c.f32();
        be.parallel_for(Hv, 1, [&](std::int64_t h0, std::int64_t h1) {
            std::vector<float> logit(static_cast<std::size_t>(B + 1)), r(static_cast<std::size_t>(dv));
            for (std::int64_t h = h0; h < h1; ++h) {
                const std::int64_t kh = d.h().gdn_qk_head_of(h);
                gdn_head_io io{y + kh * dk, y + Hk * dk + kh * dk, y + 2 * Hk * dk + h * dv, nullptr, nullptr,
                               o + h * dv, C, C, C, 0, inner};
                block_softmax_mix(st.S.data() + h * dk * dv, io, B, dk, dv, lambda[h], hist_b[h], hist_c[h],
                                  logit, r);
            }
        });
        gated_norm_out(be, d, w, o, z, out, B);
    }

    // This project's reading of "a block softmax with a history slot read from the clean state"
    // (clover-diffusion.md §3) — kept in this one function so it can be swapped:
    //   r_t = Sᵀ (q̂_t / sqrt(dk));  a_{t,s} = λ (q̂_t·k̂_s), s = 0..B-1;  a_{t,★} = b
    //   w = softmax over {★} ∪ {0..B-1};   o_t = w_★ c r_t + Σ_s w_s v_s
    // io.q / io.k are unit vectors; io.v the value rows; io.o receives o_t.
    static void block_softmax_mix(const float* S, const gdn_head_io& io, std::int64_t B, std::int64_t dk,
                                  std::int64_t dv, float lambda, float hist_bias, float hist_c,
                                  std::vector<float>& logit, std::vector<float>& r) {
        const float qs = 1.f / std::sqrt(float(dk));
        for (std::int64_t t = 0; t < B; ++t) {
            const float* q = io.q + t * io.q_stride;
            for (std::int64_t j = 0; j < dv; ++j) r[j] = 0.f;
            for (std::int64_t i = 0; i < dk; ++i) {
                const float qi = q[i] * qs;
                const float* Si = S + i * dv;
                for (std::int64_t j = 0; j < dv; ++j) r[j] += Si[j] * qi;
            }
            logit[0] = hist_bias;
            for (std::int64_t s = 0; s < B; ++s) {
                const float* k = io.k + s * io.k_stride;
                float dot = 0.f;
                for (std::int64_t i = 0; i < dk; ++i) dot += q[i] * k[i];
                logit[1 + s] = lambda * dot;
            }
            math::softmax(logit.data(), B + 1);
            float* o = io.o + t * io.o_stride;
            for (std::int64_t j = 0; j < dv; ++j) o[j] = logit[0] * hist_c * r[j];
            for (std::int64_t s = 0; s < B; ++s) {
                const float* v = io.v + s * io.v_stride;
                const float ws = logit[1 + s];
                for (std::int64_t j = 0; j < dv; ++j) o[j] += ws * v[j];
            }
        }
    }

    // o: [n, Hv, dv] -> RMSNorm per head (shared weight) ⊙ silu(z) -> out projection.
    static void gated_norm_out(Backend& be, const dims<V>& d, const gdn_weights& w, float* o, const float* z,
                               float* out, std::int64_t n) {
        const std::int64_t Hv = d.v_heads(), dv = d.dv(), inner = d.ssm_d_inner();
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < Hv; ++h) {
                float* oh = o + t * inner + h * dv;
                math::rms_norm(oh, w.norm.f32(), oh, dv, d.h().rms_eps);
                const float* zh = z + t * inner + h * dv;
                for (std::int64_t j = 0; j < dv; ++j) oh[j] *= math::silu(zh[j]);
            }
        be.matmul(w.out, o, out, n);
    }
};

}  // namespace clover::layers
