#pragma once
// The composed model: embedding, then per layer a token mixer chosen by the layer pattern
// (gated attention every full_attention_interval-th layer, Gated DeltaNet otherwise) and a
// sparse MoE, both pre-norm residual; final norm and LM head. Template on the variant (static
// or from_file dimensions) and on the backend policy.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "clover/backend/cpu/cpu.hpp"
#include "clover/core/math.hpp"
#include "clover/io/gguf.hpp"
#include "clover/layers/gated_attention.hpp"
#include "clover/layers/gated_deltanet.hpp"
#include "clover/layers/sparse_moe.hpp"
#include "clover/model/hparams.hpp"
#include "clover/model/passes.hpp"
#include "clover/model/session.hpp"
#include "clover/model/variants.hpp"
#include "clover/model/weights.hpp"

namespace clover {

using token = std::int32_t;

// Opens a model file (mmap; nothing is copied).
inline std::shared_ptr<const io::gguf_file> load(const std::filesystem::path& path) {
    return std::make_shared<const io::gguf_file>(path);
}

// Which rows of a commit pass produce logits.
enum class logits_rows { none, last, all };

template <variant V, class Backend = backend::cpu>
class model {
public:
    using variant_type = V;
    using backend_type = Backend;

    explicit model(std::shared_ptr<const io::gguf_file> file, typename Backend::options opt = {},
                   void (*warn)(const std::string&) = nullptr)
        : hp_(read_hparams(*file, warn)), weights_(bind_weights(file, hp_)), be_(opt) {
        check_fits<V>(hp_, file->path());
        if constexpr (!V::diffusion) weights_.missing_diffusion.clear();  // causal-only variants never ask
        if constexpr (requires { be_.map_weights(file->map().bytes()); }) be_.map_weights(file->map().bytes());
    }

    const hparams& hp() const { return hp_; }
    const model_weights& weights() const { return weights_; }
    Backend& backend() { return be_; }
    dims<V> dim() const { return dims<V>{&hp_}; }
    std::int64_t n_vocab() const { return hp_.n_vocab; }

    session new_session(session_options o = {}) const { return session(hp_, o); }

    // Commit pass over `ids` appended at s.n_past(). logits: [rows, n_vocab] for the chosen rows
    // (all: one row per id; last: one row). Bad ids or a full context throw before any state
    // is touched. Long inputs run in chunks of s.batch() rows.
    void commit(session& s, std::span<const token> ids, logits_rows rows, std::vector<float>& logits) {
        const std::int64_t n = std::int64_t(ids.size());
        check_ids(ids);
        if (s.n_past() + n > s.n_ctx())
            fail("context full: ", s.n_past(), " + ", n, " tokens exceed the context size ", s.n_ctx());
        const std::int64_t V_ = hp_.n_vocab;
        logits.assign(rows == logits_rows::all ? std::size_t(n * V_) : rows == logits_rows::last && n > 0 ? std::size_t(V_) : 0, 0.f);
        for (std::int64_t c0 = 0; c0 < n; c0 += s.batch()) {
            const std::int64_t m = std::min(s.batch(), n - c0);
            float* dst = nullptr;
            std::int64_t first_row = 0;
            if (rows == logits_rows::all) {
                dst = logits.data() + c0 * V_;
            } else if (rows == logits_rows::last && c0 + m == n) {
                dst = logits.data();
                first_row = m - 1;
            }
            run_rows(commit_pass{}, s, ids.data() + c0, m, dst, first_row);
        }
    }

    // Why this file cannot run block diffusion, or "" when it can.
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
    void require_diffusion() const {
        if (auto why = diffusion_unavailable(); !why.empty()) fail(weights_.file->path(), ": cannot run block diffusion: ", why);
    }

    // Preview pass (clover-diffusion.md §3) over block rows at positions [n_past, n_past + B).
    // logits: [B, n_vocab], no shift: row i is the distribution of the token at position
    // n_past + i. The session is only read. coreset < 0: the file's default.
    void preview(const session& s, std::span<const token> block, std::int64_t coreset, std::vector<float>& logits) {
        require_diffusion();
        const std::int64_t B = std::int64_t(block.size());
        if (B < 1) fail("preview: the block is empty");
        check_ids(block);
        if (coreset < 0) coreset = hp_.diffusion_coreset;
        const dims<V> d = dim();
        const std::int64_t E = d.n_embd();
        workspace& ws = s.scratch();
        float* h = workspace::get(ws.x, std::size_t(B * E));
        float* u = workspace::get(ws.u, std::size_t(B * E));
        float* y = workspace::get(ws.logits_rows, std::size_t(B * E));
        embed(block.data(), B, h);
        for (std::int64_t il = 0; il < d.n_layer(); ++il) {
            const layer_weights& L = weights_.layers[il];
            norm_rows(h, L.attn_norm, u, B);
            if (L.recurrent)
                layers::gated_deltanet<V, Backend>::forward(preview_pass{}, be_, d, L.gdn, s.gdn(il), u, y, B, ws);
            else
                layers::gated_attention<V, Backend>::forward(preview_pass{}, be_, d, L.attn, s.attn(il), s.n_past(), u, y, B, ws);
            add_rows(h, y, B);
            norm_rows(h, L.post_norm, u, B);
            layers::sparse_moe<V, Backend>::forward(preview_pass{}, be_, d, L.moe, u, y, B, coreset, ws);
            add_rows(h, y, B);
        }
        logits.resize(std::size_t(B * hp_.n_vocab));
        norm_rows(h, weights_.output_norm, u, B);
        be_.matmul(weights_.output, u, logits.data(), B);
    }

    // Verify pass: a causal pass over drafted rows that writes the session like a commit, with
    // every row computed exactly as AR decoding would (row-by-row products and recurrence), and
    // keeps what rollback() needs. logits: [n, n_vocab] (row i predicts position n_past+i+1).
    void verify(session& s, std::span<const token> ids, std::vector<float>& logits) {
        const std::int64_t n = std::int64_t(ids.size());
        check_ids(ids);
        if (s.n_past() + n > s.n_ctx())
            fail("context full: ", s.n_past(), " + ", n, " tokens exceed the context size ", s.n_ctx());
        logits.resize(std::size_t(n * hp_.n_vocab));
        typename Backend::exact_rows_scope exact(be_);
        run_rows(verify_pass{}, s, ids.data(), n, logits.data(), 0);
        verify_start_ = s.n_past() - n;
    }
    // Keeps the first `keep` rows of the last verify pass and forgets the rest.
    void rollback(session& s, std::int64_t keep) {
        const std::int64_t n = s.n_past() - verify_start_;
        if (keep < 0 || keep > n) fail("rollback: cannot keep ", keep, " of ", n, " verified rows");
        const dims<V> d = dim();
        for (std::int64_t il = 0; il < d.n_layer(); ++il)
            if (weights_.layers[il].recurrent) layers::gated_deltanet<V, Backend>::rollback(d, s.gdn(il), keep);
        s.truncate_tokens(verify_start_ + keep);  // KV rows past n_past are dead
    }

private:
    void check_ids(std::span<const token> ids) const {
        for (std::size_t i = 0; i < ids.size(); ++i)
            if (ids[i] < 0 || ids[i] >= hp_.n_vocab)
                fail("token id ", ids[i], " at position ", i, " is out of range [0, ", hp_.n_vocab, ")");
    }
    void embed(const token* ids, std::int64_t m, float* h) const {
        const std::int64_t E = hp_.n_embd;
        for (std::int64_t t = 0; t < m; ++t)
            quant::dequantize_row(weights_.tok_embd.type, weights_.tok_embd.row(ids[t]), h + t * E, E);
    }
    void norm_rows(const float* h, const weight& w, float* u, std::int64_t m) const {
        const std::int64_t E = hp_.n_embd;
        for (std::int64_t t = 0; t < m; ++t) math::rms_norm(h + t * E, w.f32(), u + t * E, E, hp_.rms_eps);
    }
    void add_rows(float* h, const float* y, std::int64_t m) const {
        for (std::int64_t i = 0; i < m * hp_.n_embd; ++i) h[i] += y[i];
    }

    // Runs rows through all layers with a state-writing pass (commit or verify); writes logits
    // of rows [first_row, m) to dst if given.
    template <class Pass>
    void run_rows(Pass pass, session& s, const token* ids, std::int64_t m, float* dst, std::int64_t first_row) {
        const dims<V> d = dim();
        const std::int64_t E = d.n_embd();
        workspace& ws = s.scratch();
        float* h = workspace::get(ws.x, std::size_t(m * E));   // residual stream [m, E]
        float* u = workspace::get(ws.u, std::size_t(m * E));   // normed input [m, E]
        float* y = workspace::get(ws.logits_rows, std::size_t(m * E));  // sub-layer output [m, E]
        embed(ids, m, h);
        const std::int64_t pos0 = s.n_past();
        for (std::int64_t il = 0; il < d.n_layer(); ++il) {
            const layer_weights& L = weights_.layers[il];
            norm_rows(h, L.attn_norm, u, m);
            if (L.recurrent)
                layers::gated_deltanet<V, Backend>::forward(pass, be_, d, L.gdn, s.gdn(il), u, y, m, ws);
            else
                layers::gated_attention<V, Backend>::forward(pass, be_, d, L.attn, s.attn(il), pos0, u, y, m, ws);
            add_rows(h, y, m);
            norm_rows(h, L.post_norm, u, m);
            layers::sparse_moe<V, Backend>::forward(pass, be_, d, L.moe, u, y, m, ws);
            add_rows(h, y, m);
        }
        s.append_tokens(ids, m);
        if (!dst) return;
        const std::int64_t r = m - first_row;
        norm_rows(h + first_row * E, weights_.output_norm, u, r);
        be_.matmul(weights_.output, u, dst, r);
    }

    hparams hp_;
    model_weights weights_;
    Backend be_;
    std::int64_t verify_start_ = 0;
};

}  // namespace clover
