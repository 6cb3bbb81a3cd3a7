#pragma once
// Helpers shared by the test executables.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <clover/core/error.hpp>
#include <clover/core/rng.hpp>
#include <clover/model/synth.hpp>

namespace testutil {

// The message of the clover::error f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const clover::error& e) {
        return e.what();
    }
    return "(no error)";
}

inline std::string tmp(const std::string& name) { return std::string(CLOVER_TEST_TMP) + "/" + name; }

// Writes a synthetic model once per test run (keyed by file name).
inline std::string synth_file(const std::string& name, const clover::synth::spec& s) {
    const std::string path = tmp(name);
    clover::synth::write(s, path);
    return path;
}

// An odd-shaped spec: nothing is a power of two, dk != dv, 3 V heads per QK head, a conv of 3,
// attention every 2nd layer, and rope sections that leave one frequency slot on the "extra"
// stream (not rotated for text).
inline clover::synth::spec odd_spec() {
    clover::synth::spec s;
    s.preset = "odd";
    s.n_vocab = 300; s.n_embd = 40; s.n_layer = 5; s.interval = 2;
    s.n_head = 6; s.n_head_kv = 2; s.head_dim = 12; s.n_rot = 8; s.sections = {1, 1, 0, 1};
    s.rope_theta = 5000.f;
    s.ssm_conv = 3; s.ssm_d_state = 5; s.ssm_n_group = 2; s.ssm_dt_rank = 6; s.ssm_d_inner = 42;
    s.n_expert = 5; s.n_expert_used = 3; s.n_ff_exp = 9; s.n_ff_shexp = 11;
    s.seed = 7;
    return s;
}

// The odd shapes with rope sections HF can express (three streams covering every slot), for the
// HF folder tests.
inline clover::synth::spec hf_odd_spec(const std::string& arch, clover::dtype t = clover::dtype::f32) {
    clover::synth::spec s = odd_spec();
    s.arch = arch;
    s.sections = {2, 1, 1, 0};
    s.type = t;
    return s;
}

// An odd-shaped block-diffusion model (clover_moe).
inline clover::synth::spec clover_odd_spec() {
    auto s = odd_spec();
    s.arch = "clover_moe";
    return s;
}

// n token ids below `vocab`, from a seed.
inline std::vector<std::int32_t> random_ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    clover::rng r(seed);
    std::vector<std::int32_t> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(std::int32_t(r.next() % std::uint64_t(vocab)));
    return v;
}

inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed, float lo = -1.f, float hi = 1.f) {
    clover::rng r(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = r.uniform(lo, hi);
    return v;
}

// Bit-for-bit equality of two float vectors. memcmp is not called on an empty vector's data(),
// which may be null (undefined even for 0 bytes).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
inline float max_abs(const std::vector<float>& v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

inline float max_abs_diff(const float* a, const float* b, std::size_t n) {
    float m = 0;
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace testutil
