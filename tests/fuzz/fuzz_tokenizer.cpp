// Tokenizer encode/decode of arbitrary bytes with the bundled model's tokenizer
// (models/clover-small.gguf). The first input byte picks the options, the rest is the text.
// Checked, beyond "no crash": every id is in the vocabulary; without parse_special no control
// token comes out of user text; decode(encode(x)) gives x back (x in NFC when the tokenizer
// normalises); the streaming decoder's pieces add up to sanitize(decode(ids)).
#include <cstddef>
#include <cstdint>
#include <string>

#include <clover/tokenizer/nfc.hpp>
#include <clover/tokenizer/streaming_decoder.hpp>
#include <clover/tokenizer/tokenizer.hpp>
#include <clover/tokenizer/utf8.hpp>

#include "fuzz_util.hpp"

namespace {

const clover::tokenizer& tok() {
    static const clover::tokenizer t = clover::tokenizer::from_gguf(fuzz::source_dir() / "models/clover-small.gguf");
    return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    (void)tok();  // load once, before the first input is timed
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto in = fuzz::split_flags(data, size);
    const clover::encode_options opt{.parse_special = in.bit(0), .add_special = in.bit(1)};
    const clover::tokenizer& t = tok();

    const std::vector<std::int32_t> ids = t.encode(in.rest, opt);
    for (auto id : ids) {
        if (id < 0 || std::size_t(id) >= t.n_vocab()) fuzz::die("encode gave id " + std::to_string(id) + " outside the vocabulary");
        if (!opt.parse_special && t.is_control(id) && !(opt.add_special && (id == t.bos_id() || id == t.eos_id())))
            fuzz::die("user text became control token " + std::to_string(id) + " without parse_special");
    }

    const std::string back = t.decode(ids);
    if (!opt.add_special) {
        std::string normalized;
        const bool changed = t.normalizes_nfc() && clover::tok::nfc_append(in.rest, normalized);
        if (!changed && back != in.rest) fuzz::die("decode(encode(text)) differs from the text");
    }

    clover::streaming_decoder sd(t);
    std::string streamed;
    for (auto id : ids) streamed += sd.push(id);
    streamed += sd.finish();
    if (streamed != clover::tok::utf8::sanitize(back)) fuzz::die("the streaming decoder differs from sanitize(decode(ids))");
    (void)t.decode(ids, /*skip_special=*/true);
    return 0;
}
