// Batches of many sequences (execution.md §5): a pass over segments of N sequences — prefill
// chunks, decode rows, preview blocks, verify rows — gives each sequence exactly what it gets
// alone (bit for bit in exact mode, the same greedy tokens in fast mode); one model driven from
// two threads gives what it gives from one.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;

synth::spec clover_odd() { return testutil::clover_odd_spec(); }

std::vector<token> ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) { return testutil::random_ids(n, vocab, seed); }

// Sequence i's segment in the mixed pass: kinds cycle commit-chunk, decode row, preview, verify.
struct seg_plan {
    pass_kind kind;
    std::vector<token> rows;
    std::int64_t logits, coreset;
};
seg_plan plan_for(int i, const rt_model& m) {
    const std::int64_t V = 290;
    switch (i % 4) {
        case 0: return {pass_kind::commit, ids(3 + i, V, 100 + i), 3 + i, -1};
        case 1: return {pass_kind::commit, ids(1, V, 200 + i), 1, -1};
        case 2: {
            auto b = ids(5, V, 300 + i);
            b[1] = b[3] = token(m.hp().mask_token_id);
            return {pass_kind::preview, b, 5, i % 3 == 0 ? 3 : 0};
        }
        default: return {pass_kind::verify, ids(4, V, 400 + i), 4, -1};
    }
}

std::int64_t argmax_row(const float* p, std::int64_t n) {
    std::int64_t b = 0;
    for (std::int64_t i = 1; i < n; ++i)
        if (p[i] > p[b]) b = i;
    return b;
}

}  // namespace

TEST_CASE("batch equivalence: N = 1..8 mixed segments equal each sequence alone (exact: bitwise; fast: argmax)") {
    const std::string path = testutil::synth_file("b_odd.gguf", clover_odd());
    rt_model m(load(path), {2});
    const std::int64_t V = m.n_vocab();
    for (bool exact : {true, false}) {
        for (int N = 1; N <= 8; ++N) {
            CAPTURE(exact);
            CAPTURE(N);
            std::vector<session> together, alone;
            std::vector<seg_plan> plans;
            for (int i = 0; i < N; ++i) {
                together.push_back(m.new_session({.ctx = 64}));
                alone.push_back(m.new_session({.ctx = 64}));
                std::vector<float> tmp;
                m.commit(together.back(), ids(2 + 3 * i, 290, 7 + i), logits_rows::none, tmp, exact);
                m.copy_state(alone.back(), together.back());
                plans.push_back(plan_for(i, m));
            }
            std::vector<pass_request> reqs;
            for (int i = 0; i < N; ++i)
                reqs.push_back({&together[std::size_t(i)], plans[std::size_t(i)].kind, plans[std::size_t(i)].rows,
                                plans[std::size_t(i)].logits, plans[std::size_t(i)].coreset});
            std::vector<float> all;
            m.run(reqs, all, exact);
            std::int64_t row = 0;
            for (int i = 0; i < N; ++i) {
                CAPTURE(i);
                const seg_plan& p = plans[std::size_t(i)];
                pass_request one{&alone[std::size_t(i)], p.kind, p.rows, p.logits, p.coreset};
                std::vector<float> mine;
                m.run(std::span(&one, 1), mine, exact);
                REQUIRE(std::int64_t(mine.size()) == p.logits * V);
                const float* got = all.data() + row * V;
                if (exact) {
                    CHECK(std::memcmp(got, mine.data(), mine.size() * 4) == 0);
                } else {
                    for (std::int64_t r = 0; r < p.logits; ++r) CHECK(argmax_row(got + r * V, V) == argmax_row(mine.data() + r * V, V));
                    CHECK(testutil::max_abs_diff(got, mine.data(), mine.size()) <= 1e-4f * testutil::max_abs(mine));
                }
                row += p.logits;
                if (p.kind == pass_kind::verify) {  // rollback from a batched verify equals the lone one
                    m.rollback(together[std::size_t(i)], 2);
                    m.rollback(alone[std::size_t(i)], 2);
                }
                if (exact) CHECK(m.same_state(together[std::size_t(i)], alone[std::size_t(i)]));
            }
        }
    }
}

TEST_CASE("a batch refuses bad segments before touching any state") {
    const std::string path = testutil::synth_file("b_odd.gguf", clover_odd());
    rt_model m(load(path), {1});
    auto a = m.new_session({.ctx = 8});
    auto b = m.new_session({.ctx = 8});
    auto c = m.new_session({.ctx = 8, .kv_f16 = false});  // a and b: the default, F16
    std::vector<token> ok = {1, 2, 3}, bad = {1, 9999};
    std::vector<float> lg;
    pass_request r1{&a, pass_kind::commit, ok, 1}, r2{&b, pass_kind::commit, bad, 1};
    std::vector<pass_request> reqs{r1, r2};
    CHECK_THROWS_WITH_AS(m.run(reqs, lg), doctest::Contains("out of range"), error);
    CHECK(a.n_past() == 0);
    pass_request twice[2] = {r1, r1};
    CHECK_THROWS_WITH_AS(m.run(twice, lg), doctest::Contains("two segments"), error);
    pass_request mixed[2] = {r1, {&c, pass_kind::commit, ok, 1}};
    CHECK_THROWS_WITH_AS(m.run(mixed, lg), doctest::Contains("KV formats"), error);
    std::vector<token> many(9, 1);
    pass_request full{&a, pass_kind::commit, many, 1};
    CHECK_THROWS_WITH_AS(m.run(std::span(&full, 1), lg), doctest::Contains("context full"), error);
    CHECK(a.n_past() == 0);
}

TEST_CASE("one model driven from two threads (two sets of sequences) equals one thread at a time") {
    const std::string path = testutil::synth_file("b_odd.gguf", clover_odd());
    rt_model m(load(path), {2});
    auto run_set = [&](int base, std::vector<std::vector<token>>& out) {
        for (int i = 0; i < 3; ++i) {
            auto s = m.new_session({.ctx = 64});
            decode::generate_options o;
            o.max_tokens = 12;
            o.ignore_eos = true;
            std::vector<token> got;
            decode::generate<decode::ar>(m, s, ids(5 + i, 290, std::uint64_t(base + i)), o, [&](token t) {
                got.push_back(t);
                return true;
            });
            out.push_back(got);
        }
    };
    std::vector<std::vector<token>> a1, b1, a2, b2;
    run_set(10, a1);
    run_set(20, b1);
    std::thread ta([&] { run_set(10, a2); });
    std::thread tb([&] { run_set(20, b2); });
    ta.join();
    tb.join();
    CHECK(a1 == a2);
    CHECK(b1 == b2);
}
