#pragma once
// backend::cuda's MoE feed-forward primitive (out of cuda.hpp to keep files small): the routed
// experts grouped by expert and the shared expert with its sigmoid gate, on the device
// (moe.cuh, in the CPU's order of additions). Layers below options.n_cpu_moe run the whole
// primitive on the host.
#if !defined(__CUDACC__)
#error "clover/backend/cuda/cuda_ffn.hpp is part of backend/cuda/cuda.hpp (nvcc only)"
#endif

#include "clover/backend/cuda/cuda.hpp"

namespace clover::backend {

inline void cuda::moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r,
                          tensor out) {
    cuda_detail::device_guard on(opt_.device);
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
    const cuda_detail::device_matrix& gate = dev(merged ? *mp.gate_up_exps : *mp.gate_exps);
    const cuda_detail::device_matrix* up = merged ? nullptr : &dev(*mp.up_exps);
    cuda_detail::moe_shared sh;
    if (mp.gate_shexp && *mp.gate_shexp) sh = {&dev(*mp.gate_shexp), &dev(*mp.up_shexp), &dev(*mp.down_shexp), &dev(*mp.shexp_gate)};
    cuda_detail::moe_experts(gate, up, dev(*mp.down_exps), x.data, r.ids, r.w, out.data, n, int(k), d.moe, s, &sh);
}

}  // namespace clover::backend
