#pragma once
// backend::cpu — the CPU policy. It owns the thread pool and the conversion scratch, and offers
// the operations layers ask for. Layers are written against this interface; backend::cuda
// (CLOVER_CUDA builds) offers the same names.
//
// Kernels are chosen at compile time (simd.hpp: AVX-512 with VNNI/BF16, AVX2, or scalar); the
// constructor runs the one CPUID check that refuses a binary this CPU cannot run.
#include <algorithm>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "clover/backend/cpu/matmul.hpp"
#include "clover/backend/cpu/simd.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

struct cpu_options {
    int threads = 0;  // 0: all hardware threads
};

// One product of a multi-product call: y[n, w.rows] = x · wᵀ.
struct matmul_job {
    const weight* w;
    float* y;
};

class cpu {
public:
    static constexpr const char* name = "CPU";
    using options = cpu_options;

    explicit cpu(options o = {})
        : pool_((cpu_detail::check_cpu(), o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())))),
          prep_(std::size_t(pool_.size())) {}

    int threads() const { return pool_.size(); }
    static const char* isa_name() { return cpu_detail::isa_name(); }
    // While alive, every matmul computes each row exactly as a one-row product would, so a
    // verify pass over drafted rows reproduces AR decoding bit for bit (lossless speculation
    // compares argmaxes, and a different summation order can flip a near tie).
    class exact_rows_scope {
    public:
        explicit exact_rows_scope(cpu& be) : be_(be), old_(be.exact_rows_) { be.exact_rows_ = true; }
        ~exact_rows_scope() { be_.exact_rows_ = old_; }
        exact_rows_scope(const exact_rows_scope&) = delete;
        exact_rows_scope& operator=(const exact_rows_scope&) = delete;

    private:
        cpu& be_;
        bool old_;
    };

    template <class F>
    void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
        pool_.parallel_for(n, grain, std::forward<F>(fn));
    }

    // fn(begin, end, thread) over [0, n) in chunks taken dynamically by the pool's threads.
    template <class F>
    void run_chunks(std::int64_t n, std::int64_t chunk, F&& fn) {
        pool_.run_chunks(n, chunk, std::forward<F>(fn));
    }

    // y[n, w.rows] = x[n, w.cols] · wᵀ, for one (non-stacked) weight matrix.
    void matmul(const weight& w, const float* x, float* y, std::int64_t n) {
        const matmul_job j{&w, y};
        matmul_many(std::span<const matmul_job>(&j, 1), x, n);
    }

    // Several products of the same input x [n, K] in one parallel region: the activation rows
    // are rounded/quantized once per activation format, and the rows of all weights form one
    // pool of work (a decode step's q|k|v or gate|up pay one wake-up instead of three).
    void matmul_many(std::span<const matmul_job> jobs, const float* x, std::int64_t n) {
        if (jobs.empty() || n <= 0) return;
        const std::int64_t K = jobs[0].w->cols;
        for (const auto& j : jobs)
            if (j.w->cols != K) fail("matmul_many: weights disagree on the input size (", j.w->name, ")");
        // Dense f32 with several rows: Eigen's blocked GEMM, split over output features (not in
        // exact-rows mode: its blocking changes the summation order with the row count).
        if (jobs.size() == 1 && jobs[0].w->type == dtype::f32 && n > 1 && !exact_rows_) {
            const weight& w = *jobs[0].w;
            float* y = jobs[0].y;
            const std::int64_t N = w.rows;
            using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
            Eigen::Map<const RowMat> X(x, n, K);
            pool_.parallel_for(N, 16, [&](std::int64_t b, std::int64_t e) {
                Eigen::Map<const RowMat> W(reinterpret_cast<const float*>(w.row(b)), e - b, K);
                Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + b, n, e - b, Eigen::OuterStride<>(N));
                Y.noalias() = X * W.transpose();
            });
            return;
        }
        // Prepare each distinct activation format once.
        using prep = cpu_detail::kernel_set::prep;
        struct fmt { prep p; cpu_detail::act_view view; };
        std::vector<fmt> fmts;
        std::vector<std::size_t> fmt_of(jobs.size());
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            const prep p = cpu_detail::kernels_for(jobs[i].w->type).act;
            std::size_t f = 0;
            while (f < fmts.size() && fmts[f].p != p) ++f;
            if (f == fmts.size()) fmts.push_back({p, {}});
            fmt_of[i] = f;
        }
        if (acts_.size() < fmts.size()) acts_.resize(fmts.size());
        for (std::size_t f = 0; f < fmts.size(); ++f) {
            const std::size_t stride = cpu_detail::act_row_bytes(fmts[f].p, K);
            std::byte* buf = acts_[f].get(stride * std::size_t(n));
            fmts[f].view = {buf, stride, n};
            const prep p = fmts[f].p;
            pool_.run_chunks(n, 8, [&](std::int64_t b, std::int64_t e, int t) {
                for (std::int64_t r = b; r < e; ++r) cpu_detail::prepare_row(p, x + r * K, buf + std::size_t(r) * stride, K, prep_[t]);
            });
        }
        // Work items: (job, row chunk, token chunk). Decode: ~8 chunks per thread, rows a
        // multiple of 4; prefill: 32 rows × 64 tokens (the weight chunk stays in L2 while the
        // token tiles stream through L1).
        const std::int64_t tchunk = n == 1 ? 1 : 64;
        const std::int64_t ntc = (n + tchunk - 1) / tchunk;
        std::int64_t total_rows = 0;
        for (const auto& j : jobs) total_rows += j.w->rows;
        std::int64_t rchunk = 32;
        if (n == 1) rchunk = std::clamp<std::int64_t>((total_rows / (8 * threads()) + 3) / 4 * 4, 4, 512);
        items_.clear();
        for (std::size_t i = 0; i < jobs.size(); ++i)
            for (std::int64_t r = 0; r < jobs[i].w->rows; r += rchunk)
                for (std::int64_t tc = 0; tc < ntc; ++tc)
                    items_.push_back({i, r, std::min(jobs[i].w->rows, r + rchunk), tc * tchunk, std::min(n, (tc + 1) * tchunk)});
        const item_storage* its = items_.data();
        pool_.run_chunks(std::int64_t(items_.size()), 1, [&](std::int64_t b, std::int64_t e, int) {
            for (std::int64_t k = b; k < e; ++k) {
                const item_storage& it = its[k];
                const weight& w = *jobs[it.job].w;
                cpu_detail::gemm_block(cpu_detail::kernels_for(w.type), w, it.r0, it.r1, fmts[fmt_of[it.job]].view, it.t0,
                                       it.t1, jobs[it.job].y, w.rows);
            }
        });
    }

    // Reference twin of matmul: dequantize-free plain loops over quant::vec_dot_ref.
    static void matmul_ref(const weight& w, const float* x, float* y, std::int64_t n) {
        const dtype at = quant::activation_type(w.type);
        const std::size_t xrow = quant::row_bytes(at, w.cols);
        std::vector<std::byte> xq(xrow);
        for (std::int64_t t = 0; t < n; ++t) {
            quant::quantize_row(at, x + t * w.cols, xq.data(), w.cols);
            for (std::int64_t o = 0; o < w.rows; ++o)
                y[t * w.rows + o] = quant::vec_dot_ref(w.type, w.row(o), xq.data(), w.cols);
        }
    }

private:
    struct item_storage { std::size_t job; std::int64_t r0, r1, t0, t1; };
    cpu_detail::thread_pool pool_;
    std::vector<cpu_detail::prep_scratch> prep_;       // per thread
    std::vector<cpu_detail::aligned_buffer> acts_;     // per activation format of one call
    std::vector<item_storage> items_;
    bool exact_rows_ = false;
};

}  // namespace clover::backend
