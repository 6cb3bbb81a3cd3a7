#pragma once
// A weight matrix as the file stores it: `rows` rows of `cols` elements (ggml ne = {cols, rows}),
// each row `row_bytes` long in the file's dtype. Weights are views into the mapped file.
// A 3-D expert tensor (ne = {cols, rows, n_expert}) is a stack of such matrices: expert(e).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "clover/core/dtype.hpp"
#include "clover/core/error.hpp"
#include "clover/quant/rows.hpp"

namespace clover {

// How a matrix's bytes are arranged. rows16: a backend rearranged each run of 16 rows (from the
// matrix's row 0) into a layout of its own kernels (backend::cpu: k512::repack_*_x16); the group
// of rows 16g..16g+15 still occupies those rows' bytes, and rows past the last full group keep
// the file's layout. Only the backend that rearranged a matrix may read it.
enum class weight_layout : std::uint8_t { file, rows16 };

struct weight {
    const std::byte* data = nullptr;
    dtype type = dtype::f32;
    std::int64_t cols = 0;   // input features (contiguous)
    std::int64_t rows = 0;   // output features
    std::int64_t n_mat = 1;  // stacked matrices (experts)
    std::size_t row_bytes = 0;
    weight_layout layout = weight_layout::file;
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
    // Rows [r0, r0 + n) as a matrix of their own (for split projections such as gate|up). A
    // rows16 matrix is sliced only on its groups (the backend rearranged only such matrices).
    weight row_slice(std::int64_t r0, std::int64_t n) const {
        if (layout == weight_layout::rows16 && (r0 % 16 || (n % 16 && r0 + n != rows)))
            fail("weight ", name, ": rows [", r0, ", ", r0 + n, ") split the 16-row groups the backend rearranged");
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
    // The ranges of `bytes` the model reads, sorted and disjoint, when it reads only some of them
    // (a stage of a model split by layers: its layers' tensors, the embedding on the first, the
    // head on the last); a backend then reads, populates and moves nothing outside them, and
    // to_huge_pages is empty. Empty: all of `bytes`.
    std::vector<std::span<const std::byte>> parts;
    // Moves `bytes` into transparent huge pages at the same addresses (a private copy; every
    // weight stays valid): "" when done, else why not, and nothing changed. Empty when the bytes
    // are not a file map (a virtual file built in memory).
    std::function<std::string()> to_huge_pages;
    // "" when `bytes` fit in the memory available (beside a reserve), else one sentence saying
    // how much of them demand paging will read from disk again. Empty for a virtual file.
    std::function<std::string()> shortfall;
    // Matrices that only products read (no row lookups such as the token embedding's; sliced
    // only at multiples of 16 rows), which a backend may rearrange for its kernels: it then
    // sets their `layout`. The pointers stay the model's.
    std::vector<weight*> products;
    // Rewrites `bytes` once per file, in place: while no model of this file has yet, runs
    // `rearrange` with the bytes writable and records the data pointers it returns (the
    // matrices it rearranged); every call returns that record. Null where the bytes may not be
    // rewritten (not a private copy: a file map in place, a virtual file), and then nothing
    // may be rearranged.
    using rearrange_fn = std::function<std::vector<const std::byte*>()>;
    std::function<std::vector<const std::byte*>(const rearrange_fn&)> rewrite_once;
};

}  // namespace clover
