#pragma once
// A session is one sequence's state: the KV rows of every attention layer, the recurrent state
// and conv ring of every Gated DeltaNet layer, and the committed tokens. Only commit passes
// write it. A snapshot is a full copy (GDN states cannot be rolled back by truncation); it is
// what lets speculative decoding undo a verify pass and a server reuse a prompt prefix.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/model/hparams.hpp"

namespace clover {

struct session_options {
    std::int64_t ctx = 4096;   // maximum tokens (prompt + output)
    std::int64_t batch = 512;  // rows per commit pass chunk (bounds scratch memory)
    bool kv_f16 = false;       // KV cache in F16 (half the memory; K and V rounded once)
};

struct attention_cache {
    std::vector<float> k, v;                // [ctx, n_head_kv * head_dim] (F32 cache)
    std::vector<std::uint16_t> k16, v16;    // the same in F16 bits (kv_f16); the other pair is empty
    bool f16() const { return !k16.empty(); }
};

struct gdn_state;

// What a verify pass keeps per GDN layer so the decoder can roll back to any prefix of the
// verified rows by replaying the recurrence (clover-diffusion.md §4), without re-reading weights.
struct gdn_verify_record {
    std::vector<float> S0, ring0;  // state and conv ring at the block start
    std::vector<float> m;          // [n, C] pre-conv rows
    std::vector<float> y;          // [n, C] post-conv rows: q̃ (scaled), k̂, v
    std::vector<float> g, beta;    // [n, n_v_heads]
    std::int64_t n = 0;
    inline void begin(const gdn_state& st, const float* m_rows, std::int64_t rows, std::int64_t C);
    void keep(const float* y_rows, const float* g_rows, const float* beta_rows, std::int64_t rows, std::int64_t C,
              std::int64_t Hv) {
        y.assign(y_rows, y_rows + rows * C);
        g.assign(g_rows, g_rows + rows * Hv);
        beta.assign(beta_rows, beta_rows + rows * Hv);
    }
};

struct gdn_state {
    std::vector<float> S;     // [n_v_heads][dk][dv]  (row = key index, column = value index)
    std::vector<float> conv;  // [K-1][conv_channels]: the last K-1 pre-conv inputs, oldest first
    gdn_verify_record rec;    // scratch of the last verify pass (not part of the state proper)
};

inline void gdn_verify_record::begin(const gdn_state& st, const float* m_rows, std::int64_t rows, std::int64_t C) {
    S0 = st.S;
    ring0 = st.conv;
    m.assign(m_rows, m_rows + rows * C);
    n = rows;
}

// Grow-only scratch buffers so steady-state decoding allocates nothing.
struct workspace {
    std::vector<float> x, u, t0, t1, t2, t3, t4, t5, t6, logits_rows;
    static float* get(std::vector<float>& v, std::size_t n) {
        if (v.size() < n) v.resize(n);
        return v.data();
    }
};

class session {
public:
    session() = default;
    session(const hparams& h, session_options o) : opt_(o) {
        if (o.ctx < 1) fail("session: ctx must be at least 1");
        if (o.batch < 1) fail("session: batch must be at least 1");
        layer_slot_.resize(std::size_t(h.n_layer));
        const std::size_t kv = std::size_t(h.n_head_kv * h.head_dim);
        for (std::int64_t il = 0; il < h.n_layer; ++il) {
            if (h.recurrent[il]) {
                layer_slot_[il] = gdn_.size();
                gdn_state g;
                g.S.assign(std::size_t(h.gdn_v_heads() * h.gdn_dk() * h.gdn_dv()), 0.f);
                g.conv.assign(std::size_t((h.ssm_conv - 1) * h.gdn_conv_channels()), 0.f);
                gdn_.push_back(std::move(g));
            } else {
                layer_slot_[il] = attn_.size();
                attention_cache c;
                if (o.kv_f16) {
                    c.k16.assign(std::size_t(o.ctx) * kv, 0);
                    c.v16.assign(std::size_t(o.ctx) * kv, 0);
                } else {
                    c.k.assign(std::size_t(o.ctx) * kv, 0.f);
                    c.v.assign(std::size_t(o.ctx) * kv, 0.f);
                }
                attn_.push_back(std::move(c));
            }
        }
    }

    std::int64_t n_past() const { return std::int64_t(tokens_.size()); }
    std::int64_t n_ctx() const { return opt_.ctx; }
    std::int64_t batch() const { return opt_.batch; }
    const std::vector<std::int32_t>& tokens() const { return tokens_; }

    attention_cache& attn(std::int64_t layer) { return attn_[layer_slot_[layer]]; }
    const attention_cache& attn(std::int64_t layer) const { return attn_[layer_slot_[layer]]; }
    gdn_state& gdn(std::int64_t layer) { return gdn_[layer_slot_[layer]]; }
    const gdn_state& gdn(std::int64_t layer) const { return gdn_[layer_slot_[layer]]; }
    workspace& scratch() const { return ws_; }

    // State after the last commit, for rollback. KV rows past n_past are never read, so the
    // snapshot only needs the GDN states and the token count.
    struct snapshot {
        std::vector<gdn_state> gdn;
        std::int64_t n_past = 0;
    };
    snapshot save() const { return {gdn_, n_past()}; }
    void restore(const snapshot& s) {
        if (s.n_past > n_past()) fail("session: cannot restore a snapshot from the future");
        gdn_ = s.gdn;
        tokens_.resize(std::size_t(s.n_past));
    }
    // Drops committed tokens past n (the model rolls the GDN layers back itself).
    void truncate_tokens(std::int64_t n) { tokens_.resize(std::size_t(n)); }
    // Exact equality of the whole state (tests: a preview pass must leave it bit-identical).
    bool same_state(const session& o) const {
        if (tokens_ != o.tokens_ || attn_.size() != o.attn_.size() || gdn_.size() != o.gdn_.size()) return false;
        const std::size_t used = std::size_t(n_past());
        auto same = [&](const auto& a, const auto& b) {
            if (a.size() != b.size()) return false;
            const std::size_t row = a.size() / std::size_t(opt_.ctx);
            return std::equal(a.begin(), a.begin() + used * row, b.begin());
        };
        for (std::size_t i = 0; i < attn_.size(); ++i)
            if (!same(attn_[i].k, o.attn_[i].k) || !same(attn_[i].v, o.attn_[i].v) || !same(attn_[i].k16, o.attn_[i].k16) ||
                !same(attn_[i].v16, o.attn_[i].v16))
                return false;
        for (std::size_t i = 0; i < gdn_.size(); ++i)
            if (gdn_[i].S != o.gdn_[i].S || gdn_[i].conv != o.gdn_[i].conv) return false;
        return true;
    }

    // Called by the model after a commit pass wrote the state for these tokens.
    void append_tokens(const std::int32_t* ids, std::int64_t n) { tokens_.insert(tokens_.end(), ids, ids + n); }

private:
    session_options opt_;
    std::vector<std::size_t> layer_slot_;
    std::vector<attention_cache> attn_;
    std::vector<gdn_state> gdn_;
    std::vector<std::int32_t> tokens_;
    mutable workspace ws_;
};

}  // namespace clover
