#pragma once
// The conformance table: one row per primitive of the backend concept (conformance.hpp runs
// each over every segment mix, its weight types and the odd shapes). A new primitive costs one
// row here, plus the few lines of its operation below.
#include <array>
#include <span>
#include <vector>

#include "../reference/reference_model.hpp"
#include "conformance.hpp"

namespace conformance {

namespace ops {

using backend::product_of;
constexpr float eps = 1e-6f;

template <class B>
void embed(env<B>& e) {
    const auto& w = e.weight_of("token_embd", e.c.type, e.c.sh->vocab, e.c.E());
    auto h = e.scratch(buf::h, e.c.E());
    e.be.embed(e.cx, e.bt, w, h);
    e.save("h", kind::dequant, h);
}
inline void embed_scalar(env_base& e) {
    const auto& w = e.weight_of("token_embd", e.c.type, e.c.sh->vocab, e.c.E());
    std::vector<float> h(std::size_t(e.n() * w.cols));
    for (std::int64_t r = 0; r < e.n(); ++r) quant::dequantize_row(w.type, w.row(e.bt.tokens()[std::size_t(r)]), h.data() + r * w.cols, w.cols);
    e.save_rows("h", kind::dequant, h, w.cols);
}

template <class B>
void rms_norm(env<B>& e) {
    const std::int64_t E = e.c.E();
    auto x = e.in(buf::h, "x", E, -2.f, 2.f), out = e.scratch(buf::u, E);
    e.be.rms_norm(e.cx, x, e.vec_weight("norm", E), out, eps);
    e.save("out", kind::math, out);
}
inline void rms_norm_scalar(env_base& e) {
    const std::int64_t E = e.c.E();
    const auto x = e.rows("x", E, -2.f, 2.f);
    std::vector<float> out;
    for (std::int64_t r = 0; r < e.n(); ++r) {
        const auto y = ref::rmsnorm(x, e.vec_weight("norm", E).f32(), std::size_t(r * E), std::size_t(E), eps);
        out.insert(out.end(), y.begin(), y.end());
    }
    e.save_rows("out", kind::math, out, E);
}

template <class B>
void add_rms_norm(env<B>& e) {
    const std::int64_t E = e.c.E();
    auto h = e.in(buf::h, "h", E, -2.f, 2.f), y = e.in(buf::y, "y", E), out = e.scratch(buf::u, E);
    e.be.add_rms_norm(e.cx, h, y, e.vec_weight("norm", E), out, eps);
    e.save("h", kind::exact, h);
    e.save("out", kind::math, out);
}
inline void add_rms_norm_scalar(env_base& e) {
    const std::int64_t E = e.c.E();
    auto h = e.rows("h", E, -2.f, 2.f);
    const auto y = e.rows("y", E);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += y[i];
    std::vector<float> out;
    for (std::int64_t r = 0; r < e.n(); ++r) {
        const auto o = ref::rmsnorm(h, e.vec_weight("norm", E).f32(), std::size_t(r * E), std::size_t(E), eps);
        out.insert(out.end(), o.begin(), o.end());
    }
    e.save_rows("h", kind::exact, h, E);
    e.save_rows("out", kind::math, out, E);
}

// Products sharing one input: two of the case's type and one F32 (two activation types).
struct products {
    const weight *w1, *w2, *w3;
    explicit products(env_base& e)
        : w1(&e.weight_of("w1", e.c.type, e.c.sh->out1, e.c.E())), w2(&e.weight_of("w2", e.c.type, e.c.sh->out2, e.c.E())),
          w3(&e.weight_of("w3", dtype::f32, e.c.sh->out2, e.c.E())) {}
};
template <class B>
void matmul_from(env<B>& e, typename B::tensor x) {
    const products p(e);
    auto y1 = e.scratch(buf::q, p.w1->rows), y2 = e.scratch(buf::k, p.w2->rows), y3 = e.scratch(buf::v, p.w3->rows);
    const std::array prods{product_of<typename B::tensor>{p.w1, y1}, product_of<typename B::tensor>{p.w2, y2},
                           product_of<typename B::tensor>{p.w3, y3}};
    e.be.matmul(e.cx, e.bt, x, std::span<const product_of<typename B::tensor>>(prods));
    e.save("y1", kind::product, y1);
    e.save("y2", kind::product, y2);
    e.save("y3", kind::product, y3);
}
template <class B>
void matmul(env<B>& e) {
    matmul_from(e, e.in(buf::u, "x", e.c.E()));
}
// The norm's output as the products' input (a backend may fuse the two).
template <class B>
void norm_matmul(env<B>& e) {
    const std::int64_t E = e.c.E();
    auto x = e.in(buf::h, "x", E, -2.f, 2.f), u = e.scratch(buf::u, E);
    e.be.rms_norm(e.cx, x, e.vec_weight("norm", E), u, eps);
    matmul_from(e, u);
}
// ref::mat: weights dequantized, the input rounded to the partner type, the sum in double.
inline ref::mat dequantized(const weight& w) {
    ref::mat m;
    m.rows = w.rows;
    m.cols = w.cols;
    m.stored = w.type;
    m.w.resize(std::size_t(w.rows * w.cols));
    for (std::int64_t r = 0; r < w.rows; ++r) quant::dequantize_row(w.type, w.row(r), m.w.data() + r * w.cols, w.cols);
    return m;
}
inline void products_scalar(env_base& e, const std::vector<float>& x) {
    const products p(e);
    const std::int64_t E = e.c.E();
    // (names from a table: GCC 12 warns -Wrestrict, falsely, on "y" + std::to_string(i))
    static constexpr const char* names[] = {"y1", "y2", "y3"};
    int i = 0;
    for (const weight* w : {p.w1, p.w2, p.w3}) {
        const ref::mat m = dequantized(*w);
        std::vector<float> y;
        for (std::int64_t r = 0; r < e.n(); ++r) {
            const auto yr = m.apply(std::vector<float>(x.begin() + r * E, x.begin() + (r + 1) * E));
            y.insert(y.end(), yr.begin(), yr.end());
        }
        e.save_rows(names[i++], kind::product, y, w->rows);
    }
}
inline void matmul_scalar(env_base& e) { products_scalar(e, e.rows("x", e.c.E())); }
inline void norm_matmul_scalar(env_base& e) {
    const std::int64_t E = e.c.E();
    const auto x = e.rows("x", E, -2.f, 2.f);
    std::vector<float> u;
    for (std::int64_t r = 0; r < e.n(); ++r) {
        const auto y = ref::rmsnorm(x, e.vec_weight("norm", E).f32(), std::size_t(r * E), std::size_t(E), eps);
        u.insert(u.end(), y.begin(), y.end());
    }
    products_scalar(e, u);
}

template <class B>
void lm_head(env<B>& e) {
    const std::int64_t E = e.c.E(), V = e.c.sh->vocab;
    const auto& w = e.weight_of("output", e.c.type, V, E);
    auto x = e.in(buf::u, "x", E);
    auto logits = e.cx.get(buf::logits, e.bt.n_logits(), V);
    e.be.lm_head(e.cx, e.bt, w, x, logits);
    std::vector<float> host(std::size_t(e.bt.n_logits() * V));
    e.be.read_logits(e.cx, logits, host.data());
    e.save_logits("logits", kind::product, host, V);
}
inline void lm_head_scalar(env_base& e) {
    const std::int64_t E = e.c.E();
    const ref::mat m = dequantized(e.weight_of("output", e.c.type, e.c.sh->vocab, E));
    const auto x = e.rows("x", E);
    std::vector<float> host;
    for (std::int32_t r : e.bt.logits_rows()) {
        const auto y = m.apply(std::vector<float>(x.begin() + r * E, x.begin() + (r + 1) * E));
        host.insert(host.end(), y.begin(), y.end());
    }
    e.save_logits("logits", kind::product, host, m.rows);
}

// Gated attention: attn_prepare (norms, rope, the KV append) then attention; the case's type is
// the KV pages' (F16 or F32).
template <class B>
void attention(env<B>& e) {
    const auto as = e.c.attention();
    const std::int64_t H = as.n_head, hd = as.head_dim, kvw = as.n_head_kv * hd;
    const backend::attention_norms norms{&e.vec_weight("q_norm", hd), &e.vec_weight("k_norm", hd)};
    auto qg = e.in(buf::qg, "qg", H * 2 * hd), k = e.in(buf::k, "k", kvw), v = e.in(buf::v, "v", kvw);
    auto q = e.scratch(buf::q, H * hd), gate = e.scratch(buf::gate, H * hd), out = e.scratch(buf::attn, H * hd);
    e.be.attn_prepare(e.cx, e.bt, *e.st, tested_layer, as, norms, qg, k, v, q, gate);
    e.save("q", kind::math, q);
    e.save("gate", kind::exact, gate);
    e.save("k", kind::math, k);
    e.be.attention(e.cx, e.bt, *e.st, tested_layer, as, q, gate, k, v, out);
    e.save("out", kind::math, out);
}

inline backend::gdn_params gdn_weights(env_base& e) {
    const auto g = e.c.gdn();
    const std::int64_t C = g.channels, K = g.conv, Hv = g.v_heads;
    return {&e.vec_weight("conv", C * K, -1.f, 1.f, C), &e.vec_weight("conv_right", C * (K - 1), -1.f, 1.f, C),
            &e.vec_weight("dt_bias", Hv, -1.f, 1.f),     &e.vec_weight("a", Hv, -1.f, -0.1f),
            &e.vec_weight("bd_scale", Hv, 0.5f, 2.f),    &e.vec_weight("bd_bias", Hv, -1.f, 1.f),
            &e.vec_weight("bd_c", Hv, 0.5f, 1.5f)};
}
template <class B>
typename B::tensor gdn_conv_from(env<B>& e) {
    const auto g = e.c.gdn();
    auto m = e.in(buf::conv_in, "m", g.channels), y = e.scratch(buf::conv_out, g.channels);
    e.be.gdn_conv(e.cx, e.bt, *e.st, tested_layer, g, gdn_weights(e), m, y);
    e.save("y", kind::math, y);
    return y;
}
template <class B>
void gdn_conv(env<B>& e) {
    gdn_conv_from(e);
}
// The conv makes the mix's input (normalised q and k heads, as the layer feeds it).
template <class B>
void gdn_mix(env<B>& e) {
    const auto g = e.c.gdn();
    auto y = gdn_conv_from(e);
    auto beta = e.in(buf::beta, "beta", g.v_heads, -2.f, 2.f), alpha = e.in(buf::alpha, "alpha", g.v_heads);
    auto o = e.scratch(buf::o, g.v_heads * g.dv);
    e.be.gdn_mix(e.cx, e.bt, *e.st, tested_layer, g, gdn_weights(e), y, beta, alpha, o);
    e.save("o", kind::recurrent, o);
}

template <class B>
void gated_norm(env<B>& e) {
    const auto g = e.c.gdn();
    const std::int64_t inner = g.v_heads * g.dv;
    auto o = e.in(buf::o, "o", inner, -2.f, 2.f), z = e.in(buf::z, "z", inner, -3.f, 3.f);
    e.be.gated_norm(e.cx, g, e.vec_weight("norm", g.dv), o, z);
    e.save("o", kind::math, o);
}
inline void gated_norm_scalar(env_base& e) {
    const auto g = e.c.gdn();
    const std::int64_t inner = g.v_heads * g.dv;
    const auto o = e.rows("o", inner, -2.f, 2.f), z = e.rows("z", inner, -3.f, 3.f);
    std::vector<float> out;
    for (std::int64_t r = 0; r < e.n() * g.v_heads; ++r) {
        const auto y = ref::rmsnorm(o, e.vec_weight("norm", g.dv).f32(), std::size_t(r * g.dv), std::size_t(g.dv), g.rms_eps);
        for (std::int64_t j = 0; j < g.dv; ++j) out.push_back(y[std::size_t(j)] * ref::silu(z[std::size_t(r * g.dv + j)]));
    }
    e.save_rows("o", kind::math, out, inner);
}

// The router's product, softmax, coreset and top-k; the router of the case's type.
template <class B>
void moe_route(env<B>& e) {
    const auto ms = e.c.moe(true);
    const auto& router = e.weight_of("router", e.c.type, ms.n_expert, e.c.E());
    auto x = e.in(buf::u, "x", e.c.E());
    auto r = e.cx.get_route(e.n(), ms.n_expert_used);
    e.be.moe_route(e.cx, e.bt, ms, router, x, r);
    e.save_route(r);
}

// Routed experts (and the shared expert) over a given route: stacked or merged gate|up.
enum class ffn_form { shared, routed_only, merged };
template <ffn_form form, class B>
void moe_ffn(env<B>& e) {
    const auto ms = e.c.moe(form != ffn_form::routed_only);
    const std::int64_t E = e.c.E(), X = ms.n_expert, F = ms.n_ff, Fs = e.c.Fs();
    const dtype t = e.c.type;
    backend::moe_params mp{};
    if (form == ffn_form::merged) {
        mp.gate_up_exps = &e.weight_of("blk.0.ffn_gate_up_exps.weight", t, 2 * F, E, X);
    } else {
        mp.gate_exps = &e.weight_of("blk.0.ffn_gate_exps.weight", t, F, E, X);
        mp.up_exps = &e.weight_of("blk.0.ffn_up_exps.weight", t, F, E, X);
    }
    mp.down_exps = &e.weight_of("blk.0.ffn_down_exps.weight", t, E, F, X);
    if (ms.n_ff_shared) {
        mp.shexp_gate = &e.vec_weight("blk.0.ffn_gate_inp_shexp.weight", E, -1.f, 1.f);
        mp.gate_shexp = &e.weight_of("blk.0.ffn_gate_shexp.weight", t, Fs, E);
        mp.up_shexp = &e.weight_of("blk.0.ffn_up_shexp.weight", t, Fs, E);
        mp.down_shexp = &e.weight_of("blk.0.ffn_down_shexp.weight", t, E, Fs);
    }
    auto x = e.in(buf::u, "x", E);
    auto r = e.route_in(X, ms.n_expert_used);
    auto out = e.scratch(buf::y, E);
    e.be.moe_ffn(e.cx, e.bt, ms, mp, x, r, out);
    e.save("out", kind::chain, out);
}

}  // namespace ops

inline const std::vector<dtype> f32_only = {dtype::f32};
inline const std::vector<dtype> kv_pages = {dtype::f16, dtype::f32};

// The table. Columns: primitive, weight types, the state it needs, its operation, a scalar
// reference (where one exists; attention, GDN and MoE are checked against the reference model
// at the level of whole models, tests/model/test_model.cpp).
template <class B>
std::vector<row<B>> table() {
    const auto& all = weight_types();
    return {
        {"embed", all, needs::nothing, &ops::embed<B>, &ops::embed_scalar},
        {"rms_norm", f32_only, needs::nothing, &ops::rms_norm<B>, &ops::rms_norm_scalar},
        {"add_rms_norm", f32_only, needs::nothing, &ops::add_rms_norm<B>, &ops::add_rms_norm_scalar},
        {"matmul", all, needs::nothing, &ops::matmul<B>, &ops::matmul_scalar},
        {"rms_norm + matmul", all, needs::nothing, &ops::norm_matmul<B>, &ops::norm_matmul_scalar},
        {"lm_head + read_logits", all, needs::nothing, &ops::lm_head<B>, &ops::lm_head_scalar},
        {"attn_prepare + attention", kv_pages, needs::attention, &ops::attention<B>},
        {"gdn_conv", f32_only, needs::gdn_conv, &ops::gdn_conv<B>},
        {"gdn_conv + gdn_mix", f32_only, needs::gdn, &ops::gdn_mix<B>},
        {"gated_norm", f32_only, needs::nothing, &ops::gated_norm<B>, &ops::gated_norm_scalar},
        {"moe_route", all, needs::nothing, &ops::moe_route<B>, nullptr, false},
        {"moe_ffn", all, needs::nothing, &ops::moe_ffn<ops::ffn_form::shared, B>},
        {"moe_ffn without a shared expert", all, needs::nothing, &ops::moe_ffn<ops::ffn_form::routed_only, B>},
        {"moe_ffn, merged gate|up", all, needs::nothing, &ops::moe_ffn<ops::ffn_form::merged, B>},
    };
}

}  // namespace conformance
