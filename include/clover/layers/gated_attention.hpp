#pragma once
// Gated full attention (architecture.md §2.2) as backend primitives: q_proj gives per head
// [query | gate]; q/k RMSNorm per head before partial NEOX rope; GQA; softmax over the paged
// cache and the new rows (causal; preview blocks bidirectional within the block); output ⊙
// sigmoid(gate); o_proj. The layer owns its tensors (attention_weights::bind), says what it
// keeps per sequence (state_spec) and runs as primitives of the backend concept (forward).
#include <array>
#include <cmath>
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
struct gated_attention;

// The tensors of one gated-attention layer. They do not depend on the variant (sizes come from
// the file), so one binding serves every dims<V>.
struct attention_weights {
    template <variant V>
    using layer = gated_attention<V>;  // the layer that runs these weights (model::forward visits by it)

    weight wq;      // [n_head*2*head_dim, n_embd]: per head [query | gate]
    weight wk, wv;  // [n_head_kv*head_dim, n_embd]
    weight wo;      // [n_embd, n_head*head_dim]
    weight q_norm, k_norm;  // [head_dim] f32

    // The matrices only products read (weight_memory::products). Each row view of a merged
    // q|k|v tensor is a matrix of its own there, its 16-row groups counted from its first row.
    void products(std::vector<weight*>& out) { out.insert(out.end(), {&wq, &wk, &wv, &wo}); }

    // Binds blk.N.attn_* under prefix p ("blk.N."). Files merge q|k|v into one attn_qkv tensor
    // or keep three; both become three row views, so forward sees one shape.
    static attention_weights bind(weight_binder& b, const std::string& p, const hparams& h) {
        const std::int64_t E = h.n_embd, hd = h.head_dim, nq = h.n_head * hd, nkv = h.n_head_kv * hd;
        attention_weights a;
        if (b.has(p + "attn_qkv.weight")) {  // merged q|k|v rows
            weight qkv = b.matrix(p + "attn_qkv.weight", {E, 2 * nq + 2 * nkv});
            a.wq = qkv.row_slice(0, 2 * nq);
            a.wk = qkv.row_slice(2 * nq, nkv);
            a.wv = qkv.row_slice(2 * nq + nkv, nkv);
        } else {
            a.wq = b.matrix(p + "attn_q.weight", {E, 2 * nq});
            a.wk = b.matrix(p + "attn_k.weight", {E, nkv});
            a.wv = b.matrix(p + "attn_v.weight", {E, nkv});
        }
        a.wo = b.matrix(p + "attn_output.weight", {nq, E});
        a.q_norm = b.vector_f32(p + "attn_q_norm.weight", {hd});
        a.k_norm = b.vector_f32(p + "attn_k_norm.weight", {hd});
        return a;
    }
};

template <variant V>
struct gated_attention {
    using weights = attention_weights;

    // What it keeps per sequence: K and V rows of n_head_kv heads.
    static backend::layer_state_spec state_spec(const dims<V>& d) {
        backend::layer_state_spec s;
        s.k = backend::layer_state_spec::kind::attention;
        s.kv_width = d.n_head_kv() * d.head_dim();
        s.n_head = d.n_head();
        s.head_dim = d.head_dim();
        return s;
    }
    static backend::attention_shape shape(const dims<V>& d) {
        const auto& h = d.h();
        backend::attention_shape a{d.n_head(), d.n_head_kv(), d.head_dim(), d.n_rot(), h.rope_theta, h.rms_eps,
                                   h.attn_scale != 0.f ? h.attn_scale : 1.f / std::sqrt(float(d.head_dim())),
                                   {h.rope_sections[0], h.rope_sections[1], h.rope_sections[2], h.rope_sections[3]}};
        return a;
    }

    // x: [n, n_embd] normed input -> out: [n, n_embd]. Five primitives.
    template <backend::backend_for B>
    static void forward(B& be, typename B::context& cx, typename B::state& st, const batch& bt, std::int64_t layer,
                        const dims<V>& d, const weights& w, typename B::tensor x, typename B::tensor out) {
        using backend::buf;
        using T = typename B::tensor;
        const std::int64_t n = bt.rows(), H = d.n_head(), hd = d.head_dim(), kvw = d.n_head_kv() * hd;
        T qg = cx.get(buf::qg, n, H * 2 * hd);  // [n, H, query | gate]
        T k = cx.get(buf::k, n, kvw);
        T v = cx.get(buf::v, n, kvw);
        T q = cx.get(buf::q, n, H * hd);
        T gate = cx.get(buf::gate, n, H * hd);
        T a = cx.get(buf::attn, n, H * hd);
        const std::array<backend::product_of<T>, 3> proj{{{&w.wq, qg}, {&w.wk, k}, {&w.wv, v}}};
        be.matmul(cx, bt, x, proj);
        const auto sh = shape(d);
        be.attn_prepare(cx, bt, st, layer, sh, backend::attention_norms{&w.q_norm, &w.k_norm}, qg, k, v, q, gate);
        be.attention(cx, bt, st, layer, sh, q, gate, k, v, a);
        const std::array<backend::product_of<T>, 1> o{{{&w.wo, out}}};
        be.matmul(cx, bt, a, o);
    }
};

}  // namespace clover::layers
