#pragma once
// Shared by the CUDA tests that drive backend primitives against backend::cpu's on the same batch
// (test_pass.cu, test_split_attention.cu): F32 weights over host vectors, token lists, and host
// arrays into and out of the device backend's pass tensors.
#include <cstdint>
#include <vector>

#include "cuda_test.hpp"

namespace cudatest {

// A host vector as an F32 weight of `rows` rows.
inline clover::weight f32_weight(const std::vector<float>& v, std::int64_t rows = 1) {
    clover::weight w;
    w.data = reinterpret_cast<const std::byte*>(v.data());
    w.type = clover::dtype::f32;
    w.rows = rows;
    w.cols = std::int64_t(v.size()) / rows;
    w.row_bytes = std::size_t(w.cols) * 4;
    return w;
}

inline std::vector<clover::token> toks(std::int64_t n) { return std::vector<clover::token>(std::size_t(n), 1); }

// A host array into a pass tensor of the device backend, and back.
inline void put(clover::backend::cuda::tensor t, const std::vector<float>& h) {
    REQUIRE(h.size() == std::size_t(t.rows * t.cols));
    CLOVER_CUDA_CHECK(cudaMemcpy(t.data, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    // A pageable copy may return before its DMA ends, and the backend's stream is non-blocking:
    // without this the next kernel could read stale inputs.
    CLOVER_CUDA_CHECK(cudaDeviceSynchronize());
}
inline std::vector<float> get(clover::backend::cuda::tensor t) {
    CLOVER_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> h(std::size_t(t.rows * t.cols));
    CLOVER_CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size() * 4, cudaMemcpyDeviceToHost));
    return h;
}
// A host vector as a pass tensor of backend::cpu.
inline clover::backend::cpu::tensor host_tensor(std::vector<float>& v, std::int64_t rows) {
    return {v.data(), rows, std::int64_t(v.size()) / rows};
}

}  // namespace cudatest
