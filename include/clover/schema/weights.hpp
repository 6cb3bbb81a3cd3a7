#pragma once
// Binding tensors by name, checking each shape (architecture.md §3.3): the generic half. Which
// tensors a model has is said by its architecture (arch/qwen35moe.hpp, arch/clover_moe.hpp) and
// by each layer's weights type (layers/*.hpp). Matrices stay views into the mapped file; small
// vectors (norms, conv taps, gates' biases) are converted once to owned f32, so the kernels read
// one type whatever the file stores.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"
#include "clover/quant/rows.hpp"
#include "clover/tensor/weight.hpp"

namespace clover {

namespace detail {
inline std::string shape_str(const std::vector<std::int64_t>& ne) {
    std::string s = "{";
    for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "}";
}
}  // namespace detail

// Looks tensors up in one file. Shapes are written ggml-style: ne[0] is the contiguous
// dimension, so a matrix of `rows` outputs over `cols` inputs is {cols, rows}.
struct weight_binder {
    const io::gguf_file& f;
    std::deque<std::vector<float>>& owned;  // where f32 copies live (deque: stable addresses)

    bool has(const std::string& name) const { return f.find_tensor(name) != nullptr; }

    const io::gguf_tensor* lookup(const std::string& name, const std::vector<std::int64_t>& ne, bool required) {
        const io::gguf_tensor* t = f.find_tensor(name);
        if (!t) {
            if (required) fail(f.path(), ": missing tensor '", name, "' (expected shape ", detail::shape_str(ne), ")");
            return nullptr;
        }
        // Trailing 1-dimensions are equivalent ({n} == {n, 1}).
        bool ok = true;
        for (int d = 0; d < 4; ++d) {
            std::int64_t want = d < int(ne.size()) ? ne[d] : 1;
            if (t->ne[d] != want) ok = false;
        }
        if (!ok) fail(f.path(), ": tensor '", name, "' has shape ", t->shape_string(), ", expected ", detail::shape_str(ne));
        return t;
    }

    // A matrix (or stack of matrices) used by matmul: must be a compute-supported type.
    weight matrix(const std::string& name, std::vector<std::int64_t> ne, bool required = true) {
        const io::gguf_tensor* t = lookup(name, ne, required);
        if (!t) return {};
        if (!quant::is_supported_weight(t->type))
            fail(f.path(), ": tensor '", name, "' has type ", dtype_name(t->type), ", which this build cannot compute with yet");
        weight w;
        w.data = t->data;
        w.type = t->type;
        w.cols = t->ne[0];
        w.rows = t->ne[1];
        w.n_mat = t->ne[2];
        w.row_bytes = t->row_bytes();
        w.name = name;
        return w;
    }

    // A small tensor read as f32 (any supported storage type), owned by the binder's store.
    weight vector_f32(const std::string& name, std::vector<std::int64_t> ne, bool required = true) {
        const io::gguf_tensor* t = lookup(name, ne, required);
        if (!t) return {};
        if (!quant::is_supported_weight(t->type))
            fail(f.path(), ": tensor '", name, "' has type ", dtype_name(t->type), ", which this build cannot read yet");
        auto& v = owned.emplace_back(std::size_t(t->nelements()));
        for (std::int64_t r = 0; r < t->nrows(); ++r)
            quant::dequantize_row(t->type, t->data + std::size_t(r) * t->row_bytes(), v.data() + r * t->ne[0], t->ne[0]);
        weight w;
        w.data = reinterpret_cast<const std::byte*>(v.data());
        w.type = dtype::f32;
        w.cols = t->ne[0];
        w.rows = t->nrows();
        w.row_bytes = std::size_t(t->ne[0]) * 4;
        w.name = name;
        return w;
    }
};

}  // namespace clover
