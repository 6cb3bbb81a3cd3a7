// Uses the library as a user would: a compile-time variant, a synthetic model, one greedy run.
#include <clover/clover.hpp>
#include <clover/model/synth.hpp>

#include <cstdio>

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    clover::synth::write(clover::synth::preset("tiny"), argv[1]);
    clover::model<clover::variants::tiny> m(clover::load(argv[1]), {.threads = 1});
    auto s = m.new_session({.ctx = 64});
    std::vector<clover::token> prompt = {1, 2, 3};
    clover::decode::generate_options o;
    o.max_tokens = 8;
    o.ignore_eos = true;
    int n = 0;
    auto st = clover::decode::generate<clover::decode::ar>(m, s, prompt, o, [&](clover::token) { return ++n, true; });
    std::printf("consumer ok: %lld tokens\n", (long long)st.tokens);
    return st.tokens == 8 ? 0 : 1;
}
