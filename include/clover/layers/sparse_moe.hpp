#pragma once
// Sparse MoE (architecture.md §2.6): softmax over all experts (fp32), top-k (ties: lower index),
// weights renormalised over the chosen k; SwiGLU experts; plus one shared SwiGLU expert scaled
// by sigmoid(x·w_gate). Multi-row passes are grouped by expert: each touched expert runs one
// matmul over the rows routed to it instead of one matrix-vector product per row.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "clover/core/math.hpp"
#include "clover/model/passes.hpp"
#include "clover/model/session.hpp"
#include "clover/model/variants.hpp"
#include "clover/model/weights.hpp"

namespace clover::layers {

// Top-k over one row of probabilities (ties: lower index first), renormalised.
// Candidates are `allowed` (all experts when empty): the coreset restricts routing this way.
inline void route_row(const float* p, std::int64_t n_expert, std::int64_t k, const std::vector<std::int32_t>& allowed,
                      std::int32_t* ids, float* w) {
    std::vector<std::int32_t> cand;
    if (allowed.empty()) {
        cand.resize(std::size_t(n_expert));
        std::iota(cand.begin(), cand.end(), 0);
    } else {
        cand = allowed;
    }
    k = std::min<std::int64_t>(k, std::int64_t(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [&](std::int32_t a, std::int32_t b) {
        return p[a] != p[b] ? p[a] > p[b] : a < b;
    });
    double sum = 0;
    for (std::int64_t j = 0; j < k; ++j) sum += p[cand[j]];
    for (std::int64_t j = 0; j < k; ++j) {
        ids[j] = cand[j];
        w[j] = float(p[cand[j]] / sum);
    }
}

// The expert coreset of a preview pass (clover-diffusion.md §3, this project's rule): every row's
// router probabilities count, masked or not; score[e] = Σ_t P[t, e]; the C experts with the
// largest score form the coreset (ties: lower index first). C = 0 or C >= E: no restriction
// (an empty set). probs: [n, n_expert].
inline std::vector<std::int32_t> select_coreset(const float* probs, std::int64_t n, std::int64_t n_expert,
                                                std::int64_t C) {
    if (C <= 0 || C >= n_expert) return {};
    std::vector<double> score(static_cast<std::size_t>(n_expert), 0.0);
    for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t e = 0; e < n_expert; ++e) score[e] += probs[t * n_expert + e];
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n_expert));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + C, ids.end(), [&](std::int32_t a, std::int32_t b) {
        return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    ids.resize(static_cast<std::size_t>(C));
    std::sort(ids.begin(), ids.end());
    return ids;
}

template <variant V, class Backend>
struct sparse_moe {
    // SwiGLU over rows xs [m, n_embd] with gate/up/down matrices -> ys [m, n_embd].
    static void swiglu(Backend& be, const weight& gate, const weight& up, const weight& down, const float* xs,
                       float* ys, std::int64_t m, std::int64_t ff, std::vector<float>& g, std::vector<float>& u) {
        g.resize(std::size_t(m * ff));
        u.resize(std::size_t(m * ff));
        be.matmul(gate, xs, g.data(), m);
        be.matmul(up, xs, u.data(), m);
        for (std::int64_t i = 0; i < m * ff; ++i) g[i] = math::silu(g[i]) * u[i];
        be.matmul(down, g.data(), ys, m);
    }

    // Routed experts for rows x [n, n_embd] given routing ids/weights [n, k] -> out [n, n_embd] (overwritten).
    static void experts(Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* out, std::int64_t n,
                        std::int64_t k, const std::int32_t* ids, const float* wts, workspace& ws) {
        const std::int64_t E = d.n_embd(), X = d.n_expert(), F = d.n_ff_exp();
        std::fill(out, out + n * E, 0.f);
        // rows_of[e]: the (row, slot) pairs routed to expert e, in row order.
        std::vector<std::vector<std::int64_t>> rows_of{std::size_t(X)};
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t j = 0; j < k; ++j) rows_of[ids[t * k + j]].push_back(t * k + j);
        std::vector<float> xs, ys, g, u;
        for (std::int64_t e = 0; e < X; ++e) {
            const auto& rs = rows_of[e];
            if (rs.empty()) continue;
            const std::int64_t m = std::int64_t(rs.size());
            xs.resize(std::size_t(m * E));
            ys.resize(std::size_t(m * E));
            for (std::int64_t r = 0; r < m; ++r) std::copy_n(x + (rs[r] / k) * E, E, xs.data() + r * E);
            weight gate, up;
            if (w.gate_up_exps) {
                weight gu = w.gate_up_exps.expert(e);
                gate = gu.row_slice(0, F);
                up = gu.row_slice(F, F);
            } else {
                gate = w.gate_exps.expert(e);
                up = w.up_exps.expert(e);
            }
            swiglu(be, gate, up, w.down_exps.expert(e), xs.data(), ys.data(), m, F, g, u);
            for (std::int64_t r = 0; r < m; ++r) {
                const float wt = wts[rs[r]];
                float* o = out + (rs[r] / k) * E;
                const float* yr = ys.data() + r * E;
                for (std::int64_t i = 0; i < E; ++i) o[i] += wt * yr[i];
            }
        }
    }

    // Shared expert, added into out: out += sigmoid(x·w_sg) · SwiGLU_shared(x).
    static void shared_expert(Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* out,
                              std::int64_t n) {
        if (!w.gate_shexp) return;
        const std::int64_t E = d.n_embd();
        std::vector<float> ys(std::size_t(n * E));
        std::vector<float> g, u;
        swiglu(be, w.gate_shexp, w.up_shexp, w.down_shexp, x, ys.data(), n, d.n_ff_shexp(), g, u);
        const float* sg = w.shexp_gate.f32();
        for (std::int64_t t = 0; t < n; ++t) {
            float dot = 0.f;
            for (std::int64_t i = 0; i < E; ++i) dot += x[t * E + i] * sg[i];
            const float s = math::sigmoid(dot);
            for (std::int64_t i = 0; i < E; ++i) out[t * E + i] += s * ys[t * E + i];
        }
    }

    // Router probabilities [n, n_expert] (softmax, fp32).
    static void router_probs(Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* probs,
                             std::int64_t n) {
        be.matmul(w.router, x, probs, n);
        for (std::int64_t t = 0; t < n; ++t) math::softmax(probs + t * d.n_expert(), d.n_expert());
    }

    // Routed over `allowed` experts (all when empty), plus the shared expert.
    static void routed_forward(Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* out,
                               std::int64_t n, const float* probs, const std::vector<std::int32_t>& allowed,
                               workspace& ws) {
        const std::int64_t X = d.n_expert();
        const std::int64_t k = allowed.empty() ? d.n_expert_used() : std::min<std::int64_t>(d.n_expert_used(), std::int64_t(allowed.size()));
        std::vector<std::int32_t> ids(static_cast<std::size_t>(n * k));
        std::vector<float> wts(static_cast<std::size_t>(n * k));
        for (std::int64_t t = 0; t < n; ++t) route_row(probs + t * X, X, k, allowed, ids.data() + t * k, wts.data() + t * k);
        experts(be, d, w, x, out, n, k, ids.data(), wts.data(), ws);
        shared_expert(be, d, w, x, out, n);
    }

    // Commit and verify passes: plain top-k routing.
    template <class Pass>
        requires(std::is_same_v<Pass, commit_pass> || std::is_same_v<Pass, verify_pass>)
    static void forward(Pass, Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* out,
                        std::int64_t n, workspace& ws) {
        float* probs = workspace::get(ws.t6, std::size_t(n * d.n_expert()));
        router_probs(be, d, w, x, probs, n);
        routed_forward(be, d, w, x, out, n, probs, {}, ws);
    }

    // Preview pass: routing restricted to the block's expert coreset of size `coreset`.
    static void forward(preview_pass, Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* out,
                        std::int64_t n, std::int64_t coreset, workspace& ws) {
        float* probs = workspace::get(ws.t6, std::size_t(n * d.n_expert()));
        router_probs(be, d, w, x, probs, n);
        routed_forward(be, d, w, x, out, n, probs, select_coreset(probs, n, d.n_expert(), coreset), ws);
    }
};

}  // namespace clover::layers
