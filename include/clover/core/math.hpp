#pragma once
// Scalar activation functions, each written once so every layer (and every backend's reference)
// uses the same formula.
#include <cmath>
#include <cstdint>

namespace clover::math {

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }
// PyTorch's softplus (beta 1, threshold 20), as HF and ggml use it.
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// y = x / sqrt(mean(x²) + eps) · w  (plain RMSNorm: GGUF norm weights already include the +1).
// The sum of squares is accumulated in double, as the peer does, so long rows agree closely.
inline void rms_norm(const float* x, const float* w, float* y, std::int64_t n, float eps) {
    double ss = 0;
    for (std::int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
    const float scale = 1.f / std::sqrt(float(ss / double(n)) + eps);
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (w ? w[i] : 1.f);
}

// L2 normalisation for GDN q/k heads: x / sqrt(Σx² + eps) (HF/FLA form; llama.cpp computes the
// same through rms_norm with eps/n).
inline void l2_norm(float* x, std::int64_t n, float eps) {
    double ss = 0;
    for (std::int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
    const float scale = 1.f / std::sqrt(float(ss) + eps);
    for (std::int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// In-place softmax over n logits (max-subtracted, fp32).
inline void softmax(float* x, std::int64_t n) {
    float m = x[0];
    for (std::int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - m);
        s += x[i];
    }
    const float inv = float(1.0 / s);
    for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace clover::math
