#pragma once
// One generation loop; the decoder policy is a type (clover-diffusion.md §4):
//   decode::ar               one commit pass per token after the prompt
//   decode::low_confidence   block diffusion: preview passes fill a block of masks, most
//                            confident first, then one commit pass per finished block
//   decode::self_speculative lossless: a preview pass drafts a block, one verify pass checks it
//                            against the causal choice, a replay rollback keeps the accepted rows
// All three share the sampler (penalties, ramps, temperature, top-k/p, min-p, seed) and the stop
// rules (end-of-generation ids, stop strings, max tokens), which live in detail::emitter.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "clover/decode/sampler.hpp"
#include "clover/model/model.hpp"

namespace clover::decode {

template <class Model>
struct context;

struct ar {
    static constexpr const char* name = "ar";
    template <class Model>
    void run(context<Model>& c) const;
};
struct low_confidence {
    static constexpr const char* name = "diffusion";
    static constexpr bool uses_preview = true;
    std::int64_t block = 32;
    float threshold = 0.95f;
    std::int64_t coreset = -1;  // -1: the file's default (diffusion.expert_coreset)
    template <class Model>
    void run(context<Model>& c) const;
};
struct self_speculative {
    static constexpr const char* name = "speculative";
    static constexpr bool uses_preview = true;
    std::int64_t block = 32;
    std::int64_t draft_passes = 1;
    float threshold = 0.95f;  // used by draft passes before the last
    std::int64_t coreset = -1;
    template <class Model>
    void run(context<Model>& c) const;
};

// A decoder policy: a type with a `name` and `run(context&)` that drives passes after the
// prompt and hands every decided token to context::emit (examples/custom_decoder.cpp); one that
// sets `uses_preview = true` is refused up front on files that cannot run preview passes.
template <class D, class Model>
concept decoder_policy_for = requires(const D d, context<Model>& c) {
    { D::name } -> std::convertible_to<const char*>;
    d.run(c);
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

// What a decoder works with: the model and session (the prompt already committed), the
// sampler, the stop rules (emit), the statistics, and the logits of the last committed row.
template <class Model>
struct context {
    Model& m;
    session& s;
    const generate_options& o;
    sampler& smp;
    detail::emitter& out;
    generate_stats& st;
    std::vector<float>& logits;  // [n_vocab]: the causal distribution of position s.n_past()
    std::int64_t room() const { return s.n_ctx() - s.n_past(); }
    std::int64_t n_vocab() const { return m.n_vocab(); }
    // False: generation ends with this token.
    bool emit(token t) { return out.emit(t); }
};

// on_token(id) is called for every generated token; returning false stops generation.
template <class Decoder, class Model>
    requires decoder_policy_for<Decoder, Model>
generate_stats generate(Model& m, session& s, std::span<const token> prompt, const generate_options& o,
                        const std::function<bool(token)>& on_token, Decoder dec = {}) {
    using clk = std::chrono::steady_clock;
    generate_stats st;
    if (prompt.empty()) fail("generate: the prompt is empty");
    if (o.max_tokens < 1) fail("generate: max_tokens must be at least 1");
    if constexpr (requires { Decoder::uses_preview; }) {
        if (Decoder::uses_preview) m.require_diffusion();
    }
    sampler smp(o.sampling);
    detail::emitter out(o, on_token, st);
    std::vector<float> logits;
    auto t0 = clk::now();
    m.commit(s, prompt, logits_rows::last, logits);
    st.prompt_tokens = std::int64_t(prompt.size());
    st.commit_passes = 1;
    auto t1 = clk::now();
    st.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
    context<Model> c{m, s, o, smp, out, st, logits};
    dec.run(c);
    st.seconds = std::chrono::duration<double>(clk::now() - t1).count();
    return st;
}

template <class Model>
void ar::run(context<Model>& c) const {
    auto& [m, s, o, smp, out, st, logits] = c;
    const std::int64_t V = c.n_vocab();
    auto room = [&] { return c.room(); };
    for (;;) {
        const token t = smp.pick(logits.data(), V, out.hist).id;
        if (!out.emit(t)) break;
        if (room() < 1) { st.stop_reason = "context"; break; }
        const token one[1] = {t};
        m.commit(s, one, logits_rows::last, logits);
        ++st.commit_passes;
    }
}

template <class Model>
void low_confidence::run(context<Model>& c) const {
    auto& [m, s, o, smp, out, st, logits] = c;
    const std::int64_t V = c.n_vocab();
    auto room = [&] { return c.room(); };
    const token mask = token(m.hp().mask_token_id);
    if (block < 1) fail("diffusion: block must be at least 1");
    std::vector<float> lg;
    for (bool going = true; going;) {
        const std::int64_t B = std::min({block, o.max_tokens - st.tokens, room()});
        if (B < 1) { st.stop_reason = room() < 1 ? "context" : "length"; break; }
        std::vector<token> rows(std::size_t(B), mask);
        std::vector<bool> known(std::size_t(B), false);
        history h = out.hist;  // penalties see tokens decided earlier in this block too
        std::int64_t end = B;  // rows up to the first end-of-generation token
        for (;;) {
            m.preview(s, rows, coreset, lg);
            ++st.preview_passes;
            // Pick every masked row; commit those at or above the threshold, else the most
            // confident one.
            // A NaN confidence (NaN logits: a broken file) counts as -1, so some masked row is
            // always chosen and the block always ends.
            std::int64_t best = -1;
            float best_p = -2.f;
            token best_id = mask;
            std::vector<std::pair<std::int64_t, token>> take;
            for (std::int64_t t = 0; t < end; ++t) {
                if (known[t]) continue;
                const choice c = smp.pick(lg.data() + t * V, V, h, mask);
                const float p = std::isnan(c.p) ? -1.f : c.p;
                if (p >= threshold) take.emplace_back(t, c.id);
                if (p > best_p) { best_p = p; best = t; best_id = c.id; }
            }
            if (take.empty()) take.emplace_back(best, best_id);
            for (auto [t, id] : take) {
                rows[t] = id;
                known[t] = true;
                h.add(id, o.sampling);
            }
            for (std::int64_t t = 0; t < end; ++t)
                if (known[t] && out.is_eog(rows[t])) { end = t + 1; break; }
            if (std::all_of(known.begin(), known.begin() + end, [](bool k) { return k; })) break;
        }
        std::int64_t keep = end;
        for (std::int64_t t = 0; t < end; ++t)
            if (!out.emit(rows[t])) { keep = t + 1; going = false; break; }
        m.commit(s, std::span<const token>(rows.data(), std::size_t(keep)), logits_rows::none, logits);
        ++st.commit_passes;
    }
}

template <class Model>
void self_speculative::run(context<Model>& c) const {
    auto& [m, s, o, smp, out, st, logits] = c;
    const std::int64_t V = c.n_vocab();
    auto room = [&] { return c.room(); };
    if (block < 2) fail("speculative: block must be at least 2");
    const token mask = token(m.hp().mask_token_id);
    std::vector<float> lg, vl;
    token next = smp.pick(logits.data(), V, out.hist).id;  // the AR token for position n_past
    bool going = out.emit(next);
    while (going) {
        // Row 0 is the token already emitted, so at most max_tokens - tokens more can follow:
        // a block larger than that drafts and verifies rows that can never be used.
        const std::int64_t B = std::min({block, room(), o.max_tokens - st.tokens + 1});
        if (room() < 1) { st.stop_reason = "context"; break; }
        // Draft: row 0 is the known AR token; the rest start masked.
        std::vector<token> rows(std::size_t(B), mask);
        rows[0] = next;
        for (std::int64_t pass = 0; pass < std::max<std::int64_t>(1, draft_passes); ++pass) {
            m.preview(s, rows, coreset, lg);
            ++st.preview_passes;
            const bool last = pass + 1 >= draft_passes;
            std::int64_t filled = 0;
            for (std::int64_t t = 1; t < B; ++t) {
                if (rows[t] != mask) continue;
                std::vector<float> adj;
                smp.adjust(lg.data() + t * V, V, out.hist, mask, adj);
                const token a = argmax(adj.data(), V);
                // Draft choices never draw from the generator: AR's draws stay aligned.
                double z = 0;
                for (std::int64_t i = 0; i < V; ++i) z += std::exp(double(adj[i]) - double(adj[a]));
                if (last || 1.0 / z >= threshold) { rows[t] = a; ++filled; }
            }
            if (!last && filled == 0) continue;
        }
        m.verify(s, rows, vl);
        ++st.verify_passes;
        std::int64_t keep = 1;  // row 0 is the AR token already emitted
        bool mismatch = false;
        for (std::int64_t t = 1; t < B && going; ++t) {
            const token a = smp.pick(vl.data() + (t - 1) * V, V, out.hist).id;
            if (a != rows[t]) { next = a; mismatch = true; break; }
            ++keep;
            going = out.emit(a);
        }
        if (going && !mismatch) next = smp.pick(vl.data() + (B - 1) * V, V, out.hist).id;
        m.rollback(s, keep);
        if (going) going = out.emit(next);
        if (going && room() < 1) { st.stop_reason = "context"; break; }
    }
}

}  // namespace clover::decode
