#pragma once
// A persistent pool: threads are created once per backend and woken for each parallel region,
// so a decode step (hundreds of small matmuls) pays no thread creation.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace clover::backend::cpu_detail {

class thread_pool {
public:
    explicit thread_pool(int n_threads) : n_(std::max(1, n_threads)) {
        for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { worker(i); });
    }
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;
    ~thread_pool() {
        {
            std::lock_guard lk(m_);
            stop_ = true;
            ++generation_;
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }
    int size() const { return n_; }

    // Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread; returns when
    // all are done. Work smaller than `grain` items per thread runs on the caller alone.
    void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& fn) {
        if (n <= 0) return;
        int nt = int(std::min<std::int64_t>(n_, std::max<std::int64_t>(1, n / std::max<std::int64_t>(1, grain))));
        if (nt <= 1) { fn(0, n); return; }
        {
            std::lock_guard lk(m_);
            job_ = &fn;
            job_n_ = n;
            job_threads_ = nt;
            pending_ = nt - 1;
            ++generation_;
        }
        cv_.notify_all();
        run_chunk(0, fn, n, nt);
        std::unique_lock lk(m_);
        done_cv_.wait(lk, [this] { return pending_ == 0; });
        job_ = nullptr;
    }

private:
    static void run_chunk(int i, const std::function<void(std::int64_t, std::int64_t)>& fn, std::int64_t n, int nt) {
        std::int64_t b = n * i / nt, e = n * (i + 1) / nt;
        if (b < e) fn(b, e);
    }
    void worker(int i) {
        std::uint64_t seen = 0;
        for (;;) {
            const std::function<void(std::int64_t, std::int64_t)>* job;
            std::int64_t n;
            int nt;
            {
                std::unique_lock lk(m_);
                cv_.wait(lk, [&] { return generation_ != seen; });
                seen = generation_;
                if (stop_) return;
                job = job_;
                n = job_n_;
                nt = job_threads_;
            }
            if (!job || i >= nt) continue;
            run_chunk(i, *job, n, nt);
            {
                std::lock_guard lk(m_);
                if (--pending_ == 0) done_cv_.notify_one();
            }
        }
    }

    int n_;
    std::vector<std::thread> workers_;
    std::mutex m_;
    std::condition_variable cv_, done_cv_;
    std::uint64_t generation_ = 0;
    bool stop_ = false;
    const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
    std::int64_t job_n_ = 0;
    int job_threads_ = 0;
    int pending_ = 0;
};

}  // namespace clover::backend::cpu_detail
