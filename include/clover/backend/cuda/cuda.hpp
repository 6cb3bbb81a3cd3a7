#pragma once
// backend::cuda — the CUDA policy, beside backend::cpu: the same model type, decoders and session
// API work with `model<V, backend::cuda>`. Only nvcc translation units may include this header
// (it pulls in the .cuh kernels); CPU-only builds never see it.
//
// What this step is (README "CUDA backend"): a temporary adapter onto the backend concept
// (backend/concept.hpp) until the CUDA issue makes every primitive a kernel on device-resident
// state. The state pool, scratch and every primitive but the dense products are backend::cpu's
// (host memory, host thread pool); the `matmul` primitive runs on the GPU: weights are uploaded
// once (cached by their address in the mapped file), activations are copied in and results out
// per call. That is correct and testable against backend::cpu, and slow (one synchronisation per
// product). The device kernels for the rest of a pass (norm, rope, fused GDN step, chunked GDN,
// attention, CUB routing, expert-grouped products, block softmax) are in the .cuh files beside
// this one with tests against their CPU twins.
#if !defined(__CUDACC__)
#error "clover/backend/cuda/cuda.hpp must be compiled by nvcc (a .cu file, CLOVER_CUDA=ON); use backend::cpu otherwise"
#endif

#include <algorithm>
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
    std::size_t staging_bytes = std::size_t(64) << 20;  // pinned buffer weights are uploaded through
};

class cuda {
public:
    static constexpr const char* name = "CUDA";
    using options = cuda_options;

    explicit cuda(options o = {}) : opt_(o), cpu_(cpu_options{o.threads}) {
        const int n = cuda_detail::device_count();
        if (n == 0) fail("backend::cuda: no CUDA device is available");
        if (o.device < 0 || o.device >= n) fail("backend::cuda: device ", o.device, " does not exist (", n, " found)");
        if (o.staging_bytes == 0) fail("backend::cuda: staging_bytes must be positive");
        cuda_detail::device_guard on(o.device);
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

    // ---- the backend concept: backend::cpu's state and primitives, products on the GPU ----
    using tensor = cpu::tensor;
    using route = cpu::route;
    using state = cpu::state;
    using context = cpu::context;
    void map_weights(std::span<const std::byte> f) { cpu_.map_weights(f); }
    state make_state(std::span<const layer_state_spec> spec, const state_options& o) { return cpu_.make_state(spec, o); }
    context begin_pass() { return cpu_.begin_pass(); }
    void rollback(state& st, seq_id seq, std::int64_t keep, std::span<const std::int64_t> layers, const gdn_shape& g) {
        cpu_.rollback(st, seq, keep, layers, g);
    }
    void advance(state& st, const batch& bt) { cpu_.advance(st, bt); }
    void embed(context& cx, const batch& bt, const weight& w, tensor h) { cpu_.embed(cx, bt, w, h); }
    void rms_norm(context& cx, tensor x, const weight& w, tensor out, float eps) { cpu_.rms_norm(cx, x, w, out, eps); }
    void add_rms_norm(context& cx, tensor h, tensor y, const weight& w, tensor out, float eps) {
        cpu_.add_rms_norm(cx, h, y, w, out, eps);
    }
    // Row-exact whatever the batch: the device product is one warp per output element with a
    // fixed reduction tree (matmul.cuh).
    void matmul(context&, const batch&, tensor x, std::span<const product_of<tensor>> prods) {
        for (const auto& p : prods) matmul(*p.w, x.data, p.y.data, x.rows);
    }
    void attn_prepare(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a,
                      const attention_norms& n, tensor qg, tensor k, tensor v, tensor q, tensor gate) {
        cpu_.attn_prepare(cx, bt, st, layer, a, n, qg, k, v, q, gate);
    }
    void attention(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a, tensor q,
                   tensor gate, tensor k, tensor v, tensor out) {
        cpu_.attention(cx, bt, st, layer, a, q, gate, k, v, out);
    }
    void gdn_conv(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w,
                  tensor m, tensor y) {
        cpu_.gdn_conv(cx, bt, st, layer, g, w, m, y);
    }
    void gdn_mix(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w,
                 tensor y, tensor beta, tensor alpha, tensor o) {
        cpu_.gdn_mix(cx, bt, st, layer, g, w, y, beta, alpha, o);
    }
    void gated_norm(context& cx, const gdn_shape& g, const weight& w, tensor o, tensor z) { cpu_.gated_norm(cx, g, w, o, z); }
    void moe_route(context& cx, const batch& bt, const moe_shape& ms, const weight& router, tensor x, route r) {
        cpu_.moe_route(cx, bt, ms, router, x, r);
    }
    void moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r, tensor out) {
        cpu_.moe_ffn(cx, bt, ms, mp, x, r, out);
    }
    void lm_head(context& cx, const batch& bt, const weight& w, tensor x, tensor logits) { cpu_.lm_head(cx, bt, w, x, logits); }
    void read_logits(context& cx, tensor logits, float* host) { cpu_.read_logits(cx, logits, host); }

    // y[n, w.rows] = x[n, w.cols] · wᵀ; x and y are host pointers.
    void matmul(const weight& w, const float* x, float* y, std::int64_t n) {
        if (n <= 0) return;
        if (on_host(w)) {
            cpu_.matmul(w, x, y, n);
            return;
        }
        cuda_detail::device_guard on(opt_.device);
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
    //
    // The bytes go through a bounded pinned staging buffer, chunk by chunk, with cudaMemcpyAsync
    // on the backend's stream: every kernel that reads the weight is queued later on that same
    // stream, so it runs after the copy (a cudaMemcpy from pageable memory on the legacy stream
    // has no ordering with a non-blocking stream). The stream is synchronised before a chunk
    // refills (or regrows) the staging buffer, which the previous copy may still be reading.
    // Work on any other stream must synchronise with stream() before reading the copy.
    const cuda_detail::device_matrix& upload(const weight& w) {
        const key k{w.data, w.rows * w.n_mat};
        auto it = cache_.find(k);
        if (it != cache_.end()) return it->second.m;
        if (!quant::is_supported_weight(w.type))
            fail("backend::cuda: weight '", w.name, "' has type ", dtype_name(w.type), ", which has no CUDA kernel");
        cuda_detail::device_guard on(opt_.device);
        entry e;
        const std::size_t bytes = std::size_t(w.rows * w.n_mat) * w.row_bytes;
        e.buf.reserve(bytes);
        for (std::size_t off = 0; off < bytes;) {
            const std::size_t len = std::min(bytes - off, opt_.staging_bytes);
            stream_->sync();
            staging_.reserve(len);
            std::memcpy(staging_.get(), w.data + off, len);
            CLOVER_CUDA_CHECK(cudaMemcpyAsync(e.buf.get<std::uint8_t>() + off, staging_.get(), len, cudaMemcpyHostToDevice,
                                              stream()));
            off += len;
        }
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
    cuda_detail::pinned_buffer staging_;
    std::size_t uploaded_bytes_ = 0;
};

}  // namespace clover::backend
