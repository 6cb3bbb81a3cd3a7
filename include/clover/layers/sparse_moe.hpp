#pragma once
// Sparse MoE (architecture.md §2.6) as backend primitives: softmax router over all experts
// (fp32), top-k (ties: lower index) renormalised — restricted to the block's expert coreset in
// preview passes (clover-diffusion.md §3) — SwiGLU experts, plus one shared SwiGLU expert scaled
// by sigmoid(x·w_gate). The rows of every sequence in the batch are grouped by expert inside
// the backend, so each touched expert's weights are read once per pass.
#include <cstdint>

#include "clover/arch/dims.hpp"
#include "clover/arch/weights.hpp"
#include "clover/backend/concept.hpp"
#include "clover/core/batch.hpp"

namespace clover::layers {

template <variant V>
struct sparse_moe {
    static backend::moe_shape shape(const dims<V>& d, const moe_weights& w) {
        return {d.n_expert(), d.n_expert_used(), d.n_ff_exp(), w.gate_shexp ? d.n_ff_shexp() : 0};
    }
    static backend::moe_params params(const moe_weights& w) {
        return {&w.gate_exps, &w.up_exps, &w.gate_up_exps, &w.down_exps, &w.shexp_gate, &w.gate_shexp, &w.up_shexp,
                &w.down_shexp};
    }

    // x: [n, n_embd] normed input -> out: [n, n_embd]. Two primitives.
    template <backend::backend_for B>
    static void forward(B& be, typename B::context& cx, const batch& bt, const dims<V>& d, const moe_weights& w,
                        typename B::tensor x, typename B::tensor out) {
        const auto sh = shape(d, w);
        typename B::route r = cx.get_route(bt.rows(), sh.n_expert_used);
        be.moe_route(cx, bt, sh, w.router, x, r);
        be.moe_ffn(cx, bt, sh, params(w), x, r, out);
    }
};

}  // namespace clover::layers
