#pragma once
// CUDA graphs for backend::cuda's passes (issue 16: "a CUDA graph per (pass kind, rows bucket),
// captured once and replayed"). A pass launches ~40-50 kernels per layer, 1,500-2,300 for the
// 40-layer model; launched one by one, a decode step is bound by the host's launch rate and the
// GPU idles between small kernels. Launched as one graph, the whole pass is one host call.
//
// Capture + update (llama.cpp's scheme), not a pure replay: every pass is captured again and the
// captured graph is folded into the shape's cached executable with cudaGraphExecUpdate, which
// keeps the instantiated executable and only rewrites node parameters. Needed because a pass's
// kernel arguments change from step to step although its shape does not: positions are kernel
// arguments (rope's pos0), the sequences' GDN states, rings and verify records are arguments
// (pointers into the state pool, per sequence), and scratch and upload buffers come from
// whichever context the pass got. A pure replay (cudaGraphLaunch alone) would need all of that
// at fixed device addresses read through memory: positions and per-row state pointers in
// tables uploaded by the pass (as the attention rows already are, pass.cuh row_info), scratch
// from one arena per shape, and uploads from fixed pinned staging. Capturing costs the host the
// launch calls' argument packing (no driver submission); the update is a walk over the nodes.
//
// Keys (graph_key_of) are what decides the pass's launch topology: per segment its kind, rows,
// coreset and logits rows, plus the batch's exact flag. Anything else that changes the node
// list (a verify record made for a new sequence adds memset nodes; F16 and F32 KV pools use
// different attention kernels; split attention adds its merge kernel once a row has more than
// 256 keys) makes the update refuse, and the key gets a new executable.
//
// Nothing inside a captured pass may wait for the device or run host work on device results;
// what a pass reaches (backend::cuda, checked by tests_cuda_host's recording runtime):
// - weights first used inside a capture: uploaded on the backend's upload stream and waited
//   for there (cuda::dev), never on the capturing stream;
// - grow-only scratch (context buffers, MoE and CUB temporaries, split attention's partials,
//   pinned upload and read-back buffers): cudaMalloc is allowed (relaxed capture mode); the
//   old block is retired, not freed, until the graph has run (runtime.cuh retirements: process-
//   wide, so a pass captured on one thread may be finished on another, and any thread's free
//   waits while a capture is open);
// - CUB's temporary sizing is host arithmetic, no device call;
// - the state pool's float arrays (state.cuh float_cache): take() may cudaMalloc; only its
//   trim() on a full device frees, which a capture refuses: that pass fails (the retried
//   allocation or the ended capture reports it) before anything of it ran, and its shape's next
//   pass runs eagerly, where trim works;
// - a verify segment's records (the rows a rollback replays) are copies that run with the graph:
//   a discarded capture leaves them saying no rows (backend::cuda end_capture), not the pass's;
// - host round trips (backend::offload, --n-cpu-moe) wait inside the pass: graphs are off with them;
// - the state pool's own copies and zeroing (opening a sequence, checkpoints) are queued on the
//   pass's stream and would land in a capture if another thread queued them meanwhile: they
//   come from the thread that runs the passes (model.hpp, the server's worker).
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "clover/backend/cuda/runtime.cuh"
#include "clover/core/batch.hpp"

namespace clover::backend::cuda_detail {

struct graph_key {
    std::vector<std::int64_t> v;
    bool operator==(const graph_key&) const = default;
};

inline graph_key graph_key_of(const batch& bt) {
    graph_key k;
    k.v.reserve(2 + 4 * bt.segments().size());
    k.v.push_back(bt.exact ? 1 : 0);  // the GDN recurrence's chunked or row-by-row kernels
    k.v.push_back(bt.n_logits());
    for (const segment& s : bt.segments()) {
        k.v.push_back(std::int64_t(s.kind));
        k.v.push_back(s.n);
        k.v.push_back(s.coreset);
        k.v.push_back(s.n_logits());
    }
    return k;
}

// The executables of the most recently used shapes, at most `capacity` keys (a server's mix of
// batch shapes is open-ended; each executable holds device memory for its nodes). Not
// thread-safe: backend::cuda calls it under its pass mutex.
class graph_cache {
public:
    static constexpr std::size_t default_capacity = 16;
    explicit graph_cache(std::size_t capacity = default_capacity) : cap_(capacity < 1 ? 1 : capacity) {}
    ~graph_cache() {
        for (entry& e : entries_) destroy(e);
    }
    graph_cache(const graph_cache&) = delete;
    graph_cache& operator=(const graph_cache&) = delete;

    // Whether a pass of shape k is captured: once a whole pass of k (embed to read_logits) ran
    // eagerly (ready), growing the scratch and uploading the weights it needs. A first sight
    // records k, evicting the least recently used key when full, and runs eagerly; primitives
    // called one by one (tests reading tensors mid-pass) never reach read_logits, never capture.
    bool capture(const graph_key& k) {
        entry& e = find_or_add(k);
        return e.ready;
    }
    // A pass of shape k ran whole, eagerly.
    void ready(const graph_key& k) {
        if (entry* e = find(k)) e->ready = true;
    }
    // The captured graph g (destroyed here) into k's executable, launched on s: updated in
    // place when the node lists match, else instantiated anew.
    void launch(const graph_key& k, cudaGraph_t g, cudaStream_t s) {
        struct owned {
            cudaGraph_t g;
            ~owned() { (void)cudaGraphDestroy(g); }
        } own{g};
        entry& e = find_or_add(k);
        if (e.exec) {
            cudaGraphExecUpdateResultInfo info{};
            if (cudaGraphExecUpdate(e.exec, g, &info) != cudaSuccess) {
                // A refusal (the topology changed) is an answer, not an error: cleared, so the
                // next launch check does not report it.
                (void)cudaGetLastError();
                destroy(e);
            }
        }
        if (!e.exec) CLOVER_CUDA_CHECK(cudaGraphInstantiate(&e.exec, g, 0));
        CLOVER_CUDA_CHECK(cudaGraphLaunch(e.exec, s));
    }
    // k's next pass runs eagerly again (its capture was abandoned or failed).
    void forget(const graph_key& k) noexcept {
        for (std::size_t i = 0; i < entries_.size(); ++i)
            if (entries_[i].key == k) {
                destroy(entries_[i]);
                entries_.erase(entries_.begin() + std::ptrdiff_t(i));
                return;
            }
    }
    std::size_t size() const { return entries_.size(); }

private:
    struct entry {
        graph_key key;
        cudaGraphExec_t exec = nullptr;
        std::uint64_t used = 0;
        bool ready = false;
    };
    static void destroy(entry& e) noexcept {
        if (e.exec) (void)cudaGraphExecDestroy(e.exec);
        e.exec = nullptr;
    }
    entry* find(const graph_key& k) {
        for (entry& e : entries_)
            if (e.key == k) {
                e.used = ++clock_;
                return &e;
            }
        return nullptr;
    }
    entry& find_or_add(const graph_key& k) {
        if (entry* e = find(k)) return *e;
        if (entries_.size() >= cap_) {  // at most 16 keys: a linear scan is cheaper than a map
            std::size_t lru = 0;
            for (std::size_t i = 1; i < entries_.size(); ++i)
                if (entries_[i].used < entries_[lru].used) lru = i;
            destroy(entries_[lru]);
            entries_.erase(entries_.begin() + std::ptrdiff_t(lru));
        }
        entries_.push_back({k, nullptr, ++clock_, false});
        return entries_.back();
    }

    std::vector<entry> entries_;
    std::size_t cap_;
    std::uint64_t clock_ = 0;
};

// The captures of one backend's stream. Every pass and every other user of the stream (a
// rollback, the host-pointer matmul) shares that stream, and a capture takes whatever is queued
// on it: a pass is captured only when it is the only user, and no user starts while it is.
// Thread-safe.
class pass_graphs {
public:
    // A pass or other stream work begins; waits while another thread's pass is being captured.
    void enter() {
        std::unique_lock lk(mu_);
        if (capturing_ && thread_ == std::this_thread::get_id())  // it would wait for itself
            fail("backend::cuda: stream work began while this thread's pass is being captured (end the pass with read_logits first)");
        cv_.wait(lk, [&] { return !capturing_; });
        ++users_;
    }
    void leave() noexcept {
        std::lock_guard lk(mu_);
        --users_;
    }
    // At a pass's first primitive: true when the pass is now being captured on s (its shape ran
    // whole before, and it is the stream's only user). Relaxed mode: a scratch buffer that grows
    // inside the capture calls cudaMalloc (its old block is retired, not freed: runtime.cuh), and
    // other threads (a loader, another backend) stay free to allocate meanwhile.
    bool begin(const graph_key& k, cudaStream_t s) {
        {
            std::lock_guard lk(mu_);
            if (users_ != 1 || capturing_ || !cache_.capture(k)) return false;
            capturing_ = true;
            thread_ = std::this_thread::get_id();
        }
        const cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess) {
            reopen();
            CLOVER_CUDA_CHECK(e);
        }
        return true;
    }
    // Ends the capture on s. launch: the graph becomes k's executable and is launched (the
    // pass's work runs now). Otherwise (an exception left the pass) it is discarded. A failure
    // forgets k, so its next pass runs eagerly.
    void end(const graph_key& k, cudaStream_t s, bool launch) {
        cudaGraph_t g = nullptr;
        const cudaError_t e = cudaStreamEndCapture(s, &g);  // the stream leaves capture mode either way
        struct reopener {
            pass_graphs* p;
            ~reopener() { p->reopen(); }  // after the launch: nothing may queue before it
        } r{this};
        std::lock_guard lk(mu_);
        if (launch && e == cudaSuccess) {
            try {
                cache_.launch(k, g, s);  // takes g
                return;
            } catch (...) {
                cache_.forget(k);
                throw;
            }
        }
        if (g) (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
        cache_.forget(k);
        // An invalidated capture: something in the pass broke a rule of stream capture (a wait
        // on the stream, a pageable copy); nothing of the pass ran.
        if (launch) CLOVER_CUDA_CHECK(e);
    }
    // A pass of shape k ran whole, eagerly: its next one is captured.
    void ready(const graph_key& k) {
        std::lock_guard lk(mu_);
        cache_.ready(k);
    }
    // A failure where nothing can throw (a pass's release, in a destructor), thrown by the next
    // pass's begin_pass.
    void defer(std::string what) {
        std::lock_guard lk(mu_);
        deferred_ = std::move(what);
    }
    void throw_deferred() {
        std::lock_guard lk(mu_);
        if (!deferred_.empty()) fail(std::exchange(deferred_, std::string()));
    }

private:
    void reopen() noexcept {
        {
            std::lock_guard lk(mu_);
            capturing_ = false;
        }
        cv_.notify_all();
    }

    std::mutex mu_;
    std::condition_variable cv_;
    graph_cache cache_;
    int users_ = 0;
    bool capturing_ = false;
    std::thread::id thread_;  // the capturing one
    std::string deferred_;
};

// Stream work outside a pass (a rollback, the host-pointer matmul) for its scope.
class stream_user {
public:
    explicit stream_user(pass_graphs& g) : g_(g) { g_.enter(); }
    ~stream_user() { g_.leave(); }
    stream_user(const stream_user&) = delete;
    stream_user& operator=(const stream_user&) = delete;

private:
    pass_graphs& g_;
};

}  // namespace clover::backend::cuda_detail
