#pragma once
// A decoder policy of one's own: greedy decoding that stops as soon as the model is unsure (top
// probability < min_p). custom_decoder.cpp runs it alone and in a batch beside the built-in
// decoders; tests/decode/test_many.cpp checks that batched equals alone.
//
// A policy is a value type with a `name` and a per-sequence `stepper<Model>`, built from the
// policy, whose step() takes the logits of the sequence's last pass, emits the tokens it decides
// and names the sequence's next pass (a commit, preview or verify segment). That is all a batch
// needs: the runner computes the segments its sequences ask for in one pass, whoever asked.
#include <clover/clover.hpp>

struct until_unsure {
    static constexpr const char* name = "until-unsure";
    float min_p = 0.5f;

    template <class Model>
    struct stepper {
        float min_p;  // the state of one sequence: here just the policy's setting
        explicit stepper(const until_unsure& p) : min_p(p.min_p) {}
        // logits: [next.logits, n_vocab] of the pass it asked for (first: the prompt's last row).
        // Returns false when the sequence is done.
        bool step(clover::decode::context<Model>& c, const float* logits, clover::decode::step_request& next) {
            const auto choice = c.smp.pick(logits, c.n_vocab(), c.out.hist);
            if (choice.p < min_p) { c.st.stop_reason = "unsure"; return false; }
            if (!c.emit(choice.id, logits) || c.room() < 1) return false;
            next = {clover::pass_kind::commit, {choice.id}, 1, -1};  // one row, its logits
            return true;
        }
    };
};
