// decode::generate_many: sequences with different decoders, prompts and lengths run together
// (one batched pass per step, up to max_active at a time) give each the tokens it gets alone.
#include <doctest/doctest.h>

#include <variant>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
using any_decoder = std::variant<decode::ar, decode::low_confidence, decode::self_speculative>;


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
