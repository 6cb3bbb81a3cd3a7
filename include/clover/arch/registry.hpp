#pragma once
// The supported architectures, picked by a file's `general.architecture`. A new architecture is
// a header in arch/ (name, read_hparams, bind_weights) and one entry in the list below.
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "clover/arch/clover_moe.hpp"
#include "clover/arch/model_weights.hpp"
#include "clover/arch/qwen35moe.hpp"
#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"
#include "clover/schema/hparams.hpp"

namespace clover {

namespace arch {

struct architecture {
    const char* name;
    hparams (*read_hparams)(const io::gguf_file&, warn_fn);
    model_weights (*bind_weights)(std::shared_ptr<const io::gguf_file>, hparams&);
};

template <class... A>
constexpr std::array<architecture, sizeof...(A)> architectures_of() {
    return {architecture{A::name, &A::read_hparams, &A::bind_weights}...};
}

inline constexpr auto all = architectures_of<qwen35moe, clover_moe>();

inline const architecture* find(std::string_view name) {
    for (const architecture& a : all)
        if (name == a.name) return &a;
    return nullptr;
}

// "qwen35moe or clover_moe": what an error for an unknown architecture expects.
inline std::string expected_names() {
    std::string s;
    for (std::size_t i = 0; i < all.size(); ++i) s += std::string(i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i].name;
    return s;
}

inline const architecture& require(const std::string& path, std::string_view name) {
    const architecture* a = find(name);
    if (!a) fail(path, ": architecture '", name, "' is not supported (expected ", expected_names(), ")");
    return *a;
}

}  // namespace arch

// Reads and checks the hyper-parameters of the file's architecture. Warnings (defaults taken
// for keys the vendor's files are known to omit) go to `warn`.
inline hparams read_hparams(const io::gguf_file& f, warn_fn warn = nullptr) {
    auto name = f.get_string("general.architecture");
    if (!name) fail(f.path(), ": key not found: general.architecture");
    return arch::require(f.path(), *name).read_hparams(f, warn);
}

// Binds every tensor of the architecture h was read for, checking shapes; sets h.n_vocab.
inline model_weights bind_weights(std::shared_ptr<const io::gguf_file> file, hparams& h) {
    const arch::architecture& a = arch::require(file->path(), h.arch);
    return a.bind_weights(std::move(file), h);
}

}  // namespace clover
