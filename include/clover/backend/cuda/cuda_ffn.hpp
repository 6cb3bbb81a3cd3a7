#pragma once
// backend::cuda's MoE feed-forward primitive (out of cuda.hpp to keep files small): the routed
// experts grouped by expert on the device (moe.cuh), then the shared expert and its sigmoid gate
// — the CPU's order of additions (backend/cpu/moe.hpp): routed experts in ascending id, then
// the shared expert. Layers below options.n_cpu_moe run the whole primitive on the host.
#if !defined(__CUDACC__)
#error "clover/backend/cuda/cuda_ffn.hpp is part of backend/cuda/cuda.hpp (nvcc only)"
#endif

#include "clover/backend/cuda/cuda.hpp"

namespace clover::backend {

inline void cuda::moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r,
                          tensor out) {
    const std::int64_t n = x.rows, E = x.cols, k = ms.n_expert_used;
    auto& d = cx.scratch();
    const cudaStream_t s = stream();
    const bool merged = mp.gate_up_exps && *mp.gate_up_exps;
    if (on_host(merged ? *mp.gate_up_exps : *mp.gate_exps)) {
        // Experts in host memory: the input and the routing go to the host, the CPU computes the
        // routed and the shared expert, the result comes back.
        d.hx.resize(std::size_t(n * E));
        d.hy.resize(std::size_t(n * E));
        d.hw.resize(std::size_t(n * k));
        d.host_ids.resize(std::size_t(n * k));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(d.hx.data(), x.data, d.hx.size() * 4, cudaMemcpyDeviceToHost, s));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(d.host_ids.data(), r.ids, d.host_ids.size() * 4, cudaMemcpyDeviceToHost, s));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(d.hw.data(), r.w, d.hw.size() * 4, cudaMemcpyDeviceToHost, s));
        stream_->sync();
        cpu::context hc = cpu_.begin_pass();
        cpu_.moe_ffn(hc, bt, ms, mp, cpu::tensor{d.hx.data(), n, E}, cpu::route{d.host_ids.data(), d.hw.data(), n, k},
                     cpu::tensor{d.hy.data(), n, E});
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(out.data, d.hy.data(), d.hy.size() * 4, cudaMemcpyHostToDevice, s));
        stream_->sync();  // d.hy is pageable and reused by the next such layer
        return;
    }
    if (k > 64) fail("backend::cuda: ", k, " experts per token exceed the device combine's limit of 64");
    const cuda_detail::device_matrix& gate = dev(merged ? *mp.gate_up_exps : *mp.gate_exps);
    const cuda_detail::device_matrix* up = merged ? nullptr : &dev(*mp.up_exps);
    cuda_detail::moe_experts(gate, up, dev(*mp.down_exps), x.data, r.ids, r.w, out.data, n, int(k), d.moe, s);
    if (!(mp.gate_shexp && *mp.gate_shexp)) return;
    const std::int64_t Fs = ms.n_ff_shared;
    float* gu = d.shared.get<float>(std::size_t(n * (3 * Fs + E)));  // [n, Fs | Fs] gate|up, [n, Fs] h, [n, E] y
    float* h = gu + n * 2 * Fs;
    float* ys = h + n * Fs;
    product(cx, *mp.gate_shexp, x.data, n, gu, nullptr, -1, 2 * Fs);
    product(cx, *mp.up_shexp, x.data, n, gu + Fs, nullptr, -1, 2 * Fs);
    cuda_detail::swiglu(gu, h, n, Fs, s);
    product(cx, *mp.down_shexp, h, n, ys);
    cuda_detail::shared_gate_add(out.data, x.data, f32(*mp.shexp_gate), ys, n, E, s);
}

}  // namespace clover::backend
