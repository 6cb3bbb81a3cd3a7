// A decoder policy of one's own plugs into the same generation loop, sampler and stop rules:
// here, greedy decoding that stops as soon as the model is unsure (top probability < 0.5).
//   custom_decoder MODEL.gguf
#include <cstdio>

#include <clover/clover.hpp>

struct until_unsure {
    static constexpr const char* name = "until-unsure";
    float min_p = 0.5f;
    // Per sequence: given the logits of its last pass, decide and name the next pass.
    template <class Model>
    struct stepper {
        float min_p;  // the enclosing type is incomplete here: keep what the steps need
        explicit stepper(const auto& p) : min_p(p.min_p) {}
        bool step(clover::decode::context<Model>& c, const float* logits, clover::decode::step_request& next) {
            const auto choice = c.smp.pick(logits, c.n_vocab(), c.out.hist);
            if (choice.p < min_p) { c.st.stop_reason = "unsure"; return false; }
            if (!c.emit(choice.id) || c.room() < 1) return false;
            next = {clover::pass_kind::commit, {choice.id}, 1, -1};  // one row, its logits
            return true;
        }
    };
};

int main(int argc, char** argv) try {
    if (argc < 2) return 2;
    clover::model<clover::variants::from_file> m(clover::load(argv[1]), {.threads = 1});
    auto s = m.new_session({.ctx = 256});
    std::vector<clover::token> prompt = {1, 2, 3};
    clover::decode::generate_options o;
    o.max_tokens = 64;
    o.ignore_eos = true;
    auto st = clover::decode::generate(m, s, prompt, o, [](clover::token t) { std::printf("%d ", t); return true; },
                                       until_unsure{});
    std::printf("\n%s\n", st.json().c_str());
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
