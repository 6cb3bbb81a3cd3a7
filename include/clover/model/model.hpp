#pragma once
/// \file
/// clover::model: the composed model, and the requests of a pass.
//
// The composed model: embedding, then per layer a token mixer of the layer's kind (the type its
// weights hold: gated attention or Gated DeltaNet, as the architecture bound it) and a sparse
// MoE, both pre-norm residual; final norm and LM head. Template on the variant (static or
// from_file dimensions) and on the backend policy.
//
// A pass is a batch of segments from many sequences (core/batch.hpp), run as a fixed sequence
// of backend primitives (execution.md rule 1) with one read-back at the end (rule 2). The
// model owns nothing per sequence: sessions are handles into the backend's state pool.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "clover/schema/dims.hpp"
#include "clover/schema/hparams.hpp"
#include "clover/arch/model_weights.hpp"
#include "clover/arch/registry.hpp"
#include "clover/backend/concept.hpp"
#include "clover/backend/cpu/cpu.hpp"
#include "clover/core/batch.hpp"
#include "clover/io/gguf.hpp"
#include "clover/layers/gated_attention.hpp"
#include "clover/layers/gated_deltanet.hpp"
#include "clover/layers/sparse_moe.hpp"
#include "clover/model/open.hpp"
#include "clover/model/session.hpp"
#include "clover/model/stage.hpp"

namespace clover {

/// Opens a model (clover::open without warnings): a GGUF file (mmap; nothing is copied unless a
/// vendor variant needs fixing) or an HF folder.
inline std::shared_ptr<const io::gguf_file> load(const std::filesystem::path& path) { return open(path); }

/// Which rows of a commit pass produce logits.
enum class logits_rows {
    none,  ///< no logits
    last,  ///< the last row's
    all    ///< one row per input id
};

/// One sequence's part of a pass (model::run).
struct pass_request {
    session* s;                          ///< the sequence
    pass_kind kind = pass_kind::commit;  ///< commit, preview or verify
    std::span<const token> ids;          ///< its rows' token ids
    std::int64_t logits = 0;    ///< how many of the last rows give logits (0: none)
    std::int64_t coreset = -1;  ///< preview: expert coreset (-1: the file's default)
};

/// A model of the Qwen3.5/3.6 hybrid MoE family (qwen35moe) or Clover (clover_moe): the weights
/// of one file, bound to variant V's dimensions (static, or from the file) and run by Backend.
/// Sequences are clover::session handles into the backend's state pool; one pass (run) batches
/// segments of many of them. Made with a stage_range, the model is one stage of a model split by
/// layers: it maps, keeps state for and runs only those layers (run_stage).

template <variant V, class Backend = backend::cpu>
class model : private detail::sequence_owner {
    static_assert(backend::backend_for<Backend>,
                  "clover::model: the backend does not implement the backend concept (backend/concept.hpp); "
                  "the compiler's note names the missing primitive");

public:
    using variant_type = V;                           ///< the dimensions (clover::variants)
    using backend_type = Backend;                     ///< the backend policy
    using attention_layer = layers::gated_attention<V>;  ///< the gated-attention layer
    using gdn_layer = layers::gated_deltanet<V>;      ///< the Gated DeltaNet layer
    using moe_layer = layers::sparse_moe<V>;          ///< the sparse MoE layer
    /// The layer that runs a token mixer's weights W (each weights type names it).
    template <class W>
    using mixer_layer = typename W::template layer<V>;

    /// Binds the file's weights (checked against V's dimensions: a mismatch is an error naming
    /// the dimension) and hands them to the backend. `warn` receives the defaults taken for keys
    /// the file lacks (keys the vendor's files are known to omit).
    explicit model(std::shared_ptr<const io::gguf_file> file, typename Backend::options opt = {},
                   void (*warn)(const std::string&) = nullptr)
        : model(nullptr, std::move(file), opt, warn) {}
    /// One stage of the model: layers [r.first, r.last) only (their matrices mapped, their state
    /// kept; the embedding on the first stage, the final norm and LM head on the last). A range
    /// that is empty or outside [0, n_layer) is an error before anything is mapped or allocated;
    /// [0, n_layer) is the whole model.
    model(std::shared_ptr<const io::gguf_file> file, stage_range r, typename Backend::options opt = {},
          void (*warn)(const std::string&) = nullptr)
        : model(&r, std::move(file), opt, warn) {}
    model(const model&) = delete;
    model& operator=(const model&) = delete;
    ~model() override = default;

private:
    // r: the stage's layers, or null for all of them.
    model(const stage_range* r, std::shared_ptr<const io::gguf_file> file, typename Backend::options opt,
          void (*warn)(const std::string&))
        : hp_(read_hparams(*file, warn)),
          range_(detail::checked_stage(r ? *r : stage_range(0, hp_.n_layer), hp_.n_layer, file->path())),
          weights_(bind_weights(file, hp_)), be_(opt) {
        check_fits<V>(hp_, file->path());
        if constexpr (!V::diffusion) weights_.missing_diffusion.clear();  // causal-only variants never ask
        be_.map_weights(detail::stage_memory(file, weights_, range_, hp_.n_layer));
        const dims<V> d = dim();
        for (std::int64_t il = 0; il < d.n_layer(); ++il) {
            spec_.push_back(std::visit([&]<class W>(const W&) { return mixer_layer<W>::state_spec(d); },
                                       weights_.layers[std::size_t(il)].mixer));
            spec_.back().n_expert = d.n_expert();
            spec_.back().n_expert_used = d.n_expert_used();
            // Another stage's layer keeps nothing here (its index stays the whole model's).
            if (il < range_.first || il >= range_.last) spec_.back() = {.k = backend::layer_state_spec::kind::none};
        }
    }

public:
    const hparams& hp() const { return hp_; }                  ///< the file's hyperparameters
    const model_weights& weights() const { return weights_; }  ///< the bound weights
    Backend& backend() { return be_; }                         ///< the backend instance
    dims<V> dim() const { return dims<V>{&hp_}; }              ///< the dimensions (static where V fixes them)
    std::int64_t n_vocab() const { return hp_.n_vocab; }       ///< rows of the LM head
    const stage_range& stage() const { return range_; }        ///< its layers ([0, n_layer): the whole model)
    bool first_stage() const { return range_.first == 0; }     ///< whether it embeds the tokens
    bool last_stage() const { return range_.last == hp_.n_layer; }  ///< whether it runs the LM head
    bool whole() const { return first_stage() && last_stage(); }    ///< all layers: not a stage
    /// The layers' state specs given to the backend's state pool (kind none: another stage's).
    std::span<const backend::layer_state_spec> state_specs() const { return spec_; }

    /// A sequence of up to o.ctx tokens in the state pool of its KV format (pages reserved now).
    session new_session(session_options o = {}) {
        if (o.ctx < 1) fail("session: ctx must be at least 1");
        if (o.batch < 1) fail("session: batch must be at least 1");
        const int p = o.kv_f16 ? 1 : 0;
        return session(this, p, state_of(p).open(o.ctx), o);
    }
    /// dst takes src's state (KV rows, GDN states, tokens): a checkpoint to return to.
    void copy_state(session& dst, const session& src) {
        if (dst.pool() != src.pool()) fail("copy_state: the sessions use different KV formats");
        if (src.n_past() > dst.n_ctx()) fail("copy_state: ", src.n_past(), " tokens do not fit a session of ", dst.n_ctx());
        state_of(dst.pool()).copy(dst.id(), src.id());
        dst.mutable_tokens() = src.tokens();
    }
    // GDN checkpoints (a prompt prefix shared by many requests, a conversation edited at turn
    // k): KV rows are positional, but the GDN state is a running sum, so going back to position
    // p needs the states saved at p. checkpoint() saves them at the session's position: a
    // multiple of page_size() (commit a prompt in two parts to end one there: whole KV pages
    // can then be shared) or the end of a chat message; restore() returns a session to 0 or a checkpoint; copy_prefix() starts `dst` from
    // src's first `pos` tokens without recomputing them. Each checkpoint costs
    // checkpoint_bytes(); a session keeps the newest `state_options::gdn_checkpoints`.
    std::int64_t page_size() { return state_of(0).page_size(); }  ///< tokens per KV page
    std::size_t checkpoint_bytes() { return state_of(0).checkpoint_bytes(); }  ///< the cost of one GDN checkpoint
    /// Saves every GDN layer's state at s's position (a page boundary or a chat message's end).
    void checkpoint(session& s) { state_of(s.pool()).checkpoint(s.id()); }
    /// The positions s has checkpoints at.
    std::vector<std::int64_t> checkpoints(const session& s) { return state_of(s.pool()).checkpoints(s.id()); }
    /// Returns s to position pos: 0 or one of its checkpoints.
    void restore(session& s, std::int64_t pos) {
        state_of(s.pool()).restore(s.id(), pos);
        s.mutable_tokens().resize(std::size_t(pos));
    }
    /// dst becomes src's first pos tokens (0 or a checkpoint of src) without recomputing them.
    void copy_prefix(session& dst, const session& src, std::int64_t pos) {
        if (dst.pool() != src.pool()) fail("copy_prefix: the sessions use different KV formats");
        if (pos > dst.n_ctx()) fail("copy_prefix: ", pos, " tokens do not fit a session of ", dst.n_ctx());
        state_of(dst.pool()).copy_prefix(dst.id(), src.id(), pos);
        dst.mutable_tokens().assign(src.tokens().begin(), src.tokens().begin() + pos);
    }

    // Prefix sharing (decode/prefix_cache.hpp keeps prompt prefixes for later requests): the
    // KV pages of a session's first positions and its GDN states at a checkpoint, held after
    // the session closes, and a new session that starts from them. Pages are page_size()
    // tokens of every attention layer, page_bytes(pool) each; a held page stays allocated
    // until dropped. Holding costs no copy; starting from a held prefix copies only a last
    // partial page and the GDN states.
    using saved_state = typename Backend::state::saved_state;  ///< GDN states saved at a position
    std::size_t page_bytes(int pool) { return state_of(pool).page_bytes(); }      ///< bytes of one KV page
    std::int64_t kv_pages_used(int pool) { return state_of(pool).pages_used(); }  ///< KV pages allocated
    /// Holds count KV pages of s from page `first` on (they outlive s until drop_pages).
    std::vector<std::int32_t> hold_pages(const session& s, std::int64_t first, std::int64_t count) {
        return state_of(s.pool()).hold_pages(s.id(), first, count);
    }
    /// Releases pages that hold_pages held.
    void drop_pages(int pool, std::span<const std::int32_t> pages) { state_of(pool).drop_pages(pages); }
    /// A copy of s's GDN states at pos (0 or a checkpoint of s).
    saved_state save_state(const session& s, std::int64_t pos) { return state_of(s.pool()).save(s.id(), pos); }
    /// save_state without a copy: the session loses its checkpoint at pos (it cannot go back there).
    saved_state take_state(session& s, std::int64_t pos) { return state_of(s.pool()).take(s.id(), pos); }
    /// A session of o.ctx tokens whose first tokens.size() positions are `pages` (from
    /// hold_pages, ceil(n / page_size()) of them) with GDN states `st` saved at that position.
    session new_session_from(session_options o, std::span<const std::int32_t> pages, std::span<const token> tokens,
                             const saved_state& st) {
        if (o.batch < 1) fail("session: batch must be at least 1");
        check_ids(tokens);
        const int p = o.kv_f16 ? 1 : 0;
        session s(this, p, state_of(p).open_from(o.ctx, pages, std::int64_t(tokens.size()), st), o);
        s.mutable_tokens().assign(tokens.begin(), tokens.end());
        return s;
    }

    /// Exact equality of two sessions' live state (tests).
    bool same_state(const session& a, const session& b) {
        return a.pool() == b.pool() && a.tokens() == b.tokens() && state_of(a.pool()).same_state(a.id(), b.id());
    }

    /// One pass over segments of many sessions. logits: [Σ logits rows, n_vocab], in request
    /// order. Everything is checked before any state is touched. exact: every row computed as it
    /// would be alone (batch.hpp).
    void run(std::span<const pass_request> reqs, std::vector<float>& logits, bool exact = false) {
        if (!whole())
            fail("run: this model is the stage of layers [", range_.first, ", ", range_.last, ") of ", hp_.n_layer, "; use run_stage");
        pass(reqs, nullptr, logits, exact);
    }
    /// One pass of a stage (or of the whole model) over segments of many sessions, with run's
    /// checks. h_in: the previous stage's out, [Σ rows, n_embd] in request order (null on the
    /// first stage, which embeds the ids; later stages read only the ids' count). out: on the
    /// last stage the logits as run gives them; otherwise the residual rows h after its last
    /// layer, [Σ rows, n_embd], for the next stage. exact as in run: with every stage exact, the
    /// last stage's logits are bit for bit the whole model's.
    void run_stage(std::span<const pass_request> reqs, const float* h_in, std::vector<float>& out, bool exact = false) {
        if (first_stage() != (h_in == nullptr))
            fail("run_stage: the stage of layers [", range_.first, ", ", range_.last, ") ",
                 first_stage() ? "embeds its tokens and takes no input rows" : "needs the previous stage's rows");
        pass(reqs, h_in, out, exact);
    }

private:
    void pass(std::span<const pass_request> reqs, const float* h_in, std::vector<float>& logits, bool exact) {
        if (reqs.empty()) fail("run: no sequences in the pass");
        const int p = reqs[0].s->pool();
        batch bt;
        bt.exact = exact;
        for (const pass_request& r : reqs) {
            session& s = *r.s;
            if (!s.open()) fail("run: the session is closed");
            if (!s.opened_by(this)) fail("run: the session was opened by another model (each stage opens its own)");
            if (s.pool() != p) fail("run: sessions with different KV formats cannot share a pass");
            check_ids(r.ids);
            const std::int64_t n = std::int64_t(r.ids.size());
            if (n < 1) fail(pass_name(r.kind), " pass: no rows");
            if (s.n_past() + n > s.n_ctx())
                fail("context full: ", s.n_past(), " + ", n, " tokens exceed the context size ", s.n_ctx());
            std::int64_t coreset = 0;
            if (r.kind == pass_kind::preview) {
                require_diffusion();
                coreset = r.coreset < 0 ? hp_.diffusion_coreset : r.coreset;
            }
            bt.add(s.id(), r.kind, r.ids, s.n_past(), r.logits, coreset);
        }
        logits.resize(std::size_t(last_stage() ? bt.n_logits() * hp_.n_vocab : bt.rows() * hp_.n_embd));
        forward(state_of(p), bt, h_in, logits.data());
        for (const pass_request& r : reqs)
            if (r.kind != pass_kind::preview) {
                auto& t = r.s->mutable_tokens();
                t.insert(t.end(), r.ids.begin(), r.ids.end());
            }
    }

public:
    /// Commit pass over `ids` appended at s.n_past(). logits: [rows, n_vocab] for the chosen rows
    /// (all: one row per id; last: one row). Bad ids or a full context throw before any state
    /// is touched. Long inputs run in chunks of s.batch() rows.
    void commit(session& s, std::span<const token> ids, logits_rows rows, std::vector<float>& logits, bool exact = false) {
        const std::int64_t n = std::int64_t(ids.size());
        check_ids(ids);
        if (s.n_past() + n > s.n_ctx()) fail("context full: ", s.n_past(), " + ", n, " tokens exceed the context size ", s.n_ctx());
        const std::int64_t V_ = hp_.n_vocab;
        if (n >= 1 && n <= s.batch()) {  // one chunk: the pass writes the caller's rows directly
            const std::int64_t want = rows == logits_rows::all ? n : rows == logits_rows::last ? 1 : 0;
            const pass_request r{&s, pass_kind::commit, ids, want};
            run(std::span(&r, 1), logits, exact);
            return;
        }
        std::vector<float> part;
        logits.assign(rows == logits_rows::all ? std::size_t(n * V_) : rows == logits_rows::last && n > 0 ? std::size_t(V_) : 0, 0.f);
        for (std::int64_t c0 = 0; c0 < n; c0 += s.batch()) {
            const std::int64_t m = std::min(s.batch(), n - c0);
            const std::int64_t want = rows == logits_rows::all ? m : rows == logits_rows::last && c0 + m == n ? 1 : 0;
            const pass_request r{&s, pass_kind::commit, ids.subspan(std::size_t(c0), std::size_t(m)), want};
            run(std::span(&r, 1), part, exact);
            if (want) std::copy(part.begin(), part.end(), logits.begin() + (rows == logits_rows::all ? c0 * V_ : 0));
        }
    }

    /// Why this file cannot run block diffusion, or "" when it can.
    std::string diffusion_unavailable() const {
        if constexpr (!V::diffusion) return std::string("variant '") + V::name + "' is causal only";
        if (!hp_.is_clover()) return "not a clover_moe file (architecture " + hp_.arch + ")";
        if (!weights_.has_diffusion()) {
            std::string names;
            for (std::size_t i = 0; i < weights_.missing_diffusion.size() && i < 4; ++i)
                names += (i ? ", " : "") + weights_.missing_diffusion[i];
            if (weights_.missing_diffusion.size() > 4) names += ", ... (" + std::to_string(weights_.missing_diffusion.size()) + " in all)";
            return "the file lacks the block-diffusion tensors: " + names;
        }
        if (hp_.mask_token_id < 0) return "the file has no diffusion.mask_token_id";
        return "";
    }
    /// Throws clover::error saying why, when the file cannot run block diffusion.
    void require_diffusion() const {
        if (auto why = diffusion_unavailable(); !why.empty()) fail(weights_.file->path(), ": cannot run block diffusion: ", why);
    }

    /// Preview pass (clover-diffusion.md §3) over block rows at positions [n_past, n_past + B).
    /// logits: [B, n_vocab], no shift: row i is the distribution of the token at position
    /// n_past + i. The session is only read. coreset < 0: the file's default.
    void preview(const session& s, std::span<const token> block, std::int64_t coreset, std::vector<float>& logits) {
        if (block.empty()) fail("preview: the block is empty");
        const pass_request r{const_cast<session*>(&s), pass_kind::preview, block, std::int64_t(block.size()), coreset};
        run(std::span(&r, 1), logits);
    }

    /// Verify pass: a causal pass over drafted rows that writes the session like a commit, with
    /// every row computed exactly as AR decoding would, and keeps what rollback() needs.
    /// logits: [n, n_vocab] (row i predicts position n_past+i+1).
    void verify(session& s, std::span<const token> ids, std::vector<float>& logits) {
        const pass_request r{&s, pass_kind::verify, ids, std::int64_t(ids.size())};
        run(std::span(&r, 1), logits);
    }
    /// Keeps the first `keep` rows of the last verify pass and forgets the rest.
    void rollback(session& s, std::int64_t keep) {
        const backend::gdn_shape g = gdn_layer::shape(dim());
        state_of(s.pool()).rollback(s.id(), keep, [&](auto& slot, std::int64_t k) { be_.replay_gdn(slot, k, g); });
        s.mutable_tokens().resize(std::size_t(state_of(s.pool()).n_past(s.id())));
    }

private:
    void close_sequence(int pool, seq_id id) noexcept override {
        try {
            state_of(pool).close(id);
        } catch (...) {  // a closed or unknown id: nothing to free
        }
    }
    typename Backend::state& state_of(int p) {
        std::lock_guard lk(pools_mu_);
        if (!pools_[std::size_t(p)]) {
            backend::state_options o;
            o.kv_f16 = p == 1;
            pools_[std::size_t(p)].emplace(be_.make_state(spec_, o));
        }
        return *pools_[std::size_t(p)];
    }
    void check_ids(std::span<const token> ids) const {
        for (std::size_t i = 0; i < ids.size(); ++i)
            if (ids[i] < 0 || ids[i] >= hp_.n_vocab)
                fail("token id ", ids[i], " at position ", i, " is out of range [0, ", hp_.n_vocab, ")");
    }

    // The pass: control flow from the batch's shape only; one read-back (logits) at the end.
    // A stage runs its layers only: it starts from the previous stage's h (the unsplit pass's
    // add_rms_norm is h += y, then the norm of h: the same bits as rms_norm of the h received)
    // and ends with its last add, reading h back instead of logits.
    void forward(typename Backend::state& st, const batch& bt, const float* h_in, float* out) {
        using backend::buf;
        using T = typename Backend::tensor;
        const dims<V> d = dim();
        const std::int64_t n = bt.rows(), E = d.n_embd();
        const float eps = hp_.rms_eps;
        typename Backend::context cx = be_.begin_pass();
        T h = cx.get(buf::h, n, E);  // residual stream [n, E]
        T u = cx.get(buf::u, n, E);  // normed input [n, E]
        T y = cx.get(buf::y, n, E);  // sub-layer output [n, E]
        if (first_stage()) be_.embed(cx, bt, weights_.tok_embd, h);
        else be_.write_rows(cx, bt, h_in, h);
        be_.rms_norm(cx, h, weights_.layers[std::size_t(range_.first)].attn_norm, u, eps);
        for (std::int64_t il = range_.first; il < range_.last; ++il) {
            const layer_weights& L = weights_.layers[std::size_t(il)];
            std::visit([&]<class W>(const W& w) { mixer_layer<W>::forward(be_, cx, st, bt, il, d, w, u, y); }, L.mixer);
            be_.add_rms_norm(cx, h, y, L.post_norm, u, eps);
            moe_layer::forward(be_, cx, bt, d, L.moe, u, y);
            // A stage before the last ends with h += y; its norm there is of no use (the next stage
            // norms the h it receives), so it takes a weight of the stage's own, never another's.
            const weight& next = il + 1 == range_.last && !last_stage() ? L.post_norm
                                 : il + 1 < d.n_layer()                  ? weights_.layers[std::size_t(il + 1)].attn_norm
                                                                         : weights_.output_norm;
            be_.add_rms_norm(cx, h, y, next, u, eps);
        }
        if (last_stage()) {
            T logits = cx.get(buf::logits, bt.n_logits(), hp_.n_vocab);
            be_.lm_head(cx, bt, weights_.output, u, logits);
            be_.read_logits(cx, logits, out);
        } else {
            be_.read_logits(cx, h, out);
        }
        st.advance(bt);
    }

    hparams hp_;
    stage_range range_;  // the layers this model runs ([0, n_layer): all)
    model_weights weights_;
    Backend be_;
    std::vector<backend::layer_state_spec> spec_;
    std::mutex pools_mu_;
    std::array<std::optional<typename Backend::state>, 2> pools_;
};

}  // namespace clover
