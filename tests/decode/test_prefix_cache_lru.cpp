// The prefix cache's eviction (decode/prefix_cache.hpp): the resume point it evicts is the one a
// walk over every resume point for the least recently used would pick (that walk, the cache's
// former eviction, is kept here as the oracle), and one eviction costs the same however many
// resume points the cache holds. A fake model stands in for the real one: it counts the pages
// the cache holds and checks what the cache hands back, and runs thousands of operations in
// milliseconds.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <clover/decode/prefix_cache.hpp>

using namespace clover;

// A namespace of its own: the folder's files compile as one unit.
namespace prefix_cache_lru_test {

constexpr token kStart = 0;  // stands for <|im_start|>

// The part of a model the cache uses. Each hold_pages is a page of its own (the real pool shares
// them by reference count; what matters here is that the cache drops each page it holds once,
// and never hands out one it dropped). A saved state is the position it was saved at.
struct fake_model {
    using saved_state = std::unique_ptr<std::int64_t>;
    std::int64_t P = 4, batch = 6;
    std::size_t page_b = 10, ck_b = 3;
    std::set<std::int32_t> held;
    std::int32_t next_page = 0;
    seq_id next_id = 0;
    std::map<seq_id, std::set<std::int64_t>> taken;  // checkpoints take_state moved out

    std::int64_t page_size() const { return P; }
    std::size_t page_bytes(int) const { return page_b; }
    std::size_t checkpoint_bytes() const { return ck_b; }
    session new_session(session_options o) { return session(nullptr, o.kv_f16 ? 1 : 0, next_id++, o); }
    session with_tokens(const std::vector<token>& t) {
        auto s = new_session({.ctx = 256});
        s.mutable_tokens() = t;
        return s;
    }
    // A session's checkpoints: where prompt_cuts cuts its tokens (what the runner checkpoints).
    std::vector<std::int64_t> checkpoints(const session& s) {
        auto c = decode::prompt_cuts(s.tokens(), batch, kStart, 2);
        std::erase_if(c, [&](std::int64_t p) { return taken[s.id()].count(p) > 0; });
        return c;
    }
    saved_state save_state(const session& s, std::int64_t pos) {
        const auto c = checkpoints(s);
        REQUIRE(std::find(c.begin(), c.end(), pos) != c.end());
        return std::make_unique<std::int64_t>(pos);
    }
    saved_state take_state(session& s, std::int64_t pos) {
        auto st = save_state(s, pos);
        taken[s.id()].insert(pos);
        return st;
    }
    std::vector<std::int32_t> hold_pages(const session& s, std::int64_t first, std::int64_t count) {
        REQUIRE(first + count <= (s.n_past() + P - 1) / P);
        std::vector<std::int32_t> v;
        for (std::int64_t i = 0; i < count; ++i) v.push_back(next_page), held.insert(next_page++);
        return v;
    }
    void drop_pages(int, std::span<const std::int32_t> pages) {
        for (std::int32_t p : pages) REQUIRE(held.erase(p) == 1);
    }
    session new_session_from(session_options o, std::span<const std::int32_t> pages, std::span<const token> toks,
                             const saved_state& st) {
        REQUIRE(st);
        CHECK(*st == std::int64_t(toks.size()));
        CHECK(std::int64_t(pages.size()) == (std::int64_t(toks.size()) + P - 1) / P);
        for (std::int32_t p : pages) CHECK(held.count(p) == 1);
        auto s = new_session(o);
        s.mutable_tokens().assign(toks.begin(), toks.end());
        return s;
    }
};

// The cache as a flat list of resume points, each with the clock of its last use; eviction is the
// walk over all of them for the smallest clock (the cache's eviction before its LRU list), and
// the bytes are counted from scratch.
struct old_walk {
    struct entry {
        std::string scope;
        std::vector<token> prefix;
        std::uint64_t used = 0;
    };
    std::vector<entry> e;
    std::uint64_t clock = 0;
    std::int64_t P;
    std::size_t page_b, ck_b;

    entry* held(const std::string& scope, std::span<const token> prefix) {
        for (auto& x : e)
            if (x.scope == scope && std::ranges::equal(x.prefix, prefix)) return &x;
        return nullptr;
    }
    // open(): the longest held prefix of prompt[0, min(limit, n - 1)] that ends at a cut; 0: none.
    std::int64_t open(const std::string& scope, const std::vector<token>& prompt, const std::vector<std::int64_t>& cuts,
                      std::int64_t limit) {
        limit = std::min<std::int64_t>(limit, std::int64_t(prompt.size()) - 1);
        entry* best = nullptr;
        for (auto& x : e) {
            const auto pos = std::int64_t(x.prefix.size());
            if (x.scope != scope || pos < 1 || pos > limit || !std::binary_search(cuts.begin(), cuts.end(), pos)) continue;
            if (!std::equal(x.prefix.begin(), x.prefix.end(), prompt.begin())) continue;
            if (!best || pos > std::int64_t(best->prefix.size())) best = &x;
        }
        if (!best) return 0;
        best->used = ++clock;
        return std::int64_t(best->prefix.size());
    }
    // insert(): each checkpoint up to upto is touched when held, added when not; then evictions
    // down to the budget.
    void insert(const std::string& scope, const std::vector<token>& toks, const std::vector<std::int64_t>& cks, std::int64_t upto,
                std::size_t budget) {
        upto = std::min<std::int64_t>(upto, std::int64_t(toks.size()));
        for (std::int64_t c : cks) {
            if (c < 1 || c > upto) continue;
            const std::span<const token> prefix(toks.data(), std::size_t(c));
            if (entry* x = held(scope, prefix)) x->used = ++clock;
            else e.push_back({scope, std::vector<token>(prefix.begin(), prefix.end()), ++clock});
        }
        while (bytes() > budget && !e.empty()) evict_oldest();
    }
    void evict_oldest() {
        auto old = e.begin();
        for (auto it = e.begin(); it != e.end(); ++it)
            if (it->used < old->used) old = it;
        e.erase(old);
    }
    // Each point's GDN state and partial page, and each whole page some point needs, once per scope.
    std::size_t bytes() const {
        std::set<std::pair<std::string, std::vector<token>>> pages;
        std::size_t b = 0;
        for (const auto& x : e) {
            const auto pos = std::int64_t(x.prefix.size());
            b += ck_b + (pos % P ? page_b : 0);
            for (std::int64_t d = 1; d <= pos / P; ++d) pages.emplace(x.scope, std::vector<token>(x.prefix.begin(), x.prefix.begin() + d * P));
        }
        return b + pages.size() * page_b;
    }
    std::vector<std::pair<std::string, std::vector<token>>> order() const {
        auto v = e;
        std::sort(v.begin(), v.end(), [](const entry& a, const entry& b) { return a.used < b.used; });
        std::vector<std::pair<std::string, std::vector<token>>> o;
        for (auto& x : v) o.emplace_back(x.scope, x.prefix);
        return o;
    }
};

TEST_CASE("prefix cache eviction picks what a walk over every resume point for the least recently used picks") {
    fake_model m;
    const std::size_t budget = 160;
    decode::prefix_cache<fake_model> cache(m, true, budget);
    old_walk oracle{.e = {}, .clock = 0, .P = m.P, .page_b = m.page_b, .ck_b = m.ck_b};
    std::mt19937_64 rng(20261207);
    auto pick = [&](std::uint64_t n) { return std::int64_t(rng() % n); };
    // Four conversations over a small alphabet (0 is a message start), the second and third
    // sharing their first pages with the first: prompts share prefixes at every depth.
    std::vector<std::vector<token>> base(4);
    for (auto& b : base)
        for (int i = 0; i < 40; ++i) b.push_back(token(pick(6)));
    std::copy_n(base[0].begin(), 8, base[1].begin());
    std::copy_n(base[0].begin(), 13, base[2].begin());
    const std::string scopes[] = {"", "a", "b"};
    std::vector<session> live;  // sessions resumed from the cache, alive across evictions
    std::int64_t hits = 0, touched_by_insert = 0;
    for (int step = 0; step < 4000; ++step) {
        CAPTURE(step);
        const std::string& scope = scopes[pick(3)];
        const auto& b = base[std::size_t(pick(4))];
        std::vector<token> prompt(b.begin(), b.begin() + 1 + pick(b.size()));
        if (pick(3) == 0)
            for (std::int64_t i = 1 + pick(8); i > 0; --i) prompt.push_back(token(pick(6)));
        const auto cuts = decode::prompt_cuts(prompt, m.batch, kStart, 2);
        const auto n = std::int64_t(prompt.size());
        auto insert = [&](session& s) {
            const std::int64_t upto = pick(std::uint64_t(n) + 2);
            const auto cks = m.checkpoints(s);
            const auto before = oracle.clock;
            oracle.insert(scope, prompt, cks, upto, budget);
            touched_by_insert += std::int64_t(oracle.clock - before);
            if (pick(2)) cache.insert_finished(s, upto, scope);
            else cache.insert(s, upto, scope);
        };
        if (pick(2)) {  // a lookup; half of them then computed to the end and kept
            const std::int64_t limit = pick(std::uint64_t(n) + 1);
            const std::int64_t want = oracle.open(scope, prompt, cuts, limit);
            std::int64_t cached = -1;
            auto s = cache.open({.ctx = 256, .kv_f16 = true}, prompt, cuts, limit, cached, scope);
            REQUIRE(cached == want);
            CHECK(s.n_past() == cached);
            hits += cached > 0;
            if (pick(2)) {
                s.mutable_tokens() = prompt;
                insert(s);
            }
            if (pick(3) == 0) live.push_back(std::move(s));
        } else {  // a prompt computed from scratch
            auto s = m.with_tokens(prompt);
            insert(s);
        }
        if (live.size() > 6) live.erase(live.begin() + pick(live.size()));
        REQUIRE(cache.eviction_order() == oracle.order());
        REQUIRE(cache.stats().bytes == oracle.bytes());
        CHECK(cache.stats().bytes <= budget);
    }
    // The sequence exercised what it is meant to: hits, points touched again, many evictions.
    CHECK(hits > 300);
    CHECK(touched_by_insert > 1000);
    CHECK(cache.stats().evicted > 1000);
    CHECK(cache.stats().entries == std::int64_t(oracle.e.size()));
    cache.clear();
    CHECK(cache.stats().bytes == 0);
    CHECK(cache.eviction_order().empty());
    CHECK(m.held.empty());  // every page the cache held was dropped, once
}

TEST_CASE("one prefix cache eviction visits the same few nodes however many resume points the cache holds") {
    // n prompts sharing their first page, each with its own second page and one resume point at
    // its end (8 = two whole pages: a node of its own, no partial page). Evicting the oldest
    // removes that point and its node; the shared first page stays. A walk over every resume
    // point would visit n of them.
    for (std::int64_t n : {8, 64, 512, 4096}) {
        CAPTURE(n);
        fake_model m;
        m.batch = 8;
        m.page_b = 1;
        m.ck_b = 1;
        decode::prefix_cache<fake_model> cache(m, true, std::size_t(2 * n + 1));  // n points + the shared page
        auto prompt = [](std::int64_t i) { return std::vector<token>{1, 1, 1, 1, token(10 + i), 3, 3, 3, 3, 3, 3}; };
        for (std::int64_t i = 0; i < n; ++i) cache.insert(m.with_tokens(prompt(i)), 11);
        REQUIRE(cache.stats().entries == n);
        REQUIRE(cache.stats().evicted == 0);
        const auto oldest = cache.eviction_order().front();
        const auto first = prompt(0);
        CHECK(oldest.second == std::vector<token>(first.begin(), first.begin() + 8));
        const std::int64_t before = cache.eviction_visits();
        cache.insert(m.with_tokens(prompt(n)), 11);
        CHECK(cache.stats().evicted == 1);
        CHECK(cache.eviction_visits() - before == 2);  // the resume point and its node
        CHECK(cache.stats().entries == n);
        CHECK(cache.eviction_order().front().second != oldest.second);
        CHECK(cache.stats().bytes == std::size_t(2 * n + 1));
    }
}

}  // namespace prefix_cache_lru_test
