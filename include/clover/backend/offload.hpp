#pragma once
// backend::offload<Device, Host> — a device backend with some layers' work placed on a host
// backend: a composition, so neither backend knows the other (as llama.cpp's CUDA backend knows
// nothing of its CPU one). Every primitive runs on Device except the MoE feed-forward of the
// layers whose routed experts stay in host memory (options::host_moe_layers, llama.cpp's
// --n-cpu-moe): Device copies that layer's input and routing to host memory, Host computes the
// routed and shared experts there, Device copies the result back (Device::host_round_trip: one
// host wait per such layer, inside the pass).
//
// Placement is decided once, when the model hands over its weights (map_weights), from the
// routed-expert matrices it offers ("blk.<layer>.ffn_*_exps.weight"); a pass only looks up the
// address of a layer's down_exps matrix. Host, and its thread pool, exists only when something
// is placed on it: with nothing placed an offload is Device with one more pointer test per MoE
// layer, bit for bit.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/backend/shared.hpp"
#include "clover/core/error.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

// What an offload's Device offers besides the backend concept: host round trips. A
// composition that will run host work inside passes calls enable_host_round_trips() once,
// before any pass (a pass that waits for the host cannot be captured or queued ahead); then
// host_round_trip(cx, x, r, out, f) copies x [n, E] and r [n, k] into host memory, waits for
// them, calls f(host x, host r, host out) on the calling thread and copies f's output into out.
template <class D>
concept host_round_trip_device =
    requires(D& d, typename D::context& cx, typename D::tensor t, typename D::route r,
             void (*f)(host_tensor, host_route, host_tensor)) {
        d.enable_host_round_trips();
        d.host_round_trip(cx, t, r, t, f);
    };

// What an offload's Host needs besides the backend concept: tensors and routes made from views
// of host memory (its primitives work in place on the round trip's host copies).
template <class H>
concept host_memory_views = requires(float* p, std::int32_t* ids, std::int64_t n) {
    { typename H::tensor{p, n, n} } -> std::same_as<typename H::tensor>;
    { typename H::route{ids, p, n, n} } -> std::same_as<typename H::route>;
};

template <class Device, class Host>
struct offload_options {
    typename Device::options device{};  // the device backend's options
    typename Host::options host{};      // the host backend's, used only if something is placed on it
    // The routed experts of layers 0..host_moe_layers-1 stay in host memory, never uploaded, and
    // those layers' MoE feed-forward runs on Host (llama.cpp's --n-cpu-moe). 0: all on Device.
    int host_moe_layers = 0;
};

template <class Device, class Host>
class offload {
    static_assert(backend_for<Device>, "backend::offload<Device, Host>: Device does not implement the backend concept");
    static_assert(backend_for<Host>, "backend::offload<Device, Host>: Host does not implement the backend concept");
    static_assert(host_round_trip_device<Device>,
                  "backend::offload<Device, Host>: Device offers no host round trip (enable_host_round_trips, "
                  "host_round_trip), so it cannot hand a layer's work to a host backend (backend::cpu is no Device)");
    static_assert(!host_round_trip_device<Host>,
                  "backend::offload<Device, Host>: Host is itself a device backend (it offers host round trips); the host "
                  "backend must compute in host memory (e.g. backend::cpu)");
    static_assert(host_memory_views<Host>,
                  "backend::offload<Device, Host>: Host's tensor and route cannot view host memory ({float*, rows, cols}, "
                  "{int32_t* ids, float* w, rows, k})");

public:
    static constexpr const char* name = Device::name;  // the tables name the device
    using options = offload_options<Device, Host>;
    using tensor = typename Device::tensor;
    using route = typename Device::route;
    using state = typename Device::state;
    using context = typename Device::context;

    explicit offload(options o = {}) : opt_(std::move(o)), dev_(opt_.device) {
        if (opt_.host_moe_layers < 0)
            fail("backend::offload: host_moe_layers must be 0 or more (got ", opt_.host_moe_layers, ")");
    }
    offload(const offload&) = delete;
    offload& operator=(const offload&) = delete;

    Device& device() { return dev_; }
    const Device& device() const { return dev_; }
    // The host backend, or null while nothing is placed on it.
    Host* host() { return host_.get(); }
    const Host* host() const { return host_.get(); }
    // The host backend's threads (0: no host backend).
    int threads() const { return host_ ? host_->threads() : 0; }

    // ---- placement (decided by map_weights) ----
    // The layers whose MoE feed-forward runs on Host, ascending.
    const std::vector<std::int64_t>& host_layers() const { return host_layers_; }
    bool on_host(std::int64_t layer) const { return std::binary_search(host_layers_.begin(), host_layers_.end(), layer); }
    // True when w (a whole matrix or a view into one: expert(), row_slice()) lies in a routed-expert
    // matrix placed on the host.
    bool on_host(const weight& w) const {
        auto it = std::upper_bound(placed_.begin(), placed_.end(), w.data,
                                   [](const std::byte* p, const extent& e) { return std::less<>()(p, e.begin); });
        if (it == placed_.begin()) return false;
        --it;
        return std::less<>()(w.data, it->end);
    }

    // ---- memory ----
    // Decides placement: the routed-expert matrices of layers below host_moe_layers among the
    // matrices the model offers. The host maps the file only when something is placed on it,
    // and rearranges nothing (the device reads the file's layout).
    void map_weights(const weight_memory& m) {
        place(m.products);
        if (!placed_.empty()) {
            if (!host_) host_ = std::make_unique<Host>(opt_.host);
            weight_memory h = m;
            h.products.clear();
            host_->map_weights(h);
            dev_.enable_host_round_trips();
        }
        dev_.map_weights(m);
    }
    state make_state(std::span<const layer_state_spec> spec, const state_options& o) { return dev_.make_state(spec, o); }
    context begin_pass() { return dev_.begin_pass(); }

    // ---- sequences: the state is the device's, and so is the replay ----
    void replay_gdn(typename state::gdn_slot& slot, std::int64_t keep, const gdn_shape& g) { dev_.replay_gdn(slot, keep, g); }

    // ---- primitives: Device's, but for the host layers' MoE feed-forward ----
    void embed(context& cx, const batch& bt, const weight& tok_embd, tensor h) { dev_.embed(cx, bt, tok_embd, h); }
    void write_rows(context& cx, const batch& bt, const float* host, tensor t) { dev_.write_rows(cx, bt, host, t); }
    void rms_norm(context& cx, tensor x, const weight& w, tensor out, float eps) { dev_.rms_norm(cx, x, w, out, eps); }
    void add_rms_norm(context& cx, tensor h, tensor y, const weight& w, tensor out, float eps) {
        dev_.add_rms_norm(cx, h, y, w, out, eps);
    }
    void matmul(context& cx, const batch& bt, tensor x, std::span<const product_of<tensor>> prods) {
        dev_.matmul(cx, bt, x, prods);
    }
    void attn_prepare(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a,
                      const attention_norms& nw, tensor qg, tensor k, tensor v, tensor q, tensor gate) {
        dev_.attn_prepare(cx, bt, st, layer, a, nw, qg, k, v, q, gate);
    }
    void attention(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a, tensor q,
                   tensor gate, tensor k, tensor v, tensor out) {
        dev_.attention(cx, bt, st, layer, a, q, gate, k, v, out);
    }
    void gdn_conv(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w,
                  tensor m, tensor y) {
        dev_.gdn_conv(cx, bt, st, layer, g, w, m, y);
    }
    void gdn_mix(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w,
                 tensor y, tensor beta, tensor alpha, tensor o) {
        dev_.gdn_mix(cx, bt, st, layer, g, w, y, beta, alpha, o);
    }
    void gated_norm(context& cx, const gdn_shape& g, const weight& norm, tensor o, tensor z) {
        dev_.gated_norm(cx, g, norm, o, z);
    }
    void moe_route(context& cx, const batch& bt, const moe_shape& ms, const weight& router, tensor x, route r) {
        dev_.moe_route(cx, bt, ms, router, x, r);
    }
    // A host layer: x and the routing go to host memory, Host computes the routed and the
    // shared expert in one pass of its own (its row-exactness follows the batch's), the result
    // comes back into out.
    void moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r, tensor out) {
        if (!host_ || !on_host(*mp.down_exps)) {
            dev_.moe_ffn(cx, bt, ms, mp, x, r, out);
            return;
        }
        Host& h = *host_;
        dev_.host_round_trip(cx, x, r, out, [&](host_tensor hx, host_route hr, host_tensor hy) {
            typename Host::context hc = h.begin_pass();
            h.moe_ffn(hc, bt, ms, mp, typename Host::tensor{hx.data, hx.rows, hx.cols},
                      typename Host::route{hr.ids, hr.w, hr.rows, hr.k}, typename Host::tensor{hy.data, hy.rows, hy.cols});
        });
    }
    void lm_head(context& cx, const batch& bt, const weight& output, tensor x, tensor logits) {
        dev_.lm_head(cx, bt, output, x, logits);
    }
    void read_logits(context& cx, tensor logits, float* host) { dev_.read_logits(cx, logits, host); }

private:
    struct extent {
        const std::byte* begin;
        const std::byte* end;
    };
    // The layer of a routed-expert matrix's GGUF name ("blk.<layer>.ffn_*_exps.weight"), or -1.
    static std::int64_t expert_layer(const weight& w) {
        if (w.name.rfind("blk.", 0) != 0 || w.name.find("_exps") == std::string::npos) return -1;
        char* end = nullptr;
        const long long l = std::strtoll(w.name.c_str() + 4, &end, 10);
        return end != w.name.c_str() + 4 && *end == '.' ? l : -1;
    }
    void place(std::span<weight* const> mats) {
        placed_.clear();
        host_layers_.clear();
        for (const weight* w : mats) {
            if (!w || !*w) continue;
            const std::int64_t l = expert_layer(*w);
            if (l < 0 || l >= opt_.host_moe_layers) continue;
            placed_.push_back({w->data, w->data + std::size_t(w->rows * w->n_mat) * w->row_bytes});
            host_layers_.push_back(l);
        }
        std::sort(placed_.begin(), placed_.end(),
                  [](const extent& a, const extent& b) { return std::less<>()(a.begin, b.begin); });
        std::sort(host_layers_.begin(), host_layers_.end());
        host_layers_.erase(std::unique(host_layers_.begin(), host_layers_.end()), host_layers_.end());
    }

    options opt_;
    Device dev_;
    std::unique_ptr<Host> host_;  // made by map_weights when something is placed on it
    std::vector<extent> placed_;  // the host-placed matrices' bytes, by address
    std::vector<std::int64_t> host_layers_;
};

}  // namespace clover::backend
