#pragma once
// tokenizer.json of an HF folder → the tokenizer.* GGUF keys of the folder's virtual file (and of
// `clover convert`'s output). Above io (which reads files and knows no tokenizer) and the
// tokenizer; clover::open / load_hf / convert_hf (model/open.hpp) pass it to io as its
// metadata hook.
#include <cstdint>
#include <filesystem>
#include <string>

#include "clover/core/error.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/io/hf_model.hpp"
#include "clover/tokenizer/tokenizer_json.hpp"
#include "clover/tokenizer/vocab.hpp"

namespace clover::tok {

// Returns the id of "<|mask|>" (or -1). A folder without tokenizer.json adds nothing; a broken
// one is named in a warning and left out (the weights still load).
inline std::int64_t put_hf_tokenizer(const std::filesystem::path& dir, std::int64_t bos, std::int64_t eos, io::gguf_writer& w,
                                     std::int64_t n_vocab, hf::warn_fn warn) {
    const auto path = dir / "tokenizer.json";
    if (!std::filesystem::exists(path) && !std::filesystem::is_symlink(path)) return -1;
    try {
        for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
            if (std::filesystem::exists(dir / name) || std::filesystem::is_symlink(dir / name))
                hf::hf_detail::require_inside(dir, dir / name);
        tokenizer_spec s = read_tokenizer_json_spec(path);
        if (std::int64_t(s.tokens.size()) > n_vocab)
            fail(path.string(), ": ", s.tokens.size(), " tokens but the embedding has ", n_vocab, " rows");
        if (s.bos < 0 && bos >= 0 && bos < std::int64_t(s.tokens.size())) s.bos = std::int32_t(bos);
        if (s.eos < 0 && eos >= 0 && eos < std::int64_t(s.tokens.size())) s.eos = std::int32_t(eos);
        write_gguf_spec(s, w, std::size_t(n_vocab));
        for (std::size_t i = 0; i < s.tokens.size(); ++i)
            if (s.tokens[i] == "<|mask|>") return std::int64_t(i);
    } catch (const clover::error& e) {
        if (warn) warn(std::string("tokenizer not included: ") + e.what());
    }
    return -1;
}

}  // namespace clover::tok
