#pragma once
// backend::cuda's MoE feed-forward primitive (out of cuda.hpp to keep files small): the routed
// experts grouped by expert and the shared expert with its sigmoid gate, on the device
// (moe.cuh, in the CPU's order of additions); and the host round trip through which a
// composition (backend::offload) runs a layer's feed-forward on a host backend instead.
#if !defined(__CUDACC__) && !defined(CLOVER_CUDA_EMU)
#error "clover/backend/cuda/cuda_ffn.hpp is part of backend/cuda/cuda.hpp (nvcc only)"
#endif

#include "clover/backend/cuda/cuda.hpp"

namespace clover::backend {

inline void cuda::moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r,
                          tensor out) {
    cuda_detail::device_guard on(opt_.device);
    flush_norm(cx);  // a recorded norm runs before anything reads x (moe_route usually did it)
    const std::int64_t n = x.rows, k = ms.n_expert_used;
    auto& d = cx.scratch();
    const cudaStream_t s = stream();
    const bool merged = mp.gate_up_exps && *mp.gate_up_exps;
    const cuda_detail::device_matrix& gate = dev(merged ? *mp.gate_up_exps : *mp.gate_exps);
    const cuda_detail::device_matrix* up = merged ? nullptr : &dev(*mp.up_exps);
    cuda_detail::moe_shared sh;
    if (mp.gate_shexp && *mp.gate_shexp) sh = {&dev(*mp.gate_shexp), &dev(*mp.up_shexp), &dev(*mp.down_shexp), &dev(*mp.shexp_gate)};
    cuda_detail::moe_experts(gate, up, dev(*mp.down_exps), x.data, r.ids, r.w, out.data, n, int(k), d.moe, s, &sh);
}

// Pinned buffers: the copies are true asynchronous DMA (pageable memory goes through a hidden
// staged, synchronous copy), and f works in place on them. One host wait per round trip: the
// next round trip's wait (or read_logits') orders this one's copy of `out` before its buffers
// are reused, since everything runs on one stream.
template <class F>
void cuda::host_round_trip(context& cx, tensor x, route r, tensor out, F&& f) {
    cuda_detail::device_guard on(opt_.device);
    auto& d = cx.scratch();
    if (!host_trips_ || d.capturing)
        fail("backend::cuda: a host round trip inside a pass needs enable_host_round_trips() before the first pass "
             "(a captured pass cannot wait for the host)");
    if (out.rows != x.rows || out.cols != x.cols || r.rows != x.rows)
        fail("backend::cuda: host round trip of [", x.rows, ", ", x.cols, "] with ", r.rows, " routed rows into [", out.rows,
             ", ", out.cols, "]");
    flush_norm(cx);  // a recorded norm runs before anything reads x
    const std::int64_t n = x.rows, E = x.cols, k = r.k;
    const cudaStream_t s = stream();
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
    f(host_tensor{hx, n, E}, host_route{hids, hw, n, k}, host_tensor{hy, n, E});
    CLOVER_CUDA_CHECK(cudaMemcpyAsync(out.data, hy, xb, cudaMemcpyHostToDevice, s));
}

}  // namespace clover::backend
