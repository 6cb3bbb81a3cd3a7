#pragma once
// Gated full attention (architecture.md §2.2): q_proj gives per head [query | gate]; q/k RMSNorm
// per head before partial NEOX rope; GQA (query head h reads KV head h / (n_head/n_head_kv));
// softmax over the cache and the new rows (causal); output ⊙ sigmoid(gate); o_proj.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "clover/backend/cpu/cpu.hpp"
#include "clover/backend/cpu/vec_ops.hpp"
#include "clover/core/math.hpp"
#include "clover/layers/rope.hpp"
#include "clover/model/passes.hpp"
#include "clover/model/session.hpp"
#include "clover/model/variants.hpp"
#include "clover/model/weights.hpp"
#include "clover/quant/half.hpp"

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
        const backend::matmul_job proj[3] = {{&w.wq, qg}, {&w.wk, k}, {&w.wv, v}};
        backend::matmul_all(be, proj, x, n);  // one parallel region, x quantized once
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

    // A run of cached or fresh key/value rows with a common stride, in F32 or (an F16 cache)
    // F16 bits (k16/v16 set, k/v null).
    struct kv_span {
        const float* k;
        const float* v;
        std::int64_t stride, n;
        const std::uint16_t* k16 = nullptr;
        const std::uint16_t* v16 = nullptr;
    };
    static kv_span cache_span(const attention_cache& c, std::int64_t off, std::int64_t stride, std::int64_t n) {
        if (c.f16()) return {nullptr, nullptr, stride, n, c.k16.data() + off, c.v16.data() + off};
        return {c.k.data() + off, c.v.data() + off, stride, n};
    }

    // One query head over the keys of up to two spans, in one softmax: out[hd].
    static void attend(const float* qh, kv_span a, kv_span b, std::int64_t hd, float scale, float* out,
                       std::vector<float>& p) {
        const std::int64_t n = a.n + b.n;
        p.resize(static_cast<std::size_t>(n));
        // SIMD dot/axpy (backend/cpu/vec_ops.hpp): fixed order per row, so verify rows still
        // equal AR rows; the plain loop was one add per 4 cycles (no vectorised reductions).
        namespace vo = backend::cpu_detail;
        auto scores = [&](const kv_span& sp, float* dst) {
            for (std::int64_t j = 0; j < sp.n; ++j)
                dst[j] = (sp.k16 ? vo::dot_f32_f16(qh, sp.k16 + j * sp.stride, hd) : vo::dot_f32(qh, sp.k + j * sp.stride, hd)) * scale;
        };
        scores(a, p.data());
        scores(b, p.data() + a.n);
        math::softmax(p.data(), n);
        for (std::int64_t i = 0; i < hd; ++i) out[i] = 0.f;
        auto values = [&](const kv_span& sp, const float* pj) {
            for (std::int64_t j = 0; j < sp.n; ++j) {
                if (sp.v16) vo::axpy_f16(pj[j], sp.v16 + j * sp.stride, out, hd);
                else vo::axpy(pj[j], sp.v + j * sp.stride, out, hd);
            }
        };
        values(a, p.data());
        values(b, p.data() + a.n);
    }

    static float scale_of(const dims<V>& d) {
        return d.h().attn_scale != 0.f ? d.h().attn_scale : 1.f / std::sqrt(float(d.head_dim()));
    }

    // Commit and verify passes: rows at positions [pos0, pos0+n) are appended to the cache, and
    // row t attends causally to keys [0, pos0+t].
    template <class Pass>
        requires(std::is_same_v<Pass, commit_pass> || std::is_same_v<Pass, verify_pass>)
    static void forward(Pass, Backend& be, const dims<V>& d, const attention_weights& w, attention_cache& c,
                        std::int64_t pos0, const float* x, float* out, std::int64_t n, workspace& ws) {
        const std::int64_t H = d.n_head(), Hkv = d.n_head_kv(), hd = d.head_dim(), kvw = Hkv * hd;
        float* q = workspace::get(ws.t0, std::size_t(n * H * hd));
        float* gate = workspace::get(ws.t1, std::size_t(n * H * hd));
        float* a = workspace::get(ws.t2, std::size_t(n * H * hd));
        if (c.f16()) {  // project into scratch, then round the new rows into the F16 cache
            float* kf = workspace::get(ws.t3, std::size_t(n * kvw));
            float* vf = workspace::get(ws.t4, std::size_t(n * kvw));
            project(be, d, w, x, n, pos0, q, gate, kf, vf, ws);
            for (std::int64_t i = 0; i < n * kvw; ++i) {
                c.k16[std::size_t(pos0 * kvw + i)] = quant::f32_to_f16(kf[i]);
                c.v16[std::size_t(pos0 * kvw + i)] = quant::f32_to_f16(vf[i]);
            }
        } else {
            project(be, d, w, x, n, pos0, q, gate, c.k.data() + pos0 * kvw, c.v.data() + pos0 * kvw, ws);
        }
        const float scale = scale_of(d);
        const std::int64_t group = H / Hkv;
        be.parallel_for(n * H, 4, [&](std::int64_t b, std::int64_t e) {
            std::vector<float> p;
            for (std::int64_t th = b; th < e; ++th) {
                const std::int64_t t = th / H, kvh = (th % H) / group;
                const kv_span cached = cache_span(c, kvh * hd, kvw, pos0 + t + 1);
                attend(q + th * hd, cached, {nullptr, nullptr, 0, 0}, hd, scale, a + th * hd, p);
            }
        });
        finish(be, w, a, gate, out, n * H * hd, n);
    }

    // Preview pass over the B block rows at positions [p, p+B): every row attends to all cached
    // positions < p and to all B block rows (no mask inside the block). Block K/V are computed
    // fresh and never cached.
    static void forward(preview_pass, Backend& be, const dims<V>& d, const attention_weights& w,
                        const attention_cache& c, std::int64_t p, const float* x, float* out, std::int64_t B,
                        workspace& ws) {
        const std::int64_t H = d.n_head(), Hkv = d.n_head_kv(), hd = d.head_dim(), kvw = Hkv * hd;
        float* q = workspace::get(ws.t0, std::size_t(B * H * hd));
        float* gate = workspace::get(ws.t1, std::size_t(B * H * hd));
        float* a = workspace::get(ws.t2, std::size_t(B * H * hd));
        float* kb = workspace::get(ws.t3, std::size_t(B * kvw));
        float* vb = workspace::get(ws.t4, std::size_t(B * kvw));
        project(be, d, w, x, B, p, q, gate, kb, vb, ws);
        const float scale = scale_of(d);
        const std::int64_t group = H / Hkv;
        be.parallel_for(B * H, 4, [&](std::int64_t b, std::int64_t e) {
            std::vector<float> pr;
            for (std::int64_t th = b; th < e; ++th) {
                const std::int64_t kvh = (th % H) / group;
                const kv_span cached = cache_span(c, kvh * hd, kvw, p);
                kv_span block{kb + kvh * hd, vb + kvh * hd, kvw, B};
                attend(q + th * hd, cached, block, hd, scale, a + th * hd, pr);
            }
        });
        finish(be, w, a, gate, out, B * H * hd, B);
    }

    // out = (a ⊙ sigmoid(gate)) · W_oᵀ
    static void finish(Backend& be, const attention_weights& w, float* a, const float* gate, float* out,
                       std::int64_t n_elems, std::int64_t n) {
        for (std::int64_t i = 0; i < n_elems; ++i) a[i] *= math::sigmoid(gate[i]);
        be.matmul(w.wo, a, out, n);
    }
};

}  // namespace clover::layers
