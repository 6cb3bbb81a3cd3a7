#pragma once
// One sampler for every decoder (clover-diffusion.md §5): a logit bias, response-only penalties,
// the think and stop ramps, then greedy (argmax, ties to the lower id — the peer's rule, so greedy
// runs compare token for token) or temperature sampling with top-k, top-p and min-p from a seeded
// generator.
// Each choice also reports its probability, which is the LowConfidence decoder's confidence.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clover/core/rng.hpp"

namespace clover::decode {

struct sampler_options {
    float temperature = 0.f;  // 0: greedy
    std::int32_t top_k = 0;   // 0: off
    float top_p = 1.f;
    float min_p = 0.f;
    std::uint64_t seed = 0;
    // Penalties over generated tokens only (not the prompt).
    float presence_penalty = 0.f;    // additive, once per seen token (OpenAI)
    float frequency_penalty = 0.f;   // additive, per occurrence (OpenAI)
    float repetition_penalty = 1.f;  // multiplicative (llama.cpp / HF): logit/p if > 0, logit*p otherwise
    // Ramps: after `start` tokens, add slope × (tokens past start) to one token's logit.
    std::int64_t think_ramp_start = 4096;
    float think_ramp_slope = 0.f;  // pushes `think_end` while a <think> block is open
    std::int64_t stop_ramp_start = 8192;
    float stop_ramp_slope = 0.f;   // pushes `stop_token` once the answer is long
    std::int32_t think_end = -1;   // id of </think>, -1: none
    std::int32_t stop_token = -1;  // end-of-generation id the stop ramp pushes
    // Added to a token's logit before anything else (OpenAI's logit_bias: -100 all but bans it).
    std::vector<std::pair<std::int32_t, float>> logit_bias = {};
};

inline std::int32_t argmax(const float* logits, std::int64_t n) {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    return std::int32_t(best);
}

// What the penalties and ramps look at: the generated tokens so far.
struct history {
    std::unordered_map<std::int32_t, std::int32_t> counts;
    std::int64_t generated = 0;
    bool in_think = false;           // a <think> block is open
    std::int64_t think_tokens = 0;   // tokens inside the open think block
    std::int64_t answer_tokens = 0;  // tokens outside any think block

    void add(std::int32_t t, const sampler_options& o) {
        ++counts[t];
        ++generated;
        if (in_think) {
            ++think_tokens;
            if (t == o.think_end) in_think = false;
        } else {
            ++answer_tokens;
        }
    }
};

// A decided token's log-probability under the model's own distribution (the raw logits' log-softmax,
// as llama-server and vLLM report it by default: before penalties, bias and temperature), with the
// `top` likeliest tokens (`exclude`, e.g. the mask token, never among them).
struct token_logprob {
    std::int32_t id = 0;
    float logprob = 0;
    std::vector<std::pair<std::int32_t, float>> top;  // likeliest first
};

inline token_logprob logprob_of(const float* logits, std::int64_t n, std::int32_t id, std::int32_t top, std::int32_t exclude = -1) {
    double mx = -INFINITY;
    for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
    double z = 0;
    for (std::int64_t i = 0; i < n; ++i) z += std::exp(double(logits[i]) - mx);
    const double lse = mx + std::log(z);
    token_logprob r;
    r.id = id;
    r.logprob = id >= 0 && id < n ? float(double(logits[id]) - lse) : -INFINITY;
    // The k likeliest by one scan (k is at most 20): an insertion into a short sorted list.
    const auto before = [&](std::int32_t a, std::int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    std::vector<std::int32_t> best;
    for (std::int64_t i = 0; i < n && top > 0; ++i) {
        if (i == exclude || std::isnan(logits[i])) continue;
        if (std::int64_t(best.size()) == top && !before(std::int32_t(i), best.back())) continue;
        if (std::int64_t(best.size()) == top) best.pop_back();
        best.insert(std::upper_bound(best.begin(), best.end(), std::int32_t(i), before), std::int32_t(i));
    }
    for (std::int32_t t : best) r.top.emplace_back(t, float(double(logits[t]) - lse));
    return r;
}

struct choice {
    std::int32_t id;
    float p;  // probability of id after penalties, ramps and temperature (1 for greedy ties)
};

class sampler {
public:
    explicit sampler(sampler_options o = {}) : o_(o), rng_(o.seed) {}
    const sampler_options& options() const { return o_; }

    // Penalties and ramps applied to a copy of the logits; `exclude` (e.g. the mask token) is
    // never chosen.
    void adjust(const float* logits, std::int64_t n, const history& h, std::int32_t exclude, std::vector<float>& out) const {
        out.assign(logits, logits + n);
        for (const auto& [t, b] : o_.logit_bias)
            if (t >= 0 && t < n) out[std::size_t(t)] += b;
        for (const auto& [t, c] : h.counts) {
            if (t < 0 || t >= n) continue;
            float& l = out[t];
            if (o_.repetition_penalty != 1.f) l = l > 0 ? l / o_.repetition_penalty : l * o_.repetition_penalty;
            l -= float(c) * o_.frequency_penalty + o_.presence_penalty;
        }
        if (h.in_think && o_.think_end >= 0 && o_.think_end < n && h.think_tokens > o_.think_ramp_start)
            out[o_.think_end] += o_.think_ramp_slope * float(h.think_tokens - o_.think_ramp_start);
        if (!h.in_think && o_.stop_token >= 0 && o_.stop_token < n && h.answer_tokens > o_.stop_ramp_start)
            out[o_.stop_token] += o_.stop_ramp_slope * float(h.answer_tokens - o_.stop_ramp_start);
        if (exclude >= 0 && exclude < n) out[exclude] = -INFINITY;
    }

    choice pick(const float* logits, std::int64_t n, const history& h, std::int32_t exclude = -1) {
        adjust(logits, n, h, exclude, adj_);
        if (o_.temperature <= 0.f) {
            const std::int32_t best = argmax(adj_.data(), n);
            double z = 0;
            for (std::int64_t i = 0; i < n; ++i) z += std::exp(double(adj_[i]) - double(adj_[best]));
            return {best, float(1.0 / z)};
        }
        idx_.resize(std::size_t(n));
        std::iota(idx_.begin(), idx_.end(), 0);
        std::int64_t keep = n;
        if (o_.top_k > 0 && o_.top_k < n) keep = o_.top_k;
        std::partial_sort(idx_.begin(), idx_.begin() + keep, idx_.end(), [&](std::int32_t a, std::int32_t b) {
            return adj_[a] != adj_[b] ? adj_[a] > adj_[b] : a < b;
        });
        p_.resize(std::size_t(keep));
        const double mx = adj_[idx_[0]];
        double sum = 0;
        for (std::int64_t i = 0; i < keep; ++i) sum += p_[i] = std::exp((double(adj_[idx_[i]]) - mx) / o_.temperature);
        for (auto& x : p_) x /= sum;
        // min-p: drop tokens below min_p × the top probability; top-p: smallest prefix reaching p.
        std::int64_t cut = keep;
        for (std::int64_t i = 1; i < keep; ++i)
            if (p_[i] < o_.min_p * p_[0]) { cut = i; break; }
        double acc = 0;
        for (std::int64_t i = 0; i < cut; ++i) {
            acc += p_[i];
            if (acc >= o_.top_p) { cut = i + 1; break; }
        }
        double total = 0;
        for (std::int64_t i = 0; i < cut; ++i) total += p_[i];
        double r = rng_.uniform() * total;
        std::int64_t chosen = cut - 1;
        for (std::int64_t i = 0; i < cut; ++i) {
            r -= p_[i];
            if (r <= 0) { chosen = i; break; }
        }
        return {idx_[chosen], float(p_[chosen] / total)};
    }

private:
    sampler_options o_;
    rng rng_;
    std::vector<float> adj_;
    std::vector<std::int32_t> idx_;
    std::vector<double> p_;
};

}  // namespace clover::decode
