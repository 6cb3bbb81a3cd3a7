#pragma once
// Partial NEOX rotary embedding with Qwen3.5's interleaved multi-section rule (architecture.md
// §2.3). For text every position stream equals the token position, except the fourth ("extra")
// stream, which is 0 — frequency slots that fall into it are not rotated. With no sections the
// rule reduces to plain NEOX partial rope.
#include <array>
#include <cmath>
#include <cstdint>

namespace clover::backend::cpu_detail {

struct rope_params {
    std::int64_t n_rot = 0;  // rotated dims (pairs (i, i + n_rot/2))
    float theta = 10000.f;
    std::array<int, 4> sections{0, 0, 0, 0};
};

// cs: [n_rot/2][2] = (cos, sin) for position `pos`. Angles are built by repeated multiplication
// in float, the same recurrence the peer uses, so positions far out agree to rounding.
inline void rope_cache(const rope_params& r, std::int64_t pos, float* cs) {
    const std::int64_t half = r.n_rot / 2;
    const float scale = std::pow(r.theta, -2.0f / float(r.n_rot));
    const int sect = r.sections[0] + r.sections[1] + r.sections[2] + r.sections[3];
    float th = float(pos);
    for (std::int64_t i = 0; i < half; ++i) {
        float angle = th;
        if (sect > 0) {
            const int s = int(i % sect);
            const bool t_stream = s % 3 == 0 && s < 3 * r.sections[0];
            const bool h_stream = s % 3 == 1 && s < 3 * r.sections[1];
            const bool w_stream = s % 3 == 2 && s < 3 * r.sections[2];
            if (!(t_stream || h_stream || w_stream)) angle = 0.f;  // extra stream: position 0 for text
        }
        cs[2 * i] = std::cos(angle);
        cs[2 * i + 1] = std::sin(angle);
        th *= scale;
    }
}

// x: one head [head_dim]; rotates the first n_rot dims in place.
inline void rope_apply(float* x, std::int64_t n_rot, const float* cs) {
    const std::int64_t half = n_rot / 2;
    for (std::int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
}

}  // namespace clover::backend::cpu_detail
