#pragma once
// Gated full attention (architecture.md §2.2): q_proj gives per head [query | gate]; q/k RMSNorm
// per head before partial NEOX rope; GQA (query head h reads KV head h / (n_head/n_head_kv));
// softmax over the cache and the new rows (causal); output ⊙ sigmoid(gate); o_proj.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "clover/core/math.hpp"
#include "clover/layers/rope.hpp"
#include "clover/model/passes.hpp"
#include "clover/model/session.hpp"
#include "clover/model/variants.hpp"
#include "clover/model/weights.hpp"

namespace clover::layers {

template <variant V, class Backend>
struct gated_attention {
    static rope_params rope_of(const dims<V>& d) {
        return {d.n_rot(), d.h().rope_theta, d.h().rope_sections};
    }

    // Projects x [n, n_embd] into normed+roped q [n, n_head, hd], gate [n, n_head*hd], k and v
    // [n, n_kv*hd], for rows at positions pos0 + t.
    static void project(Backend& be, const dims<V>& d, const attention_weights& w, const float* x, std::int64_t n,
                        std::int64_t pos0, float* q, float* gate, float* k, float* v, workspace& ws) {
        const std::int64_t H = d.n_head(), Hkv = d.n_head_kv(), hd = d.head_dim();
        float* qg = workspace::get(ws.t5, std::size_t(n * H * 2 * hd));  // [n, H, 2*hd]
        be.matmul(w.wq, x, qg, n);
        be.matmul(w.wk, x, k, n);
        be.matmul(w.wv, x, v, n);
        const float eps = d.h().rms_eps;
        const rope_params rp = rope_of(d);
        std::vector<float> cs(std::size_t(rp.n_rot));
        for (std::int64_t t = 0; t < n; ++t) {
            rope_cache(rp, pos0 + t, cs.data());
            for (std::int64_t h = 0; h < H; ++h) {
                const float* src = qg + (t * H + h) * 2 * hd;
                float* qh = q + (t * H + h) * hd;
                math::rms_norm(src, w.q_norm.f32(), qh, hd, eps);
                rope_apply(qh, rp.n_rot, cs.data());
                std::memcpy(gate + (t * H + h) * hd, src + hd, std::size_t(hd) * 4);
            }
            for (std::int64_t h = 0; h < Hkv; ++h) {
                float* kh = k + (t * Hkv + h) * hd;
                math::rms_norm(kh, w.k_norm.f32(), kh, hd, eps);
                rope_apply(kh, rp.n_rot, cs.data());
            }
        }
    }

    // One query head over keys [0, n_keys) of K/V rows with stride `kv_stride`: out[hd].
    static void attend(const float* qh, const float* K, const float* Vv, std::int64_t kv_stride, std::int64_t n_keys,
                       std::int64_t hd, float scale, float* out, std::vector<float>& p) {
        p.resize(std::size_t(n_keys));
        for (std::int64_t j = 0; j < n_keys; ++j) {
            const float* kj = K + j * kv_stride;
            float s = 0.f;
            for (std::int64_t i = 0; i < hd; ++i) s += qh[i] * kj[i];
            p[j] = s * scale;
        }
        math::softmax(p.data(), n_keys);
        for (std::int64_t i = 0; i < hd; ++i) out[i] = 0.f;
        for (std::int64_t j = 0; j < n_keys; ++j) {
            const float* vj = Vv + j * kv_stride;
            const float pj = p[j];
            for (std::int64_t i = 0; i < hd; ++i) out[i] += pj * vj[i];
        }
    }

    static float scale_of(const dims<V>& d) {
        return d.h().attn_scale != 0.f ? d.h().attn_scale : 1.f / std::sqrt(float(d.head_dim()));
    }

    // Commit pass: rows at positions [pos0, pos0+n) are appended to the cache.
    static void forward(commit_pass, Backend& be, const dims<V>& d, const attention_weights& w, attention_cache& c,
                        std::int64_t pos0, const float* x, float* out, std::int64_t n, workspace& ws) {
        const std::int64_t H = d.n_head(), Hkv = d.n_head_kv(), hd = d.head_dim(), kvw = Hkv * hd;
        float* q = workspace::get(ws.t0, std::size_t(n * H * hd));
        float* gate = workspace::get(ws.t1, std::size_t(n * H * hd));
        float* a = workspace::get(ws.t2, std::size_t(n * H * hd));
        float* kc = c.k.data() + pos0 * kvw;
        float* vc = c.v.data() + pos0 * kvw;
        project(be, d, w, x, n, pos0, q, gate, kc, vc, ws);
        const float scale = scale_of(d);
        const std::int64_t group = H / Hkv;
        be.parallel_for(n * H, 4, [&](std::int64_t b, std::int64_t e) {
            std::vector<float> p;
            for (std::int64_t th = b; th < e; ++th) {
                const std::int64_t t = th / H, h = th % H, kvh = h / group;
                attend(q + th * hd, c.k.data() + kvh * hd, c.v.data() + kvh * hd, kvw, pos0 + t + 1, hd, scale,
                       a + th * hd, p);
            }
        });
        for (std::int64_t i = 0; i < n * H * hd; ++i) a[i] *= math::sigmoid(gate[i]);
        be.matmul(w.wo, a, out, n);
    }
};

}  // namespace clover::layers
