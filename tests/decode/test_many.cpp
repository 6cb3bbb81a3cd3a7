// decode::generate_many: sequences with different decoders, prompts and lengths run together
// (one batched pass per step, up to max_active at a time) give each the tokens it gets alone.
#include <doctest/doctest.h>

#include <cmath>
#include <type_traits>
#include <variant>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"
#include "../../examples/until_unsure.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
using any_decoder = std::variant<decode::ar, decode::low_confidence, decode::self_speculative>;
// A user's decoder (examples/until_unsure.hpp) as one more alternative.
using with_custom = std::variant<decode::ar, decode::low_confidence, decode::self_speculative, until_unsure>;

// Policies that each lack one piece a batch needs (the runner's static_assert names it).
struct no_name {
    template <class M>
    struct stepper {
        explicit stepper(const no_name&) {}
        bool step(decode::context<M>&, const float*, decode::step_request&) { return false; }
    };
};
struct no_stepper {
    static constexpr const char* name = "no-stepper";
};
struct no_ctor {
    static constexpr const char* name = "no-ctor";
    template <class M>
    struct stepper {
        bool step(decode::context<M>&, const float*, decode::step_request&) { return false; }
    };
};
struct no_step {
    static constexpr const char* name = "no-step";
    template <class M>
    struct stepper {
        explicit stepper(const no_step&) {}
    };
};
namespace dd = decode::detail;
static_assert(dd::batchable_policy<until_unsure, rt_model> && decode::decoder_policy_for<until_unsure, rt_model>);
static_assert(dd::batchable_policy<decode::self_speculative, rt_model>);
static_assert(!dd::named_policy<no_name> && dd::stepper_steps<no_name, rt_model>);
static_assert(dd::named_policy<no_stepper> && !dd::has_stepper<no_stepper, rt_model>);
static_assert(dd::has_stepper<no_ctor, rt_model> && !dd::stepper_from_policy<no_ctor, rt_model>);
static_assert(dd::stepper_from_policy<no_step, rt_model> && !dd::stepper_steps<no_step, rt_model>);
// The runner's steppers follow the variant, alternative for alternative.
static_assert(std::is_same_v<dd::stepper_set<with_custom, rt_model>::type,
                             std::variant<decode::ar::stepper<rt_model>, decode::low_confidence::stepper<rt_model>,
                                          decode::self_speculative::stepper<rt_model>, until_unsure::stepper<rt_model>>>);

}  // namespace

TEST_CASE("generate_many: mixed decoders together equal each alone (exact mode), any max_active") {
    auto spec = synth::preset("tiny");
    spec.arch = "clover_moe";
    spec.rope_theta = 100.f;
    const std::string path = testutil::synth_file("many_tiny.gguf", spec);
    rt_model m(load(path), {2});
    const int N = 7;
    std::vector<std::vector<token>> prompts;
    std::vector<decode::generate_options> opts(N);
    std::vector<any_decoder> decs;
    for (int i = 0; i < N; ++i) {
        prompts.push_back(testutil::random_ids(3 + 5 * i, 500, 40 + i));
        opts[std::size_t(i)].max_tokens = 9 + 4 * i;
        opts[std::size_t(i)].ignore_eos = true;
        if (i % 3 == 0) decs.emplace_back(decode::ar{});
        else if (i % 3 == 1) decs.emplace_back(decode::low_confidence{8, 0.9f, 3});
        else decs.emplace_back(decode::self_speculative{6, 1, 0.95f, -1});
    }
    auto run = [&](std::vector<int> which, std::int64_t max_active) {
        std::vector<std::vector<token>> out(which.size());
        std::vector<decode::sequence_job<any_decoder>> jobs(which.size());
        for (std::size_t k = 0; k < which.size(); ++k) {
            const int i = which[k];
            jobs[k].prompt = prompts[std::size_t(i)];
            jobs[k].o = &opts[std::size_t(i)];
            jobs[k].dec = decs[std::size_t(i)];
            jobs[k].on_token = [&out, k](token t) { out[k].push_back(t); return true; };
        }
        decode::generate_many(m, std::span(jobs), max_active, true);
        for (std::size_t k = 0; k < which.size(); ++k) CHECK(jobs[k].stats.tokens == std::int64_t(out[k].size()));
        return out;
    };
    std::vector<std::vector<token>> alone;
    for (int i = 0; i < N; ++i) alone.push_back(run({i}, 0)[0]);
    for (std::int64_t max_active : {0, 3}) {
        CAPTURE(max_active);
        auto together = run({0, 1, 2, 3, 4, 5, 6}, max_active);
        for (int i = 0; i < N; ++i) {
            CAPTURE(i);
            CHECK(together[std::size_t(i)] == alone[std::size_t(i)]);
            CHECK(std::int64_t(together[std::size_t(i)].size()) == opts[std::size_t(i)].max_tokens);
        }
    }
}

// A decoder of one's own joins a batch beside the built-in ones. until_unsure is greedy AR that
// stops before the first token whose probability is below min_p; the threshold is chosen from an
// AR run so that it stops after k >= 1 tokens, which no built-in decoder does (they run to
// max_tokens with stop reason "length"): a runner that stepped it as a built-in one fails here.
TEST_CASE("generate_many: a custom decoder batched beside ar, diffusion and speculative equals it alone") {
    auto spec = synth::preset("tiny");
    spec.arch = "clover_moe";
    spec.rope_theta = 100.f;
    const std::string path = testutil::synth_file("many_custom_tiny.gguf", spec);
    rt_model m(load(path), {2});
    const std::int64_t M = 12;
    decode::generate_options o;
    o.max_tokens = M;
    o.ignore_eos = true;

    // The greedy AR tokens of a prompt, with each one's probability.
    auto ar_run = [&](const std::vector<token>& prompt, std::vector<token>& ids, std::vector<double>& q) {
        decode::generate_options lo = o;
        lo.logprobs = 0;
        decode::sequence_job<with_custom> j;
        j.prompt = prompt;
        j.o = &lo;
        j.dec = decode::ar{};
        j.on_token = [&](token t) { ids.push_back(t); return true; };
        j.on_logprob = [&](const decode::token_logprob& lp) { q.push_back(std::exp(double(lp.logprob))); };
        decode::generate_many(m, std::span(&j, 1));
    };
    // A prompt and threshold with which until_unsure emits k tokens, 1 <= k < M: the first
    // token less likely than every one before it, by a clear margin (10%).
    std::vector<token> prompt, ar_ids;
    std::int64_t k = 0;
    float min_p = 0;
    for (std::uint64_t seed = 1; seed < 40 && k == 0; ++seed) {
        prompt = testutil::random_ids(5 + std::int64_t(seed % 7), 500, 900 + seed);
        std::vector<double> q;
        ar_ids.clear();
        ar_run(prompt, ar_ids, q);
        REQUIRE(std::int64_t(q.size()) == M);
        double lowest = q[0];
        for (std::int64_t i = 1; i < M; ++i) {
            if (q[std::size_t(i)] < 0.9 * lowest) {
                k = i;
                min_p = float((q[std::size_t(i)] + lowest) / 2);
                break;
            }
            lowest = std::min(lowest, q[std::size_t(i)]);
        }
    }
    REQUIRE(k >= 1);
    CAPTURE(k);
    CAPTURE(min_p);

    std::vector<std::vector<token>> prompts = {prompt};
    std::vector<with_custom> decs = {until_unsure{min_p}};
    for (int i = 0; i < 4; ++i) prompts.push_back(testutil::random_ids(4 + 3 * i, 500, 70 + std::uint64_t(i)));
    decs.emplace_back(decode::ar{});
    decs.emplace_back(decode::low_confidence{8, 0.9f, 3});
    decs.emplace_back(decode::self_speculative{6, 1, 0.95f, -1});
    decs.emplace_back(until_unsure{0.f});  // never unsure: runs to max_tokens
    struct result {
        std::vector<token> ids;
        decode::generate_stats st;
    };
    auto run = [&](std::vector<std::size_t> which) {
        std::vector<result> out(which.size());
        std::vector<decode::sequence_job<with_custom>> jobs(which.size());
        for (std::size_t n = 0; n < which.size(); ++n) {
            jobs[n].prompt = prompts[which[n]];
            jobs[n].o = &o;
            jobs[n].dec = decs[which[n]];
            jobs[n].on_token = [&out, n](token t) { out[n].ids.push_back(t); return true; };
        }
        decode::generate_many(m, std::span(jobs), 0, true);
        for (std::size_t n = 0; n < which.size(); ++n) out[n].st = jobs[n].stats;
        return out;
    };
    std::vector<result> alone;
    for (std::size_t i = 0; i < decs.size(); ++i) alone.push_back(run({i})[0]);
    const std::vector<token> ar_prefix(ar_ids.begin(), ar_ids.begin() + k);
    CHECK(alone[0].ids == ar_prefix);
    CHECK(alone[0].st.stop_reason == "unsure");
    const auto together = run({0, 1, 2, 3, 4});
    for (std::size_t i = 0; i < decs.size(); ++i) {
        CAPTURE(i);
        CHECK(together[i].ids == alone[i].ids);
        CHECK(together[i].st.stop_reason == alone[i].st.stop_reason);
        CHECK(together[i].st.tokens == std::int64_t(together[i].ids.size()));
        if (i > 0) CHECK(std::int64_t(together[i].ids.size()) == M);
    }
    CHECK(together[0].ids == ar_prefix);
    CHECK(together[0].st.stop_reason == "unsure");
    CHECK(together[2].st.preview_passes > 0);  // the diffusion and speculative sequences did preview
    CHECK(together[3].st.verify_passes > 0);
}
