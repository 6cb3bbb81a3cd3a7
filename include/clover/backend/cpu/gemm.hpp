#pragma once
// Several products in one parallel region (backend::cpu's `matmul` primitive and the MoE's
// expert products): every distinct input is rounded/quantized once per activation format, and
// the rows of all weights form one pool of work (a decode step's q|k|v or gate|up, or all
// experts of an MoE pass, pay one wake-up instead of dozens). The per-call bookkeeping lives in
// `gemm_scratch`, which belongs to the pass, so two passes on two threads share nothing but the
// pool (whose regions are serialised).
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "clover/backend/cpu/matmul.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend::cpu_detail {

// One product: y[n, w.rows] = x · wᵀ over input rows x (gathered through `rows` when set: row i
// of the input is x[rows[i]]), which is how an MoE pass feeds each expert the rows routed to it.
struct gemm_job {
    const weight* w;
    float* y;
    const float* x;
    std::int64_t n;
    const std::int32_t* rows = nullptr;
};

struct gemm_scratch {
    struct input {
        kernel_set::prep p;
        const float* x;
        const std::int32_t* rows;
        std::int64_t n, K;
        std::size_t stride, offset;
        act_view view;
    };
    struct item { std::size_t job; std::int64_t r0, r1, t0, t1; };
    aligned_buffer acts;
    std::vector<input> inputs;
    std::vector<std::size_t> job_input;
    std::vector<std::pair<std::size_t, std::int64_t>> prep_index;
    std::vector<item> items;
    std::vector<prep_scratch> prep;  // per pool thread
};

// exact: every row computed exactly as a one-row product would be (no Eigen blocking, whose
// summation order changes with the row count). The quantized tiles are row-exact already.
inline void run_gemm(thread_pool& pool, gemm_scratch& sc, std::span<const gemm_job> jobs, bool exact) {
    if (jobs.empty()) return;
    // Dense f32 with more rows than a few sequences' decode step: Eigen's blocked GEMM, split over
    // output features. Up to small_batch_tokens rows the row tiles below stream the weights once;
    // Eigen packed every weight block again for 8 rows (gemm_pack_lhs showed in perf of an
    // 8-sequence decode step of the 8-layer Q4_K_M file, whose router and GDN gates are F32, and
    // is gone from it since; docs/performance.md).
    if (jobs.size() == 1 && jobs[0].w->type == dtype::f32 && jobs[0].n > small_batch_tokens && !jobs[0].rows && !exact) {
        const weight& w = *jobs[0].w;
        float* y = jobs[0].y;
        const std::int64_t N = w.rows, m = jobs[0].n, K = w.cols;
        using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
        Eigen::Map<const RowMat> X(jobs[0].x, m, K);
        pool.parallel_for(N, 16, [&](std::int64_t b, std::int64_t e) {
            Eigen::Map<const RowMat> W(reinterpret_cast<const float*>(w.row(b)), e - b, K);
            Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + b, m, e - b, Eigen::OuterStride<>(N));
            Y.noalias() = X * W.transpose();
        });
        return;
    }
    if (sc.prep.size() < std::size_t(pool.size())) sc.prep.resize(std::size_t(pool.size()));
    // Distinct inputs (x, rows, n, width, activation format), each prepared once.
    sc.inputs.clear();
    sc.job_input.resize(jobs.size());
    std::int64_t prep_rows = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        const kernel_set::prep p = kernels_for(jobs[i].w->type).act;
        const std::int64_t K = jobs[i].w->cols;
        std::size_t f = 0;
        while (f < sc.inputs.size() && !(sc.inputs[f].p == p && sc.inputs[f].x == jobs[i].x && sc.inputs[f].rows == jobs[i].rows &&
                                         sc.inputs[f].n == jobs[i].n && sc.inputs[f].K == K))
            ++f;
        if (f == sc.inputs.size()) {
            sc.inputs.push_back({p, jobs[i].x, jobs[i].rows, jobs[i].n, K, act_row_bytes(p, K), 0, {}});
            prep_rows += jobs[i].n;
        }
        sc.job_input[i] = f;
    }
    if (prep_rows == 0) return;
    std::size_t bytes = 0;
    for (auto& in : sc.inputs) {
        in.offset = bytes;
        bytes += in.stride * std::size_t(in.n);
    }
    std::byte* buf = sc.acts.get(bytes);
    for (auto& in : sc.inputs) in.view = {buf + in.offset, in.stride, in.n};
    // Preparation: one region over all rows of all inputs (serial when there are few).
    sc.prep_index.clear();
    for (std::size_t f = 0; f < sc.inputs.size(); ++f)
        for (std::int64_t r = 0; r < sc.inputs[f].n; ++r) sc.prep_index.emplace_back(f, r);
    auto prep_rows_fn = [&](std::int64_t b, std::int64_t e, int t) {
        for (std::int64_t k = b; k < e; ++k) {
            const auto [f, r] = sc.prep_index[std::size_t(k)];
            const auto& in = sc.inputs[f];
            const float* src = in.x + (in.rows ? std::int64_t(in.rows[r]) : r) * in.K;
            prepare_row(in.p, src, const_cast<std::byte*>(in.view.row(r)), in.K, sc.prep[std::size_t(t)]);
        }
    };
    if (prep_rows < 16) prep_rows_fn(0, prep_rows, 0);
    else pool.run_chunks(prep_rows, 8, prep_rows_fn);
    // Work items: (job, row chunk, token chunk). Decode: ~8 chunks per thread, rows a multiple
    // of 4; prefill: 32 rows × 64 tokens (the weight chunk stays in L2 while the token tiles
    // stream through L1).
    // Chunking per job, not per call: in a batch of several sequences the MoE's experts mostly
    // get one row each while the shared expert gets all of them; one multi-row job used to put
    // every 1-row expert on the prefill tiling too, and 2 sequences decoded together ran slower in
    // aggregate than one alone (docs/performance.md).
    std::int64_t total_rows = 0;
    for (const gemm_job& j : jobs) total_rows += j.w->rows;
    const std::int64_t decode_rchunk = std::clamp<std::int64_t>((total_rows / (8 * pool.size()) + 3) / 4 * 4, 4, 512);
    sc.items.clear();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        // Up to small_batch_tokens rows stream the weights like a decode step (matmul.hpp).
        const bool decode = jobs[i].n <= small_batch_tokens;
        // (a rearranged matrix's items start on its 16-row groups: x16_block)
        const std::int64_t rchunk = !decode ? 32 : jobs[i].w->layout == weight_layout::rows16 ? (decode_rchunk + 15) / 16 * 16 : decode_rchunk;
        const std::int64_t tchunk = decode ? jobs[i].n : 64;
        for (std::int64_t r = 0; r < jobs[i].w->rows; r += rchunk)
            for (std::int64_t t = 0; t < jobs[i].n; t += tchunk)
                sc.items.push_back({i, r, std::min(jobs[i].w->rows, r + rchunk), t, std::min(jobs[i].n, t + tchunk)});
    }
    const gemm_scratch::item* its = sc.items.data();
    pool.run_chunks(std::int64_t(sc.items.size()), 1, [&](std::int64_t b, std::int64_t e, int) {
        for (std::int64_t k = b; k < e; ++k) {
            const auto& it = its[k];
            const weight& w = *jobs[it.job].w;
            gemm_block(kernels_for(w.type), w, it.r0, it.r1, sc.inputs[sc.job_input[it.job]].view, it.t0, it.t1, jobs[it.job].y,
                       w.rows, exact);
        }
    });
}

// Reference twin of run_gemm: plain loops over quant::vec_dot_ref.
inline void gemm_ref(const weight& w, const float* x, float* y, std::int64_t n) {
    const dtype at = quant::activation_type(w.type);
    const std::size_t xrow = quant::row_bytes(at, w.cols);
    std::vector<std::byte> xq(xrow);
    for (std::int64_t t = 0; t < n; ++t) {
        quant::quantize_row(at, x + t * w.cols, xq.data(), w.cols);
        for (std::int64_t o = 0; o < w.rows; ++o) y[t * w.rows + o] = quant::vec_dot_ref(w.type, w.row(o), xq.data(), w.cols);
    }
}

}  // namespace clover::backend::cpu_detail
