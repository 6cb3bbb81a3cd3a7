// The prefix cache (decode/prefix_cache.hpp): a prompt resumed from a cached prefix gives the
// logits of computing it whole, bit for bit (exact mode, both KV formats); pages are shared,
// not copied, and a session never writes a page it shares; the byte budget evicts the least
// recently used resume points; prompt_cuts depends only on the tokens before each cut.
#include <doctest/doctest.h>

#include <cstring>

#include <clover/clover.hpp>
#include <clover/decode/prefix_cache.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
constexpr token kBoundary = 7;  // stands for <|im_start|>

// A "conversation": random tokens with a message start every `every` tokens or so.
std::vector<token> chat_ids(std::int64_t n, std::uint64_t seed, std::int64_t every = 40) {
    auto v = testutil::random_ids(n, 290, seed);
    for (auto& t : v)
        if (t == kBoundary) t = kBoundary + 1;
    for (std::int64_t i = every; i < n; i += every + std::int64_t(seed % 7)) v[std::size_t(i)] = kBoundary;
    return v;
}

std::vector<std::int64_t> cuts_of(const std::vector<token>& p) { return decode::prompt_cuts(p, 64, kBoundary, 16); }

// Commits prompt[from, n) in the chunks prompt_cuts gives, checkpointing at each cut (what the
// server's runner does); the last row's logits.
std::vector<float> compute(rt_model& m, session& s, const std::vector<token>& p, std::int64_t from, std::int64_t batch = 64) {
    const auto cuts = decode::prompt_cuts(p, batch, kBoundary, 16);
    REQUIRE((from == 0 || std::binary_search(cuts.begin(), cuts.end(), from)));
    std::vector<float> lg;
    std::int64_t at = from;
    const std::int64_t n = std::int64_t(p.size());
    while (at < n) {
        std::int64_t end = n;
        if (auto c = std::upper_bound(cuts.begin(), cuts.end(), at); c != cuts.end()) end = std::min(end, *c);
        m.commit(s, std::span(p).subspan(std::size_t(at), std::size_t(end - at)), end == n ? logits_rows::last : logits_rows::none,
                 lg, true);
        if (std::binary_search(cuts.begin(), cuts.end(), end)) m.checkpoint(s);
        at = end;
    }
    return lg;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("prompt_cuts: every batch tokens and at message starts, each cut depending only on what precedes it") {
    const auto p = chat_ids(500, 3, 37);
    const auto cuts = decode::prompt_cuts(p, 64, kBoundary, 16);
    REQUIRE(!cuts.empty());
    std::int64_t last = 0;
    for (std::int64_t c : cuts) {
        CHECK(c > last);
        CHECK(c - last <= 64);
        CHECK((c - last == 64 || (p[std::size_t(c - 1)] == kBoundary && c - last >= 16)));
        last = c;
    }
    CHECK(std::int64_t(p.size()) - last <= 64);
    // Whether k is a cut depends on p[0, k) only: any prompt beginning with them has the same
    // cuts up to k, whatever follows (here: a boundary token right at k, or none).
    for (std::int64_t k : {1, 37, 41, 86, 100, 333, 499}) {
        CAPTURE(k);
        for (token next : {kBoundary, token(kBoundary + 1)}) {
            auto q = std::vector<token>(p.begin(), p.begin() + k);
            q.push_back(next);
            const auto more = testutil::random_ids(90, 290, std::uint64_t(k));
            q.insert(q.end(), more.begin(), more.end());
            auto upto = [&](const std::vector<std::int64_t>& v) {
                std::vector<std::int64_t> w;
                for (std::int64_t c : v)
                    if (c <= k) w.push_back(c);
                return w;
            };
            CHECK(upto(decode::prompt_cuts(q, 64, kBoundary, 16)) == upto(cuts));
        }
    }
    CHECK(decode::prompt_cuts(p, 100, -1) == std::vector<std::int64_t>{100, 200, 300, 400});
    CHECK_THROWS_WITH(decode::prompt_cuts(p, 0, -1), doctest::Contains("batch"));
}

TEST_CASE("a prompt resumed from the cache gives the logits of computing it whole, bit for bit") {
    const std::string path = testutil::synth_file("pc_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {2});
    for (const auto& [f16, finished] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
        CAPTURE(f16);
        CAPTURE(finished);  // insert_finished: the checkpoints move into the cache (a server's finished request)
        decode::prefix_cache<rt_model> cache(m, f16, std::size_t(64) << 20);
        const session_options so{.ctx = 512, .kv_f16 = f16};
        // Turn 1, then turn 2 = turn 1's prompt up to a message start + new text (what the chat
        // template makes of the next turn once it drops the reasoning).
        const auto a = chat_ids(300, 5);
        std::int64_t cached = -1;
        {
            auto s = cache.open(so, a, cuts_of(a), std::int64_t(a.size()) - 1, cached);
            CHECK(cached == 0);
            compute(m, s, a, 0);
            const auto held = m.checkpoints(s);
            REQUIRE(!held.empty());
            if (finished) {
                cache.insert_finished(s, std::int64_t(a.size()));
                CHECK(m.checkpoints(s).empty());  // moved, not copied
                CHECK_THROWS_WITH(m.save_state(s, held.back()), doctest::Contains("no GDN checkpoint"));
            } else {
                cache.insert(s, std::int64_t(a.size()));
                CHECK(m.checkpoints(s) == held);
            }
            CHECK(cache.positions() == held);
        }
        REQUIRE(cache.stats().entries > 0);
        std::int64_t last_boundary = 0;
        for (std::int64_t i = 0; i < std::int64_t(a.size()); ++i)
            if (a[std::size_t(i)] == kBoundary) last_boundary = i;
        auto b = std::vector<token>(a.begin(), a.begin() + last_boundary + 1);  // ... <|im_start|> + something else
        const auto more = chat_ids(150, 9);
        b.insert(b.end(), more.begin(), more.end());

        auto fresh = m.new_session(so);
        const auto want = compute(m, fresh, b, 0);
        const std::int64_t used_before = m.kv_pages_used(f16 ? 1 : 0);
        auto s = cache.open(so, b, cuts_of(b), std::int64_t(b.size()) - 1, cached);
        CHECK(cached == last_boundary + 1);  // resumed just after the last message start the two share
        CHECK(s.n_past() == cached);
        // Whole pages are shared: the new session took pages only for what lies past them.
        const std::int64_t P = m.page_size();
        CHECK(m.kv_pages_used(f16 ? 1 : 0) - used_before == (so.ctx + P - 1) / P - cached / P);
        const auto got = compute(m, s, b, cached);
        CHECK(same_bits(got, want));
        CHECK(cache.stats().hits == 1);
        CHECK(cache.stats().hit_tokens == cached);

        // Going back below the shared prefix gives the session its own pages: what it writes
        // then does not reach the cache, and the next request still gets exact logits.
        m.restore(s, 0);
        compute(m, s, chat_ids(200, 77), 0);
        auto s2 = cache.open(so, b, cuts_of(b), std::int64_t(b.size()) - 1, cached);
        CHECK(cached == last_boundary + 1);
        CHECK(same_bits(compute(m, s2, b, cached), want));
    }
}

TEST_CASE("the cache keeps no more than its budget: least recently used resume points go first") {
    const std::string path = testutil::synth_file("pc_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {2});
    const std::size_t one = m.checkpoint_bytes() + 2 * m.page_bytes(1);  // a point, a node page, a tail page
    decode::prefix_cache<rt_model> cache(m, true, 2 * one + one / 2);
    const session_options so{.ctx = 256, .kv_f16 = true};
    auto run = [&](const std::vector<token>& p) {
        std::int64_t cached = 0;
        auto s = cache.open(so, p, cuts_of(p), std::int64_t(p.size()) - 1, cached);
        compute(m, s, p, cached);
        cache.insert(s, std::int64_t(p.size()));
        return cached;
    };
    // Three unrelated prompts, each with one message start at 50 (one resume point each, at 51).
    auto prompt = [](std::uint64_t seed) {
        auto v = testutil::random_ids(80, 290, seed);
        for (auto& t : v)
            if (t == kBoundary) t = kBoundary + 1;
        v[50] = kBoundary;
        return v;
    };
    const auto a = prompt(1), b = prompt(2), c = prompt(3);
    run(a);
    run(b);
    CHECK(cache.stats().entries == 2);
    CHECK(run(a) == 51);  // a hit: a is now the most recently used
    run(c);               // over budget: b goes, not a
    const auto st = cache.stats();
    CHECK(st.bytes <= st.budget);
    CHECK(st.evicted >= 1);
    CHECK(run(a) == 51);
    CHECK(run(b) == 0);
    // Everything dropped: the pool has only what live sessions hold.
    const std::int64_t before = m.kv_pages_used(1);
    cache.clear();
    CHECK(cache.stats().entries == 0);
    CHECK(cache.stats().bytes == 0);
    CHECK(m.kv_pages_used(1) < before);
    CHECK(m.kv_pages_used(1) == 0);
}

TEST_CASE("misuse of shared prefixes is one clear error") {
    const std::string path = testutil::synth_file("pc_odd.gguf", testutil::clover_odd_spec());
    rt_model m(load(path), {2});
    auto s = m.new_session({.ctx = 128});
    const auto p = chat_ids(70, 4);
    compute(m, s, p, 0);
    CHECK_THROWS_WITH(m.hold_pages(s, 3, 2), doctest::Contains("outside the sequence"));
    CHECK_THROWS_WITH(m.save_state(s, 33), doctest::Contains("no GDN checkpoint at position 33"));
    CHECK_THROWS_WITH(m.take_state(s, 33), doctest::Contains("no GDN checkpoint at position 33"));
    const auto cks = m.checkpoints(s);
    REQUIRE(!cks.empty());
    const std::int64_t c = cks.back();
    const auto pages = m.hold_pages(s, 0, (c + 31) / 32);
    const auto st = m.save_state(s, c);
    CHECK_THROWS_WITH(m.new_session_from({.ctx = 128}, std::span(pages).first(pages.size() - 1), std::span(p).first(std::size_t(c)), st),
                      doctest::Contains("pages"));
    CHECK_THROWS_WITH(m.new_session_from({.ctx = 128}, pages, std::span(p).first(std::size_t(c - 1)), st),
                      doctest::Contains("not those of position"));
    CHECK_THROWS_WITH(m.new_session_from({.ctx = c}, pages, std::span(p).first(std::size_t(c)), st), doctest::Contains("does not fit"));
    auto ok = m.new_session_from({.ctx = 128}, pages, std::span(p).first(std::size_t(c)), st);
    CHECK(ok.n_past() == c);
    m.drop_pages(ok.pool(), pages);
}
