#pragma once
// backend::cpu — the CPU policy. It owns the thread pool and the conversion scratch, and offers
// the operations layers ask for. Layers are written against this interface; backend::cuda
// (CLOVER_CUDA builds) offers the same names.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/backend/cpu/vec_dot.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

struct cpu_options {
    int threads = 0;  // 0: all hardware threads
};

class cpu {
public:
    static constexpr const char* name = "CPU";
    using options = cpu_options;

    explicit cpu(options o = {})
        : pool_(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()))) {}

    int threads() const { return pool_.size(); }

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

    // y[n, w.rows] = x[n, w.cols] · wᵀ, for one (non-stacked) weight matrix.
    void matmul(const weight& w, const float* x, float* y, std::int64_t n) {
        const std::int64_t K = w.cols, N = w.rows;
        if (w.type == dtype::f32 && n > 1 && !exact_rows_) {
            // Dense f32 multi-row: Eigen's blocked GEMM, split over output features.
            using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
            Eigen::Map<const RowMat> X(x, n, K);
            pool_.parallel_for(N, 16, [&](std::int64_t b, std::int64_t e) {
                Eigen::Map<const RowMat> W(reinterpret_cast<const float*>(w.row(b)), e - b, K);
                Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(y + b, n, e - b, Eigen::OuterStride<>(N));
                Y.noalias() = X * W.transpose();
            });
            return;
        }
        const dtype at = quant::activation_type(w.type);
        const std::size_t xrow = quant::row_bytes(at, K);
        const std::byte* xq = reinterpret_cast<const std::byte*>(x);
        if (at != dtype::f32) {
            act_.resize(xrow * std::size_t(n));
            for (std::int64_t t = 0; t < n; ++t) quant::quantize_row(at, x + t * K, act_.data() + t * xrow, K);
            xq = act_.data();
        }
        pool_.parallel_for(N, 32, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t o = b; o < e; ++o) {
                const std::byte* wr = w.row(o);
                for (std::int64_t t = 0; t < n; ++t) y[t * N + o] = cpu_detail::vec_dot(w.type, wr, xq + t * xrow, K);
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
    cpu_detail::thread_pool pool_;
    std::vector<std::byte> act_;
    bool exact_rows_ = false;
};

}  // namespace clover::backend
