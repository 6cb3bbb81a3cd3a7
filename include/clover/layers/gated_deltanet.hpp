#pragma once
// Gated DeltaNet token mixer (architecture.md §2.4): qkv/z/β/α projections, causal depthwise
// conv over a ring of the last K-1 inputs, SiLU, per-head L2 norm, the gated delta rule, gated
// RMSNorm and the output projection. Commit pass: writes the state and the ring.
#include <cmath>
#include <cstdint>
#include <vector>

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
    // ring: [K-1, C] oldest first, updated to the last K-1 inputs. y: [n, C].
    static void conv_silu(const dims<V>& d, const gdn_weights& w, float* ring, const float* m, float* y, std::int64_t n) {
        const std::int64_t C = d.conv_channels(), K = d.ssm_conv();
        const float* wc = w.conv.f32();  // [C][K]
        auto in = [&](std::int64_t tau, std::int64_t c) {  // tau in [-(K-1), n)
            return tau < 0 ? ring[(tau + K - 1) * C + c] : m[tau * C + c];
        };
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t c = 0; c < C; ++c) {
                float s = 0.f;
                for (std::int64_t i = 0; i < K; ++i) s += wc[c * K + i] * in(t - K + 1 + i, c);
                y[t * C + c] = math::silu(s);
            }
        // New ring: the last K-1 rows of [ring ; m]. Row r comes from a later row (ring row n+r or
        // m), so filling in increasing r never overwrites a row still to be read.
        for (std::int64_t r = 0; r < K - 1; ++r) {
            const std::int64_t tau = n - (K - 1) + r;
            for (std::int64_t c = 0; c < C; ++c) ring[r * C + c] = in(tau, c);
        }
    }

    // x: [n, n_embd] (normed input) -> out: [n, n_embd].
    static void forward(commit_pass, Backend& be, const dims<V>& d, const gdn_weights& w, gdn_state& st,
                        const float* x, float* out, std::int64_t n, workspace& ws) {
        const std::int64_t C = d.conv_channels(), Hk = d.qk_heads(), Hv = d.v_heads();
        const std::int64_t dk = d.dk(), dv = d.dv(), inner = d.ssm_d_inner();
        const float eps = d.h().rms_eps;
        float* m = workspace::get(ws.t0, std::size_t(n * C));     // [n, C]
        float* y = workspace::get(ws.t1, std::size_t(n * C));     // [n, C]
        float* z = workspace::get(ws.t2, std::size_t(n * inner)); // [n, inner]
        float* gb = workspace::get(ws.t3, std::size_t(n * 2 * Hv));  // [n, Hv] β then [n, Hv] g
        float* o = workspace::get(ws.t4, std::size_t(n * inner)); // [n, Hv, dv]
        be.matmul(w.qkv, x, m, n);
        be.matmul(w.z, x, z, n);
        float* beta = gb;
        float* g = gb + n * Hv;
        be.matmul(w.beta, x, beta, n);
        be.matmul(w.alpha, x, g, n);
        const float* dt = w.dt_bias.f32();
        const float* A = w.a.f32();
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < Hv; ++h) {
                beta[t * Hv + h] = math::sigmoid(beta[t * Hv + h]);
                g[t * Hv + h] = A[h] * math::softplus(g[t * Hv + h] + dt[h]);
            }
        conv_silu(d, w, st.conv.data(), m, y, n);
        const float qscale = 1.f / std::sqrt(float(dk));
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < Hk; ++h) {
                float* q = y + t * C + h * dk;
                float* k = y + t * C + Hk * dk + h * dk;
                math::l2_norm(q, dk, eps);
                math::l2_norm(k, dk, eps);
                for (std::int64_t i = 0; i < dk; ++i) q[i] *= qscale;
            }
        be.parallel_for(Hv, 1, [&](std::int64_t h0, std::int64_t h1) {
            std::vector<float> tmp;
            gdn_chunk_scratch sc;
            for (std::int64_t h = h0; h < h1; ++h) {
                const std::int64_t kh = d.h().gdn_qk_head_of(h);
                gdn_head_io io{y + kh * dk, y + Hk * dk + kh * dk, y + 2 * Hk * dk + h * dv, g + h, beta + h,
                               o + h * dv, C, C, C, Hv, inner};
                float* S = st.S.data() + h * dk * dv;
                if (n >= chunked_min_rows) gdn_chunked(S, io, n, dk, dv, sc);
                else gdn_recurrent(S, io, n, dk, dv, tmp);
            }
        });
        gated_norm_out(be, d, w, o, z, out, n);
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
