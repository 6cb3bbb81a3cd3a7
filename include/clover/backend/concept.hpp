#pragma once
// The backend concept (execution.md §2–3): what a backend must offer for a model to run on it.
// A pass is a host-side sequence of these primitives over backend-owned buffers; its control
// flow depends only on the batch's shape, and values come back to the host once per pass
// (`read_logits`). Layers are written against this concept alone and never include a backend.
//
// A backend B provides:
//   B::options                      construction options
//   B::tensor                       a handle to a backend buffer of [rows, cols] f32 elements
//   B::route                        a handle to routing results: ids and weights, [rows, k]
//   B::state                        the state pool (KV pages, GDN slots, checkpoints, records)
//   B::context                      per-pass scratch (an arena of named buffers), one per
//                                   concurrent pass; obtained from begin_pass
// and the primitives below. Shapes are in rows of the batch (n = batch.rows()) unless noted;
// "E" = n_embd. Every primitive may assume its arguments have the shapes written here (the
// layers guarantee them); none may read a tensor's values back to the host.
//
// There is no feature probing: a backend that lacks one of these does not satisfy
// `backend_for`, and the compiler names the missing expression.
#include <concepts>
#include <cstdint>
#include <span>

#include "clover/core/batch.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

// What one layer keeps per sequence; the model hands the list to the backend's state pool.
// kind::none: the layer runs elsewhere (another stage of a model split by layers): the pool keeps
// nothing for it, and layer indices stay those of the whole model.
struct layer_state_spec {
    enum class kind : std::uint8_t { attention, gdn, none } k = kind::attention;
    std::int64_t kv_width = 0;    // attention: n_head_kv * head_dim (K and V each)
    std::int64_t gdn_heads = 0;   // GDN: V heads
    std::int64_t gdn_dk = 0, gdn_dv = 0;
    std::int64_t conv_rows = 0;   // GDN: K - 1 ring rows
    std::int64_t conv_channels = 0;
    // Shapes a backend checks against its kernels' limits when the pool is made, before any
    // pass could fail half way through a model (a device kernel has limits the CPU has not).
    std::int64_t n_head = 0, head_dim = 0;         // attention: query heads, head size
    std::int64_t n_expert = 0, n_expert_used = 0;  // the layer's MoE (0: none)
};

struct state_options {
    std::int64_t token_budget = 0;  // KV tokens reserved for all sequences (0: grow on demand)
    bool kv_f16 = true;             // KV pages in F16 (false: F32)
    std::int64_t page = 32;         // tokens per KV page (= the diffusion block)
    // GDN checkpoints kept per sequence (beyond it the oldest is dropped). Each holds every GDN
    // layer's state and conv ring: 30 × 2.1 MB ≈ 63 MB for Clover-35B-A3B, so few are kept.
    std::int64_t gdn_checkpoints = 8;
};

// Sizes a layer's primitives need besides tensor shapes.
struct attention_shape {
    std::int64_t n_head, n_head_kv, head_dim, n_rot;
    float rope_theta, rms_eps, scale;
    int rope_sections[4];
};
struct gdn_shape {
    std::int64_t qk_heads, v_heads, dk, dv, conv, channels;
    float rms_eps;
    bool grouped_heads;  // V head h pairs with QK head h / (v_heads / qk_heads) (else h mod qk_heads)
    std::int64_t qk_head_of(std::int64_t h) const { return grouped_heads ? h / (v_heads / qk_heads) : h % qk_heads; }
};
struct moe_shape {
    std::int64_t n_expert, n_expert_used, n_ff, n_ff_shared;
};

// The weights one primitive reads, as views (tensor/weight.hpp); empty views are absent tensors.
struct attention_norms {
    const weight* q_norm;  // [head_dim] f32
    const weight* k_norm;  // [head_dim] f32
};
struct gdn_params {
    const weight* conv;        // [C][K] f32, index 0 = oldest input
    const weight* conv_right;  // [C][K-1] f32 (preview only)
    const weight* dt_bias;     // [Hv] f32
    const weight* a;           // [Hv] f32 (negative)
    const weight* bd_scale;    // [Hv] f32 (preview only): λ
    const weight* bd_bias;     // [Hv] f32 (preview only): history logit b
    const weight* bd_c;        // [Hv] f32 (preview only): history scale c
};
struct moe_params {
    const weight* gate_exps;     // [X][F, E] (or gate_up_exps [X][2F, E])
    const weight* up_exps;
    const weight* gate_up_exps;
    const weight* down_exps;     // [X][E, F]
    const weight* shexp_gate;    // [E] f32, absent without a shared expert
    const weight* gate_shexp;    // [Fs, E]
    const weight* up_shexp;
    const weight* down_shexp;    // [E, Fs]
};

// Names of a pass's scratch buffers: each layer asks its context for these, so one pass's
// buffers never alias and two concurrent passes never share any.
enum class buf : int {
    h, u, y, logits,                    // residual stream, normed input, sub-layer output, logits
    qg, q, gate, k, v, attn,            // gated attention
    conv_in, conv_out, z, beta, alpha,  // Gated DeltaNet
    o,
    router,                             // MoE router probabilities
    count
};

template <class T>
struct product_of {
    const weight* w;  // y[n, w.rows] = x[n, w.cols] · wᵀ
    T y;
};

// clang-format off
template <class B>
concept backend_for = requires(B& be, typename B::context& cx, typename B::state& st, const batch& bt,
                               typename B::tensor t, typename B::route r, const weight& w,
                               std::span<const product_of<typename B::tensor>> prods,
                               const attention_shape& as, const attention_norms& an, const gdn_shape& gs,
                               const gdn_params& gp, const moe_shape& ms, const moe_params& mp,
                               std::span<const layer_state_spec> spec, const state_options& so,
                               float* host, const float* rows_in, float eps,
                               std::int64_t layer, typename B::state::gdn_slot& slot,
                               seq_id seq, std::int64_t n) {
    typename B::options;
    { B::name } -> std::convertible_to<const char*>;

    // ---- memory -------------------------------------------------------------------------
    // The model file's bytes, once at load: a device uploads the weights here; the CPU maps
    // them, in huge pages when it may (cpu_options::huge_pages).
    be.map_weights(weight_memory{});
    // The state pool for layers `spec` (one entry per model layer).
    { be.make_state(spec, so) } -> std::same_as<typename B::state>;
    // Scratch for one pass; buffers live until the context is released. Thread-safe.
    { be.begin_pass() } -> std::same_as<typename B::context>;
    // A named scratch buffer of [rows, cols] f32 (the name keeps buffers of one pass apart).
    { cx.get(buf::h, n, n) } -> std::same_as<typename B::tensor>;
    { cx.get_route(n, n) } -> std::same_as<typename B::route>;
    st.set_n_past(seq, n);

    // ---- sequences (state pool) -----------------------------------------------------------
    // A new sequence able to hold `n` tokens (pages reserved now: running out is an error).
    { st.open(n) } -> std::same_as<seq_id>;
    st.close(seq);                      // frees its pages and slots
    { st.n_past(seq) } -> std::same_as<std::int64_t>;
    { st.capacity(seq) } -> std::same_as<std::int64_t>;
    // Checkpoints (GDN states + conv rings + n_past; KV rows past n_past are dead): a sequence
    // can be saved into another handle and restored from it (clover-diffusion.md §4).
    st.copy(seq, seq);                  // dst <- src, all of the state up to src's n_past
    st.truncate(seq, n);                // drop committed positions >= n (KV only; GDN must be restored)
    // GDN checkpoints (at page boundaries and at the ends of chat messages): KV rows are
    // positional and survive truncation, the GDN state is a running sum and does not, so
    // returning to position p (a shared prompt prefix, an edited conversation) needs the GDN
    // states saved at p.
    st.checkpoint(seq);                 // saves them at n_past
    st.restore(seq, n);                 // back to position n (0 or a checkpoint), later ones dropped
    st.copy_prefix(seq, seq, n);        // dst <- src's KV rows [0, n) and src's checkpoint at n
    { st.checkpoints(seq) } -> std::same_as<std::vector<std::int64_t>>;  // positions, ascending
    // Prefix sharing (a prefix cache): KV pages with holders besides their sequence, and GDN
    // states copied out of a sequence; a sequence opened from them shares the whole pages and
    // never writes a page it shares.
    { st.page_bytes() } -> std::same_as<std::size_t>;
    { st.pages_used() } -> std::same_as<std::int64_t>;                        // held by anyone
    { st.hold_pages(seq, n, n) } -> std::same_as<std::vector<std::int32_t>>;  // pages [first, first + count)
    st.drop_pages(std::span<const std::int32_t>{});
    { st.save(seq, n) } -> std::same_as<typename B::state::saved_state>;      // GDN states at 0 or a checkpoint
    { st.take(seq, n) } -> std::same_as<typename B::state::saved_state>;      // the same, moved out of the sequence
    { st.open_from(n, std::span<const std::int32_t>{}, n, st.save(seq, n)) } -> std::same_as<seq_id>;
    // What a pass and a rollback mean for a sequence is the state pool's, the same on every
    // backend (state_pool.hpp: st.advance(bt) after a pass, st.rollback(seq, n, replay)); a
    // backend supplies the replay: a verified GDN slot back to its first `n` recorded rows, from
    // the record a verify segment keeps (no weights are read).
    st.advance(bt);
    be.replay_gdn(slot, n, gs);

    // ---- primitives (one call each per layer and pass) ----------------------------------------
    // h[n, E] = token_embd rows of the batch's tokens (architecture.md §2.1).
    be.embed(cx, bt, w, t);
    // t[n, t.cols] = host rows [n, t.cols] f32: a stage that does not embed (a model split by
    // layers) starts its pass here with the previous stage's residual rows h. Like embed, the
    // first primitive of its pass; the host memory may be reused once the call returns.
    be.write_rows(cx, bt, rows_in, t);
    // out[n, E] = RMSNorm(x) · w with epsilon eps (§2.1: GGUF norm weights include the +1).
    be.rms_norm(cx, t, w, t, eps);
    // h += y; out = RMSNorm(h) · w — the residual add fused with the next norm.
    be.add_rms_norm(cx, t, t, w, t, eps);
    // Several products sharing one input x[n, K]: y_i[n, w_i.rows] = x · w_iᵀ, each input row
    // prepared once. Row-exact for verify segments (and all rows when bt.exact).
    be.matmul(cx, bt, t, prods);
    // Gated attention, projections done (§2.2): qg [n, H*2*hd] (per head query | gate), k, v
    // [n, Hkv*hd]. Per head RMSNorm of q and k, partial rope at each row's position; writes
    // q [n, H*hd] and gate [n, H*hd]; appends k/v of commit and verify rows to the layer's KV
    // pages (normed, roped, rounded to the page format). Preview rows' k/v stay in k, v.
    be.attn_prepare(cx, bt, st, layer, as, an, t, t, t, t, t);
    // out[n, H*hd] = softmax(q·Kᵀ·scale) V ⊙ sigmoid(gate): commit/verify rows attend causally
    // to their sequence's cache [0, pos]; preview rows to the cache [0, pos0) and all rows of
    // their block (k, v from attn_prepare), with no mask inside the block (clover-diffusion §3).
    be.attention(cx, bt, st, layer, as, t, t, t, t, t);
    // Gated DeltaNet conv (§2.4.3): m [n, C] pre-conv rows → y [n, C]: causal depthwise conv over
    // the sequence's ring and the segment, SiLU, L2-norm of q and k heads (q also scaled by
    // 1/sqrt(dk) for commit/verify). Preview rows add the look-ahead taps and keep unit q.
    // Commit/verify segments advance the ring; verify records the block-start state.
    be.gdn_conv(cx, bt, st, layer, gs, gp, t, t);
    // Gated delta rule (§2.4.5): gates from beta/alpha pre-activations [n, Hv], then per
    // segment: commit — chunked WY form (recurrence when row-exact or 1 row), verify — the
    // recurrence row by row with a record for rollback, preview — the block softmax with the
    // history slot (clover-diffusion.md §3). o [n, Hv*dv]. Writes the state for commit/verify.
    be.gdn_mix(cx, bt, st, layer, gs, gp, t, t, t, t);
    // o = RMSNorm_per_head(o) · w ⊙ silu(z)  (§2.4.6), in place. o, z: [n, Hv*dv].
    be.gated_norm(cx, gs, w, t, t);
    // MoE routing (§2.6): probs = softmax(x · routerᵀ) [n, X]; per row the top-k (ties: lower
    // index) renormalised; preview segments with a coreset restrict every row to the block's
    // coreset (clover-diffusion.md §3). Writes route [n, k].
    be.moe_route(cx, bt, ms, w, t, r);
    // out[n, E] = Σ_j w_j SwiGLU_e_j(x) in ascending expert id, then + sigmoid(x·g) SwiGLU_s(x):
    // rows of all sequences grouped by expert (one product per touched expert).
    be.moe_ffn(cx, bt, ms, mp, t, r, t);
    // logits[n_logits, V] = x[rows asked for] · outputᵀ (the rows in bt.logits_rows() order).
    be.lm_head(cx, bt, w, t, t);
    // The one read-back of a pass: all of t into host memory [t.rows, t.cols] — the logits rows
    // [n_logits, V], or, on a stage before the last of a model split by layers, the residual
    // rows h [n, E] after its last layer's add (every norm queued before has run).
    be.read_logits(cx, t, host);
};
// clang-format on

}  // namespace clover::backend
