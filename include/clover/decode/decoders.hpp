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

/// Autoregressive decoding: one commit pass per token after the prompt.
struct ar {
    static constexpr const char* name = "ar";  ///< the decoder's name (CLI, server, stats)
    template <class Model>
    struct stepper;
};
/// Block diffusion: preview passes fill a block of masks, every masked row whose confidence
/// reaches the threshold (else the most confident one), then one commit pass per finished block.
/// Needs a clover_moe file with the block-diffusion tensors.
struct low_confidence {
    static constexpr const char* name = "diffusion";  ///< the decoder's name
    static constexpr bool uses_preview = true;        ///< refused up front on files without preview passes
    std::int64_t block = 32;   ///< tokens per block
    float threshold = 0.95f;   ///< confidence at which a row is committed
    std::int64_t coreset = -1;  ///< experts per MoE layer in preview passes; -1: the file's default (diffusion.expert_coreset)
    /// The progress rule (0: off): a block that computes more than this many rows per token it
    /// decides halves the block for the rest of the sequence (stats.block_cuts counts it).
    std::int64_t max_rows_per_token = 0;
    template <class Model>
    struct stepper;
};
/// Lossless self-speculation: preview passes draft a block after the known AR token, one verify
/// pass checks every drafted row against the causal choice, and a rollback keeps the accepted
/// rows; greedy output equals ar's.
struct self_speculative {
    static constexpr const char* name = "speculative";  ///< the decoder's name
    static constexpr bool uses_preview = true;          ///< refused up front on files without preview passes
    std::int64_t block = 32;        ///< rows per draft (at least 2: the known token and one drafted)
    std::int64_t draft_passes = 1;  ///< preview passes per draft
    float threshold = 0.95f;  ///< used by draft passes before the last
    std::int64_t coreset = -1;  ///< as low_confidence's
    std::int64_t max_rows_per_token = 0;  ///< as low_confidence's, per draft-and-verify cycle (block >= 2)
    template <class Model>
    struct stepper;
};

/// A decoder policy: a type with a `name` and a `stepper<Model>` built from the policy, whose
/// step(context&, logits, next) takes the logits of the sequence's last pass (first: the causal
/// distribution after the prompt, [n_vocab]; then [next.logits, n_vocab] of the pass it asked
/// for), hands decided tokens to context::emit, and either fills `next` and returns true or
/// returns false when the sequence is done (examples/until_unsure.hpp). A policy that sets
/// `uses_preview = true` is refused up front on files that cannot run preview passes. Any such
/// policy runs batched beside others as an alternative of a std::variant of policies (the
/// runner's Decoder); one that lacks a piece fails there with a static_assert naming it.
template <class D, class Model>
concept decoder_policy_for = requires(const D d, context<Model>& c, const float* lg, step_request& r) {
    { D::name } -> std::convertible_to<const char*>;
    { typename D::template stepper<Model>(d).step(c, lg, r) } -> std::same_as<bool>;
};

/// What to generate and when to stop: the sampler's settings and the stop rules.
struct generate_options {
    std::int64_t max_tokens = 128;  ///< most tokens to generate
    bool ignore_eos = false;        ///< go on past end-of-generation ids
    std::vector<token> eog;  ///< end-of-generation ids
    sampler_options sampling;  ///< penalties, ramps, temperature, top-k / top-p / min-p, seed
    std::vector<std::string> stop;                 ///< stop strings (need `piece`)
    std::function<std::string(token)> piece;       ///< token -> its bytes, for stop strings
    /// -1: none; k >= 0: every emitted token's log-probability with the k likeliest tokens, from
    /// the logits of the pass that decided it (sequence_job::on_logprob receives them).
    std::int32_t logprobs = -1;
};

/// What a generation did.
struct generate_stats {
    std::int64_t prompt_tokens = 0;  ///< tokens of the prompt
    std::int64_t tokens = 0;         ///< tokens generated
    std::int64_t cached_tokens = 0;  ///< of prompt_tokens: taken from a prefix cache, not computed
    std::int64_t commit_passes = 0;   ///< commit passes (the prompt's count as one)
    std::int64_t preview_passes = 0;  ///< preview passes (diffusion and speculative drafts)
    std::int64_t verify_passes = 0;   ///< verify passes (speculative)
    std::int64_t block_cuts = 0;  ///< times the progress rule halved the block
    double prompt_seconds = 0;  ///< seconds spent on the prompt
    double seconds = 0;         ///< seconds of generation only (after the prompt)
    std::string stop_reason = "length";      ///< length | eog | stop | callback | context
    /// All forward passes.
    std::int64_t passes() const { return commit_passes + preview_passes + verify_passes; }
    /// Generated tokens per forward pass (clover-diffusion.md §4). The prompt's pass counts: it
    /// yields the first token's logits, so AR decoding is exactly 1.0.
    double tokens_per_pass() const { return passes() > 0 ? double(tokens) / double(passes()) : 0.0; }
    /// The statistics as one JSON object (what `clover generate` prints on stderr).
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
    const std::function<void(const token_logprob&)>* on_logprob;
    history hist;
    std::string tail;  // recent text, for stop strings
    std::size_t longest_stop = 0;

    emitter(const generate_options& opt, const std::function<bool(token)>& cb, generate_stats& s,
            const std::function<void(const token_logprob&)>* lp = nullptr)
        : o(opt), on_token(cb), st(s), on_logprob(lp) {
        for (const auto& x : o.stop) longest_stop = std::max(longest_stop, x.size());
    }
    bool is_eog(token t) const { return !o.ignore_eos && std::find(o.eog.begin(), o.eog.end(), t) != o.eog.end(); }
    // False: generation ends with this token (which is counted, and passed to on_token unless it
    // is an end-of-generation token; its log-probability `lp`, when given, just before).
    bool emit(token t, const token_logprob* lp = nullptr) {
        hist.add(t, o.sampling);
        ++st.tokens;
        if (is_eog(t)) { st.stop_reason = "eog"; return false; }
        if (lp && on_logprob && *on_logprob) (*on_logprob)(*lp);
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

/// The pass a sequence asks for next.
struct step_request {
    pass_kind kind = pass_kind::commit;  ///< commit, preview or verify
    std::vector<token> rows;             ///< the segment's token ids
    std::int64_t logits = 0;    ///< how many of the last rows give logits
    std::int64_t coreset = -1;  ///< preview: -1 = the file's default
};

/// What a decoder works with for one sequence: the model and session (the prompt committed), the
/// sampler, the stop rules (emit) and the statistics.
template <class Model>
struct context {
    Model& m;                   ///< the model
    session& s;                 ///< the sequence
    const generate_options& o;  ///< its options
    sampler& smp;               ///< its sampler
    detail::emitter& out;       ///< its stop rules (use emit)
    generate_stats& st;         ///< its statistics
    std::int64_t room() const { return s.n_ctx() - s.n_past(); }  ///< tokens the context has left
    std::int64_t n_vocab() const { return m.n_vocab(); }           ///< the logits' row length
    /// False: generation ends with this token. `row`: the logits it was decided from, for
    // generate_options::logprobs (`exclude`: a token that could not be chosen, e.g. the mask).
    bool emit(token t, const float* row = nullptr, token exclude = -1) {
        if (!row || o.logprobs < 0) return out.emit(t);
        const token_logprob lp = logprob_of(row, n_vocab(), t, o.logprobs, exclude);
        return out.emit(t, &lp);
    }
};

template <class Model>
struct ar::stepper {
    explicit stepper(const ar&) {}
    bool step(context<Model>& c, const float* lg, step_request& next) {
        const token t = c.smp.pick(lg, c.n_vocab(), c.out.hist).id;
        if (!c.emit(t, lg)) return false;
        if (c.room() < 1) { c.st.stop_reason = "context"; return false; }
        next = {pass_kind::commit, {t}, 1, -1};
        return true;
    }
};

// Block diffusion: preview passes fill a block of masks (every masked row at or above the
// threshold, else the most confident one), then one commit pass of the finished block.
// The progress rule: a block that cost more than max_rows_per_token rows (its preview passes and
// its commit) per token it committed halves the block for the rest of the sequence. It depends
// on the sequence's own passes only, so the answer is the same alone or batched.
template <class Model>
struct low_confidence::stepper {
    low_confidence d;
    enum class phase { start, preview, commit } ph = phase::start;
    std::vector<token> rows;
    std::vector<bool> known;
    std::vector<token_logprob> lps;  // generate_options::logprobs: each row's, from the pass that decided it
    std::int64_t end = 0, block_rows = 0, kept = 0;
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
                if (o.logprobs >= 0) lps[std::size_t(t)] = logprob_of(lg + t * V, V, id, o.logprobs, mask);
            }
            for (std::int64_t t = 0; t < end; ++t)
                if (known[std::size_t(t)] && out.is_eog(rows[std::size_t(t)])) { end = t + 1; break; }
            if (!std::all_of(known.begin(), known.begin() + end, [](bool k) { return k; })) {
                next = {pass_kind::preview, rows, std::int64_t(rows.size()), d.coreset};
                block_rows += std::int64_t(rows.size());
                return true;
            }
            std::int64_t keep = end;
            for (std::int64_t t = 0; t < end; ++t)
                if (!out.emit(rows[std::size_t(t)], o.logprobs >= 0 ? &lps[std::size_t(t)] : nullptr)) {
                    keep = t + 1;
                    going = false;
                    break;
                }
            next = {pass_kind::commit, std::vector<token>(rows.begin(), rows.begin() + keep), 0, -1};
            block_rows += keep;
            kept = keep;
            ph = phase::commit;
            return true;
        }
        if (ph == phase::commit && !going) return false;
        if (ph == phase::commit && d.max_rows_per_token > 0 && d.block > 1 && block_rows > d.max_rows_per_token * kept) {
            d.block = std::max<std::int64_t>(1, d.block / 2);
            ++st.block_cuts;
        }
        // A new block.
        const std::int64_t B = std::min({d.block, o.max_tokens - st.tokens, c.room()});
        if (B < 1) { st.stop_reason = c.room() < 1 ? "context" : "length"; return false; }
        rows.assign(std::size_t(B), mask);
        known.assign(std::size_t(B), false);
        if (o.logprobs >= 0) lps.assign(std::size_t(B), {});
        h = out.hist;  // penalties see tokens decided earlier in this block too
        end = B;
        block_rows = B;
        ph = phase::preview;
        next = {pass_kind::preview, rows, B, d.coreset};
        return true;
    }
};

// Lossless self-speculation: preview passes draft a block after the known AR token, one verify
// pass checks every drafted row against the causal choice, a replay rollback keeps the
// accepted rows. The progress rule as low_confidence's, per draft-and-verify cycle (the block
// stays at least 2).
template <class Model>
struct self_speculative::stepper {
    self_speculative d;
    enum class phase { start, draft, verify } ph = phase::start;
    std::vector<token> rows;
    token next_tok = 0;
    std::int64_t pass = 0, cycle_tokens = 0;
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
        cycle_tokens = c.st.tokens;
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
            if (!c.emit(next_tok, lg)) return false;
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
        const float* next_row = lg + (B - 1) * V;
        for (std::int64_t t = 1; t < B && going; ++t) {
            const token a = smp.pick(lg + (t - 1) * V, V, out.hist).id;
            if (a != rows[std::size_t(t)]) { next_tok = a; next_row = lg + (t - 1) * V; mismatch = true; break; }
            ++keep;
            going = c.emit(a, lg + (t - 1) * V);
        }
        if (going && !mismatch) next_tok = smp.pick(next_row, V, out.hist).id;
        m.rollback(s, keep);
        if (going) going = c.emit(next_tok, next_row);
        if (!going) return false;
        const std::int64_t cycle_rows = B * (std::max<std::int64_t>(1, d.draft_passes) + 1);
        if (d.max_rows_per_token > 0 && d.block > 2 && cycle_rows > d.max_rows_per_token * (st.tokens - cycle_tokens)) {
            d.block = std::max<std::int64_t>(2, d.block / 2);
            ++st.block_cuts;
        }
        return draft(c, next);
    }
};

}  // namespace clover::decode
