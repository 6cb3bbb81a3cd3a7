// A decoder policy of one's own (until_unsure.hpp) runs alone through decode::generate, or in a
// batch beside the built-in decoders: made an alternative of the decoder variant, it joins the
// same batched passes (here through the engine that servers and the clover command drive).
//   custom_decoder MODEL.gguf
#include <cstdio>
#include <variant>

#include <clover/clover.hpp>
#include <clover/decode/engine.hpp>

#include "until_unsure.hpp"

namespace decode = clover::decode;
using my_decoder = std::variant<decode::ar, decode::low_confidence, decode::self_speculative, until_unsure>;

int main(int argc, char** argv) try {
    if (argc < 2) return 2;
    clover::model<clover::variants::from_file> m(clover::load(argv[1]), {.threads = 1});
    std::vector<clover::token> prompt = {1, 2, 3};
    decode::generate_options o;
    o.max_tokens = 64;
    o.ignore_eos = true;

    auto s = m.new_session({.ctx = 256});
    auto st = decode::generate(m, s, prompt, o, [](clover::token t) { std::printf("%d ", t); return true; },
                               until_unsure{});
    std::printf("\nalone: %s\n", st.json().c_str());

    decode::engine<decltype(m), my_decoder> eng(m, {.parallel = 2});
    for (my_decoder d : {my_decoder(decode::ar{}), my_decoder(until_unsure{})}) {
        decode::engine_request<my_decoder> r;
        r.prompt = prompt;
        r.gen = o;
        r.dec = d;
        const char* name = std::visit([](const auto& p) { return p.name; }, d);
        r.sink.on_end = [name](const decode::engine_result& e) {
            std::printf("batched, %s: %s\n", name, e.stats.json().c_str());
        };
        eng.submit(std::move(r));
    }
    eng.run_until_idle();
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
