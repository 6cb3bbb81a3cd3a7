#pragma once
/// @file
/// The engine: what a server, `clover run` and `clover generate` drive. It owns the request
/// queue, admission, the prompt cuts, the prefix cache (looked up at admission, filled when a
/// request ends), the batch runner (runner.hpp: one batched pass per step, the token budget and
/// the fair share) and the streaming of each request's tokens to its sink, with cancellation.
/// It knows nothing of HTTP or terminals: a front end turns its input into engine_requests and
/// the tokens its sinks receive into answers.
///
///     decode::engine<rt_model> eng(model, {.parallel = 4});
///     auto h = eng.submit({.prompt = ids, .gen = opts, .sink = {.on_token = print}});
///     eng.run_until_idle();           // or: a model thread runs eng.serve()
///
/// The shape follows vLLM v1's split of an engine core from its scheduler: step() admits what
/// fits (a session opened from the longest cached prefix, or fresh), runs one pass over the
/// running requests, then retires the ones that ended (their sinks told, their prompts' resume
/// points handed to the cache). Only one thread steps an engine (a server's model thread, or the
/// command's own); submit, the handles, shutdown and stats may be called from any thread.
///
/// One reuse policy: a prompt is cut where prompt_cuts says (every chunk of a session's batch
/// and after message starts), with or without a cache, so that an answer never depends on what
/// was cached; with a cache the GDN states are checkpointed at the cuts and a later prompt that
/// begins with the same tokens resumes at its longest cached cut, bit-identical to computing it.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "clover/decode/prefix_cache.hpp"
#include "clover/decode/runner.hpp"

namespace clover::decode {

/// The built-in decoders as one type: what a server request or the `clover` command chooses from.
using builtin_decoder = std::variant<ar, low_confidence, self_speculative>;

/// How an engine schedules, and what it keeps between requests.
struct engine_options {
    std::int64_t parallel = 1;      ///< requests generating together (one batched pass per step); more wait
    std::int64_t token_budget = 0;  ///< rows per step (0: no limit); a single larger segment runs alone
    bool exact = false;             ///< every row computed as it would be alone (answers independent of the batch)
    bool fair = false;              ///< generating requests share rows fairly over steps (runner.hpp)
    bool kv_f16 = true;             ///< KV format of the sessions it opens (and of the cache)
    std::size_t max_queue = SIZE_MAX;  ///< waiting requests; submit refuses more
    std::size_t cache_bytes = 0;    ///< the prefix cache's budget (KV pages and GDN states); 0: no cache
    token boundary = -1;            ///< a message start (e.g. `<|im_start|>`): prompts are also cut after it; -1: none
    std::int64_t boundary_gap = 64; ///< the fewest tokens between the previous cut and a message-start cut
};

/// How a request ended, as its sink's on_end hears it.
struct engine_result {
    generate_stats stats;     ///< what it did (stats.cached_tokens: prompt tokens taken from the cache)
    std::string error;        ///< empty unless it failed or was refused at admission or at shutdown
    bool abandoned = false;   ///< its handle was abandoned (nobody reads the answer)
};

/// Where a request's output goes. The engine calls these on the thread that steps it.
struct request_sink {
    /// Every token the decoder accepts, in order; false: the consumer has what it wants (the
    /// request ends, stop reason "callback").
    std::function<bool(token)> on_token;
    /// With generate_options::logprobs >= 0: a token's log-probabilities, just before its on_token.
    std::function<void(const token_logprob&)> on_logprob;
    /// Exactly once, when the request ends (also when it is refused at admission, skipped because
    /// it was abandoned in the queue, or dropped at shutdown).
    std::function<void(const engine_result&)> on_end;
};

/// One generation for an engine.
template <class Decoder = builtin_decoder>
struct engine_request {
    std::vector<token> prompt;   ///< prompt ids (at least one)
    generate_options gen;        ///< sampling, stop rules, max_tokens
    Decoder dec{};               ///< the decoding policy
    std::int64_t ctx = 0;        ///< session tokens; 0: prompt + max_tokens + a block
    bool cache_prompt = true;    ///< look the prompt up in the prefix cache, and keep its resume points
    std::string cache_scope;     ///< whose cached prefixes it may see (prefix_cache.hpp's scopes)
    request_sink sink;           ///< where its tokens and its end go
};

/// A submitted request's handle: any thread may end the request early through it.
class request_handle {
public:
    /// The consumer has what it needs (a stop string matched): the request ends at the next
    /// step and counts as completed.
    void stop() { stop_ = true; }
    /// Nobody will read the answer (a client went away): the request ends at the next step, or
    /// is skipped if it still waits in the queue, and counts as cancelled.
    void abandon() {
        abandoned_ = true;
        stop_ = true;
    }
    bool stopped() const { return stop_; }         ///< stop() or abandon() was called
    bool abandoned() const { return abandoned_; }  ///< abandon() was called

private:
    std::atomic<bool> stop_{false}, abandoned_{false};
};

/// submit's refusal: the engine is shutting down, or its queue is full.
struct engine_refused : error {
    bool shutting_down;  ///< true: shut down; false: the queue holds max_queue requests
    std::size_t queued;  ///< requests waiting when it refused
    /// The refusal and its reason.
    engine_refused(bool down, std::size_t q)
        : error(down ? std::string("the engine is shutting down") : std::to_string(q) + " requests are waiting"),
          shutting_down(down), queued(q) {}
};

/// What an engine has done, for a server's /health and /metrics.
struct engine_stats {
    std::int64_t requests = 0;          ///< requests accepted into the queue
    std::int64_t completed = 0;         ///< requests that ran to their end (or failed)
    std::int64_t cancelled = 0;         ///< requests ended or skipped because they were abandoned
    std::int64_t queued = 0;            ///< waiting now
    std::int64_t running = 0;           ///< generating now (at most engine_options::parallel)
    std::int64_t peak_running = 0;      ///< the most that ever generated together
    std::int64_t prompt_tokens = 0;     ///< prompt tokens of finished requests (computed or cached)
    std::int64_t cached_tokens = 0;     ///< of those, taken from the prefix cache
    std::int64_t generated_tokens = 0;  ///< tokens they produced
    std::int64_t cut_back = 0;          ///< finished requests whose block the progress rule halved
    prefix_cache_stats cache;           ///< the prefix cache (budget 0: none)
    std::int64_t kv_pages = 0;          ///< KV pages in use (sessions and the cache)
    std::int64_t kv_page_bytes = 0;     ///< bytes of one KV page
    runner_stats steps;                 ///< the batched passes
};

/// The engine over one model. Decoder: one policy type or a std::variant of them.
template <class Model, class Decoder = builtin_decoder>
class engine {
public:
    /// An engine over m (which must outlive it). Throws clover::error for options it cannot use.
    engine(Model& m, engine_options o = {}) : m_(m), opt_(o), run_(m, o.token_budget, o.exact, o.fair) {
        if (opt_.parallel < 1) fail("engine: parallel must be at least 1");
        if (opt_.boundary_gap < 1) fail("engine: boundary_gap must be at least 1");
        if (opt_.cache_bytes > 0) cache_.emplace(m_, opt_.kv_f16, opt_.cache_bytes);
    }
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;

    /// Queues a request; it starts at a later step. Any thread. Throws engine_refused when shut
    /// down or when max_queue requests wait. Problems with the request itself (an empty prompt,
    /// a decoder the file cannot run) reach its sink's on_end as an error at admission.
    std::shared_ptr<request_handle> submit(engine_request<Decoder> r) {
        auto e = std::make_unique<entry>();
        e->req = std::move(r);
        e->h = std::make_shared<request_handle>();
        auto h = e->h;
        {
            std::lock_guard lk(mu_);
            if (stopping_) throw engine_refused(true, queue_.size());
            if (queue_.size() >= opt_.max_queue) throw engine_refused(false, queue_.size());
            queue_.push_back(std::move(e));
            ++stats_.requests;
        }
        cv_.notify_all();
        return h;
    }

    /// One step on the stepping thread: admits queued requests up to `parallel` running ones,
    /// runs one batched pass over the running ones, and retires those that ended. True while
    /// requests are queued or running.
    bool step() {
        std::vector<std::pair<std::unique_ptr<entry>, std::string>> refused;
        {
            std::lock_guard lk(mu_);
            admit(refused);
        }
        for (auto& [e, why] : refused) tell_end(*e, {}, why);
        if (!active_.empty()) pass();
        std::lock_guard lk(mu_);
        return !queue_.empty() || !active_.empty();
    }

    /// Steps until nothing is queued or running (a command's loop; the calling thread steps).
    void run_until_idle() {
        while (step()) {
        }
    }

    /// A model thread's loop: steps while there is work, sleeps while there is none, and returns
    /// after shutdown(), once every running request has been told that reason.
    void serve() {
        for (;;) {
            {
                std::unique_lock lk(mu_);
                cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !active_.empty(); });
                if (stopping_) break;
            }
            step();
        }
        // Shut down: the runner lets go of every request (cancelled before any pass: nothing is
        // computed), which then ends with the shutdown's reason, its prefix not kept.
        if (active_.empty()) return;
        try {
            run_.step();
        } catch (...) {  // the runner has let go of every request either way
        }
        while (!active_.empty()) retire(active_.begin(), shutdown_reason_);
    }

    /// Refuses new requests, tells every queued one `reason` and makes serve() return (running
    /// requests end at its next step). Any thread.
    void shutdown(const std::string& reason) {
        std::deque<std::unique_ptr<entry>> q;
        {
            std::lock_guard lk(mu_);
            stopping_ = true;
            shutdown_reason_ = reason;
            q.swap(queue_);
        }
        cv_.notify_all();
        for (auto& e : q) tell_end(*e, {}, reason);
    }
    /// Accepts requests again after shutdown() (a server started again).
    void reopen() {
        std::lock_guard lk(mu_);
        stopping_ = false;
    }

    /// The counters (any thread).
    engine_stats stats() const {
        std::lock_guard lk(mu_);
        engine_stats s = stats_;
        s.queued = std::int64_t(queue_.size());
        if (cache_) s.cache = cache_->stats();
        s.kv_pages = m_.kv_pages_used(pool());
        s.kv_page_bytes = std::int64_t(m_.page_bytes(pool()));
        return s;
    }
    const engine_options& options() const { return opt_; }  ///< the options it runs with

private:
    struct entry {
        engine_request<Decoder> req;
        std::shared_ptr<request_handle> h;
        sequence_job<Decoder> sj;
        std::optional<session> s;        // opened from the prefix cache (else the runner opens one)
        std::vector<std::int64_t> cuts;  // prompt_cuts of the prompt
    };

    int pool() const { return opt_.kv_f16 ? 1 : 0; }

    // Under mu_: queued requests join the runner while fewer than `parallel` run. Those that
    // cannot start go to `refused` (their sinks are told after the lock is released).
    void admit(std::vector<std::pair<std::unique_ptr<entry>, std::string>>& refused) {
        while (!queue_.empty() && std::int64_t(active_.size()) < opt_.parallel) {
            std::unique_ptr<entry> e = std::move(queue_.front());
            queue_.pop_front();
            if (e->h->abandoned()) {
                ++stats_.cancelled;
                refused.emplace_back(std::move(e), "cancelled");
                continue;
            }
            try {
                start(*e);
                active_.push_back(std::move(e));
            } catch (const std::exception& ex) {
                ++stats_.completed;
                refused.emplace_back(std::move(e), ex.what());
            }
        }
        stats_.running = std::int64_t(active_.size());
        stats_.peak_running = std::max(stats_.peak_running, stats_.running);
    }

    // The request's job for the runner: its cuts, its session (from the cache when it has the
    // prefix) and the callbacks that stream to its sink.
    void start(entry& e) {
        auto& r = e.req;
        auto& sj = e.sj;
        std::int64_t ctx = r.ctx;
        if (ctx <= 0)
            ctx = std::int64_t(r.prompt.size()) + r.gen.max_tokens +
                  detail::visit_policy(r.dec, [](const auto& d) { return detail::block_of(d); }) + 1;
        sj.session_ctx = ctx;
        sj.kv_f16 = opt_.kv_f16;
        sj.prompt = r.prompt;
        sj.o = &r.gen;
        sj.dec = r.dec;
        // Chunk ends at fixed places with or without a cache, so that an answer never depends
        // on what was cached.
        if (!r.prompt.empty()) e.cuts = prompt_cuts(r.prompt, session_options{}.batch, opt_.boundary, opt_.boundary_gap);
        sj.cuts = e.cuts;
        sj.checkpoint_cuts = cache_.has_value() && r.cache_prompt;
        const request_handle* h = e.h.get();
        sj.cancelled = [this, h] { return h->stopped() || stopping_; };
        if (r.gen.logprobs >= 0 && r.sink.on_logprob) sj.on_logprob = [&r](const token_logprob& lp) { r.sink.on_logprob(lp); };
        sj.on_token = [this, h, &r](token t) {
            if (h->stopped() || stopping_) return false;
            return r.sink.on_token ? r.sink.on_token(t) : true;
        };
        if (cache_ && r.cache_prompt && !r.prompt.empty()) {
            const session_options so{.ctx = ctx, .kv_f16 = opt_.kv_f16};
            e.s.emplace(cache_->open(so, r.prompt, e.cuts, std::int64_t(r.prompt.size()) - 1, sj.cached, r.cache_scope));
            sj.s = &*e.s;
        }
        run_.add(sj);
    }

    // One batched pass; the requests that ended in it are retired. A failed pass ends every
    // running request with its error (their states are not known to be consistent).
    void pass() {
        std::vector<sequence_job<Decoder>*> ended;
        std::string error;
        try {
            ended = run_.step();
        } catch (const std::exception& ex) {
            error = ex.what();
        } catch (...) {
            error = "unknown error";
        }
        {
            std::lock_guard lk(mu_);
            stats_.steps = run_.stats();
        }
        if (!error.empty()) {
            while (!active_.empty()) retire(active_.begin(), error);
            return;
        }
        for (auto* sj : ended)
            for (auto it = active_.begin(); it != active_.end(); ++it)
                if (&(*it)->sj == sj) {
                    retire(it, {});
                    break;
                }
    }

    // A running request ends: counted, its sink told, then what its prompt computed becomes a
    // prefix for later requests — also when it was stopped half way (the checkpoints made are
    // right), not after a failed pass (its state is unknown). The session is done, so its GDN
    // checkpoints move into the cache instead of being copied; the sink hears first, so its
    // answer does not wait for that.
    void retire(typename std::vector<std::unique_ptr<entry>>::iterator it, const std::string& error) {
        entry& e = **it;
        const generate_stats& st = e.sj.stats;
        {
            std::lock_guard lk(mu_);
            if (e.h->abandoned()) ++stats_.cancelled;
            else ++stats_.completed;
            // With the count above, so that a consumer told of its end never sees itself running.
            --stats_.running;
            stats_.prompt_tokens += st.prompt_tokens;
            stats_.cached_tokens += st.cached_tokens;
            stats_.generated_tokens += st.tokens;
            stats_.cut_back += st.block_cuts > 0;
        }
        tell_end(e, st, error);
        if (cache_ && e.s && error.empty() && e.req.cache_prompt) {
            try {
                cache_->insert_finished(*e.s, std::int64_t(e.req.prompt.size()), e.req.cache_scope);
            } catch (const std::exception&) {  // out of memory copying GDN states: the answer stands, it is just not kept
            }
        }
        active_.erase(it);
    }

    static void tell_end(entry& e, const generate_stats& st, const std::string& error) {
        if (!e.req.sink.on_end) return;
        engine_result r;
        r.stats = st;
        r.error = error;
        r.abandoned = e.h->abandoned();
        e.req.sink.on_end(r);
    }

    Model& m_;
    engine_options opt_;
    batch_runner<Model, Decoder> run_;
    std::optional<prefix_cache<Model>> cache_;  // the stepping thread only (stats: any)
    std::vector<std::unique_ptr<entry>> active_;  // the stepping thread only; the runner holds &sj

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<entry>> queue_;
    std::atomic<bool> stopping_{false};
    std::string shutdown_reason_ = "shutting down";
    engine_stats stats_;
};

}  // namespace clover::decode
