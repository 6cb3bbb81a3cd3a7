#pragma once
// Shared by the CUDA test executables: a counted TEST_CASE (so a machine without a GPU can say
// how many tests it skips) and small host<->device vector helpers.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
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

// A random weight stored as t: one matrix [rows, cols], or a stack of n_mat (an expert tensor).
struct random_weight {
    std::vector<std::byte> bytes;
    clover::weight w;
    random_weight(clover::dtype t, std::int64_t rows, std::int64_t cols, std::uint64_t seed, std::string name = "test",
                  std::int64_t n_mat = 1) {
        const std::size_t rb = clover::quant::row_bytes(t, cols);
        bytes.resize(rb * std::size_t(n_mat * rows));
        auto f = testutil::random_vec(std::size_t(n_mat * rows * cols), seed);
        for (std::int64_t r = 0; r < n_mat * rows; ++r)
            clover::quant::quantize_row(t, f.data() + r * cols, bytes.data() + r * rb, cols);
        w.data = bytes.data();
        w.type = t;
        w.cols = cols;
        w.rows = rows;
        w.n_mat = n_mat;
        w.row_bytes = rb;
        w.name = std::move(name);
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

