#pragma once
// One generation loop; the decoder policy is a type. `decode::ar` runs one commit pass per
// token after the prompt. The block-diffusion and self-speculative decoders plug in here with
// their own pass schedules and share the sampler and stop rules.
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "clover/decode/sampler.hpp"
#include "clover/model/model.hpp"

namespace clover::decode {

struct ar {
    static constexpr const char* name = "ar";
};

struct generate_options {
    std::int64_t max_tokens = 128;
    bool ignore_eos = false;
    std::vector<token> eog;  // end-of-generation ids
    sampler_options sampling;
};

struct generate_stats {
    std::int64_t prompt_tokens = 0, tokens = 0;
    std::int64_t commit_passes = 0, preview_passes = 0, verify_passes = 0;
    double prompt_seconds = 0, seconds = 0;  // seconds: generation only (after the prompt)
    std::int64_t passes() const { return commit_passes + preview_passes + verify_passes; }
    // Generated tokens per forward pass (clover-diffusion.md §4). The prompt's pass counts: it
    // yields the first token's logits, so AR decoding is exactly 1.0.
    double tokens_per_pass() const { return passes() > 0 ? double(tokens) / double(passes()) : 0.0; }
    std::string json() const {
        auto f = [](double x) { char b[64]; std::snprintf(b, sizeof b, "%.6g", x); return std::string(b); };
        return "{\"tokens\": " + std::to_string(tokens) + ", \"prompt_tokens\": " + std::to_string(prompt_tokens) +
               ", \"passes\": " + std::to_string(passes()) + ", \"preview_passes\": " + std::to_string(preview_passes) +
               ", \"commit_passes\": " + std::to_string(commit_passes) + ", \"verify_passes\": " +
               std::to_string(verify_passes) + ", \"tokens_per_pass\": " + f(tokens_per_pass()) +
               ", \"prompt_seconds\": " + f(prompt_seconds) + ", \"seconds\": " + f(seconds) +
               ", \"tokens_per_second\": " + f(seconds > 0 ? double(tokens) / seconds : 0.0) + "}";
    }
};

// on_token(id) is called for every generated token; returning false stops generation.
template <class Decoder, class Model>
generate_stats generate(Model& m, session& s, std::span<const token> prompt, const generate_options& o,
                        const std::function<bool(token)>& on_token) {
    static_assert(std::is_same_v<Decoder, ar>,
                  "this decoder policy is not implemented for this model/backend (available: decode::ar)");
    using clk = std::chrono::steady_clock;
    generate_stats st;
    sampler smp(o.sampling);
    std::vector<float> logits;
    auto t0 = clk::now();
    if (prompt.empty()) fail("generate: the prompt is empty");
    m.commit(s, prompt, logits_rows::last, logits);
    st.prompt_tokens = std::int64_t(prompt.size());
    st.commit_passes = 1;
    auto t1 = clk::now();
    st.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
    for (std::int64_t i = 0; i < o.max_tokens; ++i) {
        const token t = smp.pick(logits.data(), m.n_vocab());
        ++st.tokens;
        const bool keep_going = on_token ? on_token(t) : true;
        const bool is_eog = !o.ignore_eos && std::find(o.eog.begin(), o.eog.end(), t) != o.eog.end();
        if (!keep_going || is_eog || i + 1 == o.max_tokens) break;
        if (s.n_past() + 1 > s.n_ctx()) break;  // context full: stop, as llama.cpp does
        const token one[1] = {t};
        m.commit(s, one, logits_rows::last, logits);
        ++st.commit_passes;
    }
    st.seconds = std::chrono::duration<double>(clk::now() - t1).count();
    return st;
}

}  // namespace clover::decode
