// The trace backend proves execution.md's rules without a GPU, on a model with the 40-layer
// layer pattern of Clover-35B-A3B (30 Gated DeltaNet + 10 attention layers, small widths): one
// read-back per pass, at most 12 primitives per layer, and a primitive sequence that depends on
// the batch's shape only, never on token values.
#include <doctest/doctest.h>

#include <map>

#include <clover/backend/trace.hpp>
#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using traced = model<variants::from_file, backend::trace<backend::cpu>>;

synth::spec pattern_40() {
    auto s = synth::preset("tiny");
    s.arch = "clover_moe";
    s.preset = "pattern40";
    s.n_layer = 40;
    s.interval = 4;
    s.n_embd = 32;
    s.n_vocab = 300;
    return s;
}

std::vector<token> ids(std::int64_t n, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(token(r.next() % 280));
    return v;
}

struct step_trace {
    std::vector<backend::trace_call> calls;
    std::int64_t readbacks, passes;
};

template <class F>
step_trace record(traced& m, F&& f) {
    m.backend().clear();
    f();
    return {m.backend().calls(), m.backend().readbacks(), m.backend().passes()};
}

}  // namespace

TEST_CASE("trace: one read-back per pass, <= 12 primitives per layer, same sequence for other tokens") {
    const std::string path = testutil::synth_file("t_pattern40.gguf", pattern_40());
    traced m(load(path), {2});
    REQUIRE(m.hp().n_layer == 40);
    REQUIRE(m.hp().n_attention_layers() == 10);
    const std::int64_t L = m.hp().n_layer;
    auto kinds = [&](std::uint64_t seed) {
        std::map<std::string, step_trace> out;
        auto s = m.new_session({.ctx = 256});
        std::vector<float> lg;
        const auto prompt = ids(40, seed);
        out["prefill"] = record(m, [&] { m.commit(s, prompt, logits_rows::last, lg); });
        const auto one = ids(1, seed + 1);
        out["decode"] = record(m, [&] { m.commit(s, one, logits_rows::last, lg); });
        auto block = ids(32, seed + 2);
        for (std::size_t i = 1; i < block.size(); ++i) block[i] = token(m.hp().mask_token_id);
        out["preview"] = record(m, [&] { m.preview(s, block, 16, lg); });
        const auto draft = ids(8, seed + 3);
        out["verify"] = record(m, [&] { m.verify(s, draft, lg); });
        return out;
    };
    auto a = kinds(1), b = kinds(99);
    for (auto& [name, t] : a) {
        CAPTURE(name);
        CHECK(t.passes == 1);
        CHECK(t.readbacks == 1);
        std::int64_t in_layers = 0;
        std::map<std::int64_t, int> per_layer;
        for (const auto& c : t.calls) {
            if (c.layer >= 0) ++in_layers;
            if (c.layer >= 0) ++per_layer[c.layer];
        }
        MESSAGE(name << ": " << t.calls.size() << " primitives, " << double(in_layers) / double(L) << " per layer");
        CHECK(double(in_layers) / double(L) <= 12.0);
        for (auto& [l, k] : per_layer) CHECK(k <= 12);
        CHECK(t.calls == b[name].calls);  // the same shape, other token values: the same primitives
    }
    // A decode step of 3 sequences is still one pass with one read-back.
    std::vector<session> ss;
    for (int i = 0; i < 3; ++i) ss.push_back(m.new_session({.ctx = 64}));
    std::vector<float> lg;
    for (auto& s : ss) m.commit(s, ids(4, 5), logits_rows::none, lg);
    std::vector<token> t1 = {1}, t2 = {2}, t3 = {3};
    std::vector<pass_request> reqs{{&ss[0], pass_kind::commit, t1, 1}, {&ss[1], pass_kind::commit, t2, 1},
                                   {&ss[2], pass_kind::commit, t3, 1}};
    auto t = record(m, [&] { m.run(reqs, lg); });
    CHECK(t.passes == 1);
    CHECK(t.readbacks == 1);
    CHECK(lg.size() == std::size_t(3 * m.n_vocab()));
}
