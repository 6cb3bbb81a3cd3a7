#pragma once
// The decoder policies, each a type (clover-diffusion.md §4):
//   decode::ar               one commit pass per token after the prompt
//   decode::low_confidence   block diffusion: preview passes fill a block of masks, most
//                            confident first, then one commit pass per finished block
//   decode::self_speculative lossless: a preview pass drafts a block, one verify pass checks it
//                            against the causal choice, a replay rollback keeps the accepted rows
// All three share the sampler (penalties, ramps, temperature, top-k/p, min-p, seed) and the stop
// rules (end-of-generation ids, stop strings, max tokens), which live in detail::emitter.
//
// A decoder is a step machine per sequence (its `stepper`): given the logits of its last pass it
// decides tokens and names its next pass (a commit, preview or verify segment). The runner
// (runner.hpp) runs any number of sequences together — each with its own decoder, sampler and
// stop rules — as one batched pass per step (model::run); generate.hpp has the loops over it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "clover/decode/sampler.hpp"
#include "clover/model/model.hpp"

namespace clover::decode {

template <class Model>
struct context;
struct step_request;

struct ar {
    static constexpr const char* name = "ar";
    template <class Model>
    struct stepper;
};
struct low_confidence {
    static constexpr const char* name = "diffusion";
    static constexpr bool uses_preview = true;
    std::int64_t block = 32;
    float threshold = 0.95f;
    std::int64_t coreset = -1;  // -1: the file's default (diffusion.expert_coreset)
    template <class Model>
    struct stepper;
};
struct self_speculative {
    static constexpr const char* name = "speculative";
    static constexpr bool uses_preview = true;
    std::int64_t block = 32;
    std::int64_t draft_passes = 1;
    float threshold = 0.95f;  // used by draft passes before the last
    std::int64_t coreset = -1;
    template <class Model>
    struct stepper;
};

// A decoder policy: a type with a `name` and a `stepper<Model>` built from the policy, whose
// step(context&, logits, next) takes the logits of the sequence's last pass (first: the causal
// distribution after the prompt, [n_vocab]; then [next.logits, n_vocab] of the pass it asked
// for), hands decided tokens to context::emit, and either fills `next` and returns true or
// returns false when the sequence is done (examples/custom_decoder.cpp). A policy that sets
// `uses_preview = true` is refused up front on files that cannot run preview passes.
template <class D, class Model>
concept decoder_policy_for = requires(const D d, context<Model>& c, const float* lg, step_request& r) {
    { D::name } -> std::convertible_to<const char*>;
    { typename D::template stepper<Model>(d).step(c, lg, r) } -> std::same_as<bool>;
};

struct generate_options {
    std::int64_t max_tokens = 128;
    bool ignore_eos = false;
    std::vector<token> eog;  // end-of-generation ids
    sampler_options sampling;
    std::vector<std::string> stop;                 // stop strings (need `piece`)
    std::function<std::string(token)> piece;       // token -> its bytes, for stop strings
};

struct generate_stats {
    std::int64_t prompt_tokens = 0, tokens = 0;
    std::int64_t cached_tokens = 0;  // of prompt_tokens: taken from a prefix cache, not computed
    std::int64_t commit_passes = 0, preview_passes = 0, verify_passes = 0;
    double prompt_seconds = 0, seconds = 0;  // seconds: generation only (after the prompt)
    std::string stop_reason = "length";      // length | eog | stop | callback | context
    std::int64_t passes() const { return commit_passes + preview_passes + verify_passes; }
    // Generated tokens per forward pass (clover-diffusion.md §4). The prompt's pass counts: it
    // yields the first token's logits, so AR decoding is exactly 1.0.
    double tokens_per_pass() const { return passes() > 0 ? double(tokens) / double(passes()) : 0.0; }
    std::string json() const {
        auto f = [](double x) { char b[64]; std::snprintf(b, sizeof b, "%.6g", x); return std::string(b); };
        return "{\"tokens\": " + std::to_string(tokens) + ", \"prompt_tokens\": " + std::to_string(prompt_tokens) +
               ", \"cached_tokens\": " + std::to_string(cached_tokens) +
               ", \"passes\": " + std::to_string(passes()) + ", \"preview_passes\": " + std::to_string(preview_passes) +
               ", \"commit_passes\": " + std::to_string(commit_passes) + ", \"verify_passes\": " +
               std::to_string(verify_passes) + ", \"tokens_per_pass\": " + f(tokens_per_pass()) +
               ", \"prompt_seconds\": " + f(prompt_seconds) + ", \"seconds\": " + f(seconds) +
               ", \"tokens_per_second\": " + f(seconds > 0 ? double(tokens) / seconds : 0.0) +
               ", \"stop_reason\": \"" + stop_reason + "\"}";
    }
};

namespace detail {

// The stop rules, in one place. emit(t) records a decided token and says whether to go on.
struct emitter {
    const generate_options& o;
    const std::function<bool(token)>& on_token;
    generate_stats& st;
    history hist;
    std::string tail;  // recent text, for stop strings
    std::size_t longest_stop = 0;

    emitter(const generate_options& opt, const std::function<bool(token)>& cb, generate_stats& s) : o(opt), on_token(cb), st(s) {
        for (const auto& x : o.stop) longest_stop = std::max(longest_stop, x.size());
    }
    bool is_eog(token t) const { return !o.ignore_eos && std::find(o.eog.begin(), o.eog.end(), t) != o.eog.end(); }
    // False: generation ends with this token (which is counted, and passed to on_token unless it
    // is an end-of-generation token).
    bool emit(token t) {
        hist.add(t, o.sampling);
        ++st.tokens;
        if (is_eog(t)) { st.stop_reason = "eog"; return false; }
        if (on_token && !on_token(t)) { st.stop_reason = "callback"; return false; }
        if (!o.stop.empty() && o.piece) {
            tail += o.piece(t);
            for (const auto& x : o.stop)
                if (!x.empty() && tail.find(x) != std::string::npos) { st.stop_reason = "stop"; return false; }
            if (tail.size() > 4 * longest_stop + 64) tail.erase(0, tail.size() - 2 * longest_stop);
        }
        if (st.tokens >= o.max_tokens) { st.stop_reason = "length"; return false; }
        return true;
    }
};

}  // namespace detail

// The pass a sequence asks for next.
struct step_request {
    pass_kind kind = pass_kind::commit;
    std::vector<token> rows;
    std::int64_t logits = 0;    // how many of the last rows give logits
    std::int64_t coreset = -1;  // preview: -1 = the file's default
};

// What a decoder works with for one sequence: the model and session (the prompt committed), the
// sampler, the stop rules (emit) and the statistics.
template <class Model>
struct context {
    Model& m;
    session& s;
    const generate_options& o;
    sampler& smp;
    detail::emitter& out;
    generate_stats& st;
    std::int64_t room() const { return s.n_ctx() - s.n_past(); }
    std::int64_t n_vocab() const { return m.n_vocab(); }
    // False: generation ends with this token.
    bool emit(token t) { return out.emit(t); }
};

template <class Model>
struct ar::stepper {
    explicit stepper(const ar&) {}
    bool step(context<Model>& c, const float* lg, step_request& next) {
        const token t = c.smp.pick(lg, c.n_vocab(), c.out.hist).id;
        if (!c.emit(t)) return false;
        if (c.room() < 1) { c.st.stop_reason = "context"; return false; }
        next = {pass_kind::commit, {t}, 1, -1};
        return true;
    }
};

// Block diffusion: preview passes fill a block of masks (every masked row at or above the
// threshold, else the most confident one), then one commit pass of the finished block.
template <class Model>
struct low_confidence::stepper {
    low_confidence d;
    enum class phase { start, preview, commit } ph = phase::start;
    std::vector<token> rows;
    std::vector<bool> known;
    std::int64_t end = 0;
    bool going = true;
    history h;
    explicit stepper(const low_confidence& p) : d(p) {
        if (d.block < 1) fail("diffusion: block must be at least 1");
    }
    bool step(context<Model>& c, const float* lg, step_request& next) {
        auto& [m, s, o, smp, out, st] = c;
        const std::int64_t V = c.n_vocab();
        const token mask = token(m.hp().mask_token_id);
        if (ph == phase::preview) {
            // A NaN confidence (NaN logits: a broken file) counts as -1, so some masked row is
            // always chosen and the block always ends.
            std::int64_t best = -1;
            float best_p = -2.f;
            token best_id = mask;
            std::vector<std::pair<std::int64_t, token>> take;
            for (std::int64_t t = 0; t < end; ++t) {
                if (known[std::size_t(t)]) continue;
                const choice ch = smp.pick(lg + t * V, V, h, mask);
                const float p = std::isnan(ch.p) ? -1.f : ch.p;
                if (p >= d.threshold) take.emplace_back(t, ch.id);
                if (p > best_p) { best_p = p; best = t; best_id = ch.id; }
            }
            if (take.empty()) take.emplace_back(best, best_id);
            for (auto [t, id] : take) {
                rows[std::size_t(t)] = id;
                known[std::size_t(t)] = true;
                h.add(id, o.sampling);
            }
            for (std::int64_t t = 0; t < end; ++t)
                if (known[std::size_t(t)] && out.is_eog(rows[std::size_t(t)])) { end = t + 1; break; }
            if (!std::all_of(known.begin(), known.begin() + end, [](bool k) { return k; })) {
                next = {pass_kind::preview, rows, std::int64_t(rows.size()), d.coreset};
                return true;
            }
            std::int64_t keep = end;
            for (std::int64_t t = 0; t < end; ++t)
                if (!out.emit(rows[std::size_t(t)])) { keep = t + 1; going = false; break; }
            next = {pass_kind::commit, std::vector<token>(rows.begin(), rows.begin() + keep), 0, -1};
            ph = phase::commit;
            return true;
        }
        if (ph == phase::commit && !going) return false;
        // A new block.
        const std::int64_t B = std::min({d.block, o.max_tokens - st.tokens, c.room()});
        if (B < 1) { st.stop_reason = c.room() < 1 ? "context" : "length"; return false; }
        rows.assign(std::size_t(B), mask);
        known.assign(std::size_t(B), false);
        h = out.hist;  // penalties see tokens decided earlier in this block too
        end = B;
        ph = phase::preview;
        next = {pass_kind::preview, rows, B, d.coreset};
        return true;
    }
};

// Lossless self-speculation: preview passes draft a block after the known AR token, one verify
// pass checks every drafted row against the causal choice, a replay rollback keeps the
// accepted rows.
template <class Model>
struct self_speculative::stepper {
    self_speculative d;
    enum class phase { start, draft, verify } ph = phase::start;
    std::vector<token> rows;
    token next_tok = 0;
    std::int64_t pass = 0;
    explicit stepper(const self_speculative& p) : d(p) {
        if (d.block < 2) fail("speculative: block must be at least 2");
    }
    bool draft(context<Model>& c, step_request& next) {
        // Row 0 is the token already emitted, so at most max_tokens - tokens more can follow:
        // a block larger than that drafts and verifies rows that can never be used.
        const std::int64_t B = std::min({d.block, c.room(), c.o.max_tokens - c.st.tokens + 1});
        if (c.room() < 1) { c.st.stop_reason = "context"; return false; }
        rows.assign(std::size_t(B), token(c.m.hp().mask_token_id));
        rows[0] = next_tok;
        pass = 0;
        ph = phase::draft;
        next = {pass_kind::preview, rows, B, d.coreset};
        return true;
    }
    bool step(context<Model>& c, const float* lg, step_request& next) {
        auto& [m, s, o, smp, out, st] = c;
        const std::int64_t V = c.n_vocab();
        const token mask = token(m.hp().mask_token_id);
        const std::int64_t B = std::int64_t(rows.size());
        if (ph == phase::start) {
            next_tok = smp.pick(lg, V, out.hist).id;  // the AR token for position n_past
            if (!out.emit(next_tok)) return false;
            return draft(c, next);
        }
        if (ph == phase::draft) {
            const bool last = pass + 1 >= std::max<std::int64_t>(1, d.draft_passes);
            std::vector<float> adj;
            for (std::int64_t t = 1; t < B; ++t) {
                if (rows[std::size_t(t)] != mask) continue;
                smp.adjust(lg + t * V, V, out.hist, mask, adj);
                const token a = argmax(adj.data(), V);
                // Draft choices never draw from the generator: AR's draws stay aligned.
                double z = 0;
                for (std::int64_t i = 0; i < V; ++i) z += std::exp(double(adj[std::size_t(i)]) - double(adj[std::size_t(a)]));
                if (last || 1.0 / z >= d.threshold) rows[std::size_t(t)] = a;
            }
            ++pass;
            if (last) {
                ph = phase::verify;
                next = {pass_kind::verify, rows, B, -1};
            } else {
                next = {pass_kind::preview, rows, B, d.coreset};
            }
            return true;
        }
        // Verified: keep the rows that equal the causal choice.
        std::int64_t keep = 1;  // row 0 is the AR token already emitted
        bool going = true, mismatch = false;
        for (std::int64_t t = 1; t < B && going; ++t) {
            const token a = smp.pick(lg + (t - 1) * V, V, out.hist).id;
            if (a != rows[std::size_t(t)]) { next_tok = a; mismatch = true; break; }
            ++keep;
            going = out.emit(a);
        }
        if (going && !mismatch) next_tok = smp.pick(lg + (B - 1) * V, V, out.hist).id;
        m.rollback(s, keep);
        if (going) going = out.emit(next_tok);
        if (!going) return false;
        return draft(c, next);
    }
};

}  // namespace clover::decode
