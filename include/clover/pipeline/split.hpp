#pragma once
/// \file
/// How the layers of a model are split over the ranks of a pipeline: evenly, or by explicit
/// layer counts per rank (`--layer-split 3,5`: 3 layers on rank 0, 5 on rank 1).
//
// Every rank computes the same split from the same arguments (the file's layer count, the
// group's size, the counts given), so a rank needs only the file, the arguments and the
// communicator to know its own stage: nothing is sent before it loads. A split that does not
// match the layer count or the rank count is one error here, before any rank loads anything.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/model/stage.hpp"

/// \namespace clover::pipeline
/// A model split by layers over the ranks of a communicator: rank 0 drives (pipeline.hpp), the
/// other ranks serve their stage (serve.hpp). Includes model/ and dist/; nothing there includes it.
namespace clover::pipeline {

/// The stages of `n_layer` layers over `n_ranks` ranks: contiguous, in rank order, each
/// n_layer / n_ranks layers and the first n_layer % n_ranks ranks one more. An error when there
/// are fewer layers than ranks (a stage needs at least one).
inline std::vector<stage_range> even_split(std::int64_t n_layer, int n_ranks) {
    if (n_ranks < 1) fail("pipeline: the layers need at least one rank, got ", n_ranks);
    if (n_layer < n_ranks)
        fail("pipeline: ", n_layer, " layers cannot be split over ", n_ranks, " ranks (each stage needs at least one layer)");
    std::vector<stage_range> out;
    std::int64_t at = 0;
    for (int r = 0; r < n_ranks; ++r) {
        const std::int64_t n = n_layer / n_ranks + (r < n_layer % n_ranks ? 1 : 0);
        out.emplace_back(at, at + n);
        at += n;
    }
    return out;
}

/// The stages given by layer counts per rank (`--layer-split 3,5`: rank 0 runs layers [0, 3),
/// rank 1 layers [3, 8)). An error naming the mismatch when the counts are not one per rank, a
/// count is below 1, or they do not add up to the model's layer count.
inline std::vector<stage_range> counted_split(std::int64_t n_layer, int n_ranks, std::span<const std::int64_t> counts) {
    if (std::int64_t(counts.size()) != n_ranks)
        fail("pipeline: the layer split gives ", counts.size(), " stages but there are ", n_ranks,
             " ranks (one count of layers per rank)");
    std::vector<stage_range> out;
    std::int64_t at = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] < 1) fail("pipeline: the layer split gives rank ", r, " ", counts[r], " layers (each stage needs at least one)");
        out.emplace_back(at, at + counts[r]);
        at += counts[r];
    }
    if (at != n_layer)
        fail("pipeline: the layer split adds up to ", at, " layers but the model has ", n_layer);
    return out;
}

/// Parses a `--layer-split` value: comma-separated positive layer counts ("3,5"). An error
/// naming the bad part otherwise.
inline std::vector<std::int64_t> parse_layer_split(std::string_view text) {
    std::vector<std::int64_t> out;
    std::size_t at = 0;
    while (true) {
        const std::size_t comma = text.find(',', at);
        const std::string_view part = text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
        std::int64_t v = 0;
        bool ok = !part.empty() && part.size() <= 9;
        for (char ch : part) {
            if (ch < '0' || ch > '9') ok = false;
            else v = v * 10 + (ch - '0');
        }
        if (!ok) fail("pipeline: bad layer split '", std::string(text), "': '", std::string(part), "' is not a count of layers");
        out.push_back(v);
        if (comma == std::string_view::npos) break;
        at = comma + 1;
    }
    return out;
}

/// The stages of a model of `n_layer` layers over `n_ranks` ranks: counted_split when `counts`
/// is not empty, else even_split. Every rank calls it with the same arguments.
inline std::vector<stage_range> split_layers(std::int64_t n_layer, int n_ranks, std::span<const std::int64_t> counts = {}) {
    return counts.empty() ? even_split(n_layer, n_ranks) : counted_split(n_layer, n_ranks, counts);
}

/// Checks a split given as stages: one per rank, contiguous from layer 0 to n_layer, none
/// empty. The error names the first stage at fault.
inline void check_split(std::span<const stage_range> split, std::int64_t n_layer, int n_ranks) {
    if (std::int64_t(split.size()) != n_ranks)
        fail("pipeline: ", split.size(), " stages for ", n_ranks, " ranks (one stage per rank)");
    std::int64_t at = 0;
    for (std::size_t r = 0; r < split.size(); ++r) {
        if (split[r].first != at || split[r].last <= split[r].first)
            fail("pipeline: stage ", r, " runs layers [", split[r].first, ", ", split[r].last, "), expected a non-empty range from layer ", at);
        at = split[r].last;
    }
    if (at != n_layer) fail("pipeline: the stages end at layer ", at, " but the model has ", n_layer, " layers");
}

}  // namespace clover::pipeline
