#pragma once
// The state pool on the device (execution.md §3): the backend-neutral pool
// (backend/state_pool.hpp) over device memory. KV chunks, GDN states, conv rings, checkpoints
// and verify records are device allocations; every copy and zeroing is queued on the store's
// stream, so it is ordered with the passes that run on that stream and the host never waits
// for it (only `equal`, a test helper, reads bytes back).
//
// device_floats carries its stream and device: the pool copies float arrays by value (a
// checkpoint is a copy of each GDN layer's state), and a copy constructor has no other way to
// learn where to queue the copy. Every allocation and copy selects that device for its calling
// thread (a server thread opening a sequence may have another device current). Capacity only
// grows, so verify records of varying length stop allocating (cudaFree waits for the device).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <map>
#include <utility>
#include <vector>

#include "clover/backend/cuda/runtime.cuh"
#include "clover/backend/state_pool.hpp"

namespace clover::backend::cuda_detail {

// The pool's freed float arrays, kept by size for the next request of that size. A server
// opens and closes sequences, takes and drops checkpoints, and verify records come and go with
// their sequences; through cudaMalloc/cudaFree each of those is a device-wide wait (cudaFree
// synchronises the device) in the middle of other sequences' passes — tests_cuda_host counted
// 180 cudaMalloc in the first verify pass of every new sequence of the 40-layer pattern model
// (6 record arrays × 30 GDN layers), and as many cudaFree when it closed. Arrays are returned
// to the device when the pool goes, or all at once when a cudaMalloc finds the device full.
// An array serves requests from half its size up, so the cache holds at most the peak use of
// each such size range (verify records of very different lengths are kept side by side).
// Safe to reuse at once: every user of these arrays is queued on the pool's one stream, so an
// array given back here is next written by work queued after all work that used it.
class float_cache {
public:
    explicit float_cache(int device) : dev_(device) {}
    ~float_cache() {  // cudaFree takes any device's pointer (unified addressing): no guard, nothing thrown
        for (auto& [n, v] : free_)
            for (float* p : v) (void)cudaFree(p);
    }
    float_cache(const float_cache&) = delete;
    float_cache& operator=(const float_cache&) = delete;

    // An array of at least n floats: the smallest kept one up to 2n (verify records vary in
    // length from pass to pass), else a new one of n. n is updated to the array's size.
    float* take(std::size_t& n) {
        {
            std::lock_guard lk(mu_);
            auto it = free_.lower_bound(n);
            if (it != free_.end() && it->first <= 2 * n) {
                float* p = it->second.back();
                n = it->first;
                it->second.pop_back();
                if (it->second.empty()) free_.erase(it);
                return p;
            }
        }
        device_guard on(dev_);
        float* p = nullptr;
        cudaError_t e = cudaMalloc(&p, n * sizeof(float));
        if (e == cudaErrorMemoryAllocation) {  // the device is full: give back what is kept, once
            (void)cudaGetLastError();
            trim();
            e = cudaMalloc(&p, n * sizeof(float));
        }
        CLOVER_CUDA_CHECK(e);
        return p;
    }
    // Every kept array back to the device.
    void trim() noexcept {
        std::lock_guard lk(mu_);
        for (auto& [n, v] : free_)
            for (float* p : v) (void)cudaFree(p);
        free_.clear();
    }
    void give(float* p, std::size_t n) noexcept {
        try {
            std::lock_guard lk(mu_);
            free_[n].push_back(p);
        } catch (...) {  // no memory for the list: the array goes back to the device instead
            (void)cudaFree(p);
        }
    }

private:
    int dev_;
    std::mutex mu_;
    std::map<std::size_t, std::vector<float*>> free_;  // size in floats → arrays
};

class device_floats {
public:
    device_floats() = default;
    // cache: where the array comes from and goes back to (null: cudaMalloc / cudaFree).
    device_floats(std::size_t n, cudaStream_t s, int device, std::shared_ptr<float_cache> cache = {})
        : s_(s), dev_(device), cache_(std::move(cache)) {
        alloc(n);
        zero();
    }
    device_floats(const device_floats& o) : s_(o.s_), dev_(o.dev_), cache_(o.cache_) {
        alloc(o.n_);
        copy_from(o);
    }
    device_floats(device_floats&& o) noexcept
        : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)), s_(o.s_), dev_(o.dev_),
          cache_(o.cache_) {}
    device_floats& operator=(const device_floats& o) {
        if (this == &o) return *this;
        s_ = o.s_;
        dev_ = o.dev_;
        if (!cache_) cache_ = o.cache_;  // an array goes back where it came from
        resize(o.n_);
        copy_from(o);
        return *this;
    }
    device_floats& operator=(device_floats&& o) noexcept {
        if (this != &o) {
            release();
            p_ = std::exchange(o.p_, nullptr);
            n_ = std::exchange(o.n_, 0);
            cap_ = std::exchange(o.cap_, 0);
            s_ = o.s_;
            dev_ = o.dev_;
            cache_ = o.cache_;
        }
        return *this;
    }
    ~device_floats() { release(); }

    float* data() { return p_; }
    const float* data() const { return p_; }
    std::size_t size() const { return n_; }
    cudaStream_t stream() const { return s_; }
    int device() const { return dev_; }
    const std::shared_ptr<float_cache>& cache() const { return cache_; }
    void zero() {
        if (!n_) return;
        device_guard on(dev_);
        CLOVER_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(float), s_));
    }
    // Resized to n (contents undefined when it grows past its capacity): verify records take
    // the segment's row count each pass.
    void resize(std::size_t n) {
        if (n <= cap_) {
            n_ = n;
            return;
        }
        release();
        alloc(n);
    }

private:
    void alloc(std::size_t n) {
        n_ = cap_ = 0;
        if (!n) return;
        std::size_t cap = n;
        if (cache_) {
            p_ = cache_->take(cap);
        } else {
            device_guard on(dev_);
            CLOVER_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(float)));
        }
        n_ = n;
        cap_ = cap;
    }
    void copy_from(const device_floats& o) {
        if (!n_) return;
        device_guard on(dev_);
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(p_, o.p_, n_ * sizeof(float), cudaMemcpyDeviceToDevice, s_));
    }
    void release() noexcept {
        // cudaFree waits for the device to finish using the memory, so queued copies that read
        // or write it complete first; the cache relies on the one stream instead (float_cache).
        if (p_ && cache_) {
            cache_->give(p_, cap_);
        } else if (p_) {
            (void)cudaFree(p_);
        }
        p_ = nullptr;
        n_ = cap_ = 0;
    }
    float* p_ = nullptr;
    std::size_t n_ = 0, cap_ = 0;
    cudaStream_t s_ = nullptr;
    int dev_ = 0;
    std::shared_ptr<float_cache> cache_;
};

// A zeroed device block (a KV chunk) that frees itself.
class device_bytes {
public:
    device_bytes() = default;
    device_bytes(std::size_t n, cudaStream_t s, int device) {
        device_guard on(device);
        buf_.reserve(n);
        if (n) CLOVER_CUDA_CHECK(cudaMemsetAsync(buf_.get(), 0, n, s));
    }
    std::byte* get() const { return buf_.get<std::byte>(); }

private:
    device_buffer buf_;
};

struct device_store {
    using floats = device_floats;
    using bytes = device_bytes;
    cudaStream_t stream = nullptr;  // where every copy and zeroing of the pool is queued
    int device = 0;                 // the backend's device, selected for each call
    std::shared_ptr<float_cache> cache;  // the pool's float arrays, reused (null: none kept)

    floats floats_of(std::size_t n) const { return floats(n, stream, device, cache); }
    bytes bytes_of(std::size_t n) const { return bytes(n, stream, device); }
    void copy(void* dst, const void* src, std::size_t n) const {
        if (!n) return;
        device_guard on(device);
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
    }
    // Test helpers: read both back (after the stream's queued work) and compare.
    bool equal(const void* a, const void* b, std::size_t n) const {
        std::vector<std::byte> ha(n), hb(n);
        read(ha.data(), a, n);
        read(hb.data(), b, n);
        return std::memcmp(ha.data(), hb.data(), n) == 0;
    }
    bool equal(const floats& a, const floats& b) const {
        return a.size() == b.size() && equal(a.data(), b.data(), a.size() * sizeof(float));
    }
    void read(void* host, const void* dev, std::size_t n) const {
        if (!n) return;
        device_guard on(device);
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream));
        CLOVER_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    void write(void* dev, const void* host, std::size_t n) const {
        if (!n) return;
        device_guard on(device);
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream));
        CLOVER_CUDA_CHECK(cudaStreamSynchronize(stream));  // host may reuse its buffer at once
    }
};

using device_state_pool = basic_state_pool<device_store>;

}  // namespace clover::backend::cuda_detail
