#pragma once
// A prefix cache for a hybrid model: requests that share a token prefix with an earlier one
// (a system prompt, the history of a conversation) start from it instead of computing it again.
//
// Attention rows are positional, so KV pages can be shared by reference. A Gated DeltaNet
// state is a running sum over every earlier token and cannot be cut back to a shorter prefix:
// a request can resume only where a GDN checkpoint was saved. So the cache is a radix tree
// over whole KV pages (page_size() tokens per edge) whose resume points ("tails") each hold
// the GDN states at one position and, when that position is inside a page, the partial page.
// Checkpoints are saved where prompt_cuts() ends a chunk: every `batch` tokens and at the
// start of chat messages, so that the next turn of a conversation — whose rendering changes
// only after the last message (the Qwen template drops past reasoning) — resumes at the start
// of the previous answer and computes only what is new.
//
// Never a wrong answer: a prefix's chunks end at the same places in every prompt that has it
// (prompt_cuts depends only on the tokens before a position), so in exact mode a resumed
// request's logits are bit-identical to computing the whole prompt (tests/decode/
// test_prefix_cache.cpp). Memory: pages and GDN states count against a byte budget; the least
// recently used resume points go first, with the pages only they needed. The resume points sit
// on one list in the order they were last used (every scope together), so finding the one to
// evict costs O(1) and removing it O(depth freed + log siblings), whatever the cache holds.
// Evicting never waits for a session: one opened from a resume point holds its own references
// to the pages it shares (the state pool counts them), so no point is ever locked.
//
// Scopes: every entry belongs to a scope (a string; "" by default), one tree each, and a lookup
// sees only its own scope's tree. A server gives each tenant (an API key, a request's cache_salt)
// its own scope, so that cached_tokens and the time to first token tell nobody whether another
// tenant sent a prompt. Isolation has a price: the same prefix is computed and held once per scope.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/core/pass.hpp"
#include "clover/model/session.hpp"

namespace clover::decode {

// Where a prompt's chunks end (ascending prompt indices in (0, n)): `batch` tokens after the
// previous cut, or just after a message start (`boundary`, e.g. <|im_start|>; -1: none) at
// least `min_gap` tokens after it. Whether i is a cut depends only on prompt[0, i): any prompt
// that begins with those tokens has the same cuts up to i, so a prefix resumed at a cut is
// chunked as computing it whole would chunk it.
inline std::vector<std::int64_t> prompt_cuts(std::span<const token> prompt, std::int64_t batch, token boundary,
                                             std::int64_t min_gap = 64) {
    if (batch < 1) fail("prompt_cuts: batch must be at least 1");
    std::vector<std::int64_t> cuts;
    std::int64_t last = 0;
    for (std::int64_t i = 1; i < std::int64_t(prompt.size()); ++i)
        if (i - last == batch || (boundary >= 0 && prompt[std::size_t(i - 1)] == boundary && i - last >= min_gap)) {
            cuts.push_back(i);
            last = i;
        }
    return cuts;
}

struct prefix_cache_stats {
    std::int64_t lookups = 0, hits = 0, hit_tokens = 0;  // hit_tokens: prompt tokens not computed
    std::int64_t entries = 0, pages = 0, evicted = 0;    // resume points, KV pages held
    std::size_t bytes = 0, budget = 0;
};

template <class Model>
class prefix_cache {
    using saved = typename Model::saved_state;
    struct node;
    struct tail {  // a resume point at owner's depth * P + toks.size()
        node* owner = nullptr;
        std::size_t slot = 0;     // its index in owner->tails
        std::vector<token> toks;  // the tokens of the next page before the point (may be none)
        std::int32_t page = -1;   // toks non-empty: a page holding their rows
        saved st;                 // GDN states at the point
        std::size_t bytes = 0;
        tail* older = nullptr;  // the LRU list: least recently used at lru_old_, most at lru_new_
        tail* newer = nullptr;
    };
    struct node {  // one whole page of tokens below its parent
        node* parent = nullptr;
        std::int64_t depth = 0;  // pages from the root to the end of this one
        std::int32_t page = -1;
        const std::vector<token>* key = nullptr;  // its key in parent->kids (a root: none)
        const std::string* scope = nullptr;       // a root: its key in roots_
        std::map<std::vector<token>, std::unique_ptr<node>> kids;  // keyed by their page of tokens
        std::vector<std::unique_ptr<tail>> tails;                  // unordered: find compares them all
    };

public:
    // A cache for sessions of KV format pool `kv_f16`, holding at most budget_bytes.
    prefix_cache(Model& m, bool kv_f16, std::size_t budget_bytes)
        : m_(m), pool_(kv_f16 ? 1 : 0), P_(m.page_size()), page_bytes_(m.page_bytes(kv_f16 ? 1 : 0)), budget_(budget_bytes) {}
    prefix_cache(const prefix_cache&) = delete;
    prefix_cache& operator=(const prefix_cache&) = delete;
    ~prefix_cache() { clear(); }

    // A session for `prompt`: opened from the longest cached prefix of at most `limit` tokens
    // that ends at one of the prompt's `cuts` (prompt_cuts: the prompt then runs in the chunks
    // it would run in whole); `cached` says how many tokens (0: a fresh session). Whole pages
    // are shared, not copied.
    session open(session_options o, std::span<const token> prompt, std::span<const std::int64_t> cuts, std::int64_t limit,
                 std::int64_t& cached, std::string_view scope = {}) {
        cached = 0;
        ++lookups_;
        tail* t = find(prompt, cuts, std::min<std::int64_t>(limit, std::int64_t(prompt.size()) - 1), scope);
        if (!t || (o.kv_f16 ? 1 : 0) != pool_) return m_.new_session(o);
        std::vector<std::int32_t> pages(std::size_t(t->owner->depth));
        for (node* n = t->owner; n->parent; n = n->parent) pages[std::size_t(n->depth - 1)] = n->page;
        if (!t->toks.empty()) pages.push_back(t->page);
        if (page_bytes_ == 0) pages.clear();  // no attention layers: nothing positional to share
        const std::int64_t pos = pos_of(*t);
        session s = m_.new_session_from(o, pages, prompt.first(std::size_t(pos)), t->st);
        touch(t);
        cached = pos;
        ++hits_;
        hit_tokens_ += pos;
        return s;
    }

    // Keeps the resume points of a session (its checkpoints up to `upto`, with the pages before
    // them), then evicts down to the budget. The session is only read: its GDN states are copied.
    void insert(const session& s, std::int64_t upto, std::string_view scope = {}) {
        insert_with(s, upto, scope, [&](std::int64_t c) { return m_.save_state(s, c); });
    }
    // The same for a session that is done (a server's finished request): its checkpoints move
    // into the cache instead of being copied, so it can no longer go back to them.
    void insert_finished(session& s, std::int64_t upto, std::string_view scope = {}) {
        insert_with(s, upto, scope, [&](std::int64_t c) { return m_.take_state(s, c); });
    }

    // Drops everything (its pages go back to the pool unless sessions still hold them).
    void clear() {
        while (entries_ > 0) evict_oldest();
    }

    prefix_cache_stats stats() const {
        prefix_cache_stats s;
        s.lookups = lookups_;
        s.hits = hits_;
        s.hit_tokens = hit_tokens_;
        s.entries = entries_;
        s.pages = pages_;
        s.evicted = evicted_;
        s.bytes = bytes_;
        s.budget = budget_;
        return s;
    }
    // Resume positions held, ascending (tests).
    std::vector<std::int64_t> positions() const {
        std::vector<std::int64_t> v;
        for (const auto& [k, root] : roots_) walk(root, [&](const tail& t) { v.push_back(pos_of(t)); });
        std::sort(v.begin(), v.end());
        return v;
    }
    // The resume points as (scope, the tokens before the point), in eviction order: the next one
    // to go first (tests).
    std::vector<std::pair<std::string, std::vector<token>>> eviction_order() const {
        std::vector<std::pair<std::string, std::vector<token>>> v;
        for (const tail* t = lru_old_; t; t = t->newer) {
            std::vector<token> toks(std::size_t(t->owner->depth * P_));
            const node* n = t->owner;
            for (; n->parent; n = n->parent) std::copy(n->key->begin(), n->key->end(), toks.begin() + (n->depth - 1) * P_);
            toks.insert(toks.end(), t->toks.begin(), t->toks.end());
            v.emplace_back(*n->scope, std::move(toks));
        }
        return v;
    }
    // Resume points and nodes eviction has visited so far (tests: what one eviction costs must
    // not grow with what the cache holds).
    std::int64_t eviction_visits() const { return eviction_visits_; }

private:
    template <class StateAt>
    void insert_with(const session& s, std::int64_t upto, std::string_view scope, StateAt&& state_at) {
        if (s.pool() != pool_) return;
        upto = std::min(upto, s.n_past());
        const std::vector<token>& toks = s.tokens();
        for (std::int64_t c : m_.checkpoints(s)) {
            if (c < 1 || c > upto) continue;
            // A point the cache holds already (every earlier turn's, in a conversation) is only
            // touched: copying its GDN states again to throw them away cost the next turn's TTFT
            // ~5-10 ms on the bundled model (the next request is admitted after this).
            if (tail* held = find(std::span<const token>(toks).first(std::size_t(c)), std::span<const std::int64_t>(&c, 1), c, scope)) {
                touch(held);
                continue;
            }
            // First what can fail (save_state's copy of the GDN states, tens of MB on a large model), so
            // a failure leaves no page held and no node without a resume point.
            saved st = state_at(c);
            auto r = roots_.find(scope);
            if (r == roots_.end()) {
                r = roots_.try_emplace(std::string(scope)).first;
                r->second.scope = &r->first;
            }
            node* n = &r->second;
            for (std::int64_t d = 0; d < c / P_; ++d) {
                std::vector<token> key(toks.begin() + d * P_, toks.begin() + (d + 1) * P_);
                auto it = n->kids.find(key);
                if (it == n->kids.end()) {
                    auto k = std::make_unique<node>();
                    k->parent = n;
                    k->depth = d + 1;
                    if (page_bytes_) k->page = m_.hold_pages(s, d, 1)[0];
                    bytes_ += page_bytes_;
                    ++pages_;
                    it = n->kids.emplace(std::move(key), std::move(k)).first;
                    it->second->key = &it->first;
                }
                n = it->second.get();
            }
            std::vector<token> rest(toks.begin() + (c / P_) * P_, toks.begin() + c);
            auto t = std::make_unique<tail>();
            t->owner = n;
            t->toks = std::move(rest);
            if (!t->toks.empty() && page_bytes_) {
                t->page = m_.hold_pages(s, c / P_, 1)[0];
                t->bytes += page_bytes_;
                ++pages_;
            }
            t->st = std::move(st);
            if (t->st) t->bytes += m_.checkpoint_bytes();
            bytes_ += t->bytes;
            t->slot = n->tails.size();
            link_newest(t.get());
            n->tails.push_back(std::move(t));
            ++entries_;
        }
        while (bytes_ > budget_ && entries_ > 0) evict_oldest();
    }

    std::int64_t pos_of(const tail& t) const { return t.owner->depth * P_ + std::int64_t(t.toks.size()); }

    // The resume point with the longest prefix of prompt[0, limit] that ends at a cut.
    tail* find(std::span<const token> prompt, std::span<const std::int64_t> cuts, std::int64_t limit, std::string_view scope) {
        tail* best = nullptr;
        std::int64_t best_pos = 0;
        auto r = roots_.find(scope);
        if (r == roots_.end()) return nullptr;
        node* n = &r->second;
        const std::int64_t len = std::int64_t(prompt.size());
        for (;;) {
            const std::int64_t base = n->depth * P_;
            for (auto& t : n->tails) {
                const std::int64_t pos = base + std::int64_t(t->toks.size());
                if (pos < 1 || pos > limit || pos <= best_pos || !std::binary_search(cuts.begin(), cuts.end(), pos)) continue;
                if (std::equal(t->toks.begin(), t->toks.end(), prompt.begin() + base)) {
                    best = t.get();
                    best_pos = pos;
                }
            }
            if (base + P_ > len) break;
            const std::vector<token> key(prompt.begin() + base, prompt.begin() + base + P_);
            auto it = n->kids.find(key);
            if (it == n->kids.end()) break;
            n = it->second.get();
        }
        return best;
    }

    template <class F>
    static void walk(const node& n, F&& f) {
        for (const auto& t : n.tails) f(*t);
        for (const auto& [k, c] : n.kids) walk(*c, f);
    }

    void link_newest(tail* t) {
        t->older = lru_new_;
        t->newer = nullptr;
        (lru_new_ ? lru_new_->newer : lru_old_) = t;
        lru_new_ = t;
    }
    void unlink(tail* t) {
        (t->older ? t->older->newer : lru_old_) = t->newer;
        (t->newer ? t->newer->older : lru_new_) = t->older;
        t->older = t->newer = nullptr;
    }
    void touch(tail* t) {
        unlink(t);
        link_newest(t);
    }

    // The least recently used resume point goes, then every page only it needed.
    void evict_oldest() {
        tail* old = lru_old_;
        if (!old) return;
        ++eviction_visits_;
        unlink(old);
        node* n = old->owner;
        if (old->page >= 0) {
            m_.drop_pages(pool_, std::span<const std::int32_t>(&old->page, 1));
            --pages_;
        }
        bytes_ -= old->bytes;
        // Swap it with the last of its node's resume points, then drop the last.
        const std::size_t slot = old->slot;
        if (slot + 1 != n->tails.size()) {
            std::swap(n->tails[slot], n->tails.back());
            n->tails[slot]->slot = slot;
        }
        n->tails.pop_back();  // destroys *old
        --entries_;
        ++evicted_;
        while (n->parent && n->tails.empty() && n->kids.empty()) {
            ++eviction_visits_;
            node* up = n->parent;
            if (n->page >= 0) m_.drop_pages(pool_, std::span<const std::int32_t>(&n->page, 1));
            bytes_ -= page_bytes_;
            --pages_;
            up->kids.erase(up->kids.find(*n->key));  // find first: the key lives in the node it erases
            n = up;
        }
        if (!n->parent && n->tails.empty() && n->kids.empty())  // a scope with nothing left: a salt per request must not pile up roots
            roots_.erase(roots_.find(*n->scope));
    }

    Model& m_;
    int pool_;
    std::int64_t P_;
    std::size_t page_bytes_, budget_;
    std::map<std::string, node, std::less<>> roots_;  // one tree per scope
    tail* lru_old_ = nullptr;  // the next resume point to evict
    tail* lru_new_ = nullptr;  // the one used last
    std::int64_t eviction_visits_ = 0;
    std::atomic<std::int64_t> lookups_{0}, hits_{0}, hit_tokens_{0}, entries_{0}, pages_{0}, evicted_{0};
    std::atomic<std::size_t> bytes_{0};
};

}  // namespace clover::decode
