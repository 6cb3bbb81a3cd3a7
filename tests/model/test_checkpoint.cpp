// GDN checkpoints at page boundaries and message ends (execution.md §4): returning a session to a checkpoint, or
// starting another from a prefix of it, continues exactly as if the tokens after that point had
// never been committed — bit for bit in exact mode, for both KV formats — and every misuse is one
// clear error that leaves the session as it was.
#include <doctest/doctest.h>

#include <cstring>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;

std::vector<token> ids_290(std::int64_t n, std::uint64_t seed) { return testutil::random_ids(n, 290, seed); }

// Commits `t` in the given chunk lengths (exact mode); the last chunk's last row's logits.
std::vector<float> commit_chunks(rt_model& m, session& s, const std::vector<token>& t, std::initializer_list<std::int64_t> chunks) {
    std::vector<float> lg;
    std::int64_t at = 0;
    for (std::int64_t c : chunks) {
        m.commit(s, std::span(t).subspan(std::size_t(at), std::size_t(c)), logits_rows::last, lg, true);
        at += c;
    }
    REQUIRE(at == std::int64_t(t.size()));
    return lg;
}

using testutil::same_bits;

}  // namespace

TEST_CASE("restore to a page-boundary checkpoint, then continue: equals a session that never went further") {
    const std::string path = testutil::synth_file("ck_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {2});
    const std::int64_t P = m.page_size();
    REQUIRE(P == 32);
    for (bool f16 : {false, true}) {
        CAPTURE(f16);
        const auto prefix = ids_290(2 * P, 1), tail_a = ids_290(21, 2), tail_b = ids_290(13, 3);
        auto s = m.new_session({.ctx = 4 * P, .kv_f16 = f16});
        std::vector<float> lg;
        m.commit(s, std::span(prefix).first(std::size_t(P)), logits_rows::none, lg, true);
        m.checkpoint(s);
        m.commit(s, std::span(prefix).subspan(std::size_t(P)), logits_rows::none, lg, true);
        m.checkpoint(s);
        CHECK(m.checkpoints(s) == std::vector<std::int64_t>{P, 2 * P});
        m.commit(s, tail_a, logits_rows::last, lg, true);  // a turn that is then taken back

        m.restore(s, 2 * P);
        CHECK(s.n_past() == 2 * P);
        CHECK(std::vector<token>(s.tokens()) == prefix);
        auto got = commit_chunks(m, s, tail_b, {13});

        auto fresh = m.new_session({.ctx = 4 * P, .kv_f16 = f16});
        std::vector<token> want_tokens = prefix;
        want_tokens.insert(want_tokens.end(), tail_b.begin(), tail_b.end());
        auto want = commit_chunks(m, fresh, want_tokens, {P, P, 13});
        CHECK(same_bits(got, want));
        CHECK(m.same_state(s, fresh));

        // Further back: the first page, then the zero state.
        m.restore(s, P);
        CHECK(m.checkpoints(s) == std::vector<std::int64_t>{P});
        got = commit_chunks(m, s, tail_a, {21});
        auto fresh1 = m.new_session({.ctx = 4 * P, .kv_f16 = f16});
        std::vector<token> t1(prefix.begin(), prefix.begin() + P);
        t1.insert(t1.end(), tail_a.begin(), tail_a.end());
        CHECK(same_bits(got, commit_chunks(m, fresh1, t1, {P, 21})));
        m.restore(s, 0);
        CHECK(s.n_past() == 0);
        CHECK(m.checkpoints(s).empty());
        auto fresh0 = m.new_session({.ctx = 4 * P, .kv_f16 = f16});
        CHECK(same_bits(commit_chunks(m, s, tail_b, {13}), commit_chunks(m, fresh0, tail_b, {13})));
    }
}

TEST_CASE("a checkpoint at the end of a message (not a page boundary) works the same way") {
    const std::string path = testutil::synth_file("ck_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {2});
    const auto turn1 = ids_290(37, 31), reply = ids_290(9, 32), edited = ids_290(11, 33);
    auto s = m.new_session({.ctx = 96});
    std::vector<float> lg;
    m.commit(s, turn1, logits_rows::none, lg, true);
    m.checkpoint(s);
    CHECK(m.checkpoints(s) == std::vector<std::int64_t>{37});
    m.commit(s, reply, logits_rows::none, lg, true);
    m.restore(s, 37);
    const auto got = commit_chunks(m, s, edited, {11});
    auto fresh = m.new_session({.ctx = 96});
    std::vector<token> all = turn1;
    all.insert(all.end(), edited.begin(), edited.end());
    CHECK(same_bits(got, commit_chunks(m, fresh, all, {37, 11})));
    CHECK(m.same_state(s, fresh));
}

TEST_CASE("copy_prefix: a new session starts from another's checkpointed prefix without recomputing it") {
    const std::string path = testutil::synth_file("ck_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {2});
    const std::int64_t P = m.page_size();
    const auto prompt = ids_290(P + 9, 11), question = ids_290(7, 12);
    auto shared = m.new_session({.ctx = 3 * P});
    std::vector<float> lg;
    m.commit(shared, std::span(prompt).first(std::size_t(P)), logits_rows::none, lg, true);
    m.checkpoint(shared);
    m.commit(shared, std::span(prompt).subspan(std::size_t(P)), logits_rows::none, lg, true);

    auto user = m.new_session({.ctx = 2 * P});
    m.copy_prefix(user, shared, P);
    CHECK(user.n_past() == P);
    CHECK(m.checkpoints(user) == std::vector<std::int64_t>{P});
    std::vector<token> rest(prompt.begin() + P, prompt.end());
    rest.insert(rest.end(), question.begin(), question.end());
    const auto got = commit_chunks(m, user, rest, {std::int64_t(rest.size())});

    auto fresh = m.new_session({.ctx = 2 * P});
    std::vector<token> all(prompt.begin(), prompt.begin() + P);
    all.insert(all.end(), rest.begin(), rest.end());
    CHECK(same_bits(got, commit_chunks(m, fresh, all, {P, std::int64_t(rest.size())})));
    // The source is untouched by the copy and by what the copy did next.
    CHECK(shared.n_past() == P + 9);
    CHECK(m.checkpoints(shared) == std::vector<std::int64_t>{P});
    // copy_state carries the checkpoints along.
    auto twin = m.new_session({.ctx = 3 * P});
    m.copy_state(twin, shared);
    CHECK(m.checkpoints(twin) == std::vector<std::int64_t>{P});
}

TEST_CASE("checkpoint misuse is one clear error and leaves the session as it was") {
    const std::string path = testutil::synth_file("ck_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {1});
    const std::int64_t P = m.page_size();
    auto s = m.new_session({.ctx = 2 * P});
    std::vector<float> lg;
    const auto t = ids_290(P + 5, 21);
    m.commit(s, std::span(t).first(std::size_t(P)), logits_rows::none, lg, true);
    m.checkpoint(s);
    m.commit(s, std::span(t).subspan(std::size_t(P)), logits_rows::none, lg, true);
    auto before = m.new_session({.ctx = 2 * P});
    m.copy_state(before, s);

    CHECK_THROWS_WITH_AS(m.restore(s, 5), doctest::Contains("no GDN checkpoint at position 5 (checkpoints at: 0, 32)"), error);
    CHECK_THROWS_WITH_AS(m.restore(s, 38), doctest::Contains("to position 38"), error);
    CHECK_THROWS_WITH_AS(m.restore(s, -1), doctest::Contains("to position -1"), error);
    auto small = m.new_session({.ctx = 8});
    CHECK_THROWS_WITH_AS(m.copy_prefix(small, s, P), doctest::Contains("do not fit"), error);
    auto other = m.new_session({.ctx = 2 * P});
    CHECK_THROWS_WITH_AS(m.copy_prefix(other, s, 36), doctest::Contains("no GDN checkpoint at position 36"), error);
    CHECK_THROWS_WITH_AS(m.copy_prefix(other, s, 40), doctest::Contains("cannot copy 40 tokens"), error);
    auto f32 = m.new_session({.ctx = 2 * P, .kv_f16 = false});  // s has the default, F16
    CHECK_THROWS_WITH_AS(m.copy_prefix(f32, s, P), doctest::Contains("different KV formats"), error);
    CHECK(other.n_past() == 0);
    CHECK(m.same_state(s, before));
    CHECK(m.checkpoints(s) == std::vector<std::int64_t>{P});
}

TEST_CASE("a session keeps the newest checkpoints; truncation and rollback drop the ones past the end") {
    const std::string path = testutil::synth_file("ck_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {1});
    const std::int64_t P = m.page_size();
    auto s = m.new_session({.ctx = 11 * P});
    std::vector<float> lg;
    for (int k = 0; k < 10; ++k) {
        m.commit(s, ids_290(P, 40 + k), logits_rows::none, lg);
        m.checkpoint(s);
    }
    const auto cps = m.checkpoints(s);
    REQUIRE(cps.size() == 8);  // state_options::gdn_checkpoints
    CHECK(cps.front() == 3 * P);
    CHECK(cps.back() == 10 * P);
    CHECK_THROWS_WITH_AS(m.restore(s, P), doctest::Contains("no GDN checkpoint at position 32"), error);
    // A checkpoint saved after a verify pass is dropped when the rollback takes its rows back.
    m.verify(s, ids_290(P, 60), lg);
    m.checkpoint(s);
    CHECK(m.checkpoints(s).back() == 11 * P);
    m.rollback(s, 3);
    CHECK(s.n_past() == 10 * P + 3);
    CHECK(m.checkpoints(s).back() == 10 * P);
    CHECK(m.checkpoint_bytes() > 0);
}
