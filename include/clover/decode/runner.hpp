#pragma once
// Continuous batching of generations: a runner holds the sequences that are generating now, each
// with its own decoder, sampler and stop rules, and runs one batched pass (model::run) per step
// over all of them — a prompt chunk, a decode row, a preview block or verify rows each. Sequences
// join between steps (add) and leave when they finish or are cancelled, so a server admits a new
// request at the next step instead of after the running ones (execution.md §4).
//
// Per step, rows are limited by a token budget: every running generation's segment goes first
// (one decode row, one block: they are what the clients are waiting on), then prompt chunks in
// arrival order, each the session's batch rows (or what is left), while the budget lasts; the
// oldest waiting prompt always gets its chunk, so nothing starves.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
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
template <class Decoder>
std::int64_t block_of(const Decoder& d) {
    if constexpr (requires { d.block; }) return d.block;
    else return 0;
}
template <class Decoder, class F>
decltype(auto) visit_policy(const Decoder& d, F&& f) {
    if constexpr (requires { d.name; }) return f(d);
    else return std::visit(f, d);  // a std::variant of policies
}
}  // namespace detail

template <class Model, class Decoder>
class batch_runner {
    using clk = std::chrono::steady_clock;
    static auto stepper_of(const Decoder& d) {
        if constexpr (requires { typename Decoder::template stepper<Model>; }) {
            return typename Decoder::template stepper<Model>(d);
        } else {
            return std::visit([](const auto& p) {
                using P = std::decay_t<decltype(p)>;
                return std::variant<typename decode::ar::template stepper<Model>,
                                    typename decode::low_confidence::template stepper<Model>,
                                    typename decode::self_speculative::template stepper<Model>>(
                    typename P::template stepper<Model>(p));
            }, d);
        }
    }
    using stepper_t = decltype(stepper_of(std::declval<const Decoder&>()));

    struct live {
        sequence_job<Decoder>* job;
        std::optional<session> owned;
        std::optional<sampler> smp;
        std::optional<detail::emitter> out;
        std::optional<context<Model>> cx;
        std::optional<stepper_t> stp;
        step_request req;
        std::int64_t prompt_done = 0;
        bool in_prompt = true, in_step = false;
        clk::time_point t0, t1;
    };

public:
    // token_budget: rows per step (0: no limit); exact: every row as it would be alone.
    explicit batch_runner(Model& m, std::int64_t token_budget = 0, bool exact = false)
        : m_(m), budget_(token_budget), exact_(exact) {
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
        L->out.emplace(*j.o, j.on_token, j.stats);
        L->cx.emplace(context<Model>{m_, *j.s, *j.o, *L->smp, *L->out, j.stats});
        L->stp.emplace(stepper_of(j.dec));
        L->t0 = clk::now();
        live_.push_back(std::move(L));
    }

    std::size_t size() const { return live_.size(); }
    bool empty() const { return live_.empty(); }

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
        for (auto& L : live_)
            if (L->in_step) reqs_.push_back({L->job->s, L->req.kind, L->req.rows, L->req.logits, L->req.coreset});
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
        std::int64_t used = 0;
        for (auto& L : live_) {  // generating sequences first: their clients are waiting
            L->in_step = !L->in_prompt;
            if (L->in_step) used += std::int64_t(L->req.rows.size());
        }
        bool first_prompt = true;
        for (auto& L : live_) {
            if (!L->in_prompt) continue;
            const session& s = *L->job->s;
            const std::int64_t n = std::int64_t(L->job->prompt.size());
            // Chunks are never cut to fit the budget: a prompt is split exactly as it would be
            // alone (the GDN's chunked form depends on where chunks end), so a request's output
            // does not depend on the traffic beside it. The oldest prompt goes every step.
            std::int64_t end = std::min(L->prompt_done + s.batch(), n);
            const auto& cuts = L->job->cuts;
            if (auto c = std::upper_bound(cuts.begin(), cuts.end(), L->prompt_done); c != cuts.end()) end = std::min(end, *c);
            const std::int64_t m = end - L->prompt_done;
            if (budget_ > 0 && used + m > budget_ && !first_prompt) {
                L->in_step = false;
                continue;
            }
            first_prompt = false;
            L->in_step = true;
            L->req.kind = pass_kind::commit;
            L->req.rows.assign(L->job->prompt.begin() + L->prompt_done, L->job->prompt.begin() + L->prompt_done + m);
            L->req.logits = L->prompt_done + m == n ? 1 : 0;
            L->req.coreset = -1;
            used += m;
        }
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
        if constexpr (requires { stp.step(*L.cx, lg, L.req); }) return stp.step(*L.cx, lg, L.req);
        else return std::visit([&](auto& x) { return x.step(*L.cx, lg, L.req); }, stp);
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
    bool exact_;
    std::vector<std::unique_ptr<live>> live_;
    std::vector<pass_request> reqs_;
    std::vector<float> logits_;
};

}  // namespace clover::decode
