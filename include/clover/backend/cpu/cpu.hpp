#pragma once
// backend::cpu — the CPU policy. It owns the thread pool and the conversion scratch, and offers
// the operations layers ask for. Layers are written against this interface; backend::cuda
// (CLOVER_CUDA builds) offers the same names.
//
// Kernels are chosen at compile time (simd.hpp: AVX-512 with VNNI/BF16, AVX2, or scalar); the
// constructor runs the one CPUID check that refuses a binary this CPU cannot run.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <thread>
#include <vector>

#include <Eigen/Core>
#include <sys/mman.h>
#include <unistd.h>

#include "clover/backend/cpu/matmul.hpp"
#include "clover/backend/cpu/simd.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

struct cpu_options {
    int threads = 0;       // 0: all hardware threads
    bool prefault = true;  // map_weights populates the page tables of the weight file at load
};

// One product of a multi-product call: y[n, w.rows] = x · wᵀ. Input rows default to the call's
// shared input; a job may bring its own (x, n) and gather its rows (row i of the input is
// x[rows[i]]), which is how an MoE pass feeds each expert the tokens routed to it.
struct matmul_job {
    const weight* w;
    float* y;
    const float* x = nullptr;             // nullptr: the call's input
    std::int64_t n = -1;                  // -1: the call's n
    const std::int32_t* rows = nullptr;   // nullptr: rows 0..n-1 of x
};

class cpu {
public:
    static constexpr const char* name = "CPU";
    using options = cpu_options;

    explicit cpu(options o = {})
        : opt_(o), pool_((cpu_detail::check_cpu(), o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())))),
          prep_(std::size_t(pool_.size())) {}

    int threads() const { return pool_.size(); }
    static const char* isa_name() { return cpu_detail::isa_name(); }

    // The model's weights are the mapped file itself (nothing is copied). Populating the page
    // tables once at load (MADV_POPULATE_READ: no copy, the pages stay the page cache's) moves
    // the first-touch faults out of the passes: without it every token of a decode run touched
    // new expert pages and spent ~15% of its time in the kernel's fault path (measured with
    // perf on the 8-layer Q4_K_M file). llama.cpp does the same with MAP_POPULATE. Skipped for
    // files larger than 3/4 of physical memory (they only fit through demand paging) and when
    // options.prefault is false or CLOVER_NO_PREFAULT is set.
    void map_weights(std::span<const std::byte> file) const {
        if (!opt_.prefault || file.empty() || std::getenv("CLOVER_NO_PREFAULT")) return;
        const long page = ::sysconf(_SC_PAGESIZE);
        const double phys = double(::sysconf(_SC_PHYS_PAGES)) * double(page);
        if (phys > 0 && double(file.size()) > 0.75 * phys) return;
        auto* start = reinterpret_cast<std::byte*>(std::uintptr_t(file.data()) / std::uintptr_t(page) * std::uintptr_t(page));
        const std::size_t len = std::size_t(file.data() + file.size() - start);
#ifdef MADV_POPULATE_READ
        if (::madvise(start, len, MADV_POPULATE_READ) == 0) return;
#endif
        ::madvise(start, len, MADV_WILLNEED);  // older kernels: at least read ahead
    }
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
        const matmul_job j{&w, y, x, n};
        matmul_many(std::span<const matmul_job>(&j, 1), x, n);
    }

    // Several products in one parallel region: every distinct input is rounded/quantized once
    // per activation format, and the rows of all weights form one pool of work (a decode step's
    // q|k|v or gate|up, or all experts of an MoE pass, pay one wake-up instead of dozens).
    void matmul_many(std::span<const matmul_job> jobs, const float* x = nullptr, std::int64_t n = 0) {
        if (jobs.empty()) return;
        auto x_of = [&](const matmul_job& j) { return j.x ? j.x : x; };
        auto n_of = [&](const matmul_job& j) { return j.n >= 0 ? j.n : n; };
        // Dense f32 with several rows: Eigen's blocked GEMM, split over output features (not in
        // exact-rows mode: its blocking changes the summation order with the row count).
        if (jobs.size() == 1 && jobs[0].w->type == dtype::f32 && n_of(jobs[0]) > 1 && !jobs[0].rows && !exact_rows_) {
            const weight& w = *jobs[0].w;
            float* y = jobs[0].y;
            const std::int64_t N = w.rows, m = n_of(jobs[0]), K = w.cols;
            using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
            Eigen::Map<const RowMat> X(x_of(jobs[0]), m, K);
            pool_.parallel_for(N, 16, [&](std::int64_t b, std::int64_t e) {
                Eigen::Map<const RowMat> W(reinterpret_cast<const float*>(w.row(b)), e - b, K);
                Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + b, m, e - b, Eigen::OuterStride<>(N));
                Y.noalias() = X * W.transpose();
            });
            return;
        }
        // Distinct inputs (x, rows, n, width, activation format), each prepared once.
        using prep = cpu_detail::kernel_set::prep;
        inputs_.clear();
        job_input_.resize(jobs.size());
        std::int64_t prep_rows = 0;
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            const prep p = cpu_detail::kernels_for(jobs[i].w->type).act;
            const float* xi = x_of(jobs[i]);
            const std::int64_t ni = n_of(jobs[i]), K = jobs[i].w->cols;
            std::size_t f = 0;
            while (f < inputs_.size() && !(inputs_[f].p == p && inputs_[f].x == xi && inputs_[f].rows == jobs[i].rows &&
                                           inputs_[f].n == ni && inputs_[f].K == K))
                ++f;
            if (f == inputs_.size()) {
                inputs_.push_back({p, xi, jobs[i].rows, ni, K, cpu_detail::act_row_bytes(p, K), 0, {}});
                prep_rows += ni;
            }
            job_input_[i] = f;
        }
        if (prep_rows == 0) return;
        std::size_t bytes = 0;
        for (auto& in : inputs_) {
            in.offset = bytes;
            bytes += in.stride * std::size_t(in.n);
        }
        std::byte* buf = acts_.get(bytes);
        for (auto& in : inputs_) in.view = {buf + in.offset, in.stride, in.n};
        // Preparation: one region over all rows of all inputs (serial when there are few).
        prep_index_.clear();
        for (std::size_t f = 0; f < inputs_.size(); ++f)
            for (std::int64_t r = 0; r < inputs_[f].n; ++r) prep_index_.push_back({f, r});
        auto prep_rows_fn = [&](std::int64_t b, std::int64_t e, int t) {
            for (std::int64_t k = b; k < e; ++k) {
                const auto [f, r] = prep_index_[std::size_t(k)];
                const auto& in = inputs_[f];
                const float* src = in.x + (in.rows ? std::int64_t(in.rows[r]) : r) * in.K;
                cpu_detail::prepare_row(in.p, src, const_cast<std::byte*>(in.view.row(r)), in.K, prep_[std::size_t(t)]);
            }
        };
        if (prep_rows < 16) prep_rows_fn(0, prep_rows, 0);
        else pool_.run_chunks(prep_rows, 8, prep_rows_fn);
        // Work items: (job, row chunk, token chunk). Decode: ~8 chunks per thread, rows a
        // multiple of 4; prefill: 32 rows × 64 tokens (the weight chunk stays in L2 while the
        // token tiles stream through L1).
        bool decode = true;
        std::int64_t total_rows = 0;
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            decode = decode && n_of(jobs[i]) <= 1;
            total_rows += jobs[i].w->rows;
        }
        const std::int64_t tchunk = decode ? 1 : 64;
        const std::int64_t rchunk = decode ? std::clamp<std::int64_t>((total_rows / (8 * threads()) + 3) / 4 * 4, 4, 512) : 32;
        items_.clear();
        for (std::size_t i = 0; i < jobs.size(); ++i) {
            const std::int64_t ni = n_of(jobs[i]);
            for (std::int64_t r = 0; r < jobs[i].w->rows; r += rchunk)
                for (std::int64_t t = 0; t < ni; t += tchunk)
                    items_.push_back({i, r, std::min(jobs[i].w->rows, r + rchunk), t, std::min(ni, t + tchunk)});
        }
        const item_storage* its = items_.data();
        pool_.run_chunks(std::int64_t(items_.size()), 1, [&](std::int64_t b, std::int64_t e, int) {
            for (std::int64_t k = b; k < e; ++k) {
                const item_storage& it = its[k];
                const weight& w = *jobs[it.job].w;
                cpu_detail::gemm_block(cpu_detail::kernels_for(w.type), w, it.r0, it.r1, inputs_[job_input_[it.job]].view,
                                       it.t0, it.t1, jobs[it.job].y, w.rows);
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
    options opt_;
    struct input_storage {
        cpu_detail::kernel_set::prep p;
        const float* x;
        const std::int32_t* rows;
        std::int64_t n, K;
        std::size_t stride, offset;
        cpu_detail::act_view view;
    };
    cpu_detail::thread_pool pool_;
    std::vector<cpu_detail::prep_scratch> prep_;  // per thread
    cpu_detail::aligned_buffer acts_;             // prepared inputs of one call
    std::vector<input_storage> inputs_;
    std::vector<std::size_t> job_input_;
    std::vector<std::pair<std::size_t, std::int64_t>> prep_index_;
    std::vector<item_storage> items_;
    bool exact_rows_ = false;
};

// Runs several products of one input: one multi-product call on backends that have it
// (backend::cpu), one matmul per job elsewhere. Layers call this so they stay backend-generic.
template <class Backend>
void matmul_all(Backend& be, std::span<const matmul_job> jobs, const float* x, std::int64_t n) {
    if constexpr (requires { be.matmul_many(jobs, x, n); }) {
        be.matmul_many(jobs, x, n);
    } else {
        for (const auto& j : jobs) {
            if (j.rows) fail("matmul_all: this backend cannot gather rows");
            be.matmul(*j.w, j.x ? j.x : x, j.y, j.n >= 0 ? j.n : n);
        }
    }
}

}  // namespace clover::backend
