#pragma once
// clover::open(path): the one way in for every form a model comes in — a GGUF file (a known
// vendor variant is made canonical in memory, with a warning naming what was fixed), or an HF
// folder (config.json + safetensors shards + tokenizer.json, read in place as a virtual GGUF
// file). The other loaders are its internals; clover::load is open without warnings.
#include <filesystem>
#include <memory>

#include "clover/io/gguf.hpp"
#include "clover/io/hf_convert.hpp"
#include "clover/io/hf_model.hpp"
#include "clover/model/file_variants.hpp"
#include "clover/tokenizer/hf_keys.hpp"

namespace clover {

/// The hook that adds the tokenizer's keys (from tokenizer.json) to an HF folder read as a GGUF
/// file (io reads files; the tokenizer turns tokenizer.json into keys; this level joins them).
inline hf::metadata_hook tokenizer_keys() { return &tok::put_hf_tokenizer; }

/// An HF folder (config.json, safetensors shards, tokenizer.json) as a virtual GGUF file,
/// tokenizer keys included; `warn` receives what was skipped or fixed.
inline std::shared_ptr<const io::gguf_file> load_hf(const std::filesystem::path& dir, hf::warn_fn warn = nullptr) {
    return hf::load_hf(dir, warn, tokenizer_keys());
}

/// `clover convert`: an HF folder to a canonical GGUF file at `out`, tokenizer keys included.
inline hf::convert_result convert_hf(const std::filesystem::path& dir, const std::filesystem::path& out,
                                     hf::convert_options o = {}) {
    if (!o.extra_keys) o.extra_keys = tokenizer_keys();
    return hf::convert(dir, out, o);
}

/// Opens a model in any form it comes in: a GGUF file (mapped; a known vendor variant is made
/// canonical in memory and `warn` names what was fixed) or an HF folder. Throws clover::error
/// naming the problem for a file it cannot read.
inline std::shared_ptr<const io::gguf_file> open(const std::filesystem::path& path, hf::warn_fn warn = nullptr) {
    if (std::filesystem::is_directory(path)) return load_hf(path, warn);
    return load_canonical(path, {.warn = warn});
}

}  // namespace clover
