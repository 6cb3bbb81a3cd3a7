#pragma once
// The CPU backend's Gated DeltaNet primitives (architecture.md §2.4, clover-diffusion.md §3–4):
// conv over each sequence's ring, the gated delta rule per segment kind, the gated norm, and
// the replay rollback of a verify segment.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/backend/shared.hpp"
#include "clover/backend/cpu/gdn_kernels.hpp"
#include "clover/backend/cpu/state.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/core/batch.hpp"
#include "clover/core/math.hpp"

namespace clover::backend::cpu_detail {

// Causal conv over [ring (K-1 rows) ; m (n rows)] then SiLU. With `right` (preview only), the
// K-1 look-ahead taps of clover-diffusion.md §3 are added before the SiLU; rows past the block
// read 0. wc: [C][K], index 0 = oldest; right: [C][K-1], index 0 = the next row. Only channels
// [c0, c1) are computed: the channels are independent, so threads can share one segment.
// Each channel's sum runs over the taps in order (oldest first, then the look-ahead taps), as
// the definition does; the loops run channels innermost so that they vectorise: written with the
// tap loop innermost and a ring-or-rows choice per tap, it was one scalar FMA chain per channel
// and twice its present share of an 8-sequence decode step (perf; docs/performance.md). y is
// written before m is read through, so y must not overlap m or the ring (the layer passes the
// arena's conv_in and conv_out).
inline void conv_silu(const gdn_shape& g, const float* wc, const float* ring, const float* m, float* y, std::int64_t n,
                      const float* right, std::int64_t c0, std::int64_t c1) {
    const std::int64_t C = g.channels, K = g.conv;
    for (std::int64_t t = 0; t < n; ++t) {
        float* yt = y + t * C;
        for (std::int64_t c = c0; c < c1; ++c) yt[c] = 0.f;
        for (std::int64_t i = 0; i < K; ++i) {
            const std::int64_t tau = t - K + 1 + i;
            const float* x = tau < 0 ? ring + (tau + K - 1) * C : m + tau * C;
            for (std::int64_t c = c0; c < c1; ++c) yt[c] += wc[c * K + i] * x[c];
        }
        if (right)
            for (std::int64_t dd = 1; dd < K && t + dd < n; ++dd) {
                const float* x = m + (t + dd) * C;
                for (std::int64_t c = c0; c < c1; ++c) yt[c] += right[c * (K - 1) + dd - 1] * x[c];
            }
        for (std::int64_t c = c0; c < c1; ++c) yt[c] = math::silu(yt[c]);
    }
}

// The ring after consuming rows m[0, n): the last K-1 rows of [ring ; m]. Filling in increasing
// row order never overwrites a row still to be read. Channels [c0, c1) only, as conv_silu.
inline void advance_ring(const gdn_shape& g, float* ring, const float* m, std::int64_t n, std::int64_t c0, std::int64_t c1) {
    const std::int64_t C = g.channels, K = g.conv;
    for (std::int64_t r = 0; r < K - 1; ++r) {
        const std::int64_t tau = n - (K - 1) + r;
        for (std::int64_t c = c0; c < c1; ++c) ring[r * C + c] = tau < 0 ? ring[(tau + K - 1) * C + c] : m[tau * C + c];
    }
}

// L2-normalises the q and k heads of rows y [n, C] in place; q also scaled by q_scale.
inline void normalize_qk(const gdn_shape& g, float* y, std::int64_t n, float q_scale) {
    const std::int64_t C = g.channels, Hk = g.qk_heads, dk = g.dk;
    for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t h = 0; h < Hk; ++h) {
            float* q = y + t * C + h * dk;
            float* k = y + t * C + Hk * dk + h * dk;
            math::l2_norm(q, dk, g.rms_eps);
            math::l2_norm(k, dk, g.rms_eps);
            if (q_scale != 1.f)
                for (std::int64_t i = 0; i < dk; ++i) q[i] *= q_scale;
        }
}

// A segment of at least this many (row, channel) elements has its conv split by channels
// across the threads (gdn_conv).
inline constexpr std::int64_t gdn_conv_split_min = std::int64_t(1) << 15;

inline void gdn_conv(thread_pool& pool, const batch& bt, state_pool& st, std::int64_t layer, const gdn_shape& g,
                     const gdn_params& w, const float* m, float* y) {
    const std::int64_t C = g.channels;
    const auto segs = bt.segments();
    std::int64_t longest = 0;
    for (const segment& s : segs) {
        longest = std::max(longest, s.n);
        if (!records_rollback(s)) continue;
        gdn_slot& slot = st.gdn(layer, s.seq);  // what a rollback restores, before the ring moves
        slot.begin_record(s.n);
        slot.rec.m.assign(m + s.row0 * C, m + (s.row0 + s.n) * C);
    }
    // Tasks of (segment, block of channels). Why not one task per segment: a single sequence's
    // prefill then ran its conv and SiLU on one core while the other waited (perf, bundled model,
    // bench_server --conversation turn 2: 8 % of the prefill's CPU time).
    // Small batches (decode rows) stay one task per segment: a task's fixed cost would dominate.
    const std::int64_t blocks = longest * C >= gdn_conv_split_min ? std::min<std::int64_t>(4 * pool.size(), C) : 1;
    const std::int64_t per = (C + blocks - 1) / blocks;
    pool.run_chunks(std::int64_t(segs.size()) * blocks, 1, [&](std::int64_t b, std::int64_t e, int) {
        for (std::int64_t i = b; i < e; ++i) {
            const segment& s = segs[std::size_t(i / blocks)];
            const std::int64_t c0 = (i % blocks) * per, c1 = std::min(C, c0 + per);
            if (c0 >= c1) continue;
            gdn_slot& slot = st.gdn(layer, s.seq);
            const float* ms = m + s.row0 * C;
            const bool preview = s.kind == pass_kind::preview;  // look-ahead taps; the ring stays
            conv_silu(g, w.conv->f32(), slot.ring.data(), ms, y + s.row0 * C, s.n, preview ? w.conv_right->f32() : nullptr, c0, c1);
            if (!preview) advance_ring(g, slot.ring.data(), ms, s.n, c0, c1);
        }
    });
    // Then q and k per row (all channels of a row are done): unit q̂ and k̂ for a preview,
    // q scaled by 1/sqrt(dk) otherwise.
    pool.parallel_for(bt.rows(), 64, [&](std::int64_t lo, std::int64_t hi) {
        for (const segment& s : segs) {
            const std::int64_t a = std::max(lo, s.row0), e = std::min(hi, s.row0 + s.n);
            if (a < e) normalize_qk(g, y + a * C, e - a, s.kind == pass_kind::preview ? 1.f : 1.f / std::sqrt(float(g.dk)));
        }
    });
}

// This project's reading of "a block softmax with a history slot read from the clean state"
// (clover-diffusion.md §3) — kept in this one function so it can be swapped:
//   r_t = Sᵀ (q̂_t / sqrt(dk));  a_{t,s} = λ (q̂_t·k̂_s), s = 0..B-1;  a_{t,★} = b
//   w = softmax over {★} ∪ {0..B-1};   o_t = w_★ c r_t + Σ_s w_s v_s
inline void block_softmax_mix(const float* S, const gdn_head_io& io, std::int64_t B, std::int64_t dk, std::int64_t dv,
                              float lambda, float hist_bias, float hist_c, std::vector<float>& logit, std::vector<float>& r) {
    const float qs = 1.f / std::sqrt(float(dk));
    logit.resize(std::size_t(B + 1));
    r.resize(std::size_t(dv));
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

// Gates, then the delta rule / block softmax per (segment, V head). beta, alpha: [n, Hv]
// pre-activations (turned into β and g in place). y: [n, C] conv output. o: [n, Hv*dv].
inline void gdn_mix(thread_pool& pool, const batch& bt, state_pool& st, std::int64_t layer, const gdn_shape& g,
                    const gdn_params& w, const float* y, float* beta, float* alpha, float* o) {
    const std::int64_t C = g.channels, Hk = g.qk_heads, Hv = g.v_heads, dk = g.dk, dv = g.dv, inner = Hv * dv;
    const auto segs = bt.segments();
    const float* dt = w.dt_bias->f32();
    const float* A = w.a->f32();
    pool.parallel_for(bt.rows(), 64, [&](std::int64_t lo, std::int64_t hi) {  // a prefill's gates on every core
        for (std::int64_t t = lo; t < hi; ++t)
            for (std::int64_t h = 0; h < Hv; ++h) {
                beta[t * Hv + h] = math::sigmoid(beta[t * Hv + h]);
                alpha[t * Hv + h] = A[h] * math::softplus(alpha[t * Hv + h] + dt[h]);
            }
    });
    const std::int64_t n_items = std::int64_t(segs.size()) * Hv;
    pool.run_chunks(n_items, 1, [&](std::int64_t b, std::int64_t e, int) {
        std::vector<float> tmp, logit, r;
        gdn_chunk_scratch sc;
        for (std::int64_t it = b; it < e; ++it) {
            const segment& s = segs[std::size_t(it / Hv)];
            const std::int64_t h = it % Hv, kh = g.qk_head_of(h);
            gdn_slot& slot = st.gdn(layer, s.seq);
            const float* ys = y + s.row0 * C;
            gdn_head_io io{ys + kh * dk, ys + Hk * dk + kh * dk, ys + 2 * Hk * dk + h * dv, alpha + s.row0 * Hv + h,
                           beta + s.row0 * Hv + h, o + s.row0 * inner + h * dv, C, C, C, Hv, inner};
            float* S = slot.S.data() + h * dk * dv;
            if (s.kind == pass_kind::preview) {
                block_softmax_mix(S, io, s.n, dk, dv, w.bd_scale->f32()[h], w.bd_bias->f32()[h], w.bd_c->f32()[h], logit, r);
            } else if (gdn_chunked_segment(bt, s)) {  // backend/shared.hpp: the same choice on every backend
                gdn_chunked(S, io, s.n, dk, dv, sc);
            } else {
                gdn_recurrent(S, io, s.n, dk, dv, tmp);
            }
        }
    });
    // Verify segments keep what a rollback replays (the post-conv rows and the gates).
    for (const segment& s : segs) {
        if (!records_rollback(s)) continue;
        gdn_record& rec = st.gdn(layer, s.seq).rec;
        rec.y.assign(y + s.row0 * C, y + (s.row0 + s.n) * C);
        rec.g.assign(alpha + s.row0 * Hv, alpha + (s.row0 + s.n) * Hv);
        rec.beta.assign(beta + s.row0 * Hv, beta + (s.row0 + s.n) * Hv);
    }
}

// Rolls a verified layer back to the state after its first `keep` rows: restores the
// segment-start state and replays the recurrence over the recorded rows (no weights read).
inline void gdn_rollback(const gdn_shape& g, gdn_slot& slot, std::int64_t keep) {
    gdn_record& r = slot.rec;
    const std::int64_t C = g.channels, Hk = g.qk_heads, Hv = g.v_heads, dk = g.dk, dv = g.dv;
    if (keep < 0 || keep > r.n) fail("gdn rollback: cannot keep ", keep, " of ", r.n, " verified rows");
    slot.S = r.S0;
    slot.ring = r.ring0;
    advance_ring(g, slot.ring.data(), r.m.data(), keep, 0, C);
    std::vector<float> tmp, o(static_cast<std::size_t>(std::max<std::int64_t>(keep, 1) * dv));
    for (std::int64_t h = 0; h < Hv; ++h) {
        const std::int64_t kh = g.qk_head_of(h);
        const float* y = r.y.data();
        gdn_head_io io{y + kh * dk, y + Hk * dk + kh * dk, y + 2 * Hk * dk + h * dv, r.g.data() + h, r.beta.data() + h,
                       o.data(), C, C, C, Hv, dv};
        gdn_recurrent(slot.S.data() + h * dk * dv, io, keep, dk, dv, tmp);
    }
    r.n = 0;
}

// o: [n, Hv, dv] -> RMSNorm per head (shared weight) ⊙ silu(z), in place.
inline void gated_norm(thread_pool& pool, const gdn_shape& g, const float* norm, float* o, const float* z, std::int64_t n) {
    const std::int64_t Hv = g.v_heads, dv = g.dv, inner = Hv * dv;
    pool.parallel_for(n * Hv, 64, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) {
            const std::int64_t t = i / Hv, h = i % Hv;
            float* oh = o + t * inner + h * dv;
            math::rms_norm(oh, norm, oh, dv, g.rms_eps);
            const float* zh = z + t * inner + h * dv;
            for (std::int64_t j = 0; j < dv; ++j) oh[j] *= math::silu(zh[j]);
        }
    });
}

}  // namespace clover::backend::cpu_detail
