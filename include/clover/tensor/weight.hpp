#pragma once
// A weight matrix as the file stores it: `rows` rows of `cols` elements (ggml ne = {cols, rows}),
// each row `row_bytes` long in the file's dtype. Weights are views into the mapped file.
// A 3-D expert tensor (ne = {cols, rows, n_expert}) is a stack of such matrices: expert(e).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "clover/core/dtype.hpp"
#include "clover/quant/rows.hpp"

namespace clover {

struct weight {
    const std::byte* data = nullptr;
    dtype type = dtype::f32;
    std::int64_t cols = 0;   // input features (contiguous)
    std::int64_t rows = 0;   // output features
    std::int64_t n_mat = 1;  // stacked matrices (experts)
    std::size_t row_bytes = 0;
    std::string name;

    explicit operator bool() const { return data != nullptr; }
    const std::byte* row(std::int64_t r) const { return data + std::size_t(r) * row_bytes; }
    // One matrix of a stacked (expert) tensor.
    weight expert(std::int64_t e) const {
        weight w = *this;
        w.data = data + std::size_t(e) * std::size_t(rows) * row_bytes;
        w.n_mat = 1;
        return w;
    }
    // Rows [r0, r0 + n) as a matrix of their own (for split projections such as gate|up).
    weight row_slice(std::int64_t r0, std::int64_t n) const {
        weight w = *this;
        w.data = row(r0);
        w.rows = n;
        return w;
    }
    // Reads a 1-D f32 vector weight (norm weights, biases).
    const float* f32() const { return reinterpret_cast<const float*>(data); }
};

// The bytes every weight of a model points into, as a backend receives them at load
// (backend concept: map_weights).
struct weight_memory {
    std::span<const std::byte> bytes;
    // Moves `bytes` into transparent huge pages at the same addresses (a private copy; every
    // weight stays valid): "" when done, else why not, and nothing changed. Empty when the bytes
    // are not a file map (a virtual file built in memory).
    std::function<std::string()> to_huge_pages;
};

}  // namespace clover
