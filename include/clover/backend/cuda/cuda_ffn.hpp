#pragma once
// backend::cuda's MoE feed-forward primitive (out of cuda.hpp to keep files small): the routed
// experts grouped by expert and the shared expert with its sigmoid gate, on the device
// (moe.cuh, in the CPU's order of additions). Layers below options.n_cpu_moe run the whole
// primitive on the host.
#if !defined(__CUDACC__) && !defined(CLOVER_CUDA_EMU)
#error "clover/backend/cuda/cuda_ffn.hpp is part of backend/cuda/cuda.hpp (nvcc only)"
#endif

#include "clover/backend/cuda/cuda.hpp"

namespace clover::backend {

inline void cuda::moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r,
                          tensor out) {
    cuda_detail::device_guard on(opt_.device);
    flush_norm(cx);  // a recorded norm runs before anything reads x (moe_route usually did it)
    const std::int64_t n = x.rows, E = x.cols, k = ms.n_expert_used;
    auto& d = cx.scratch();
    const cudaStream_t s = stream();
    const bool merged = mp.gate_up_exps && *mp.gate_up_exps;
    if (on_host(merged ? *mp.gate_up_exps : *mp.gate_exps)) {
        // Experts in host memory: the input and the routing go to the host, the CPU computes the
        // routed and the shared expert, the result comes back. Pinned buffers: the copies are
        // true asynchronous DMA (pageable memory goes through a hidden staged, synchronous copy),
        // and the CPU works in place on them. One host wait per such layer: the next layer's
        // wait (or read_logits') orders this layer's upload of `out` before its buffers are
        // reused, since everything runs on one stream.
        const std::size_t xb = std::size_t(n * E) * 4, kb = std::size_t(n * k) * 4;
        d.pin_hx.reserve(xb);
        d.pin_hy.reserve(xb);
        d.pin_hw.reserve(kb);
        d.pin_hids.reserve(kb);
        float* hx = d.pin_hx.get<float>();
        float* hy = d.pin_hy.get<float>();
        float* hw = d.pin_hw.get<float>();
        auto* hids = d.pin_hids.get<std::int32_t>();
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(hx, x.data, xb, cudaMemcpyDeviceToHost, s));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(hids, r.ids, kb, cudaMemcpyDeviceToHost, s));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(hw, r.w, kb, cudaMemcpyDeviceToHost, s));
        stream_->sync();
        cpu::context hc = cpu_.begin_pass();
        cpu_.moe_ffn(hc, bt, ms, mp, cpu::tensor{hx, n, E}, cpu::route{hids, hw, n, k}, cpu::tensor{hy, n, E});
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(out.data, hy, xb, cudaMemcpyHostToDevice, s));
        return;
    }
    const cuda_detail::device_matrix& gate = dev(merged ? *mp.gate_up_exps : *mp.gate_exps);
    const cuda_detail::device_matrix* up = merged ? nullptr : &dev(*mp.up_exps);
    cuda_detail::moe_shared sh;
    if (mp.gate_shexp && *mp.gate_shexp) sh = {&dev(*mp.gate_shexp), &dev(*mp.up_shexp), &dev(*mp.down_shexp), &dev(*mp.shexp_gate)};
    cuda_detail::moe_experts(gate, up, dev(*mp.down_exps), x.data, r.ids, r.w, out.data, n, int(k), d.moe, s, &sh);
}

}  // namespace clover::backend
