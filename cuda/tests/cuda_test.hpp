#pragma once
// Shared by the CUDA test executables: a counted TEST_CASE (so a machine without a GPU can say
// how many tests it skips) and small host<->device vector helpers.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <clover/backend/cuda/cuda.hpp>

#include "../../tests/common/test_util.hpp"

#include "cuda_test_count.hpp"

namespace cudatest {

// A device copy of a host vector.
template <class T>
struct dvec {
    clover::backend::cuda_detail::device_buffer buf;
    std::size_t n = 0;
    dvec() = default;
    explicit dvec(std::size_t count) : n(count) {
        buf.reserve(std::max<std::size_t>(1, n) * sizeof(T));
        CLOVER_CUDA_CHECK(cudaMemset(buf.get(), 0, std::max<std::size_t>(1, n) * sizeof(T)));
    }
    explicit dvec(const std::vector<T>& h) : dvec(h.size()) {
        CLOVER_CUDA_CHECK(cudaMemcpy(buf.get(), h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    T* p() { return buf.get<T>(); }
    std::vector<T> host() const {
        CLOVER_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<T> h(n);
        CLOVER_CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
};

// max |a - b| / (1 + max |b|): the tolerance measure of every CUDA-vs-CPU check.
inline float rel(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    return testutil::max_abs_diff(a.data(), b.data(), a.size()) / (1.f + testutil::max_abs(b));
}

// The tiny model with every matrix's input width a multiple of 256, as K-quant rows need.
inline clover::synth::spec kquant_tiny(clover::dtype t) {
    auto s = clover::synth::preset("tiny");
    s.type = t;
    s.n_embd = 256; s.n_ff_exp = 256; s.n_ff_shexp = 256;
    s.head_dim = 64;                        // n_head * head_dim = 256 (attn_output)
    s.ssm_d_inner = 256; s.ssm_d_state = 64;  // ssm_out; conv channels 2*2*64 + 256
    return s;
}

}  // namespace cudatest

