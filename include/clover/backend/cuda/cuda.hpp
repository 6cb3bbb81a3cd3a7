#pragma once
// backend::cuda — the CUDA policy, beside backend::cpu: the same model type, decoders and session
// API work with `model<V, backend::cuda>`. Only nvcc translation units may include this header
// (it pulls in the .cuh kernels); CPU-only builds never see it.
//
// What this first step is (README "CUDA backend"): it offers the interface layers already call
// — matmul on host pointers, parallel_for, exact_rows_scope, options — and runs every matmul on
// the GPU: weights are uploaded once (cached by their address in the mapped file), activations
// are copied in and results out per call. Norms, attention, the GDN recurrence and routing still
// run on the host thread pool. That is correct and testable against backend::cpu, and slow (one
// synchronisation per product). The device kernels for the rest of a pass (norm, rope, fused GDN
// step, chunked GDN, attention over the KV cache, CUB routing, expert-grouped products, block
// softmax) are in the .cuh files beside this one with tests against their CPU twins; wiring them
// into device-resident passes captured in CUDA graphs is the next step.
#if !defined(__CUDACC__)
#error "clover/backend/cuda/cuda.hpp must be compiled by nvcc (a .cu file, CLOVER_CUDA=ON); use backend::cpu otherwise"
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "clover/backend/cpu/cpu.hpp"
#include "clover/backend/cuda/attention.cuh"
#include "clover/backend/cuda/gdn.cuh"
#include "clover/backend/cuda/matmul.cuh"
#include "clover/backend/cuda/moe.cuh"
#include "clover/backend/cuda/ops.cuh"
#include "clover/backend/cuda/runtime.cuh"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

struct cuda_options {
    int threads = 0;    // host threads for the parts of a pass still on the CPU (0: all)
    int device = 0;     // CUDA device ordinal
    int n_cpu_moe = 0;  // --n-cpu-moe N: the routed experts of layers 0..N-1 stay in host memory
                        // and are computed by the CPU (llama.cpp's meaning of the flag)
};

class cuda {
public:
    static constexpr const char* name = "CUDA";
    using options = cuda_options;

    explicit cuda(options o = {}) : opt_(o), cpu_(cpu_options{o.threads}) {
        const int n = cuda_detail::device_count();
        if (n == 0) fail("backend::cuda: no CUDA device is available");
        if (o.device < 0 || o.device >= n) fail("backend::cuda: device ", o.device, " does not exist (", n, " found)");
        CLOVER_CUDA_CHECK(cudaSetDevice(o.device));
        stream_ = std::make_unique<cuda_detail::stream>();
    }

    int threads() const { return cpu_.threads(); }
    int device() const { return opt_.device; }
    cudaStream_t stream() const { return stream_->get(); }
    backend::cpu& host() { return cpu_; }

    // The device kernels are row-exact by construction (matmul.cuh: one warp per output element
    // with a fixed reduction tree, independent of the number of rows), so verify passes already
    // reproduce AR decoding; the scope also makes the host fallbacks (n_cpu_moe) row-exact.
    class exact_rows_scope {
    public:
        explicit exact_rows_scope(cuda& be) : inner_(be.cpu_) {}
        exact_rows_scope(const exact_rows_scope&) = delete;
        exact_rows_scope& operator=(const exact_rows_scope&) = delete;

    private:
        cpu::exact_rows_scope inner_;
    };

    template <class F>
    void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
        cpu_.parallel_for(n, grain, std::forward<F>(fn));
    }

    // y[n, w.rows] = x[n, w.cols] · wᵀ; x and y are host pointers.
    void matmul(const weight& w, const float* x, float* y, std::int64_t n) {
        if (n <= 0) return;
        if (on_host(w)) {
            cpu_.matmul(w, x, y, n);
            return;
        }
        const cuda_detail::device_matrix& dw = upload(w);
        const std::size_t xb = std::size_t(n * w.cols) * 4, yb = std::size_t(n * w.rows) * 4;
        float* dx = x_.get<float>(std::size_t(n * w.cols));
        float* dy = y_.get<float>(std::size_t(n * w.rows));
        void* act = act_.get<std::uint8_t>(cuda_detail::act_bytes(w.type, n, w.cols));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(dx, x, xb, cudaMemcpyHostToDevice, stream()));
        cuda_detail::matmul(dw, dx, dy, n, act, stream());
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(y, dy, yb, cudaMemcpyDeviceToHost, stream()));
        stream_->sync();  // the caller reads y next (this is the host-interface step's cost)
    }

    // The device copy of a weight, uploaded on first use. Keyed by the address of its first byte
    // in the mapped file (stable for the model's life) and its shape: a row slice of a merged
    // tensor is its own entry.
    const cuda_detail::device_matrix& upload(const weight& w) {
        const key k{w.data, w.rows * w.n_mat};
        auto it = cache_.find(k);
        if (it != cache_.end()) return it->second.m;
        if (!quant::is_supported_weight(w.type))
            fail("backend::cuda: weight '", w.name, "' has type ", dtype_name(w.type), ", which has no CUDA kernel");
        entry e;
        const std::size_t bytes = std::size_t(w.rows * w.n_mat) * w.row_bytes;
        e.buf.reserve(bytes);
        CLOVER_CUDA_CHECK(cudaMemcpy(e.buf.get(), w.data, bytes, cudaMemcpyHostToDevice));
        e.m = {e.buf.get<const std::uint8_t>(), w.type, w.cols, w.rows, w.n_mat, w.row_bytes};
        uploaded_bytes_ += bytes;
        return cache_.emplace(k, std::move(e)).first->second.m;
    }
    std::size_t uploaded_bytes() const { return uploaded_bytes_; }

    // True when w is a routed-expert matrix of a layer below opt.n_cpu_moe (its name is
    // "blk.<layer>.ffn_*_exps.weight"; expert() and row_slice() views keep the name).
    bool on_host(const weight& w) const {
        if (opt_.n_cpu_moe <= 0 || w.name.find("_exps") == std::string::npos) return false;
        if (w.name.rfind("blk.", 0) != 0) return false;
        return std::atoi(w.name.c_str() + 4) < opt_.n_cpu_moe;
    }

private:
    struct key {
        const std::byte* data;
        std::int64_t rows;
        bool operator==(const key& o) const { return data == o.data && rows == o.rows; }
    };
    struct key_hash {
        std::size_t operator()(const key& k) const {
            return std::hash<const void*>()(k.data) ^ (std::hash<std::int64_t>()(k.rows) << 1);
        }
    };
    struct entry {
        cuda_detail::device_buffer buf;
        cuda_detail::device_matrix m;
    };

    options opt_;
    backend::cpu cpu_;
    std::unique_ptr<cuda_detail::stream> stream_;
    std::unordered_map<key, entry, key_hash> cache_;
    cuda_detail::device_buffer x_, y_, act_;
    std::size_t uploaded_bytes_ = 0;
};

}  // namespace clover::backend
