#pragma once
// Gated DeltaNet token mixer (architecture.md §2.4) as backend primitives: qkv/z/β/α
// projections, causal depthwise conv over the sequence's ring (+ look-ahead taps in preview
// passes), SiLU, per-head L2 norm, the gated delta rule (block softmax with a history slot in
// preview passes, clover-diffusion.md §3), gated RMSNorm, output projection. The layer owns its
// tensors (gdn_weights::bind, bind_diffusion), its state spec and its forward.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/core/batch.hpp"
#include "clover/schema/dims.hpp"
#include "clover/schema/hparams.hpp"
#include "clover/schema/weights.hpp"

namespace clover::layers {

template <variant V>
struct gated_deltanet;

// The tensors of one Gated DeltaNet layer; variant-independent like attention_weights.
struct gdn_weights {
    template <variant V>
    using layer = gated_deltanet<V>;  // the layer that runs these weights (model::forward visits by it)

    weight qkv;     // [conv_channels, n_embd]: Q heads | K heads | V heads
    weight z;       // [d_inner, n_embd]
    weight beta, alpha;  // [n_v_heads, n_embd]
    weight conv;    // [conv_channels][K] f32, index 0 = oldest input
    weight dt_bias, a;   // [n_v_heads] f32; a = -exp(A_log)
    weight norm;    // [dv] f32, shared by all V heads
    weight out;     // [n_embd, d_inner]
    // block-diffusion extras (clover-diffusion.md §6); empty unless the architecture binds them
    // (bind_diffusion) and the file has them
    weight conv_right;  // [conv_channels][K-1] f32, index 0 = nearest future row
    weight bd_scale, bd_bias, bd_c;  // [n_v_heads] f32
    bool has_diffusion() const { return conv_right && bd_scale && bd_bias && bd_c; }
    // The matrices only products read (weight_memory::products).
    void products(std::vector<weight*>& dst) { dst.insert(dst.end(), {&qkv, &z, &beta, &alpha, &out}); }

    // The causal tensors under prefix p ("blk.N."): every one is required.
    static gdn_weights bind(weight_binder& b, const std::string& p, const hparams& h) {
        const std::int64_t E = h.n_embd, C = h.gdn_conv_channels(), K = h.ssm_conv, Hv = h.gdn_v_heads();
        gdn_weights g;
        g.qkv = b.matrix(p + "attn_qkv.weight", {E, C});
        g.z = b.matrix(p + "attn_gate.weight", {E, h.ssm_d_inner});
        g.beta = b.matrix(p + "ssm_beta.weight", {E, Hv});
        g.alpha = b.matrix(p + "ssm_alpha.weight", {E, Hv});
        g.conv = b.vector_f32(p + "ssm_conv1d.weight", {K, C});
        g.dt_bias = b.vector_f32(p + "ssm_dt.bias", {Hv});
        g.a = b.vector_f32(p + "ssm_a", {Hv});
        g.norm = b.vector_f32(p + "ssm_norm.weight", {h.gdn_dv()});
        g.out = b.matrix(p + "ssm_out.weight", {h.ssm_d_inner, E});
        return g;
    }

    // The block-diffusion tensors (clover_moe). They are optional: a file without them still
    // runs causally, so the absent ones are appended to `missing` (named in the error of a
    // preview pass) instead of failing the load. A present one must have its shape.
    void bind_diffusion(weight_binder& b, const std::string& p, const hparams& h, std::vector<std::string>& missing) {
        const std::int64_t C = h.gdn_conv_channels(), K = h.ssm_conv, Hv = h.gdn_v_heads();
        conv_right = b.vector_f32(p + "ssm_conv1d_right.weight", {K - 1, C}, false);
        bd_scale = b.vector_f32(p + "ssm_bd_logit_scale", {Hv}, false);
        bd_bias = b.vector_f32(p + "ssm_bd_history_bias", {Hv}, false);
        bd_c = b.vector_f32(p + "ssm_bd_history_c", {Hv}, false);
        if (!conv_right) missing.push_back(p + "ssm_conv1d_right.weight");
        if (!bd_scale) missing.push_back(p + "ssm_bd_logit_scale");
        if (!bd_bias) missing.push_back(p + "ssm_bd_history_bias");
        if (!bd_c) missing.push_back(p + "ssm_bd_history_c");
    }
};

template <variant V>
struct gated_deltanet {
    using weights = gdn_weights;

    // What it keeps per sequence: the state [Hv][dk][dv] and a ring of the last K-1 conv inputs.
    static backend::layer_state_spec state_spec(const dims<V>& d) {
        backend::layer_state_spec s;
        s.k = backend::layer_state_spec::kind::gdn;
        s.gdn_heads = d.v_heads();
        s.gdn_dk = d.dk();
        s.gdn_dv = d.dv();
        s.conv_rows = d.ssm_conv() - 1;
        s.conv_channels = d.conv_channels();
        return s;
    }
    static backend::gdn_shape shape(const dims<V>& d) {
        return {d.qk_heads(), d.v_heads(), d.dk(), d.dv(), d.ssm_conv(), d.conv_channels(), d.h().rms_eps,
                d.h().gdn_grouped_heads};
    }
    static backend::gdn_params params(const weights& w) {
        return {&w.conv, &w.conv_right, &w.dt_bias, &w.a, &w.bd_scale, &w.bd_bias, &w.bd_c};
    }

    // x: [n, n_embd] normed input -> out: [n, n_embd]. Five primitives.
    template <backend::backend_for B>
    static void forward(B& be, typename B::context& cx, typename B::state& st, const batch& bt, std::int64_t layer,
                        const dims<V>& d, const weights& w, typename B::tensor x, typename B::tensor out) {
        using backend::buf;
        using T = typename B::tensor;
        const std::int64_t n = bt.rows(), C = d.conv_channels(), Hv = d.v_heads(), inner = d.ssm_d_inner();
        T m = cx.get(buf::conv_in, n, C);      // pre-conv q|k|v rows
        T y = cx.get(buf::conv_out, n, C);     // post-conv rows
        T z = cx.get(buf::z, n, inner);        // output gate
        T beta = cx.get(buf::beta, n, Hv);
        T alpha = cx.get(buf::alpha, n, Hv);
        T o = cx.get(buf::o, n, inner);        // [n, Hv, dv]
        const std::array<backend::product_of<T>, 4> proj{{{&w.qkv, m}, {&w.z, z}, {&w.beta, beta}, {&w.alpha, alpha}}};
        be.matmul(cx, bt, x, proj);
        const auto sh = shape(d);
        const auto pw = params(w);
        be.gdn_conv(cx, bt, st, layer, sh, pw, m, y);
        be.gdn_mix(cx, bt, st, layer, sh, pw, y, beta, alpha, o);
        be.gated_norm(cx, sh, w.norm, o, z);
        const std::array<backend::product_of<T>, 1> po{{{&w.out, out}}};
        be.matmul(cx, bt, o, po);
    }
};

}  // namespace clover::layers
