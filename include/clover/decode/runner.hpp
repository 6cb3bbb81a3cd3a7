#pragma once
// Continuous batching of generations: a runner holds the sequences that are generating now, each
// with its own decoder, sampler and stop rules, and runs one batched pass (model::run) per step
// over all of them — a prompt chunk, a decode row, a preview block or verify rows each. Sequences
// join between steps (add) and leave when they finish or are cancelled, so a server admits a new
// request at the next step instead of after the running ones (execution.md §4).
//
// Per step, rows are limited by a token budget, for every kind of segment: a step holds at most
// `token_budget` rows unless a single segment is larger, which then runs alone. Segments are
// never cut to fit (a request's answer must not depend on the traffic beside it), so fairness (a
// server's; off for generate_many, where bigger steps finish the whole set sooner) is kept over
// steps, by deficit round robin in rows: while several sequences generate, each earns
// the smallest segment among them per step and runs when its credit covers its segment. One
// decode row a step beside a 64-row diffusion block gets the block in every 64th step, not in
// every step: each generating sequence computes the same rows over time, whatever its segments.
// Generating sequences go first (their clients are waiting), most owed first, then prompt
// chunks in arrival order while the budget lasts; the oldest waiting prompt goes first in the
// step after one it was left out of, so nothing starves.
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "clover/decode/decoders.hpp"

namespace clover::decode {

// One sequence for a runner (or generate_many). A null session: the runner opens one of
// session_ctx tokens (prompt + max_tokens + a block when 0) when the job starts and closes it
// when it ends. The job must outlive its run.
template <class Decoder>
struct sequence_job {
    session* s = nullptr;
    std::int64_t session_ctx = 0;
    bool kv_f16 = true;  // without s: the KV format of the session opened for it
    std::span<const token> prompt;
    const generate_options* o = nullptr;
    std::function<bool(token)> on_token;
    std::function<bool()> cancelled;  // optional: checked before every step; true ends the job
    std::function<void(const token_logprob&)> on_logprob;  // generate_options::logprobs: before on_token
    Decoder dec{};
    // Prompt indices where a prompt chunk must end, ascending; the GDN states are checkpointed
    // there (prefix_cache.hpp's prompt_cuts: the same prefix is then chunked the same way in
    // every prompt that has it). Empty: chunks of the session's batch rows, no checkpoints.
    std::span<const std::int64_t> cuts;
    // Leading prompt tokens already in `s` (a session opened from a prefix cache at a cut).
    std::int64_t cached = 0;
    bool checkpoint_cuts = true;  // false: cut there without saving (no cache to keep them for)
    generate_stats stats;  // filled in
};

namespace detail {
template <class D>
inline constexpr bool is_policy_variant = false;
template <class... P>
inline constexpr bool is_policy_variant<std::variant<P...>> = true;

template <class Decoder>
std::int64_t block_of(const Decoder& d) {
    if constexpr (requires { d.block; }) return d.block;
    else return 0;
}
template <class Decoder, class F>
decltype(auto) visit_policy(const Decoder& d, F&& f) {
    if constexpr (is_policy_variant<Decoder>) return std::visit(f, d);
    else return f(d);
}

// What a policy needs to join a batch (decoder_policy_for, in pieces), so that a policy missing
// one piece is told which.
template <class P>
concept named_policy = requires {
    { P::name } -> std::convertible_to<const char*>;
};
template <class P, class Model>
concept has_stepper = requires { typename P::template stepper<Model>; };
template <class P, class Model>
concept stepper_from_policy = has_stepper<P, Model> && std::constructible_from<typename P::template stepper<Model>, const P&>;
template <class P, class Model>
concept stepper_steps = stepper_from_policy<P, Model> &&
    requires(typename P::template stepper<Model>& x, context<Model>& c, const float* lg, step_request& r) {
        { x.step(c, lg, r) } -> std::same_as<bool>;
    };
template <class P, class Model>
concept batchable_policy = named_policy<P> && stepper_steps<P, Model>;

// Stands in for a stepper that cannot be built, so that the static_asserts below are the only
// errors rather than the first of a cascade.
struct unbatchable_stepper {
    explicit unbatchable_stepper(const auto&) {}
    bool step(const auto&, const float*, step_request&) { return false; }
};

// The stepper of policy P over Model.
template <class P, class Model, bool = batchable_policy<P, Model>>
struct stepper_of {
    using type = typename P::template stepper<Model>;
};
template <class P, class Model>
struct stepper_of<P, Model, false> {
    static_assert(named_policy<P>,
                  "clover: a decoder policy needs a name: static constexpr const char* name = \"...\";");
    static_assert(has_stepper<P, Model>,
                  "clover: a decoder policy needs a per-sequence step machine: "
                  "template <class Model> struct stepper { ... };");
    static_assert(!has_stepper<P, Model> || stepper_from_policy<P, Model>,
                  "clover: a decoder policy's stepper<Model> needs a constructor from the policy: "
                  "explicit stepper(const Policy&)");
    static_assert(!stepper_from_policy<P, Model> || stepper_steps<P, Model>,
                  "clover: a decoder policy's stepper<Model> needs "
                  "bool step(clover::decode::context<Model>&, const float* logits, clover::decode::step_request& next)");
    using type = unbatchable_stepper;
};

// The steppers a runner holds: one policy's, or for a std::variant of policies a variant of
// theirs, alternative for alternative (any policy with a stepper joins a batch, a user's too).
template <class Decoder, class Model>
struct stepper_set {
    using type = typename stepper_of<Decoder, Model>::type;
};
template <class... P, class Model>
struct stepper_set<std::variant<P...>, Model> {
    using type = std::variant<typename stepper_of<P, Model>::type...>;
};

// Builds d's stepper in `out`, in place (a stepper need not be movable); for a variant, the
// stepper of its I-th alternative or a later one's. By index, not by type: two alternatives may
// share a stepper type.
template <std::size_t I = 0, class Decoder, class Out>
void make_stepper(Out& out, const Decoder& d) {
    if constexpr (!is_policy_variant<Decoder>) {
        out.emplace(d);
    } else if (d.index() == I) {
        out.emplace(std::in_place_index<I>, std::get<I>(d));
    } else if constexpr (I + 1 < std::variant_size_v<Decoder>) {
        make_stepper<I + 1>(out, d);
    } else {
        fail("generate: the decoder variant holds no policy (valueless after an exception)");
    }
}
}  // namespace detail

// What a runner has done, for a server's metrics.
struct runner_stats {
    std::int64_t steps = 0, rows = 0, max_rows = 0;  // batched passes, their rows, the most in one
    std::int64_t deferred = 0;  // generating segments left for a later step (fair share or budget)
};

template <class Model, class Decoder>
class batch_runner {
    using clk = std::chrono::steady_clock;
    // Every policy Decoder can hold gets its stepper type here: a user's policy joins a batch
    // beside the built-in ones by being an alternative of Decoder.
    using stepper_t = typename detail::stepper_set<Decoder, Model>::type;

    struct live {
        sequence_job<Decoder>* job;
        std::optional<session> owned;
        std::optional<sampler> smp;
        std::optional<detail::emitter> out;
        std::optional<context<Model>> cx;
        std::optional<stepper_t> stp;
        step_request req;
        std::int64_t prompt_done = 0;
        std::int64_t credit = 0;  // rows this generating sequence is owed (deficit round robin)
        bool in_prompt = true, in_step = false, passed_over = false;
        clk::time_point t0, t1;
    };

public:
    // token_budget: rows per step (0: no limit); exact: every row as it would be alone; fair: the
    // generating sequences' fair share (above), else each of them goes in every step it fits.
    explicit batch_runner(Model& m, std::int64_t token_budget = 0, bool exact = false, bool fair = false)
        : m_(m), budget_(token_budget), exact_(exact), fair_(fair) {
        if (token_budget < 0) fail("generate: the token budget must not be negative");
    }

    // An error for a job that cannot run: an empty prompt, no options, a decoder the file
    // cannot run.
    void check(const sequence_job<Decoder>& j) const {
        if (j.prompt.empty()) fail("generate: the prompt is empty");
        if (!j.o) fail("generate: a job has no options");
        if (j.o->max_tokens < 1) fail("generate: max_tokens must be at least 1");
        const bool preview = detail::visit_policy(j.dec, [](const auto& d) {
            if constexpr (requires { std::decay_t<decltype(d)>::uses_preview; }) return bool(std::decay_t<decltype(d)>::uses_preview);
            else return false;
        });
        if (preview) m_.require_diffusion();
    }
    // Checks the job and opens its session (nothing starts on an error); it joins at the next step.
    void add(sequence_job<Decoder>& j) {
        check(j);
        if (j.cached < 0 || j.cached >= std::int64_t(j.prompt.size()))
            fail("generate: ", j.cached, " cached tokens of a prompt of ", j.prompt.size(), " (at least one must be computed)");
        if (j.cached > 0) {
            if (!j.s || j.s->n_past() < j.cached ||
                !std::equal(j.prompt.begin(), j.prompt.begin() + j.cached, j.s->tokens().end() - j.cached))
                fail("generate: the session does not end with the job's ", j.cached, " cached prompt tokens");
            // Resumed elsewhere than at a cut, the rest would be chunked unlike the whole prompt.
            if (!j.cuts.empty() && !std::binary_search(j.cuts.begin(), j.cuts.end(), j.cached))
                fail("generate: a prompt resumed at ", j.cached, " tokens, which is not one of its cuts");
        }
        if (!std::is_sorted(j.cuts.begin(), j.cuts.end()) || (!j.cuts.empty() && j.cuts.front() < 1))
            fail("generate: prompt cuts must be ascending positive prompt indices");
        auto L = std::make_unique<live>();
        L->job = &j;
        L->prompt_done = j.cached;
        if (!j.s) {
            std::int64_t ctx = j.session_ctx;
            if (ctx <= 0)
                ctx = std::int64_t(j.prompt.size()) + j.o->max_tokens +
                      detail::visit_policy(j.dec, [](const auto& d) { return detail::block_of(d); }) + 1;
            L->owned.emplace(m_.new_session({.ctx = ctx, .kv_f16 = j.kv_f16}));
            j.s = &*L->owned;
        }
        j.stats = {};
        L->smp.emplace(j.o->sampling);
        L->out.emplace(*j.o, j.on_token, j.stats, &j.on_logprob);
        L->cx.emplace(context<Model>{m_, *j.s, *j.o, *L->smp, *L->out, j.stats});
        detail::make_stepper(L->stp, j.dec);
        L->t0 = clk::now();
        live_.push_back(std::move(L));
    }

    std::size_t size() const { return live_.size(); }
    bool empty() const { return live_.empty(); }
    const runner_stats& stats() const { return stats_; }

    // One pass over the running sequences. Returns the jobs that ended in it (finished, stopped
    // by on_token, or cancelled); their sessions are closed when the runner opened them. An
    // error from the pass ends every job of the step (and is rethrown): their states are not
    // known to be consistent.
    std::vector<sequence_job<Decoder>*> step() {
        std::vector<sequence_job<Decoder>*> ended;
        // Cancelled jobs leave before the pass: their rows are not computed.
        for (auto it = live_.begin(); it != live_.end();) {
            if ((*it)->job->cancelled && (*it)->job->cancelled()) {
                (*it)->job->stats.stop_reason = "cancelled";
                ended.push_back(finish(**it));
                it = live_.erase(it);
            } else {
                ++it;
            }
        }
        if (live_.empty()) return ended;
        plan();
        reqs_.clear();
        std::int64_t rows = 0;
        for (auto& L : live_)
            if (L->in_step) {
                reqs_.push_back({L->job->s, L->req.kind, L->req.rows, L->req.logits, L->req.coreset});
                rows += std::int64_t(L->req.rows.size());
            }
        ++stats_.steps;
        stats_.rows += rows;
        stats_.max_rows = std::max(stats_.max_rows, rows);
        try {
            m_.run(reqs_, logits_, exact_);
        } catch (...) {
            for (auto& L : live_) ended.push_back(finish(*L));
            live_.clear();
            throw;
        }
        const std::int64_t V = m_.n_vocab();
        std::int64_t row = 0;
        for (auto it = live_.begin(); it != live_.end();) {
            live& L = **it;
            if (!L.in_step) { ++it; continue; }
            const float* lg = logits_.data() + row * V;
            row += L.req.logits;
            if (advance(L, lg)) {
                ++it;
            } else {
                ended.push_back(finish(L));
                it = live_.erase(it);
            }
        }
        return ended;
    }

private:
    // Chooses every sequence's segment for this step under the token budget.
    void plan() {
        const std::int64_t budget = budget_ > 0 ? budget_ : INT64_MAX;
        std::int64_t used = 0;
        bool any = false;
        // Whether a segment of m rows goes: it fits, or nothing has gone yet (a segment larger
        // than the budget runs alone).
        auto fits = [&](std::int64_t m) { return !any || used + m <= budget; };
        auto take = [&](live& L, std::int64_t m) {
            L.in_step = any = true;
            used += m;
        };
        for (auto& L : live_) L->in_step = false;
        live* oldest = nullptr;
        for (auto& L : live_)
            if (L->in_prompt) { oldest = L.get(); break; }
        if (oldest && oldest->passed_over) {
            take(*oldest, prompt_chunk(*oldest));
            oldest->passed_over = false;
        }
        std::vector<live*> gen;
        std::int64_t quantum = INT64_MAX;
        for (auto& L : live_)
            if (!L->in_prompt) {
                gen.push_back(L.get());
                quantum = std::min(quantum, std::int64_t(L->req.rows.size()));
            }
        if (gen.size() == 1) gen[0]->credit = std::int64_t(gen[0]->req.rows.size());  // alone: nobody to share with
        else  // not fair: each always runnable, and one the budget left out goes first next time
            for (live* g : gen) g->credit += fair_ ? quantum : std::int64_t(g->req.rows.size());
        // The most owed first; live_ is in arrival order, so ties go to the older.
        std::stable_sort(gen.begin(), gen.end(), [](const live* a, const live* b) {
            return a->credit - std::int64_t(a->req.rows.size()) > b->credit - std::int64_t(b->req.rows.size());
        });
        for (live* g : gen) {
            const std::int64_t m = std::int64_t(g->req.rows.size());
            if (g->credit >= m && fits(m)) {
                take(*g, m);
                g->credit -= m;
            } else {
                ++stats_.deferred;
            }
        }
        for (auto& L : live_) {
            if (!L->in_prompt || L->in_step) continue;
            const std::int64_t m = prompt_chunk(*L, false);
            if (fits(m)) {
                prompt_chunk(*L);
                take(*L, m);
            } else if (L.get() == oldest) {
                L->passed_over = true;
            }
        }
    }

    // The rows of a prompt's next chunk; `fill`: also make it the sequence's segment. Chunks are
    // never cut to fit the budget: a prompt is split exactly as it would be alone (the GDN's
    // chunked form depends on where chunks end), so a request's output does not depend on the
    // traffic beside it.
    std::int64_t prompt_chunk(live& L, bool fill = true) {
        const session& s = *L.job->s;
        const std::int64_t n = std::int64_t(L.job->prompt.size());
        std::int64_t end = std::min(L.prompt_done + s.batch(), n);
        const auto& cuts = L.job->cuts;
        if (auto c = std::upper_bound(cuts.begin(), cuts.end(), L.prompt_done); c != cuts.end()) end = std::min(end, *c);
        const std::int64_t m = end - L.prompt_done;
        if (fill) {
            L.req.kind = pass_kind::commit;
            L.req.rows.assign(L.job->prompt.begin() + L.prompt_done, L.job->prompt.begin() + end);
            L.req.logits = end == n ? 1 : 0;
            L.req.coreset = -1;
        }
        return m;
    }

    // After the pass: the prompt's progress, or the decoder's step. False: the job is over.
    bool advance(live& L, const float* lg) {
        auto& st = L.job->stats;
        if (L.in_prompt) {
            L.prompt_done += std::int64_t(L.req.rows.size());
            if (L.job->checkpoint_cuts && std::binary_search(L.job->cuts.begin(), L.job->cuts.end(), L.prompt_done))
                m_.checkpoint(*L.job->s);
            if (L.prompt_done < std::int64_t(L.job->prompt.size())) return true;
            L.in_prompt = false;
            st.prompt_tokens = std::int64_t(L.job->prompt.size());
            st.cached_tokens = L.job->cached;
            st.commit_passes = 1;
            L.t1 = clk::now();
            st.prompt_seconds = std::chrono::duration<double>(L.t1 - L.t0).count();
        } else if (L.req.kind == pass_kind::commit) {
            ++st.commit_passes;
        } else if (L.req.kind == pass_kind::preview) {
            ++st.preview_passes;
        } else {
            ++st.verify_passes;
        }
        auto& stp = *L.stp;
        if constexpr (detail::is_policy_variant<Decoder>) return std::visit([&](auto& x) { return x.step(*L.cx, lg, L.req); }, stp);
        else return stp.step(*L.cx, lg, L.req);
    }

    sequence_job<Decoder>* finish(live& L) {
        auto* j = L.job;
        j->stats.seconds = L.in_prompt ? 0.0 : std::chrono::duration<double>(clk::now() - L.t1).count();
        if (L.owned) {
            j->s = nullptr;
            L.owned.reset();  // closes the session: its pages go back to the pool now
        }
        return j;
    }

    Model& m_;
    std::int64_t budget_;
    bool exact_, fair_;
    std::vector<std::unique_ptr<live>> live_;
    std::vector<pass_request> reqs_;
    std::vector<float> logits_;
    runner_stats stats_;
};

}  // namespace clover::decode
