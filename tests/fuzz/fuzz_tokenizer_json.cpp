// tokenizer.json (tokenizer/tokenizer_json.hpp) on arbitrary bytes, then what an accepted spec
// is used for: a tokenizer built from it encodes and decodes a fixed text, and `clover convert`
// writes it as GGUF tokenizer.* keys. Bad input must be one clover::error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <clover/core/error.hpp>
#include <clover/io/gguf_writer.hpp>
#include <clover/tokenizer/tokenizer.hpp>
#include <clover/tokenizer/tokenizer_json.hpp>
#include <clover/tokenizer/vocab.hpp>

#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const fuzz::fs::path dir = [] {
        auto d = fuzz::scratch_dir() / "tokenizer";
        fuzz::fs::create_directories(d);
        return d;
    }();
    fuzz::write_file(dir / "tokenizer.json", data, size);
    try {
        clover::tok::tokenizer_spec spec = clover::tok::read_tokenizer_json_spec(dir);
        clover::io::gguf_writer w;
        clover::tok::write_gguf_spec(spec, w);
        clover::tokenizer tok(spec);
        constexpr std::string_view text = "Hello, world!  <|im_end|>\n\tx = 42; caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82 \xFF";
        for (bool special : {false, true}) {
            const auto ids = tok.encode(text, {.parse_special = special, .add_special = true});
            for (auto id : ids)
                if (id < 0 || std::size_t(id) >= tok.n_vocab()) fuzz::die("encode gave id " + std::to_string(id) + " outside the vocabulary");
            (void)tok.decode(ids);
        }
    } catch (const clover::error&) {
    }
    return 0;
}
