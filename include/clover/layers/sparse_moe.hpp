#pragma once
// Sparse MoE (architecture.md §2.6) as backend primitives: softmax router over all experts
// (fp32), top-k (ties: lower index) renormalised — restricted to the block's expert coreset in
// preview passes (clover-diffusion.md §3) — SwiGLU experts, plus one shared SwiGLU expert scaled
// by sigmoid(x·w_gate). The rows of every sequence in the batch are grouped by expert inside
// the backend, so each touched expert's weights are read once per pass. Every layer of both
// architectures has one, so it is bound per layer beside the token mixer (moe_weights::bind).
#include <cstdint>
#include <string>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/core/batch.hpp"
#include "clover/schema/dims.hpp"
#include "clover/schema/hparams.hpp"
#include "clover/schema/weights.hpp"

namespace clover::layers {

// The tensors of one MoE block; variant-independent.
struct moe_weights {
    weight router;            // [n_expert, n_embd]
    weight gate_exps, up_exps;  // [n_expert][n_ff, n_embd]  (or gate_up merged: [n_expert][2*n_ff, n_embd])
    weight gate_up_exps;
    weight down_exps;         // [n_expert][n_embd, n_ff]
    weight shexp_gate;        // [n_embd] f32: the shared expert's sigmoid gate
    weight gate_shexp, up_shexp;  // [n_ff_shexp, n_embd]
    weight down_shexp;        // [n_embd, n_ff_shexp]

    // The matrices only products read (weight_memory::products). A merged gate|up stack is
    // split at n_ff per expert (backend/cpu/moe.hpp), which must fall on a 16-row group.
    void products(std::vector<weight*>& out) {
        out.insert(out.end(), {&router, &gate_exps, &up_exps, &down_exps, &gate_shexp, &up_shexp, &down_shexp});
        if (gate_up_exps.rows % 32 == 0) out.push_back(&gate_up_exps);
    }

    // Binds blk.N.ffn_* under prefix p. Gate and up experts come merged or apart (the backend
    // takes either); the shared expert only when the hparams say there is one.
    static moe_weights bind(weight_binder& b, const std::string& p, const hparams& h) {
        const std::int64_t E = h.n_embd, X = h.n_expert, F = h.n_ff_exp;
        moe_weights m;
        m.router = b.matrix(p + "ffn_gate_inp.weight", {E, X});
        if (b.has(p + "ffn_gate_up_exps.weight")) {
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
        return m;
    }
};

template <variant V>
struct sparse_moe {
    using weights = moe_weights;

    static backend::moe_shape shape(const dims<V>& d, const weights& w) {
        return {d.n_expert(), d.n_expert_used(), d.n_ff_exp(), w.gate_shexp ? d.n_ff_shexp() : 0};
    }
    static backend::moe_params params(const weights& w) {
        return {&w.gate_exps, &w.up_exps, &w.gate_up_exps, &w.down_exps, &w.shexp_gate, &w.gate_shexp, &w.up_shexp,
                &w.down_shexp};
    }

    // x: [n, n_embd] normed input -> out: [n, n_embd]. Two primitives.
    template <backend::backend_for B>
    static void forward(B& be, typename B::context& cx, const batch& bt, const dims<V>& d, const weights& w,
                        typename B::tensor x, typename B::tensor out) {
        const auto sh = shape(d, w);
        typename B::route r = cx.get_route(bt.rows(), sh.n_expert_used);
        be.moe_route(cx, bt, sh, w.router, x, r);
        be.moe_ffn(cx, bt, sh, params(w), x, r, out);
    }
};

}  // namespace clover::layers
