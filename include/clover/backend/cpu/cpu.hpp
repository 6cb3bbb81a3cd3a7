#pragma once
// backend::cpu — the CPU policy: implements the backend concept (backend/concept.hpp) with host
// buffers, the thread pool and the kernels of this folder. It owns the pool, the per-pass
// scratch contexts (handed out one per concurrent pass) and creates state pools.
//
// Kernels are chosen at compile time (simd.hpp: AVX-512 with VNNI/BF16, AVX2, or scalar); the
// constructor runs the one CPUID check that refuses a binary this CPU cannot run.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "clover/backend/concept.hpp"
#include "clover/backend/cpu/attention.hpp"
#include "clover/backend/cpu/gdn.hpp"
#include "clover/backend/cpu/gemm.hpp"
#include "clover/backend/cpu/moe.hpp"
#include "clover/backend/cpu/simd.hpp"
#include "clover/backend/cpu/state.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/core/math.hpp"
#include "clover/quant/rows.hpp"
#include "clover/tensor/weight.hpp"

namespace clover::backend {

struct cpu_options {
    int threads = 0;         // 0: all hardware threads
    bool huge_pages = true;  // map_weights moves the weights into 2 MiB pages (io/huge_pages.hpp) when memory allows
    bool prefault = true;    // otherwise it populates the page tables of the weight file at load
    // map_weights rearranges the Q8_0 / Q4_K / Q6_K product matrices into 16-row groups (matmul.hpp:
    // x16_block) when it may rewrite the bytes (weights in huge pages); CLOVER_NO_REARRANGE=1
    // turns it off too (side-by-side benchmarks).
    bool rearrange = true;
};

// One product of the host-pointer helper matmul_many (tests, kernel twins): y[n, w.rows] =
// x · wᵀ; input rows default to the call's input; a job may bring its own (x, n) and gather.
struct matmul_job {
    const weight* w;
    float* y;
    const float* x = nullptr;
    std::int64_t n = -1;
    const std::int32_t* rows = nullptr;
};

class cpu {
public:
    static constexpr const char* name = "CPU";
    using options = cpu_options;

    struct tensor {
        float* data = nullptr;
        std::int64_t rows = 0, cols = 0;
    };
    struct route {
        std::int32_t* ids = nullptr;
        float* w = nullptr;
        std::int64_t rows = 0, k = 0;
    };
    using state = cpu_detail::state_pool;

    // Scratch of one pass: named buffers, product and MoE bookkeeping. Returned to the
    // backend's free list when the pass ends, so steady-state decoding allocates nothing.
    class context {
    public:
        struct data {
            std::array<std::vector<float>, std::size_t(buf::count)> bufs;
            std::vector<std::int32_t> ids, rows;
            std::vector<float> wts;
            cpu_detail::gemm_scratch gemm;
            cpu_detail::moe_scratch moe;
            std::vector<cpu_detail::gemm_job> jobs;
        };
        context(cpu* owner, std::unique_ptr<data> d) : owner_(owner), d_(std::move(d)) {}
        context(context&&) = default;
        context& operator=(context&&) = delete;
        ~context() {
            if (d_) owner_->release(std::move(d_));
        }
        tensor get(buf b, std::int64_t rows, std::int64_t cols) {
            auto& v = d_->bufs[std::size_t(b)];
            if (v.size() < std::size_t(rows * cols)) v.resize(std::size_t(rows * cols));
            return {v.data(), rows, cols};
        }
        route get_route(std::int64_t rows, std::int64_t k) {
            if (d_->ids.size() < std::size_t(rows * k)) {
                d_->ids.resize(std::size_t(rows * k));
                d_->wts.resize(std::size_t(rows * k));
            }
            return {d_->ids.data(), d_->wts.data(), rows, k};
        }
        data& scratch() { return *d_; }

    private:
        cpu* owner_;
        std::unique_ptr<data> d_;
    };

    explicit cpu(options o = {})
        : opt_(o), pool_((cpu_detail::check_cpu(), o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())))) {}
    cpu(const cpu&) = delete;
    cpu& operator=(const cpu&) = delete;

    int threads() const { return pool_.size(); }
    static const char* isa_name() { return cpu_detail::isa_name(); }

    // The model's weights are the mapped file itself (nothing is copied). Populating the page
    // tables once at load (MADV_POPULATE_READ: no copy, the pages stay the page cache's) moves
    // the first-touch faults out of the passes: without it every token of a decode run touched
    // new expert pages and spent ~15% of its time in the kernel's fault path (measured with
    // perf on the 8-layer Q4_K_M file). llama.cpp does the same with MAP_POPULATE. Skipped for
    // files that do not fit in the memory available (they only fit through demand paging) and
    // when options.prefault is false or CLOVER_NO_PREFAULT is set.
    // A stage of a model split by layers (m.parts) is populated only where it reads.
    void map_weights(const weight_memory& m) {
        if (opt_.huge_pages && m.to_huge_pages && m.parts.empty()) {
            std::string why = m.to_huge_pages();
            if (why.empty()) {
                weights_placement_ = "weights in huge pages";
                rearrange_products(m);
                return;  // populated by the copy
            }
            weights_placement_ = "weights mapped in place: " + why;
        } else {
            weights_placement_ = m.parts.empty() ? "weights mapped in place" : "a stage's weights mapped in place";
        }
        rearrange_products(m);  // rearranges nothing now, but marks what an earlier model of the file did
        // Memory honesty: weights that do not fit in memory are read again from disk as the
        // page cache evicts them, every token; the load line says how much.
        const std::string shortfall = m.shortfall ? m.shortfall() : std::string();
        if (!shortfall.empty()) weights_placement_ += "; " + shortfall;
        if (!opt_.prefault || m.bytes.empty() || std::getenv("CLOVER_NO_PREFAULT") || !shortfall.empty()) return;
        const long page = ::sysconf(_SC_PAGESIZE);
        for (const std::span<const std::byte> part : m.parts.empty() ? std::vector{m.bytes} : m.parts) {
            if (part.empty()) continue;
            auto* start = reinterpret_cast<std::byte*>(std::uintptr_t(part.data()) / std::uintptr_t(page) * std::uintptr_t(page));
            const std::size_t len = std::size_t(part.data() + part.size() - start);
#ifdef MADV_POPULATE_READ
            if (::madvise(start, len, MADV_POPULATE_READ) == 0) continue;
#endif
            ::madvise(start, len, MADV_WILLNEED);  // older kernels: at least read ahead
        }
    }

    // The decode products of several tokens (a batch of sequences, a verify or preview block)
    // run faster on rows regrouped 16 at a time (bench_repack; docs/performance.md, "A repacked
    // Q8_0 (and Q4_K) layout, probed"), and the regrouped form is row-exact, so it serves every token
    // count. The file is rewritten once, in place (weight_memory::rewrite_once): the first model
    // of a file decides, and a later model of the same file marks the matrices that one
    // rearranged (it must read them the same way) and rearranges no others.
    void rearrange_products(const weight_memory& m) {
        if (!m.rewrite_once) return;
        const bool want = opt_.rearrange && !std::getenv("CLOVER_NO_REARRANGE") && !m.products.empty();
        // Distinct matrices this build can regroup; two views of overlapping bytes are left alone.
        std::vector<weight*> todo;
        for (weight* w : m.products)
            if (w && w->data && w->rows >= 16 && cpu_detail::kernels_for(w->type).repack) todo.push_back(w);
        std::sort(todo.begin(), todo.end(), [](const weight* a, const weight* b) { return a->data < b->data; });
        auto bytes = [](const weight* w) { return std::size_t(w->n_mat) * std::size_t(w->rows) * w->row_bytes; };
        std::vector<weight*> unique;
        for (std::size_t i = 0; i < todo.size();) {  // runs of views whose bytes overlap (a chain counts)
            std::size_t j = i + 1;
            bool clash = false;
            const std::byte* end = todo[i]->data + bytes(todo[i]);
            for (; j < todo.size() && todo[j]->data < end; ++j) {
                clash |= !(todo[j]->data == todo[i]->data && bytes(todo[j]) == bytes(todo[i]) && todo[j]->rows == todo[i]->rows);
                end = std::max(end, todo[j]->data + bytes(todo[j]));
            }
            if (!clash) unique.push_back(todo[i]);
            i = j;
        }
        const std::vector<const std::byte*> done = m.rewrite_once(want ? weight_memory::rearrange_fn([&] {
            std::vector<const std::byte*> out;
            for (const weight* w : unique) out.push_back(w->data);
            pool_.run_chunks(std::int64_t(unique.size()), 1, [&](std::int64_t b, std::int64_t e, int) {
                std::vector<std::byte> rows;
                for (std::int64_t i = b; i < e; ++i) {
                    const weight& w = *unique[std::size_t(i)];
                    const auto& ks = cpu_detail::kernels_for(w.type);
                    const std::size_t group = 16 * w.row_bytes;
                    rows.resize(group);
                    for (std::int64_t e2 = 0; e2 < w.n_mat; ++e2) {
                        auto* mat = const_cast<std::byte*>(w.expert(e2).data);
                        for (std::int64_t g = 0; g < w.rows / 16; ++g) {
                            std::memcpy(rows.data(), mat + std::size_t(g) * group, group);
                            ks.repack(rows.data(), w.row_bytes, w.cols, mat + std::size_t(g) * group);
                        }
                    }
                }
            });
            return out;
        }) : weight_memory::rearrange_fn{});
        std::size_t n = 0;
        for (weight* w : todo)
            if (std::binary_search(done.begin(), done.end(), w->data)) {
                w->layout = weight_layout::rows16;
                ++n;
            }
        if (n) weights_placement_ += ", " + std::to_string(n) + " matrices in 16-row groups";
    }

    // ---- memory ----
    state make_state(std::span<const layer_state_spec> spec, const state_options& o) { return state(spec, o); }
    context begin_pass() {
        std::lock_guard lk(free_mu_);
        if (free_.empty()) return context(this, std::make_unique<context::data>());
        auto d = std::move(free_.back());
        free_.pop_back();
        return context(this, std::move(d));
    }

    // ---- sequences (the bookkeeping is the state pool's: state_pool.hpp advance / rollback) ----
    void replay_gdn(state::gdn_slot& slot, std::int64_t keep, const gdn_shape& g) { cpu_detail::gdn_rollback(g, slot, keep); }

    // ---- primitives (backend/concept.hpp says what each computes) ----
    void embed(context&, const batch& bt, const weight& tok_embd, tensor h) {
        const auto ids = bt.tokens();
        pool_.parallel_for(bt.rows(), 64, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t t = b; t < e; ++t)
                quant::dequantize_row(tok_embd.type, tok_embd.row(ids[std::size_t(t)]), h.data + t * h.cols, h.cols);
        });
    }
    void write_rows(context&, const batch&, const float* host, tensor t) {
        if (t.rows > 0) std::memcpy(t.data, host, std::size_t(t.rows * t.cols) * sizeof(float));
    }
    void rms_norm(context&, tensor x, const weight& w, tensor out, float eps) {
        pool_.parallel_for(x.rows, 16, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t t = b; t < e; ++t) math::rms_norm(x.data + t * x.cols, w.f32(), out.data + t * x.cols, x.cols, eps);
        });
    }
    void add_rms_norm(context&, tensor h, tensor y, const weight& w, tensor out, float eps) {
        pool_.parallel_for(h.rows, 16, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t t = b; t < e; ++t) {
                float* hr = h.data + t * h.cols;
                const float* yr = y.data + t * h.cols;
                for (std::int64_t i = 0; i < h.cols; ++i) hr[i] += yr[i];
                math::rms_norm(hr, w.f32(), out.data + t * h.cols, h.cols, eps);
            }
        });
    }
    void matmul(context& cx, const batch& bt, tensor x, std::span<const product_of<tensor>> prods) {
        auto& jobs = cx.scratch().jobs;
        jobs.clear();
        for (const auto& p : prods) jobs.push_back({p.w, p.y.data, x.data, x.rows});
        cpu_detail::run_gemm(pool_, cx.scratch().gemm, jobs, bt.row_exact());
    }
    void attn_prepare(context&, const batch& bt, state& st, std::int64_t layer, const attention_shape& a,
                      const attention_norms& nw, tensor qg, tensor k, tensor v, tensor q, tensor gate) {
        cpu_detail::attn_prepare(pool_, bt, st, layer, a, nw.q_norm->f32(), nw.k_norm->f32(), qg.data, k.data, v.data, q.data,
                                 gate.data);
    }
    void attention(context&, const batch& bt, state& st, std::int64_t layer, const attention_shape& a, tensor q, tensor gate,
                   tensor k, tensor v, tensor out) {
        cpu_detail::attention(pool_, bt, st, layer, a, q.data, gate.data, k.data, v.data, out.data);
    }
    void gdn_conv(context&, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w, tensor m,
                  tensor y) {
        cpu_detail::gdn_conv(pool_, bt, st, layer, g, w, m.data, y.data);
    }
    void gdn_mix(context&, const batch& bt, state& st, std::int64_t layer, const gdn_shape& g, const gdn_params& w, tensor y,
                 tensor beta, tensor alpha, tensor o) {
        cpu_detail::gdn_mix(pool_, bt, st, layer, g, w, y.data, beta.data, alpha.data, o.data);
    }
    void gated_norm(context&, const gdn_shape& g, const weight& norm, tensor o, tensor z) {
        cpu_detail::gated_norm(pool_, g, norm.f32(), o.data, z.data, o.rows);
    }
    void moe_route(context& cx, const batch& bt, const moe_shape& ms, const weight& router, tensor x, route r) {
        tensor probs = cx.get(buf::router, x.rows, ms.n_expert);
        matmul(cx, bt, x, std::span<const product_of<tensor>>(std::array{product_of<tensor>{&router, probs}}));
        cpu_detail::moe_route(bt, ms, probs.data, r.ids, r.w);
    }
    void moe_ffn(context& cx, const batch& bt, const moe_shape& ms, const moe_params& mp, tensor x, route r, tensor out) {
        cpu_detail::moe_ffn(pool_, cx.scratch().gemm, cx.scratch().moe, ms, mp, x.data, x.rows, r.ids, r.w, out.data, x.cols,
                            bt.row_exact());
    }
    void lm_head(context& cx, const batch& bt, const weight& output, tensor x, tensor logits) {
        auto& rows = cx.scratch().rows;
        rows = bt.logits_rows();
        if (rows.empty()) return;
        const cpu_detail::gemm_job j{&output, logits.data, x.data, std::int64_t(rows.size()), rows.data()};
        // A gathered job never takes the Eigen path; the quantized tiles are row-exact.
        cpu_detail::run_gemm(pool_, cx.scratch().gemm, std::span(&j, 1), bt.row_exact());
    }
    void read_logits(context&, tensor logits, float* host) {
        if (logits.rows > 0) std::memcpy(host, logits.data, std::size_t(logits.rows * logits.cols) * sizeof(float));
    }

    // ---- host-pointer helpers (kernel tests and twins; not part of the concept) ----
    // While alive, matmul/matmul_many compute each row exactly as a one-row product would.
    class exact_rows_scope {
    public:
        explicit exact_rows_scope(cpu& be) : be_(be), old_(be.exact_rows_) { be.exact_rows_ = true; }
        ~exact_rows_scope() { be_.exact_rows_ = old_; }
        exact_rows_scope(const exact_rows_scope&) = delete;
        exact_rows_scope& operator=(const exact_rows_scope&) = delete;

    private:
        cpu& be_;
        bool old_;
    };
    template <class F>
    void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
        pool_.parallel_for(n, grain, std::forward<F>(fn));
    }
    template <class F>
    void run_chunks(std::int64_t n, std::int64_t chunk, F&& fn) {
        pool_.run_chunks(n, chunk, std::forward<F>(fn));
    }
    void matmul(const weight& w, const float* x, float* y, std::int64_t n) {
        const matmul_job j{&w, y, x, n};
        matmul_many(std::span<const matmul_job>(&j, 1), x, n);
    }
    void matmul_many(std::span<const matmul_job> jobs, const float* x = nullptr, std::int64_t n = 0) {
        std::vector<cpu_detail::gemm_job> g;
        for (const auto& j : jobs) g.push_back({j.w, j.y, j.x ? j.x : x, j.n >= 0 ? j.n : n, j.rows});
        std::lock_guard lk(helper_mu_);
        cpu_detail::run_gemm(pool_, helper_scratch_, g, exact_rows_);
    }
    static void matmul_ref(const weight& w, const float* x, float* y, std::int64_t n) { cpu_detail::gemm_ref(w, x, y, n); }
    // Where map_weights left the weights, for the load line ("weights in huge pages", or
    // "weights mapped in place" and why).
    const std::string& weights_placement() const { return weights_placement_; }

private:
    void release(std::unique_ptr<context::data> d) {
        std::lock_guard lk(free_mu_);
        free_.push_back(std::move(d));
    }

    options opt_;
    cpu_detail::thread_pool pool_;
    std::mutex free_mu_, helper_mu_;
    std::vector<std::unique_ptr<context::data>> free_;
    cpu_detail::gemm_scratch helper_scratch_;
    bool exact_rows_ = false;
    std::string weights_placement_ = "no weights mapped";
};

}  // namespace clover::backend
