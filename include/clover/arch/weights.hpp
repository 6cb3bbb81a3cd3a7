#pragma once
// Binds the tensors of a qwen35moe / clover_moe GGUF by name, checking each shape against the
// hyper-parameters (architecture.md §3.3). Matrices stay views into the mapped file; small
// vectors (norms, conv taps, gates' biases) are converted once to owned f32.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "clover/io/gguf.hpp"
#include "clover/arch/hparams.hpp"
#include "clover/tensor/weight.hpp"

namespace clover {

struct attention_weights {
    weight wq;      // [n_head*2*head_dim, n_embd]: per head [query | gate]
    weight wk, wv;  // [n_head_kv*head_dim, n_embd]
    weight wo;      // [n_embd, n_head*head_dim]
    weight q_norm, k_norm;  // [head_dim] f32
};

struct gdn_weights {
    weight qkv;     // [conv_channels, n_embd]: Q heads | K heads | V heads
    weight z;       // [d_inner, n_embd]
    weight beta, alpha;  // [n_v_heads, n_embd]
    weight conv;    // [conv_channels][K] f32, index 0 = oldest input
    weight dt_bias, a;   // [n_v_heads] f32; a = -exp(A_log)
    weight norm;    // [dv] f32, shared by all V heads
    weight out;     // [n_embd, d_inner]
    // block-diffusion extras (clover-diffusion.md §6); empty when the file lacks them
    weight conv_right;  // [conv_channels][K-1] f32, index 0 = nearest future row
    weight bd_scale, bd_bias, bd_c;  // [n_v_heads] f32
    bool has_diffusion() const { return conv_right && bd_scale && bd_bias && bd_c; }
};

struct moe_weights {
    weight router;            // [n_expert, n_embd]
    weight gate_exps, up_exps;  // [n_expert][n_ff, n_embd]  (or gate_up merged: [n_expert][2*n_ff, n_embd])
    weight gate_up_exps;
    weight down_exps;         // [n_expert][n_embd, n_ff]
    weight shexp_gate;        // [n_embd] f32: the shared expert's sigmoid gate
    weight gate_shexp, up_shexp;  // [n_ff_shexp, n_embd]
    weight down_shexp;        // [n_embd, n_ff_shexp]
};

struct layer_weights {
    bool recurrent = false;
    weight attn_norm, post_norm;  // [n_embd] f32
    attention_weights attn;
    gdn_weights gdn;
    moe_weights moe;
};

struct model_weights {
    std::shared_ptr<const io::gguf_file> file;
    weight tok_embd;     // [n_vocab, n_embd]
    weight output_norm;  // [n_embd] f32
    weight output;       // [n_vocab, n_embd] (token_embd when the file ties them)
    std::vector<layer_weights> layers;
    std::deque<std::vector<float>> owned;  // f32 copies of small vectors (deque: stable addresses)
    std::vector<std::string> missing_diffusion;  // names of absent block-diffusion tensors

    bool has_diffusion() const { return missing_diffusion.empty(); }
};

namespace detail {

inline std::string shape_str(const std::vector<std::int64_t>& ne) {
    std::string s = "{";
    for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "}";
}

struct binder {
    const io::gguf_file& f;
    model_weights& mw;

    const io::gguf_tensor* lookup(const std::string& name, const std::vector<std::int64_t>& ne, bool required) {
        const io::gguf_tensor* t = f.find_tensor(name);
        if (!t) {
            if (required) fail(f.path(), ": missing tensor '", name, "' (expected shape ", shape_str(ne), ")");
            return nullptr;
        }
        // Trailing 1-dimensions are equivalent ({n} == {n, 1}).
        bool ok = true;
        for (int d = 0; d < 4; ++d) {
            std::int64_t want = d < int(ne.size()) ? ne[d] : 1;
            if (t->ne[d] != want) ok = false;
        }
        if (!ok) fail(f.path(), ": tensor '", name, "' has shape ", t->shape_string(), ", expected ", shape_str(ne));
        return t;
    }

    // A matrix (or stack of matrices) used by matmul: must be a compute-supported type.
    weight matrix(const std::string& name, std::vector<std::int64_t> ne, bool required = true) {
        const io::gguf_tensor* t = lookup(name, ne, required);
        if (!t) return {};
        if (!quant::is_supported_weight(t->type))
            fail(f.path(), ": tensor '", name, "' has type ", dtype_name(t->type), ", which this build cannot compute with yet");
        weight w;
        w.data = t->data;
        w.type = t->type;
        w.cols = t->ne[0];
        w.rows = t->ne[1];
        w.n_mat = t->ne[2];
        w.row_bytes = t->row_bytes();
        w.name = name;
        return w;
    }

    // A small tensor read as f32 (any supported storage type), owned by the weights.
    weight vector_f32(const std::string& name, std::vector<std::int64_t> ne, bool required = true) {
        const io::gguf_tensor* t = lookup(name, ne, required);
        if (!t) return {};
        if (!quant::is_supported_weight(t->type))
            fail(f.path(), ": tensor '", name, "' has type ", dtype_name(t->type), ", which this build cannot read yet");
        auto& v = mw.owned.emplace_back(std::size_t(t->nelements()));
        for (std::int64_t r = 0; r < t->nrows(); ++r)
            quant::dequantize_row(t->type, t->data + std::size_t(r) * t->row_bytes(), v.data() + r * t->ne[0], t->ne[0]);
        weight w;
        w.data = reinterpret_cast<const std::byte*>(v.data());
        w.type = dtype::f32;
        w.cols = t->ne[0];
        w.rows = t->nrows();
        w.row_bytes = std::size_t(t->ne[0]) * 4;
        w.name = name;
        return w;
    }
};

}  // namespace detail

inline model_weights bind_weights(std::shared_ptr<const io::gguf_file> file, hparams& h) {
    model_weights mw;
    mw.file = file;
    detail::binder b{*file, mw};
    const io::gguf_tensor* emb = file->find_tensor("token_embd.weight");
    if (!emb) fail(file->path(), ": missing tensor 'token_embd.weight'");
    if (emb->n_dims != 2 || emb->ne[0] != h.n_embd)
        fail(file->path(), ": tensor 'token_embd.weight' has shape ", emb->shape_string(), ", expected {", h.n_embd, ", n_vocab}");
    h.n_vocab = emb->ne[1];
    const std::int64_t E = h.n_embd, V = h.n_vocab;
    mw.tok_embd = b.matrix("token_embd.weight", {E, V});
    mw.output_norm = b.vector_f32("output_norm.weight", {E});
    mw.output = b.matrix("output.weight", {E, V}, false);
    if (!mw.output) mw.output = mw.tok_embd;

    const std::int64_t hd = h.head_dim, nq = h.n_head * hd, nkv = h.n_head_kv * hd;
    const std::int64_t C = h.gdn_conv_channels(), K = h.ssm_conv, Hv = h.gdn_v_heads();
    for (std::int64_t il = 0; il < h.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        layer_weights L;
        L.recurrent = h.recurrent[il];
        L.attn_norm = b.vector_f32(p + "attn_norm.weight", {E});
        L.post_norm = b.vector_f32(p + "post_attention_norm.weight", {E});
        if (!L.recurrent) {
            auto& a = L.attn;
            if (file->find_tensor(p + "attn_qkv.weight")) {  // merged q|k|v rows
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
        } else {
            auto& g = L.gdn;
            g.qkv = b.matrix(p + "attn_qkv.weight", {E, C});
            g.z = b.matrix(p + "attn_gate.weight", {E, h.ssm_d_inner});
            g.beta = b.matrix(p + "ssm_beta.weight", {E, Hv});
            g.alpha = b.matrix(p + "ssm_alpha.weight", {E, Hv});
            g.conv = b.vector_f32(p + "ssm_conv1d.weight", {K, C});
            g.dt_bias = b.vector_f32(p + "ssm_dt.bias", {Hv});
            g.a = b.vector_f32(p + "ssm_a", {Hv});
            g.norm = b.vector_f32(p + "ssm_norm.weight", {h.gdn_dv()});
            g.out = b.matrix(p + "ssm_out.weight", {h.ssm_d_inner, E});
            g.conv_right = b.vector_f32(p + "ssm_conv1d_right.weight", {K - 1, C}, false);
            g.bd_scale = b.vector_f32(p + "ssm_bd_logit_scale", {Hv}, false);
            g.bd_bias = b.vector_f32(p + "ssm_bd_history_bias", {Hv}, false);
            g.bd_c = b.vector_f32(p + "ssm_bd_history_c", {Hv}, false);
            if (!g.conv_right) mw.missing_diffusion.push_back(p + "ssm_conv1d_right.weight");
            if (!g.bd_scale) mw.missing_diffusion.push_back(p + "ssm_bd_logit_scale");
            if (!g.bd_bias) mw.missing_diffusion.push_back(p + "ssm_bd_history_bias");
            if (!g.bd_c) mw.missing_diffusion.push_back(p + "ssm_bd_history_c");
        }
        auto& m = L.moe;
        const std::int64_t X = h.n_expert, F = h.n_ff_exp;
        m.router = b.matrix(p + "ffn_gate_inp.weight", {E, X});
        if (file->find_tensor(p + "ffn_gate_up_exps.weight")) {
            m.gate_up_exps = b.matrix(p + "ffn_gate_up_exps.weight", {E, 2 * F, X});
        } else {
            m.gate_exps = b.matrix(p + "ffn_gate_exps.weight", {E, F, X});
            m.up_exps = b.matrix(p + "ffn_up_exps.weight", {E, F, X});
        }
        m.down_exps = b.matrix(p + "ffn_down_exps.weight", {F, E, X});
        if (h.n_expert_shared > 0 && h.n_ff_shexp > 0) {
            m.shexp_gate = b.vector_f32(p + "ffn_gate_inp_shexp.weight", {E});
            m.gate_shexp = b.matrix(p + "ffn_gate_shexp.weight", {E, h.n_ff_shexp});
            m.up_shexp = b.matrix(p + "ffn_up_shexp.weight", {E, h.n_ff_shexp});
            m.down_shexp = b.matrix(p + "ffn_down_shexp.weight", {h.n_ff_shexp, E});
        }
        mw.layers.push_back(std::move(L));
    }
    if (h.mask_token_id >= h.n_vocab) fail(file->path(), ": diffusion.mask_token_id ", h.mask_token_id, " is not below n_vocab ", h.n_vocab);
    return mw;
}

}  // namespace clover
