#pragma once
// Weight and activation rows for the host-run tests of the products' item dot products
// (test_quant_dot.cu) and of the tensor-core warp (host/test_mma_host.cu).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <clover/core/dtype.hpp>
#include <clover/core/rng.hpp>
#include <clover/quant/rows.hpp>

#include "../../tests/common/test_util.hpp"

namespace cudatest {

// rows x K elements of type t: quantized from random floats, or (raw) random bytes.
inline std::vector<std::uint8_t> rows_of(clover::dtype t, std::int64_t rows, std::int64_t K, std::uint64_t seed, bool raw) {
    using clover::dtype;
    const std::size_t rb = clover::quant::row_bytes(t, K);
    std::vector<std::uint8_t> out(rb * std::size_t(rows));
    if (raw && t != dtype::f32 && t != dtype::f16 && t != dtype::bf16) {
        clover::rng r(seed);
        for (auto& b : out) b = std::uint8_t(r.next());
        // Every code and high-bit pattern, but finite f16 scales (the exponent's top bit cleared:
        // |d| < 2): an inf or NaN in the sum would hide a difference in later items.
        std::size_t block = 0;
        std::vector<std::size_t> scales;
        if (t == dtype::q8_0) block = 34, scales = {0};
        if (t == dtype::q4_k) block = 144, scales = {0, 2};
        if (t == dtype::q5_k) block = 176, scales = {0, 2};
        if (t == dtype::q6_k) block = 210, scales = {208};
        for (std::size_t b = 0; b + block <= out.size(); b += block)
            for (std::size_t at : scales) out[b + at + 1] &= 0xbf;
        return out;
    }
    const auto f = testutil::random_vec(std::size_t(rows * K), seed);
    for (std::int64_t r = 0; r < rows; ++r) clover::quant::quantize_row(t, f.data() + r * K, out.data() + std::size_t(r) * rb, K);
    return out;
}

}  // namespace cudatest
