#pragma once
// A small deterministic generator (splitmix64): the same seed gives the same synthetic model and
// the same sampled tokens on every machine, unlike std::uniform_*_distribution.
#include <cstdint>

namespace clover {

struct rng {
    std::uint64_t state;
    explicit rng(std::uint64_t seed) : state(seed) {}
    std::uint64_t next() {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, 1).
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
    float uniform(float lo, float hi) { return lo + float(uniform()) * (hi - lo); }
};

}  // namespace clover
