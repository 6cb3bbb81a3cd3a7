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
        for (std::int64_t i = 0; i < n; ++i)
            if (ids[i] < 0 || ids[i] >= hp_.n_vocab)
                fail("token id ", ids[i], " at position ", i, " is out of range [0, ", hp_.n_vocab, ")");
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
            commit_chunk(s, ids.data() + c0, m, dst, first_row);
        }
    }

private:
    // Runs one chunk through all layers; writes logits of rows [first_row, m) to dst if given.
    void commit_chunk(session& s, const token* ids, std::int64_t m, float* dst, std::int64_t first_row) {
        const dims<V> d = dim();
        const std::int64_t E = d.n_embd();
        workspace& ws = s.scratch();
        float* h = workspace::get(ws.x, std::size_t(m * E));   // residual stream [m, E]
        float* u = workspace::get(ws.u, std::size_t(m * E));   // normed input [m, E]
        float* y = workspace::get(ws.logits_rows, std::size_t(m * E));  // sub-layer output [m, E]
        for (std::int64_t t = 0; t < m; ++t)
            quant::dequantize_row(weights_.tok_embd.type, weights_.tok_embd.row(ids[t]), h + t * E, E);
        const std::int64_t pos0 = s.n_past();
        for (std::int64_t il = 0; il < d.n_layer(); ++il) {
            const layer_weights& L = weights_.layers[il];
            for (std::int64_t t = 0; t < m; ++t) math::rms_norm(h + t * E, L.attn_norm.f32(), u + t * E, E, hp_.rms_eps);
            if (L.recurrent)
                layers::gated_deltanet<V, Backend>::forward(commit_pass{}, be_, d, L.gdn, s.gdn(il), u, y, m, ws);
            else
                layers::gated_attention<V, Backend>::forward(commit_pass{}, be_, d, L.attn, s.attn(il), pos0, u, y, m, ws);
            for (std::int64_t i = 0; i < m * E; ++i) h[i] += y[i];
            for (std::int64_t t = 0; t < m; ++t) math::rms_norm(h + t * E, L.post_norm.f32(), u + t * E, E, hp_.rms_eps);
            layers::sparse_moe<V, Backend>::forward(commit_pass{}, be_, d, L.moe, u, y, m, ws);
            for (std::int64_t i = 0; i < m * E; ++i) h[i] += y[i];
        }
        s.append_tokens(ids, m);
        if (!dst) return;
        const std::int64_t r = m - first_row;
        for (std::int64_t t = 0; t < r; ++t)
            math::rms_norm(h + (first_row + t) * E, weights_.output_norm.f32(), u + t * E, E, hp_.rms_eps);
        be_.matmul(weights_.output, u, dst, r);
    }

    hparams hp_;
    model_weights weights_;
    Backend be_;
};

}  // namespace clover
