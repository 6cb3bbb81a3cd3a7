#pragma once
// A persistent pool: threads are created once per backend and woken for each parallel region,
// so a decode step (a few hundred regions per token) pays no thread creation.
//
// Waiting: a worker spins on the job counter for a short while (spin_us, default 50 µs) before
// it sleeps on a futex (std::atomic::wait), and the caller does the same for completion. Why:
// on this 2-core machine a region of a decode step lasts 20–300 µs, so a sleeping worker would
// pay a futex wake (~5–20 µs, measured) per region; spinning much longer than a region, though,
// is what makes llama.cpp's default (poll 50) run 5–10× slower at -t 2 when another process
// wants the core (tools/llama_peer/README.md) — our spin gives the core up after 50 µs.
//
// Work is handed out in chunks from an atomic counter (dynamic scheduling), and a region waits
// only for the workers that joined it: when the other core is taken by someone else's process,
// the caller takes every chunk itself and returns instead of waiting for a worker the OS has
// not scheduled. (Measured on this shared 2-core machine at load ~5: a region that waited for
// every worker to check in cost 173 µs, i.e. ~9 ms per decoded token.) fn(begin, end, thread)
// may be called several times per thread; `thread` (0 = the caller) indexes per-thread scratch.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CLOVER_CPU_PAUSE() _mm_pause()
#else
#define CLOVER_CPU_PAUSE() ((void)0)
#endif

namespace clover::backend::cpu_detail {

// A non-owning callable reference: no allocation per region (std::function may allocate).
class chunk_fn {
public:
    template <class F>
    chunk_fn(F& f) : obj_(&f), call_([](void* o, std::int64_t b, std::int64_t e, int t) { (*static_cast<F*>(o))(b, e, t); }) {}
    void operator()(std::int64_t b, std::int64_t e, int t) const { call_(obj_, b, e, t); }

private:
    void* obj_;
    void (*call_)(void*, std::int64_t, std::int64_t, int);
};

class thread_pool {
public:
    explicit thread_pool(int n_threads) : n_(std::max(1, n_threads)) {
        if (const char* s = std::getenv("CLOVER_SPIN_US")) spin_us_ = std::max(0, std::atoi(s));
        for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { worker(i); });
    }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() {
        stop_.store(true);
        ticket_.store((++gen_) << 32, std::memory_order_seq_cst);
        ticket_.notify_all();
        for (auto& t : workers_) t.join();
    }
    int size() const { return n_; }

    // fn(b, e, thread) over [0, n) in chunks of `chunk` items (the last may be shorter), taken
    // dynamically by up to `max_threads` threads (0: all). Returns when every chunk is done.
    template <class F>
    void run_chunks(std::int64_t n, std::int64_t chunk, F&& fn, int max_threads = 0) {
        if (n <= 0) return;
        chunk = std::max<std::int64_t>(1, chunk);
        const std::int64_t n_chunks = (n + chunk - 1) / chunk;
        int nt = int(std::min<std::int64_t>(max_threads > 0 ? std::min(max_threads, n_) : n_, n_chunks));
        if (nt <= 1) {
            fn(0, n, 0);
            return;
        }
        // One region at a time: two passes driven from two threads (one model, two sets of
        // sequences) take turns region by region instead of corrupting the job fields.
        std::lock_guard region(region_mu_);
        auto body = [&](std::int64_t b, std::int64_t e, int t) { fn(b, e, t); };
        chunk_fn f(body);
        job_ = &f;
        job_n_ = n;
        job_chunk_ = chunk;
        job_threads_ = nt;
        next_.store(0, std::memory_order_relaxed);
        // Open the region: new generation, not closed, nobody joined. No worker can be inside the
        // previous region (it was closed with zero members), so the fields above were free.
        ticket_.store((++gen_) << 32, std::memory_order_seq_cst);
        if (sleepers_.load(std::memory_order_seq_cst) > 0) ticket_.notify_all();
        take_chunks(f, 0);
        // Close it: workers that have not joined yet never will; wait only for those inside
        // (they hold chunks). A worker the OS has not scheduled costs nothing.
        const std::uint64_t prev = ticket_.fetch_or(closed_bit, std::memory_order_acq_rel);
        if (prev & active_mask)
            wait_until([&] { return (ticket_.load(std::memory_order_acquire) & active_mask) == 0; },
                       [&] {
                           const std::uint64_t v = ticket_.load(std::memory_order_acquire);
                           if (v & active_mask) ticket_.wait(v, std::memory_order_acquire);
                       });
    }

    // The original contract: fn(begin, end) over [0, n) in contiguous pieces, one per thread,
    // each at least `grain` items (less work runs on the caller alone).
    template <class F>
    void parallel_for(std::int64_t n, std::int64_t grain, F&& fn) {
        if (n <= 0) return;
        const int nt = int(std::min<std::int64_t>(n_, std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, grain))));
        run_chunks(nt, 1, [&](std::int64_t b, std::int64_t e, int) {
            for (std::int64_t i = b; i < e; ++i) {
                const std::int64_t lo = n * i / nt, hi = n * (i + 1) / nt;
                if (lo < hi) fn(lo, hi);
            }
        }, nt);
    }

private:
    // ticket_ = generation << 32 | closed << 31 | members (workers inside the region).
    static constexpr std::uint64_t closed_bit = 1ull << 31, active_mask = closed_bit - 1;

    template <class Done, class Sleep>
    void wait_until(Done done, Sleep sleep) {
        if (done()) return;
        if (spin_us_ > 0) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0;; ++k) {
                for (int i = 0; i < 32; ++i) {
                    if (done()) return;
                    CLOVER_CPU_PAUSE();
                }
                if ((k & 7) == 7 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(spin_us_)) break;
            }
        }
        while (!done()) sleep();
    }

    void take_chunks(const chunk_fn& f, int t) {
        for (;;) {
            const std::int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
            const std::int64_t b = c * job_chunk_;
            if (b >= job_n_) return;
            f(b, std::min(job_n_, b + job_chunk_), t);
        }
    }

    void worker(int i) {
        std::uint64_t seen = 0;  // last generation this worker joined or found closed
        for (;;) {
            std::uint64_t t = ticket_.load(std::memory_order_acquire);
            if (stop_.load(std::memory_order_acquire)) return;
            if ((t >> 32) == seen || (t & closed_bit)) {
                if (t & closed_bit) seen = t >> 32;
                wait_until([&] {
                    const std::uint64_t v = ticket_.load(std::memory_order_acquire);
                    return ((v >> 32) != seen && !(v & closed_bit)) || stop_.load(std::memory_order_relaxed);
                }, [&] {
                    // seq_cst pairs with the caller's ticket store then sleepers_ load: one of
                    // the two sides always sees the other (no lost wake-up).
                    sleepers_.fetch_add(1, std::memory_order_seq_cst);
                    const std::uint64_t v = ticket_.load(std::memory_order_seq_cst);
                    if (((v >> 32) == seen || (v & closed_bit)) && !stop_.load()) ticket_.wait(v, std::memory_order_seq_cst);
                    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
                });
                continue;
            }
            // Join the open region (fails if it closed or changed meanwhile).
            if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
            seen = t >> 32;
            if (i < job_threads_) take_chunks(*job_, i);
            const std::uint64_t after = ticket_.fetch_sub(1, std::memory_order_acq_rel) - 1;
            if ((after & closed_bit) && (after & active_mask) == 0) ticket_.notify_all();  // the caller waits
        }
    }

    int n_;
    int spin_us_ = 50;
    std::mutex region_mu_;
    std::vector<std::thread> workers_;
    alignas(64) std::atomic<std::uint64_t> ticket_{0};
    alignas(64) std::atomic<std::int64_t> next_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::uint64_t gen_ = 0;  // written by the caller only
    const chunk_fn* job_ = nullptr;
    std::int64_t job_n_ = 0, job_chunk_ = 1;
    int job_threads_ = 0;
};

}  // namespace clover::backend::cpu_detail
