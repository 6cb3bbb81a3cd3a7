#pragma once
// The CPU backend's MoE primitives (architecture.md §2.6, clover-diffusion.md §3): routing with
// the per-block expert coreset, and the expert products of every row of a batch grouped by
// expert (one product per touched expert over the rows routed to it, from all sequences).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/backend/cpu/gemm.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/core/batch.hpp"
#include "clover/core/math.hpp"

namespace clover::backend::cpu_detail {

// Top-k over one row of probabilities (ties: lower index first), renormalised. Candidates are
// `allowed` (all experts when empty): the coreset restricts routing this way.
inline void route_row(const float* p, std::int64_t n_expert, std::int64_t k, const std::vector<std::int32_t>& allowed,
                      std::int32_t* ids, float* w, std::vector<std::int32_t>& cand) {
    if (allowed.empty()) {
        cand.resize(std::size_t(n_expert));
        std::iota(cand.begin(), cand.end(), 0);
    } else {
        cand = allowed;
    }
    const std::int64_t kk = std::min<std::int64_t>(k, std::int64_t(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + kk, cand.end(),
                      [&](std::int32_t a, std::int32_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
    double sum = 0;
    for (std::int64_t j = 0; j < kk; ++j) sum += p[cand[j]];
    for (std::int64_t j = 0; j < k; ++j) {  // slots past the candidates: weight 0 on expert cand[0]
        ids[j] = j < kk ? cand[j] : cand[0];
        w[j] = j < kk ? float(p[cand[j]] / sum) : 0.f;
    }
}

inline void route_row(const float* p, std::int64_t n_expert, std::int64_t k, const std::vector<std::int32_t>& allowed,
                      std::int32_t* ids, float* w) {
    std::vector<std::int32_t> cand;
    route_row(p, n_expert, std::min<std::int64_t>(k, allowed.empty() ? k : std::int64_t(allowed.size())), allowed, ids, w, cand);
}

// The expert coreset of a preview block (clover-diffusion.md §3, this project's rule): every
// row's router probabilities count, masked or not; score[e] = Σ_t P[t, e]; the C experts with
// the largest score form the coreset (ties: lower index first). C = 0 or C >= X: no
// restriction (an empty set). probs: [n, X].
inline std::vector<std::int32_t> select_coreset(const float* probs, std::int64_t n, std::int64_t n_expert, std::int64_t C) {
    if (C <= 0 || C >= n_expert) return {};
    std::vector<double> score(static_cast<std::size_t>(n_expert), 0.0);
    for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t e = 0; e < n_expert; ++e) score[e] += probs[t * n_expert + e];
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n_expert));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + C, ids.end(),
                      [&](std::int32_t a, std::int32_t b) { return score[a] != score[b] ? score[a] > score[b] : a < b; });
    ids.resize(static_cast<std::size_t>(C));
    std::sort(ids.begin(), ids.end());
    return ids;
}

// Router logits that are not finite (NaN, +-inf: an overflow upstream) count as -inf, so their
// experts get probability 0; a row with no finite logit routes as if all were equal (uniform
// probabilities, so its top k are the lowest allowed ids). Without it a NaN reaches the top-k
// comparison (no strict weak order) and the weights. The CUDA routing kernel applies the same
// rule (cuda/moe.cuh warp_softmax): both backends choose the same experts for such a row.
inline void route_logits(float* l, std::int64_t X) {
    bool any = false;
    for (std::int64_t e = 0; e < X; ++e) {
        if (std::isfinite(l[e])) any = true;
        else l[e] = -std::numeric_limits<float>::infinity();
    }
    if (!any) std::fill(l, l + X, 0.f);
}

// probs [n, X] (router logits in, probabilities out) -> ids, wts [n, k]. A coreset smaller
// than k gives its rows weight-0 slots (ids of the coreset's first expert) so every row has k.
// Non-finite logits: route_logits.
inline void moe_route(const batch& bt, const moe_shape& ms, float* probs, std::int32_t* ids, float* wts) {
    const std::int64_t X = ms.n_expert, k = ms.n_expert_used;
    std::vector<std::int32_t> cand, none;
    for (const segment& s : bt.segments()) {
        for (std::int64_t t = s.row0; t < s.row0 + s.n; ++t) {
            route_logits(probs + t * X, X);
            math::softmax(probs + t * X, X);
        }
        const std::vector<std::int32_t> allowed =
            s.kind == pass_kind::preview ? select_coreset(probs + s.row0 * X, s.n, X, s.coreset) : none;
        for (std::int64_t t = s.row0; t < s.row0 + s.n; ++t) route_row(probs + t * X, X, k, allowed, ids + t * k, wts + t * k, cand);
    }
}

struct moe_scratch {
    std::vector<std::int32_t> cnt, start, tok, pos_of;
    std::vector<float> gu, h, ys, gus, hs, yss;
    std::vector<gemm_job> jobs;
    std::vector<weight> mats;  // stable storage for the per-expert views
};

// Routed experts and the shared expert for rows x [n, E], routing ids/wts [n, k] -> out [n, E]
// (overwritten). Two product regions for the whole batch: gate|up of every touched expert over
// the rows routed to it (gathered) plus the shared expert's, then every down projection. Each
// row's sum runs over its experts in ascending id, then the shared expert — the order of
// one-row passes, so multi-row passes reproduce them bit for bit.
inline void moe_ffn(thread_pool& pool, gemm_scratch& gs, moe_scratch& sc, const moe_shape& sh, const moe_params& w,
                    const float* x, std::int64_t n, const std::int32_t* ids, const float* wts, float* out, std::int64_t E,
                    bool exact) {
    const std::int64_t X = sh.n_expert, F = sh.n_ff, k = sh.n_expert_used;
    const std::int64_t Fs = w.gate_shexp && *w.gate_shexp ? sh.n_ff_shared : 0;
    const std::int64_t S = n * k;
    // Plain references, not a structured binding: clang before 16 cannot capture bindings in
    // the lambdas below.
    auto& cnt = sc.cnt;
    auto& start = sc.start;
    auto& tok = sc.tok;
    auto& pos_of = sc.pos_of;
    auto& gu = sc.gu;
    auto& h = sc.h;
    auto& ys = sc.ys;
    auto& gus = sc.gus;
    auto& hs = sc.hs;
    auto& yss = sc.yss;
    auto& jobs = sc.jobs;
    auto& mats = sc.mats;
    cnt.assign(std::size_t(X + 1), 0);
    for (std::int64_t i = 0; i < S; ++i) ++cnt[std::size_t(ids[i] + 1)];
    start.assign(std::size_t(X + 1), 0);
    for (std::int64_t e = 0; e < X; ++e) start[std::size_t(e + 1)] = start[std::size_t(e)] + cnt[std::size_t(e + 1)];
    tok.resize(std::size_t(S));
    pos_of.resize(std::size_t(S));
    std::fill(cnt.begin(), cnt.end(), 0);
    for (std::int64_t t = 0; t < n; ++t)  // rows in ascending order within each expert
        for (std::int64_t j = 0; j < k; ++j) {
            const std::int32_t e = ids[t * k + j];
            const std::int32_t p = start[std::size_t(e)] + cnt[std::size_t(e)]++;
            tok[std::size_t(p)] = std::int32_t(t);
            pos_of[std::size_t(t * k + j)] = p;
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
    const bool merged = w.gate_up_exps && *w.gate_up_exps;
    for (std::int64_t e = 0; e < X; ++e) {
        const std::int64_t m = start[std::size_t(e + 1)] - start[std::size_t(e)];
        if (m == 0) continue;
        if (merged) {
            const weight gu_e = w.gate_up_exps->expert(e);
            mats.push_back(gu_e.row_slice(0, F));
            mats.push_back(gu_e.row_slice(F, F));
        } else {
            mats.push_back(w.gate_exps->expert(e));
            mats.push_back(w.up_exps->expert(e));
        }
        float* g = gu.data() + std::size_t(start[std::size_t(e)]) * 2 * F;
        const std::int32_t* rows = tok.data() + start[std::size_t(e)];
        jobs.push_back({&mats[mats.size() - 2], g, x, m, rows});
        jobs.push_back({&mats[mats.size() - 1], g + m * F, x, m, rows});
    }
    if (Fs) {
        jobs.push_back({w.gate_shexp, gus.data(), x, n});
        jobs.push_back({w.up_shexp, gus.data() + n * Fs, x, n});
    }
    run_gemm(pool, gs, jobs, exact);
    // SwiGLU: h = silu(gate) ⊙ up, per expert block [m, F] (gate rows then up rows).
    pool.run_chunks(X + 1, 4, [&](std::int64_t e0, std::int64_t e1, int) {
        for (std::int64_t e = e0; e < e1; ++e) {
            const bool shared = e == X;
            if (shared && !Fs) continue;
            const std::int64_t m = shared ? n : start[std::size_t(e + 1)] - start[std::size_t(e)], ff = shared ? Fs : F;
            const float* g = shared ? gus.data() : gu.data() + std::size_t(start[std::size_t(e)]) * 2 * F;
            float* hh = shared ? hs.data() : h.data() + std::size_t(start[std::size_t(e)]) * F;
            for (std::int64_t i = 0; i < m * ff; ++i) hh[i] = math::silu(g[i]) * g[m * ff + i];
        }
    });
    jobs.clear();
    for (std::int64_t e = 0; e < X; ++e) {
        const std::int64_t m = start[std::size_t(e + 1)] - start[std::size_t(e)];
        if (m == 0) continue;
        mats.push_back(w.down_exps->expert(e));
        jobs.push_back({&mats.back(), ys.data() + std::size_t(start[std::size_t(e)]) * E,
                        h.data() + std::size_t(start[std::size_t(e)]) * F, m});
    }
    if (Fs) jobs.push_back({w.down_shexp, yss.data(), hs.data(), n});
    run_gemm(pool, gs, jobs, exact);
    // Weighted sums, row by row: routed experts in ascending id, then the shared expert.
    const float* sg = Fs ? w.shexp_gate->f32() : nullptr;
    pool.run_chunks(n, 16, [&](std::int64_t t0, std::int64_t t1, int) {
        std::vector<std::int32_t> ord(static_cast<std::size_t>(k));
        for (std::int64_t t = t0; t < t1; ++t) {
            float* o = out + t * E;
            std::fill(o, o + E, 0.f);
            std::iota(ord.begin(), ord.end(), 0);
            std::sort(ord.begin(), ord.end(), [&](std::int32_t a, std::int32_t b) { return ids[t * k + a] < ids[t * k + b]; });
            for (std::int64_t jj = 0; jj < k; ++jj) {
                const std::int64_t slot = t * k + ord[std::size_t(jj)];
                const float wt = wts[slot];
                if (wt == 0.f) continue;  // coreset padding
                const float* yr = ys.data() + std::size_t(pos_of[std::size_t(slot)]) * E;
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

}  // namespace clover::backend::cpu_detail
