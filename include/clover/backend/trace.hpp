#pragma once
// backend::trace<Inner> — a backend that records every primitive call (name, layer, rows, cols)
// and every read-back, then runs it on Inner. It proves execution.md's rules on a machine
// without a GPU: a pass is a fixed sequence of primitives whose shape depends only on the
// batch, with one read-back per pass (tests/model/test_trace.cpp, `clover bench --trace`).
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clover/backend/concept.hpp"

namespace clover::backend {

struct trace_call {
    const char* name;
    std::int64_t layer;  // -1: not a layer's call
    std::int64_t rows, cols;
    bool operator==(const trace_call& o) const {
        return std::string(name) == o.name && layer == o.layer && rows == o.rows && cols == o.cols;
    }
};

template <class Inner>
class trace {
public:
    static constexpr const char* name = "trace";
    using options = typename Inner::options;
    using tensor = typename Inner::tensor;
    using route = typename Inner::route;
    using state = typename Inner::state;
    using context = typename Inner::context;

    explicit trace(options o = {}) : in_(o) {}

    Inner& inner() { return in_; }
    // Calls recorded since the last clear(), in order.
    std::vector<trace_call> calls() const {
        std::lock_guard lk(mu_);
        return calls_;
    }
    std::int64_t readbacks() const {
        std::lock_guard lk(mu_);
        return readbacks_;
    }
    std::int64_t passes() const {
        std::lock_guard lk(mu_);
        return passes_;
    }
    void clear() {
        std::lock_guard lk(mu_);
        calls_.clear();
        readbacks_ = passes_ = 0;
    }

    void map_weights(const weight_memory& m) { in_.map_weights(m); }
    state make_state(std::span<const layer_state_spec> spec, const state_options& o) { return in_.make_state(spec, o); }
    context begin_pass() {
        {
            std::lock_guard lk(mu_);
            ++passes_;
        }
        return in_.begin_pass();
    }
    template <class G>
    void replay_gdn(typename state::gdn_slot& slot, std::int64_t keep, const G& g) {
        rec("replay_gdn", -1, keep, 0);
        in_.replay_gdn(slot, keep, g);
    }

    void embed(context& cx, const batch& bt, const weight& w, tensor h) {
        rec("embed", -1, h.rows, h.cols);
        in_.embed(cx, bt, w, h);
    }
    void write_rows(context& cx, const batch& bt, const float* host, tensor t) {
        rec("write_rows", -1, t.rows, t.cols);
        in_.write_rows(cx, bt, host, t);
    }
    void rms_norm(context& cx, tensor x, const weight& w, tensor out, float eps) {
        rec("rms_norm", -1, x.rows, x.cols);
        in_.rms_norm(cx, x, w, out, eps);
    }
    void add_rms_norm(context& cx, tensor h, tensor y, const weight& w, tensor out, float eps) {
        rec("add_rms_norm", layer_of(w), h.rows, h.cols);
        in_.add_rms_norm(cx, h, y, w, out, eps);
    }
    void matmul(context& cx, const batch& bt, tensor x, std::span<const product_of<tensor>> p) {
        std::int64_t cols = 0;
        for (const auto& q : p) cols += q.w->rows;
        rec("matmul", p.empty() ? -1 : layer_of(*p[0].w), x.rows, cols);
        in_.matmul(cx, bt, x, p);
    }
    void attn_prepare(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a,
                      const attention_norms& n, tensor qg, tensor k, tensor v, tensor q, tensor gate) {
        rec("attn_prepare", layer, qg.rows, qg.cols);
        in_.attn_prepare(cx, bt, st, layer, a, n, qg, k, v, q, gate);
    }
    void attention(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a, tensor q,
                   tensor gate, tensor k, tensor v, tensor out) {
        rec("attention", layer, q.rows, q.cols);
        in_.attention(cx, bt, st, layer, a, q, gate, k, v, out);
    }
    void gdn_conv(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w,
                  tensor m, tensor y) {
        rec("gdn_conv", layer, m.rows, m.cols);
        in_.gdn_conv(cx, bt, st, layer, g, w, m, y);
    }
    void gdn_mix(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w,
                 tensor y, tensor beta, tensor alpha, tensor o) {
        rec("gdn_mix", layer, o.rows, o.cols);
        in_.gdn_mix(cx, bt, st, layer, g, w, y, beta, alpha, o);
    }
    void gated_norm(context& cx, const gdn_shape& g, const weight& w, tensor o, tensor z) {
        rec("gated_norm", layer_of(w), o.rows, o.cols);
        in_.gated_norm(cx, g, w, o, z);
    }
    void moe_route(context& cx, const batch& bt, const moe_shape& ms, const weight& router, tensor x, route r) {
        rec("moe_route", layer_of(router), x.rows, ms.n_expert);
        in_.moe_route(cx, bt, ms, router, x, r);
    }
    void moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r, tensor out) {
        rec("moe_ffn", layer_of(*mp.down_exps), x.rows, x.cols);
        in_.moe_ffn(cx, bt, ms, mp, x, r, out);
    }
    void lm_head(context& cx, const batch& bt, const weight& w, tensor x, tensor logits) {
        rec("lm_head", -1, logits.rows, logits.cols);
        in_.lm_head(cx, bt, w, x, logits);
    }
    void read_logits(context& cx, tensor logits, float* host) {
        {
            std::lock_guard lk(mu_);
            ++readbacks_;
        }
        rec("read_logits", -1, logits.rows, logits.cols);
        in_.read_logits(cx, logits, host);
    }

private:
    // The layer a weight belongs to, from its GGUF name ("blk.<i>."), -1 for global tensors.
    static std::int64_t layer_of(const weight& w) {
        if (w.name.rfind("blk.", 0) != 0) return -1;
        return std::atoll(w.name.c_str() + 4);
    }
    void rec(const char* what, std::int64_t layer, std::int64_t rows, std::int64_t cols) {
        std::lock_guard lk(mu_);
        calls_.push_back({what, layer, rows, cols});
    }

    Inner in_;
    mutable std::mutex mu_;
    std::vector<trace_call> calls_;
    std::int64_t readbacks_ = 0, passes_ = 0;
};

}  // namespace clover::backend
