#pragma once
/// \file
/// clover::stage_range: a model restricted to a contiguous range of its layers (issue 40: a model
/// split by layers over ranks or devices), and what such a stage reads of its file.
//
// A stage of layers [first, last) binds the whole file's tensor views (cheap: views, and the
// small f32 vectors every layer keeps a copy of), but hands its backend only its own matrices:
// its layers', the token embedding on the first stage, the LM head on the last. The hidden rows
// cross a stage boundary as host memory [rows, n_embd] f32 (model::run_stage).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "clover/arch/model_weights.hpp"
#include "clover/core/error.hpp"
#include "clover/io/huge_pages.hpp"
#include "clover/tensor/weight.hpp"

namespace clover {

/// Layers [first, last) of a model: one stage of a model split by layers. The first stage
/// (first = 0) embeds the tokens, the last (last = the model's layer count) runs the final norm
/// and the LM head. Name the type when constructing a model with it
/// (`model(file, stage_range{0, 4}, opt)`).
struct stage_range {
    /// Layers [from, to).
    stage_range(std::int64_t from, std::int64_t to) : first(from), last(to) {}
    std::int64_t first;  ///< the stage's first layer
    std::int64_t last;   ///< one past its last layer
    bool operator==(const stage_range&) const = default;  ///< the same layers
};

namespace detail {

// The range checked against the file's layer count, before anything is allocated or mapped.
inline stage_range checked_stage(const stage_range& r, std::int64_t n_layer, const std::string& path) {
    if (r.first < 0 || r.last > n_layer || r.first >= r.last)
        fail(path, ": stage layers [", r.first, ", ", r.last, ") are not a non-empty range within the model's ", n_layer,
             " layers [0, ", n_layer, ")");
    return r;
}

// The matrices of layers [first, last) that only products read, and the LM head on the last
// stage (model_weights::products, restricted to the stage).
inline std::vector<weight*> stage_products(model_weights& w, const stage_range& r, bool last) {
    std::vector<weight*> out;
    for (std::int64_t il = r.first; il < r.last; ++il) {
        layer_weights& l = w.layers[std::size_t(il)];
        std::visit([&](auto& m) { m.products(out); }, l.mixer);
        l.moe.products(out);
    }
    if (last && w.output.data != w.tok_embd.data) out.push_back(&w.output);
    return out;
}

// The byte ranges of `file` that a stage reads, sorted and merged: its products, any matrix of
// its layers that is not one (a merged gate|up stack products leave out), the token embedding
// on the first stage and the head (perhaps the embedding, tied) on the last. Weights outside
// the file (the model's f32 copies of small vectors) are not the file's bytes.
inline std::vector<std::span<const std::byte>> stage_parts(model_weights& w, const stage_range& r, bool first, bool last,
                                                           std::span<const std::byte> file) {
    std::vector<weight*> ws = stage_products(w, r, last);
    for (std::int64_t il = r.first; il < r.last; ++il) ws.push_back(&w.layers[std::size_t(il)].moe.gate_up_exps);
    if (first || (last && w.output.data == w.tok_embd.data)) ws.push_back(&w.tok_embd);
    if (last) ws.push_back(&w.output);
    std::vector<std::span<const std::byte>> v;
    const auto lo = std::uintptr_t(file.data()), hi = lo + file.size();
    for (const weight* x : ws) {
        if (!x || !x->data) continue;
        const auto b = std::uintptr_t(x->data), n = std::size_t(x->n_mat) * std::size_t(x->rows) * x->row_bytes;
        if (b < lo || b + n > hi) continue;
        v.emplace_back(x->data, n);
    }
    std::sort(v.begin(), v.end(), [](auto a, auto b) { return std::less<>()(a.data(), b.data()); });
    std::vector<std::span<const std::byte>> out;
    for (const auto& s : v) {
        if (!out.empty() && !std::less<>()(out.back().data() + out.back().size(), s.data())) {
            const std::byte* end = std::max(out.back().data() + out.back().size(), s.data() + s.size(), std::less<>());
            out.back() = {out.back().data(), std::size_t(end - out.back().data())};
        } else {
            out.push_back(s);
        }
    }
    return out;
}

// What a model hands its backend's map_weights. The whole model: the whole file (huge pages,
// the memory check). A stage: only its own matrices (products and parts). The whole-file move
// into huge pages (io/huge_pages.hpp: one private copy of the map, one flag per file, and the
// in-place rearrangement that needs it) cannot be cut to a stage's ranges without a copy per
// range, so a stage keeps the file map in place: populated and checked against memory only
// where it reads. rewrite_once stays: a whole model of the same file may have rearranged
// matrices this stage reads, and it must read them the same way.
template <class File>
weight_memory stage_memory(const std::shared_ptr<const File>& file, model_weights& w, const stage_range& r, std::int64_t n_layer) {
    const bool first = r.first == 0, last = r.last == n_layer;
    const std::span<const std::byte> bytes = file->map().bytes();
    weight_memory wm;
    wm.bytes = bytes;
    if (first && last) {
        wm.products = w.products();
        if (!bytes.empty()) wm.to_huge_pages = [f = file.get()] { return f->map().move_to_huge_pages(); };
    } else {
        wm.products = stage_products(w, r, last);
        wm.parts = stage_parts(w, r, first, last, bytes);
    }
    if (!bytes.empty()) {
        if (first && last) {
            wm.shortfall = [f = file.get()] { return f->map().memory_shortfall(); };
        } else {
            std::size_t total = 0;
            for (const auto& p : wm.parts) total += p.size();
            wm.shortfall = [f = file.get(), total] {
                return f->map().in_huge_pages() ? std::string() : io::residency_shortfall(total, io::read_memory_outlook());
            };
        }
        wm.rewrite_once = [f = file.get()](const weight_memory::rearrange_fn& fn) { return f->map().rewrite_once(fn); };
    }
    return wm;
}

}  // namespace detail
}  // namespace clover
