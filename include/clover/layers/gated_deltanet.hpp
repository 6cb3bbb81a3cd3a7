#pragma once
// Gated DeltaNet token mixer (architecture.md §2.4) as backend primitives: qkv/z/β/α
// projections, causal depthwise conv over the sequence's ring (+ look-ahead taps in preview
// passes), SiLU, per-head L2 norm, the gated delta rule (block softmax with a history slot in
// preview passes, clover-diffusion.md §3), gated RMSNorm, output projection.
#include <array>
#include <cstdint>

#include "clover/arch/dims.hpp"
#include "clover/arch/weights.hpp"
#include "clover/backend/concept.hpp"
#include "clover/core/batch.hpp"

namespace clover::layers {

template <variant V>
struct gated_deltanet {
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
    static backend::gdn_params params(const gdn_weights& w) {
        return {&w.conv, &w.conv_right, &w.dt_bias, &w.a, &w.bd_scale, &w.bd_bias, &w.bd_c};
    }

    // x: [n, n_embd] normed input -> out: [n, n_embd]. Five primitives.
    template <backend::backend_for B>
    static void forward(B& be, typename B::context& cx, typename B::state& st, const batch& bt, std::int64_t layer,
                        const dims<V>& d, const gdn_weights& w, typename B::tensor x, typename B::tensor out) {
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
