// A compile-time variant of one's own: every dimension constexpr, so the layers' loops have
// constant trip counts. A file of another shape is refused with the dimension named.
//   custom_variant MODEL.gguf     (try it on `clover gguf synth --preset tiny --layers 8`)
#include <cstdio>

#include <clover/clover.hpp>

// The tiny preset, but 8 layers deep.
struct tiny_8_layers : clover::variants::tiny {
    static constexpr const char* name = "tiny-8-layers";
    static constexpr std::int64_t n_layer = 8;
};

int main(int argc, char** argv) try {
    if (argc < 2) return 2;
    clover::model<tiny_8_layers> m(clover::load(argv[1]), {.threads = 1});
    auto s = m.new_session({.ctx = 64});
    std::vector<clover::token> ids = {1, 2, 3};
    std::vector<float> logits;
    m.commit(s, ids, clover::logits_rows::last, logits);
    std::printf("%s: next token %d\n", tiny_8_layers::name, clover::decode::argmax(logits.data(), m.n_vocab()));
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
