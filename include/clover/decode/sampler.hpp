#pragma once
// Token choice from one row of logits. Greedy is argmax with ties to the lower id (what the
// peer does, so greedy runs can be compared token for token). Temperature sampling applies
// top-k, top-p and min-p and draws from the seeded generator.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "clover/core/rng.hpp"

namespace clover::decode {

struct sampler_options {
    float temperature = 0.f;  // 0: greedy
    std::int32_t top_k = 0;   // 0: off
    float top_p = 1.f;
    float min_p = 0.f;
    std::uint64_t seed = 0;
};

inline std::int32_t argmax(const float* logits, std::int64_t n) {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    return std::int32_t(best);
}

class sampler {
public:
    explicit sampler(sampler_options o = {}) : o_(o), rng_(o.seed) {}
    const sampler_options& options() const { return o_; }

    std::int32_t pick(const float* logits, std::int64_t n) {
        if (o_.temperature <= 0.f) return argmax(logits, n);
        idx_.resize(std::size_t(n));
        std::iota(idx_.begin(), idx_.end(), 0);
        std::int64_t keep = n;
        if (o_.top_k > 0 && o_.top_k < n) keep = o_.top_k;
        std::partial_sort(idx_.begin(), idx_.begin() + keep, idx_.end(), [&](std::int32_t a, std::int32_t b) {
            return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
        });
        p_.resize(std::size_t(keep));
        const float mx = logits[idx_[0]];
        double sum = 0;
        for (std::int64_t i = 0; i < keep; ++i) sum += p_[i] = std::exp((logits[idx_[i]] - mx) / o_.temperature);
        for (auto& x : p_) x = float(x / sum);
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
        for (std::int64_t i = 0; i < cut; ++i) {
            r -= p_[i];
            if (r <= 0) return idx_[i];
        }
        return idx_[cut - 1];
    }

private:
    sampler_options o_;
    rng rng_;
    std::vector<std::int32_t> idx_;
    std::vector<float> p_;
};

}  // namespace clover::decode
