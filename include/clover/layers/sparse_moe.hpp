#pragma once
// Sparse MoE (architecture.md §2.6): softmax over all experts (fp32), top-k (ties: lower index),
// weights renormalised over the chosen k; SwiGLU experts; plus one shared SwiGLU expert scaled
// by sigmoid(x·w_gate). Multi-row passes are grouped by expert: each touched expert runs one
// matmul over the rows routed to it instead of one matrix-vector product per row.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <type_traits>
#include <vector>

#include "clover/backend/cpu/cpu.hpp"
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

    // The same as experts() + shared_expert(), for backends with multi-product calls: routed
    // experts and the shared expert for rows x [n, n_embd], routing ids/weights [n, k]
    // -> out [n, n_embd] (overwritten). Two parallel regions for the whole block (backend
    // matmul_many): gate|up of every touched expert over the rows routed to it (gathered, one
    // GEMM per expert, not one GEMV per row) plus the shared expert's, then every down
    // projection. A decode step thus wakes the pool twice for its 8 + 1 experts instead of 27
    // times. Each row's sum runs over its experts in ascending id, then the shared expert —
    // the order of one-row passes, so multi-row passes reproduce them bit for bit.
    static void ffn(Backend& be, const dims<V>& d, const moe_weights& w, const float* x, float* out, std::int64_t n,
                    std::int64_t k, const std::int32_t* ids, const float* wts) {
        const std::int64_t E = d.n_embd(), X = d.n_expert(), F = d.n_ff_exp(), Fs = w.gate_shexp ? d.n_ff_shexp() : 0;
        const std::int64_t S = n * k;  // (row, slot) pairs
        // Grow-only scratch (steady-state decoding allocates nothing), one per calling thread; the
        // lambdas below run on pool threads, so they must see the caller's (references, not the
        // thread_local names).
        struct scratch {
            std::vector<std::int32_t> cnt, start, tok, pos_of;
            std::vector<float> gu, h, ys, gus, hs, yss;
            std::vector<backend::matmul_job> jobs;
            std::vector<weight> mats;  // stable storage for the per-expert views
        };
        thread_local scratch tls;
        scratch& sc = tls;
        auto& [cnt, start, tok, pos_of, gu, h, ys, gus, hs, yss, jobs, mats] = sc;
        cnt.assign(std::size_t(X + 1), 0);
        for (std::int64_t i = 0; i < S; ++i) ++cnt[ids[i] + 1];
        start.resize(std::size_t(X + 1));
        start[0] = 0;
        for (std::int64_t e = 0; e < X; ++e) start[e + 1] = start[e] + cnt[e + 1];
        tok.resize(std::size_t(S));
        pos_of.resize(std::size_t(S));  // slot t*k+j -> its position in expert-grouped order
        for (std::int64_t e = 0; e <= X; ++e) cnt[e] = 0;
        for (std::int64_t t = 0; t < n; ++t)  // rows in ascending order within each expert
            for (std::int64_t j = 0; j < k; ++j) {
                const std::int32_t e = ids[t * k + j];
                const std::int32_t p = start[e] + cnt[e]++;
                tok[p] = std::int32_t(t);
                pos_of[t * k + j] = p;
            }
        gu.resize(std::size_t(S * 2 * F));
        h.resize(std::size_t(S * F));
        ys.resize(std::size_t(S * E));
        gus.resize(std::size_t(n * 2 * Fs));
        hs.resize(std::size_t(n * Fs));
        yss.resize(std::size_t(n * E));
        mats.clear();
        mats.reserve(std::size_t(3 * X + 3));
        jobs.clear();
        for (std::int64_t e = 0; e < X; ++e) {
            const std::int64_t m = start[e + 1] - start[e];
            if (m == 0) continue;
            if (w.gate_up_exps) {
                const weight gu_e = w.gate_up_exps.expert(e);
                mats.push_back(gu_e.row_slice(0, F));
                mats.push_back(gu_e.row_slice(F, F));
            } else {
                mats.push_back(w.gate_exps.expert(e));
                mats.push_back(w.up_exps.expert(e));
            }
            float* g = gu.data() + std::size_t(start[e]) * 2 * F;
            jobs.push_back({&mats[mats.size() - 2], g, x, m, tok.data() + start[e]});
            jobs.push_back({&mats[mats.size() - 1], g + m * F, x, m, tok.data() + start[e]});
        }
        if (Fs) {
            jobs.push_back({&w.gate_shexp, gus.data(), x, n, nullptr});
            jobs.push_back({&w.up_shexp, gus.data() + n * Fs, x, n, nullptr});
        }
        be.matmul_many(jobs);
        // SwiGLU: h = silu(gate) ⊙ up, per expert block [m, F] (gate rows then up rows).
        be.run_chunks(X + 1, 4, [&](std::int64_t e0, std::int64_t e1, int) {
            for (std::int64_t e = e0; e < e1; ++e) {
                const bool shared = e == X;
                if (shared && !Fs) continue;
                const std::int64_t m = shared ? n : start[e + 1] - start[e], ff = shared ? Fs : F;
                const float* g = shared ? gus.data() : gu.data() + std::size_t(start[e]) * 2 * F;
                float* hh = shared ? hs.data() : h.data() + std::size_t(start[e]) * F;
                for (std::int64_t i = 0; i < m * ff; ++i) hh[i] = math::silu(g[i]) * g[m * ff + i];
            }
        });
        jobs.clear();
        for (std::int64_t e = 0; e < X; ++e) {
            const std::int64_t m = start[e + 1] - start[e];
            if (m == 0) continue;
            mats.push_back(w.down_exps.expert(e));
            jobs.push_back({&mats.back(), ys.data() + std::size_t(start[e]) * E, h.data() + std::size_t(start[e]) * F, m, nullptr});
        }
        if (Fs) jobs.push_back({&w.down_shexp, yss.data(), hs.data(), n, nullptr});
        be.matmul_many(jobs);
        // Weighted sums, row by row: routed experts in ascending id, then the shared expert.
        const float* sg = Fs ? w.shexp_gate.f32() : nullptr;
        be.run_chunks(n, 16, [&](std::int64_t t0, std::int64_t t1, int) {
            std::int32_t order[64];
            for (std::int64_t t = t0; t < t1; ++t) {
                float* o = out + t * E;
                std::fill(o, o + E, 0.f);
                const std::int64_t kk = std::min<std::int64_t>(k, 64);
                for (std::int64_t j = 0; j < kk; ++j) order[j] = std::int32_t(j);
                std::sort(order, order + kk, [&](std::int32_t a, std::int32_t b) { return ids[t * k + a] < ids[t * k + b]; });
                for (std::int64_t jj = 0; jj < kk; ++jj) {
                    const std::int64_t slot = t * k + order[jj];
                    const float wt = wts[slot];
                    const float* yr = ys.data() + std::size_t(pos_of[slot]) * E;
                    for (std::int64_t i = 0; i < E; ++i) o[i] += wt * yr[i];
                }
                if (Fs) {
                    float dot = 0.f;
                    for (std::int64_t i = 0; i < E; ++i) dot += x[t * E + i] * sg[i];
                    const float sgm = math::sigmoid(dot);
                    const float* yr = yss.data() + t * E;
                    for (std::int64_t i = 0; i < E; ++i) o[i] += sgm * yr[i];
                }
            }
        });
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
        if constexpr (requires { be.matmul_many(std::span<const backend::matmul_job>{}); }) {
            ffn(be, d, w, x, out, n, k, ids.data(), wts.data());  // fused (backend::cpu)
        } else {
            experts(be, d, w, x, out, n, k, ids.data(), wts.data(), ws);
            shared_expert(be, d, w, x, out, n);
        }
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
