#pragma once
// backend::cuda — the CUDA policy, beside backend::cpu: the same model type, decoders and session
// API work with `model<V, backend::cuda>`. Only nvcc translation units may include this header
// (it pulls in the .cuh kernels); CPU-only builds never see it.
//
// Device-resident (execution.md §2–3): weights are uploaded once (on first use, through pinned
// staging on an upload stream); KV pages, GDN states, conv rings, checkpoints and verify
// records live in a device state pool (state.cuh); every primitive is a kernel (or a CUB call)
// on one stream over the pass's device scratch. A pass uploads its batch (token ids, then the
// rows' page tables at its first attention layer, and its routing groups at its first MoE layer
// when a preview block has an expert coreset) and reads back once: read_logits, the only
// synchronisation. The exception is a host round trip (host_round_trip, for backend::offload:
// layers whose experts stay in host memory, --n-cpu-moe): the input goes to host memory, one more
// synchronisation, and the result comes back. Once a pass of a shape has run, later passes of
// that shape are captured into a CUDA graph and launched as one (graph.cuh; options.graphs, off
// once a composition enabled host round trips). This backend knows no other backend.
#if !defined(__CUDACC__) && !defined(CLOVER_CUDA_EMU)
#error "clover/backend/cuda/cuda.hpp must be compiled by nvcc (a .cu file, CLOVER_CUDA=ON); use backend::cpu otherwise"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/backend/shared.hpp"
#include "clover/backend/cuda/attention.cuh"
#include "clover/backend/cuda/gdn.cuh"
#include "clover/backend/cuda/graph.cuh"
#include "clover/backend/cuda/matmul.cuh"
#include "clover/backend/cuda/moe.cuh"
#include "clover/backend/cuda/ops.cuh"
#include "clover/backend/cuda/pass.cuh"
#include "clover/backend/cuda/runtime.cuh"
#include "clover/backend/cuda/state.cuh"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

struct cuda_options {
    int device = 0;  // CUDA device ordinal
    std::size_t staging_bytes = std::size_t(64) << 20;  // pinned buffer weights are uploaded through
    bool graphs = true;  // passes captured into CUDA graphs and replayed (graph.cuh); off with host round trips
};

class cuda {
public:
    static constexpr const char* name = "CUDA";
    using options = cuda_options;

    struct tensor {
        float* data = nullptr;  // device memory
        std::int64_t rows = 0, cols = 0;
    };
    struct route {
        int* ids = nullptr;  // device memory
        float* w = nullptr;
        std::int64_t rows = 0, k = 0;
    };
    using state = cuda_detail::device_state_pool;

    // Scratch of one pass, all device memory except the pinned staging of its uploads. Back on
    // the backend's free list when the pass ends, after the stream has finished with it.
    class context {
    public:
        struct data {
            std::array<cuda_detail::device_buffer, std::size_t(buf::count)> bufs;
            cuda_detail::device_buffer ids, wts, act, tokens, rows_idx, row_infos, page_ids, bases, groups;
            cuda_detail::pinned_buffer pin_tokens, pin_rows, pin_infos, pin_pages, pin_bases, pin_out;
            cuda_detail::pinned_buffer pin_in;  // write_rows: a stage's incoming residual rows
            cuda_detail::moe_scratch moe;
            cuda_detail::device_floats ring;  // the GDN ring's old rows while it advances
            cuda_detail::device_buffer attn_parts;  // split attention's partials (pass.cuh), grow-only
            bool tables = false;  // row infos and page tables uploaded for this pass
            std::int64_t groups_X = -1;  // the routing groups were built for X experts (-1: not yet this pass)
            std::vector<cuda_detail::route_group> host_groups;
            cuda_detail::pinned_buffer pin_groups;
            cuda_detail::pending_norm norm;  // a norm not launched yet (rms_norm, add_rms_norm)
            std::int64_t n_chunks = 0;
            std::vector<cuda_detail::row_info> host_infos;
            std::vector<std::int32_t> host_pages, host_ids;
            std::vector<const std::byte*> host_bases;
            cuda_detail::pinned_buffer pin_hx, pin_hy, pin_hw, pin_hids;  // host round trips
            // CUDA graphs (graph.cuh): the pass's shape, whether it is being captured, its hold on
            // the blocks freed during the capture (runtime.cuh), the verify records it wrote while
            // capturing (their copies run with the graph only), and the exceptions in flight when it began.
            cuda_detail::graph_key key;
            bool keyed = false, capturing = false;
            cuda_detail::capture_hold retired;
            std::vector<std::int64_t*> records;
            int uncaught = 0;
        };
        context(cuda* owner, std::unique_ptr<data> d) : owner_(owner), d_(std::move(d)) {}
        context(context&&) = default;
        context& operator=(context&&) = delete;
        ~context() {
            if (!d_) return;
            // An exception leaving the pass: a capture in progress is discarded, not launched.
            const bool unwinding = std::uncaught_exceptions() > d_->uncaught;
            owner_->release(std::move(d_), unwinding);
        }
        tensor get(buf b, std::int64_t rows, std::int64_t cols) {
            return {d_->bufs[std::size_t(b)].get<float>(std::size_t(std::max<std::int64_t>(1, rows * cols))), rows, cols};
        }
        route get_route(std::int64_t rows, std::int64_t k) {
            const auto n = std::size_t(std::max<std::int64_t>(1, rows * k));
            return {d_->ids.get<int>(n), d_->wts.get<float>(n), rows, k};
        }
        data& scratch() { return *d_; }

    private:
        cuda* owner_;
        std::unique_ptr<data> d_;
    };

    explicit cuda(options o = {}) : opt_(o) {
        const int n = cuda_detail::device_count();
        if (n == 0) fail("backend::cuda: no CUDA device is available");
        if (o.device < 0 || o.device >= n) fail("backend::cuda: device ", o.device, " does not exist (", n, " found)");
        if (o.staging_bytes == 0) fail("backend::cuda: staging_bytes must be positive");
        cuda_detail::device_guard on(o.device);
        stream_ = std::make_unique<cuda_detail::stream>();
        upload_stream_ = std::make_unique<cuda_detail::stream>();
    }
    cuda(const cuda&) = delete;
    cuda& operator=(const cuda&) = delete;

    int device() const { return opt_.device; }
    // The card's name (benchmark tables and JSON: `clover bench` prints it beside the backend).
    std::string device_name() const {
        cudaDeviceProp p{};
        CLOVER_CUDA_CHECK(cudaGetDeviceProperties(&p, opt_.device));
        return p.name;
    }
    cudaStream_t stream() const { return stream_->get(); }
    // The device products are row-exact by construction (matmul.cuh: one warp per output element
    // with a fixed reduction tree, whatever the number of rows), so this backend needs no
    // exact-rows scope (backend::cpu's host-pointer helpers have one).

    // ---- memory ----
    // The weights are uploaded on first use (dev), as the file lays them out: nothing is
    // rearranged, and a file an earlier CPU model rearranged is refused.
    void map_weights(const weight_memory& m) {
        if (m.rewrite_once && !m.rewrite_once({}).empty())
            fail("cuda: a CPU model in this process rearranged this file's weights for its kernels; open the file again for the GPU");
    }
    state make_state(std::span<const layer_state_spec> spec, const state_options& o) {
        cuda_detail::device_guard on(opt_.device);
        check_limits(spec);
        return state(spec, o, cuda_detail::device_store{stream(), opt_.device, std::make_shared<cuda_detail::float_cache>(opt_.device)});
    }
    context begin_pass() {
        cuda_detail::device_guard on(opt_.device);
        graphs_.throw_deferred();  // a graph launch that failed in an earlier pass's release
        graphs_.enter();           // waits while another thread's pass is being captured
        std::unique_ptr<context::data> d;
        try {
            std::lock_guard lk(free_mu_);
            if (free_.empty()) {
                d = std::make_unique<context::data>();
            } else {
                d = std::move(free_.back());
                free_.pop_back();
            }
        } catch (...) {
            graphs_.leave();
            throw;
        }
        d->tables = false;
        d->groups_X = -1;
        d->keyed = d->capturing = false;
        d->records.clear();
        d->uncaught = std::uncaught_exceptions();
        return context(this, std::move(d));
    }

    // ---- sequences (the bookkeeping is the state pool's: state_pool.hpp advance / rollback) ----
    void replay_gdn(state::gdn_slot& slot, std::int64_t keep, const gdn_shape& g) {
        cuda_detail::device_guard on(opt_.device);
        cuda_detail::stream_user busy(graphs_);  // its launches must not land in another thread's capture
        replay(g, slot, keep);
    }

    // ---- primitives (backend/concept.hpp says what each computes) ----
    void embed(context& cx, const batch& bt, const weight& tok_embd, tensor h) {
        cuda_detail::device_guard on(opt_.device);
        begin_capture(cx.scratch(), bt);  // the first primitive that sees the batch
        flush_norm(cx);
        auto& d = cx.scratch();
        d.host_ids.assign(bt.tokens().begin(), bt.tokens().end());
        const int* ids = upload(d.pin_tokens, d.tokens, d.host_ids.data(), d.host_ids.size());
        const cuda_detail::device_matrix& w = dev(tok_embd);
        cuda_detail::embed_rows(w.type, w.data, w.row_bytes, ids, h.data, bt.rows(), h.cols, stream());
    }
    // A stage that does not embed (a model split by layers) starts here, as embed does: the
    // rows go through the context's pinned buffer (written once per pass, read by the copy when
    // it runs: at the graph's launch for a captured pass).
    void write_rows(context& cx, const batch& bt, const float* host, tensor t) {
        cuda_detail::device_guard on(opt_.device);
        begin_capture(cx.scratch(), bt);
        flush_norm(cx);
        const std::size_t bytes = std::size_t(t.rows * t.cols) * sizeof(float);
        if (bytes == 0) return;
        auto& pin = cx.scratch().pin_in;
        pin.reserve(bytes);
        std::memcpy(pin.get(), host, bytes);
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(t.data, pin.get(), bytes, cudaMemcpyHostToDevice, stream()));
    }
    // The norms are deferred (issue 16): recorded here, launched by the next primitive — fused
    // with the conversion of its products' activations when that primitive reads `out` (matmul,
    // the router's and the LM head's products), in one kernel otherwise (flush_norm). Every
    // primitive runs a pending norm before reading anything, so the order of effects is kept
    // (moe_ffn, in cuda_ffn.hpp, does not: it always follows moe_route, which does).
    void rms_norm(context& cx, tensor x, const weight& w, tensor out, float eps) {
        cuda_detail::device_guard on(opt_.device);
        defer_norm(cx, x, nullptr, w, out, eps);
    }
    void add_rms_norm(context& cx, tensor h, tensor y, const weight& w, tensor out, float eps) {
        cuda_detail::device_guard on(opt_.device);
        if (y.rows != h.rows || y.cols != h.cols)
            fail("backend::cuda: add_rms_norm of [", y.rows, ", ", y.cols, "] onto [", h.rows, ", ", h.cols, "]");
        defer_norm(cx, h, y.data, w, out, eps);
    }
    // x is converted once per distinct activation type of the products (the GDN input projections
    // qkv, z, beta, alpha share x), each type into its own part of the act scratch.
    void matmul(context& cx, const batch&, tensor x, std::span<const product_of<tensor>> prods) {
        cuda_detail::device_guard on(opt_.device);
        const std::int64_t n = x.rows, K = x.cols;
        std::array<dtype, 4> types{};  // the non-F32 partner types: F16, BF16, Q8_0, Q8_K
        std::array<std::size_t, 4> offs{};
        int n_types = 0;
        std::size_t total = 0;
        for (const auto& p : prods) {
            if (p.w->cols != K)
                fail("backend::cuda: matmul of rows of ", K, " values with weight '", p.w->name, "' of ", p.w->cols, " columns");
            const dtype at = quant::activation_type(dev(*p.w).type);
            if (at == dtype::f32 || std::find(types.begin(), types.begin() + n_types, at) != types.begin() + n_types) continue;
            if (n_types == int(types.size())) fail("backend::cuda: matmul: more activation types than expected");
            types[std::size_t(n_types)] = at;
            offs[std::size_t(n_types++)] = total;
            total += (quant::row_bytes(at, K) * std::size_t(n) + 255) / 256 * 256;  // keeps each part 256-aligned
        }
        auto* act = cx.scratch().act.get<std::uint8_t>(std::max<std::size_t>(1, total));
        if (n_types == 0) convert(cx, x.data, n, K, dtype::f32, nullptr);  // runs a pending norm
        for (int t = 0; t < n_types; ++t) convert(cx, x.data, n, K, types[std::size_t(t)], act + offs[std::size_t(t)]);
        for (const auto& p : prods) {
            const cuda_detail::device_matrix& w = dev(*p.w);
            const dtype at = quant::activation_type(w.type);
            const auto t = std::size_t(std::find(types.begin(), types.begin() + n_types, at) - types.begin());
            void* a = at == dtype::f32 ? nullptr : act + offs[t];
            cuda_detail::matmul(w, x.data, p.y.data, n, a, stream(), 0, nullptr, -1, /*converted=*/true);
        }
    }
    void attn_prepare(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a,
                      const attention_norms& nw, tensor qg, tensor k, tensor v, tensor q, tensor gate) {
        cuda_detail::device_guard on(opt_.device);
        flush_norm(cx);
        const std::int64_t n = bt.rows(), H = a.n_head, Hkv = a.n_head_kv, hd = a.head_dim;
        const cudaStream_t s = stream();
        // The attention kernel's limits, checked before this layer writes its KV rows.
        if (!cuda_detail::split_attention_fits(H, Hkv, hd, cuda_detail::pattn_smem_optin(opt_.device)))
            fail("backend::cuda: attention with ", H, " heads over ", Hkv, " KV heads of ", hd,
                 " dims is outside the kernel's limits (head_dim <= ", 32 * cuda_detail::pattn_dims_per_lane,
                 ", heads grouped evenly, shared memory)");
        cuda_detail::split_qg(qg.data, q.data, gate.data, n * H, hd, s);
        cuda_detail::rms_norm(q.data, hd, f32(*nw.q_norm), q.data, hd, n * H, hd, a.rms_eps, s);
        cuda_detail::rms_norm(k.data, hd, f32(*nw.k_norm), k.data, hd, n * Hkv, hd, a.rms_eps, s);
        cuda_detail::rope_args r;
        r.n_rot = int(a.n_rot);
        r.scale = std::pow(a.rope_theta, -2.0f / float(a.n_rot));
        for (int i = 0; i < 4; ++i) r.sections[i] = a.rope_sections[i];
        for (const segment& sg : bt.segments()) {  // positions run on within a segment
            cuda_detail::rope(q.data + sg.row0 * H * hd, H * hd, hd, H, sg.n, sg.pos0, r, s);
            cuda_detail::rope(k.data + sg.row0 * Hkv * hd, Hkv * hd, hd, Hkv, sg.n, sg.pos0, r, s);
        }
        tables(cx, bt, st);
        cuda_detail::kv_store(k.data, v.data, cx.scratch().row_infos.get<cuda_detail::row_info>(), n, layout(cx, st, layer),
                              Hkv * hd, st.kv_f16(), s);
    }
    void attention(context& cx, const batch& bt, state& st, std::int64_t layer, const attention_shape& a, tensor q,
                   tensor gate, tensor k, tensor v, tensor out) {
        cuda_detail::device_guard on(opt_.device);
        flush_norm(cx);
        tables(cx, bt, st);
        // A row's keys: pos + 1 (commit/verify) or pos0 + n (preview), so at most its segment's pos0 + n.
        std::int64_t max_keys = 0;
        for (const segment& sg : bt.segments()) max_keys = std::max(max_keys, sg.pos0 + sg.n);
        cuda_detail::paged_attn_args pa{q.data, gate.data, k.data, v.data, out.data, nullptr,
                                        cx.scratch().row_infos.get<cuda_detail::row_info>(), layout(cx, st, layer),
                                        a.n_head, a.n_head_kv, a.head_dim, a.scale, st.kv_f16()};
        cuda_detail::paged_attention(pa, bt.rows(), max_keys, cx.scratch().attn_parts, stream());
    }
    void gdn_conv(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w, tensor m,
                  tensor y) {
        cuda_detail::device_guard on(opt_.device);
        flush_norm(cx);
        const std::int64_t C = g.channels;
        const int K = int(g.conv);
        const cudaStream_t s = stream();
        const cuda_detail::gdn_layout L = layout_of(g);
        for (const segment& sg : bt.segments()) {
            auto& slot = st.gdn(layer, sg.seq);
            const float* ms = m.data + sg.row0 * C;
            float* ys = y.data + sg.row0 * C;
            if (sg.kind == pass_kind::preview) {
                cuda_detail::conv_silu(slot.ring.data(), ms, f32(*w.conv), f32(*w.conv_right), ys, sg.n, C, K, s);
                cuda_detail::l2norm_qk(ys, sg.n, L, g.rms_eps, 1.f, s);
                continue;
            }
            if (records_rollback(sg)) {
                slot.begin_record(sg.n);
                copy_rows(slot.rec.m, ms, std::size_t(sg.n * C), slot.S);
                if (cx.scratch().capturing) cx.scratch().records.push_back(&slot.rec.n);  // end_capture
            }
            cuda_detail::conv_silu(slot.ring.data(), ms, f32(*w.conv), nullptr, ys, sg.n, C, K, s);
            // The ring moves through a scratch copy: advance_ring reads the old ring while writing.
            auto& old = cx.scratch().ring;
            old = slot.ring;
            cuda_detail::advance_ring(old.data(), ms, slot.ring.data(), sg.n, C, K, s);
            cuda_detail::l2norm_qk(ys, sg.n, L, g.rms_eps, 1.f / std::sqrt(float(g.dk)), s);
        }
    }
    void gdn_mix(context& cx, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w, tensor y,
                 tensor beta, tensor alpha, tensor o) {
        cuda_detail::device_guard on(opt_.device);
        flush_norm(cx);
        const std::int64_t C = g.channels, Hv = g.v_heads, inner = Hv * g.dv;
        const cudaStream_t s = stream();
        const cuda_detail::gdn_layout L = layout_of(g);
        cuda_detail::gdn_gates(beta.data, alpha.data, f32(*w.a), f32(*w.dt_bias), bt.rows(), Hv, s);
        for (const segment& sg : bt.segments()) {
            auto& slot = st.gdn(layer, sg.seq);
            const float* ys = y.data + sg.row0 * C;
            float* os = o.data + sg.row0 * inner;
            float* bs = beta.data + sg.row0 * Hv;
            float* gs = alpha.data + sg.row0 * Hv;
            if (sg.kind == pass_kind::preview) {
                cuda_detail::block_softmax(slot.S.data(), ys, os, L, sg.n, f32(*w.bd_scale), f32(*w.bd_bias), f32(*w.bd_c), s);
            } else if (gdn_chunked_segment(bt, sg)) {  // backend/shared.hpp: the CPU's choice
                cuda_detail::gdn_chunked(slot.S.data(), ys, bs, gs, os, L, sg.n, s);
            } else {
                cuda_detail::gdn_scan_args sa{};
                sa.S = slot.S.data();
                sa.y = ys;
                sa.beta = bs;
                sa.g = gs;
                sa.o = os;
                sa.n = sg.n;
                cuda_detail::gdn_scan(sa, L, s);
            }
            if (records_rollback(sg)) {  // what a rollback replays
                copy_rows(slot.rec.y, ys, std::size_t(sg.n * C), slot.S);
                copy_rows(slot.rec.g, gs, std::size_t(sg.n * Hv), slot.S);
                copy_rows(slot.rec.beta, bs, std::size_t(sg.n * Hv), slot.S);
            }
        }
    }
    void gated_norm(context& cx, const gdn_shape& g, const weight& norm, tensor o, tensor z) {
        cuda_detail::device_guard on(opt_.device);
        flush_norm(cx);
        cuda_detail::gated_norm(o.data, z.data, f32(norm), o.rows * g.v_heads, g.dv, g.rms_eps, stream());
    }
    // The router product, then one kernel for softmax, coresets and top-k (moe.cuh). Its group
    // table is built and uploaded at the pass's first MoE layer only (the segments and X are the
    // same for every layer), and not at all when no preview segment has a coreset.
    void moe_route(context& cx, const batch& bt, const moe_shape& ms, const weight& router, tensor x, route r) {
        cuda_detail::device_guard on(opt_.device);
        const std::int64_t X = ms.n_expert, k = ms.n_expert_used;
        tensor probs = cx.get(buf::router, x.rows, X);
        product(cx, router, x.data, x.rows, probs.data);
        auto& d = cx.scratch();
        if (d.groups_X != X) {
            // One table per pass: its pinned buffer is written once, before the copy that reads
            // it runs (at the graph's launch when the pass is captured).
            if (d.groups_X != -1)
                fail("backend::cuda: MoE layers with different expert counts (", d.groups_X, " and ", X,
                     ") in one model are not supported");
            cuda_detail::route_groups(bt, X, d.host_groups);
            if (!d.host_groups.empty()) upload(d.pin_groups, d.groups, d.host_groups.data(), d.host_groups.size());
            d.groups_X = X;
        }
        const cuda_detail::route_group* groups = d.host_groups.empty() ? nullptr : d.groups.get<cuda_detail::route_group>();
        cuda_detail::route(probs.data, x.rows, X, int(k), groups, std::int64_t(d.host_groups.size()), r.ids, r.w, stream());
    }
    void moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r, tensor out);

    // ---- host round trips (backend::offload: a layer's work placed on a host backend) ----
    // Said once, before any pass, by a composition that will run host work inside passes: such a
    // pass waits for the host, which a CUDA graph cannot capture, so no pass is captured after.
    void enable_host_round_trips() { host_trips_ = true; }
    // x [n, E] and r [n, k] copied into pinned host buffers, one wait, f(x, r, out) on the calling
    // thread over those copies (out: [n, E], for f to write), and out's copy queued back into
    // `out` (cuda_ffn.hpp). No other backend is known here: f is the composition's.
    template <class F>
    void host_round_trip(context& cx, tensor x, route r, tensor out, F&& f);

    void lm_head(context& cx, const batch& bt, const weight& output, tensor x, tensor logits) {
        cuda_detail::device_guard on(opt_.device);
        auto& d = cx.scratch();
        d.host_ids = bt.logits_rows();
        if (d.host_ids.empty()) return;
        const int* rows = upload(d.pin_rows, d.rows_idx, d.host_ids.data(), d.host_ids.size());
        product(cx, output, x.data, x.rows, logits.data, rows, std::int64_t(d.host_ids.size()));
    }
    void read_logits(context& cx, tensor logits, float* host) {
        cuda_detail::device_guard on(opt_.device);
        flush_norm(cx);
        auto& d = cx.scratch();
        const std::size_t bytes = std::size_t(logits.rows * logits.cols) * sizeof(float);
        auto& pin = d.pin_out;
        pin.reserve(bytes);
        if (bytes) CLOVER_CUDA_CHECK(cudaMemcpyAsync(pin.get(), logits.data, bytes, cudaMemcpyDeviceToHost, stream()));
        // A captured pass ends here, its read-back the graph's last node; the graph is launched
        // and the wait below is for it. (A pass without logits rows waits in release.)
        if (d.capturing) end_capture(d, true);
        if (bytes == 0) {
            if (d.keyed) graphs_.ready(d.key);
            return;
        }
        stream_->sync();  // the pass's one synchronisation
        if (d.keyed) graphs_.ready(d.key);
        std::memcpy(host, pin.get(), bytes);
    }

    // ---- host-pointer helpers (kernel tests and twins; not part of the concept) ----
    // y[n, w.rows] = x[n, w.cols] · wᵀ; x and y are host pointers.
    void matmul(const weight& w, const float* x, float* y, std::int64_t n) {
        if (n <= 0) return;
        cuda_detail::device_guard on(opt_.device);
        cuda_detail::stream_user busy(graphs_);  // never captured: it waits for the device itself
        std::lock_guard lk(helper_mu_);
        const std::size_t xb = std::size_t(n * w.cols) * 4, yb = std::size_t(n * w.rows) * 4;
        float* dx = hx_.get<float>(std::size_t(n * w.cols));
        float* dy = hy_.get<float>(std::size_t(n * w.rows));
        void* act = hact_.get<std::uint8_t>(cuda_detail::act_bytes(w.type, n, w.cols));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(dx, x, xb, cudaMemcpyHostToDevice, stream()));
        cuda_detail::matmul(dev(w), dx, dy, n, act, stream());
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(y, dy, yb, cudaMemcpyDeviceToHost, stream()));
        stream_->sync();
    }

    // The device copy of a weight, uploaded on first use through pinned staging. Keyed by the
    // address of its first byte (stable for the model's life) and its shape: a row slice of a
    // merged tensor is its own entry. The copies go on a stream of their own, waited for before
    // this returns, so the weight is in place before any kernel queued after can read it: the
    // pass's stream may be capturing (graph.cuh), where a wait is refused and a copy would only
    // run when the graph does. The wait costs nothing after warm-up (each weight uploads once).
    const cuda_detail::device_matrix& dev(const weight& w) {
        cuda_detail::device_guard on(opt_.device);
        std::lock_guard lk(upload_mu_);
        const key k{w.data, w.rows * w.n_mat};
        auto it = cache_.find(k);
        if (it != cache_.end()) return it->second.m;
        if (!quant::is_supported_weight(w.type))
            fail("backend::cuda: weight '", w.name, "' has type ", dtype_name(w.type), ", which has no CUDA kernel");
        entry e;
        const std::size_t bytes = std::size_t(w.rows * w.n_mat) * w.row_bytes;
        e.buf.reserve(std::max<std::size_t>(bytes, 1));
        const std::size_t chunk = opt_.staging_bytes;  // bounded pinned staging, reused
        staging_.reserve(std::min(bytes, chunk));
        for (std::size_t off = 0; off < bytes; off += chunk) {
            const std::size_t len = std::min(chunk, bytes - off);
            if (off) upload_stream_->sync();  // the previous chunk has left the staging buffer
            std::memcpy(staging_.get(), reinterpret_cast<const std::byte*>(w.data) + off, len);
            CLOVER_CUDA_CHECK(cudaMemcpyAsync(e.buf.get<std::byte>() + off, staging_.get(), len, cudaMemcpyHostToDevice,
                                              upload_stream_->get()));
        }
        upload_stream_->sync();  // in place before any later kernel; the staging buffer is free
        e.m = {e.buf.get<const std::uint8_t>(), w.type, w.cols, w.rows, w.n_mat, w.row_bytes};
        uploaded_bytes_ += bytes;
        return cache_.emplace(k, std::move(e)).first->second.m;
    }
    const cuda_detail::device_matrix& upload(const weight& w) { return dev(w); }
    // Runs a pending norm (rms_norm, add_rms_norm) of the pass, in one kernel (add and norm);
    // every primitive does this first, and tests that read a norm's output directly call it.
    void flush_norm(context& cx) {
        cuda_detail::pending_norm& p = cx.scratch().norm;
        if (!p.on) return;
        p.on = false;
        cuda_detail::norm_act(p, dtype::f32, nullptr, stream());
    }
    std::size_t uploaded_bytes() const { return uploaded_bytes_; }

private:
    struct key {
        const std::byte* data;
        std::int64_t rows;
        bool operator==(const key& o) const { return data == o.data && rows == o.rows; }
    };
    struct key_hash {
        std::size_t operator()(const key& k) const {
            return std::hash<const void*>()(k.data) ^ (std::hash<std::int64_t>()(k.rows) << 1);
        }
    };
    struct entry {
        cuda_detail::device_buffer buf;
        cuda_detail::device_matrix m;
    };

    void release(std::unique_ptr<context::data> d, bool unwinding) {
        // A capture still open: an exception left the pass (discarded, nothing of it runs; the
        // shape's next pass runs eagerly), or the pass never called read_logits (model.hpp always
        // does; launched here, a failure reported by the next begin_pass: a destructor cannot throw).
        bool discarded = d->capturing && unwinding;
        if (d->capturing) {
            try {
                cuda_detail::device_guard on(opt_.device);
                end_capture(*d, !unwinding);
            } catch (const std::exception& e) {
                if (d->capturing) end_capture(*d, false);  // the guard failed: ended all the same
                discarded = true;
                if (!unwinding) graphs_.defer(e.what());
            }
        }
        // A norm nobody read (a pass that ended early) is still run after what the pass queued,
        // so its effect on h (the residual add) does not depend on what came after — unless the
        // pass was a capture discarded above, of which nothing ran. Errors have nowhere to go here.
        if (d->norm.on) {
            d->norm.on = false;
            if (!discarded) {
                try {
                    cuda_detail::device_guard on(opt_.device);
                    cuda_detail::norm_act(d->norm, dtype::f32, nullptr, stream());
                } catch (...) {
                }
            }
        }
        // The stream may still be using the pass's buffers (a pass that ended early, by an
        // error, before read_logits): they are reused only after it is done with them.
        (void)cudaStreamSynchronize(stream());
        d->retired.release();  // the graph that named the blocks retired meanwhile has run
        {
            std::lock_guard lk(free_mu_);
            free_.push_back(std::move(d));
        }
        graphs_.leave();  // after: the next pass finds this scratch, grown for its shape
    }
    bool graphs_on() const { return opt_.graphs && !host_trips_; }  // host round trips wait inside the pass
    // A pass is captured from embed on once a whole pass of its shape ran eagerly, when it is
    // the stream's only user (graph.cuh), until read_logits (or release).
    void begin_capture(context::data& d, const batch& bt) {
        if (!graphs_on() || d.keyed) return;
        d.key = cuda_detail::graph_key_of(bt);
        d.keyed = true;
        d.retired.hold();  // before the capture opens: no block is freed while it is open
        if (!graphs_.begin(d.key, stream())) {
            d.retired.release();
            return;
        }
        d.capturing = true;
    }
    // launch: the graph is launched (the pass runs now); otherwise discarded (graph.cuh). A graph
    // that was not launched ran none of the pass's copies: the verify records the pass wrote say
    // no rows (a rollback refuses instead of replaying arrays the copies never filled).
    void end_capture(context::data& d, bool launch) {
        d.capturing = false;
        const auto drop_records = [&d]() noexcept {
            for (std::int64_t* n : d.records) *n = 0;
            d.records.clear();
        };
        try {
            graphs_.end(d.key, stream(), launch);
        } catch (...) {
            drop_records();
            throw;
        }
        if (!launch) drop_records();
    }
    // The kernels' limits against the model's shapes, once, before any pass: a limit met half
    // way through a pass would leave the earlier layers' states advanced.
    void check_limits(std::span<const layer_state_spec> spec) const {
        int max_smem = 0;
        CLOVER_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, opt_.device));
        for (std::size_t l = 0; l < spec.size(); ++l) {
            const layer_state_spec& s = spec[l];
            if (s.k == layer_state_spec::kind::attention && s.head_dim > 0) {
                const std::int64_t kv_heads = s.kv_width / s.head_dim;
                if (!cuda_detail::split_attention_fits(s.n_head, kv_heads, s.head_dim, max_smem))
                    fail("backend::cuda: layer ", l, ": attention with ", s.n_head, " heads over ", kv_heads, " KV heads of ",
                         s.head_dim, " dims is outside the kernel's limits (head_dim <= ", 32 * cuda_detail::pattn_dims_per_lane,
                         ", heads grouped evenly, ", max_smem, " bytes of shared memory for a group's queries and a key tile)");
            }
            if (s.k == layer_state_spec::kind::gdn) {
                const cuda_detail::gdn_layout L{s.conv_channels, 1, s.gdn_heads, s.gdn_dk, s.gdn_dv, false};
                if (cuda_detail::gdn_chunked_smem(L, 32) > std::size_t(max_smem))
                    fail("backend::cuda: layer ", l, ": a GDN head of ", s.gdn_dk, " x ", s.gdn_dv,
                         " needs more shared memory for its chunked prefill than the device has (", max_smem, " bytes)");
            }
            if (s.n_expert > 0 && (s.n_expert > cuda_detail::max_experts || s.n_expert_used < 1 ||
                                   s.n_expert_used > cuda_detail::max_experts_used || s.n_expert_used > s.n_expert))
                fail("backend::cuda: layer ", l, ": ", s.n_expert, " experts with ", s.n_expert_used,
                     " per token are outside the routing kernel's limits (at most ", cuda_detail::max_experts, " experts, 1..",
                     cuda_detail::max_experts_used, " per token)");
        }
    }
    const float* f32(const weight& w) { return reinterpret_cast<const float*>(dev(w).data); }
    static cuda_detail::gdn_layout layout_of(const gdn_shape& g) {
        return {g.channels, g.qk_heads, g.v_heads, g.dk, g.dv, g.grouped_heads};
    }
    // n host values through pinned staging into a device buffer, queued on the stream. Each
    // pinned buffer is written at most once per pass: the copy reads it when it runs, which for a
    // captured pass is when the graph is launched, after the whole pass was recorded.
    template <class T>
    T* upload(cuda_detail::pinned_buffer& pin, cuda_detail::device_buffer& dst, const T* src, std::size_t n) {
        const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(T);
        pin.reserve(bytes);
        dst.reserve(bytes);
        std::memcpy(pin.get(), src, n * sizeof(T));
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(dst.get(), pin.get(), n * sizeof(T), cudaMemcpyHostToDevice, stream()));
        return dst.get<T>();
    }
    // dst <- n floats at src; a record array not yet made comes from the pool of `like`.
    void copy_rows(cuda_detail::device_floats& dst, const float* src, std::size_t n, const cuda_detail::device_floats& like) {
        if (dst.stream() == nullptr) dst = cuda_detail::device_floats(n, stream(), opt_.device, like.cache());
        dst.resize(n);
        if (n) CLOVER_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, n * 4, cudaMemcpyDeviceToDevice, stream()));
    }
    // y[n, w.rows] = x · wᵀ; with `rows`, y has n_out rows and row p reads input row rows[p].
    // A pending norm whose output is x is fused with the conversion (convert).
    void product(context& cx, const weight& w, const float* x, std::int64_t n, float* y, const int* rows = nullptr,
                 std::int64_t n_out = -1) {
        void* act = cx.scratch().act.get<std::uint8_t>(std::max<std::size_t>(1, cuda_detail::act_bytes(w.type, n, w.cols)));
        const cuda_detail::device_matrix& m = dev(w);
        convert(cx, x, n, w.cols, quant::activation_type(w.type), act);
        cuda_detail::matmul(m, x, y, n, act, stream(), 0, rows, n_out, /*converted=*/true);
    }
    void defer_norm(context& cx, tensor x, const float* add, const weight& w, tensor out, float eps) {
        flush_norm(cx);  // an earlier norm may produce this one's input
        if (out.rows != x.rows || out.cols < x.cols)
            fail("backend::cuda: a norm of [", x.rows, ", ", x.cols, "] rows into [", out.rows, ", ", out.cols, "]");
        cuda_detail::pending_norm& p = cx.scratch().norm;
        p = {true, x.data, add, f32(w), out.data, x.cols, out.cols, x.rows, x.cols, eps};
    }
    // x [n, K] converted to `at` in act (F32: nothing; x is read as it is). A pending norm whose
    // output is x runs now, writing x and its conversion in one kernel; any other runs first.
    void convert(context& cx, const float* x, std::int64_t n, std::int64_t K, dtype at, void* act) {
        cuda_detail::pending_norm& p = cx.scratch().norm;
        if (p.on && p.out == x && p.rows == n && p.n == K && p.ys == K) {
            p.on = false;
            cuda_detail::norm_act(p, at, act, stream());
            return;
        }
        flush_norm(cx);
        cuda_detail::quantize_activations(at, x, act, n, K, stream());
    }
    // The rows' descriptors and their sequences' page lists, once per pass (the first attention
    // layer): the pool's pages do not change during a pass.
    void tables(context& cx, const batch& bt, state& st) {
        auto& d = cx.scratch();
        if (d.tables) return;
        d.host_infos.clear();
        d.host_pages.clear();
        for (const segment& sg : bt.segments()) {
            // The kernels index page lists unchecked: a row past the capacity would reach the
            // next sequence's pages (the CPU pool's kv() refuses it).
            if (sg.pos0 + sg.n > st.capacity(sg.seq))
                fail("backend::cuda: positions up to ", sg.pos0 + sg.n, " exceed the sequence's capacity ", st.capacity(sg.seq));
            const auto& pages = st.page_ids(sg.seq);
            const auto off = std::int32_t(d.host_pages.size());
            d.host_pages.insert(d.host_pages.end(), pages.begin(), pages.end());
            const bool preview = sg.kind == pass_kind::preview;
            for (std::int64_t r = 0; r < sg.n; ++r) {
                const std::int64_t pos = sg.pos0 + r;
                d.host_infos.push_back({std::int32_t(pos), std::int32_t(preview ? sg.pos0 : pos + 1), off,
                                        std::int32_t(preview ? sg.row0 : 0), std::int32_t(preview ? sg.n : 0)});
            }
        }
        d.n_chunks = st.n_chunks();
        d.host_bases.clear();
        for (std::int64_t a = 0; a < st.n_kv_slots(); ++a)
            for (std::int64_t c = 0; c < d.n_chunks; ++c) {
                d.host_bases.push_back(st.chunk_base(a, c, 0));
                d.host_bases.push_back(st.chunk_base(a, c, 1));
            }
        upload(d.pin_infos, d.row_infos, d.host_infos.data(), d.host_infos.size());
        upload(d.pin_pages, d.page_ids, d.host_pages.data(), d.host_pages.size());
        upload(d.pin_bases, d.bases, d.host_bases.data(), d.host_bases.size());
        d.tables = true;
    }
    cuda_detail::kv_layout layout(context& cx, state& st, std::int64_t layer) {
        auto& d = cx.scratch();
        const std::int64_t a = st.slot(layer);
        return {d.bases.get<const std::byte*>() + a * d.n_chunks * 2, d.page_ids.get<std::int32_t>(), st.page_size(),
                state::chunk_pages, std::size_t(st.kv_width(layer)) * (st.kv_f16() ? 2 : 4)};
    }
    // A verified GDN layer back to the state after its first `keep` rows: the segment-start
    // state and ring, then the recurrence over the recorded rows (no weights are read).
    void replay(const gdn_shape& g, state::gdn_slot& slot, std::int64_t keep) {
        auto& r = slot.rec;
        if (keep < 0 || keep > r.n) fail("gdn rollback: cannot keep ", keep, " of ", r.n, " verified rows");
        slot.S = r.S0;
        slot.ring = r.ring0;
        if (keep > 0) {
            const cudaStream_t s = stream();
            cuda_detail::advance_ring(r.ring0.data(), r.m.data(), slot.ring.data(), keep, g.channels, int(g.conv), s);
            auto& o = replay_out_;  // outputs nobody reads; grow-only (rollbacks of one backend are serial)
            if (o.stream() == nullptr) o = cuda_detail::device_floats(0, s, opt_.device);
            o.resize(std::size_t(keep * g.v_heads * g.dv));
            cuda_detail::gdn_scan_args sa{};
            sa.S = slot.S.data();
            sa.y = r.y.data();
            sa.beta = r.beta.data();
            sa.g = r.g.data();
            sa.o = o.data();
            sa.n = keep;
            cuda_detail::gdn_scan(sa, layout_of(g), s);
        }
        r.n = 0;
    }

    options opt_;
    std::atomic<bool> host_trips_{false};  // enable_host_round_trips
    std::unique_ptr<cuda_detail::stream> stream_;
    std::unique_ptr<cuda_detail::stream> upload_stream_;  // weight uploads (dev)
    std::mutex free_mu_, upload_mu_, helper_mu_;
    std::vector<std::unique_ptr<context::data>> free_;
    cuda_detail::pass_graphs graphs_;  // the passes' executables and who uses the stream (graph.cuh)
    std::unordered_map<key, entry, key_hash> cache_;
    cuda_detail::pinned_buffer staging_;
    cuda_detail::device_buffer hx_, hy_, hact_;
    cuda_detail::device_floats replay_out_;
    std::size_t uploaded_bytes_ = 0;
};

}  // namespace clover::backend

#include "clover/backend/cuda/cuda_ffn.hpp"
