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
#include <utility>
#include <vector>

#include "clover/backend/cuda/runtime.cuh"
#include "clover/backend/state_pool.hpp"

namespace clover::backend::cuda_detail {

class device_floats {
public:
    device_floats() = default;
    device_floats(std::size_t n, cudaStream_t s, int device) : s_(s), dev_(device) {
        alloc(n);
        zero();
    }
    device_floats(const device_floats& o) : s_(o.s_), dev_(o.dev_) {
        alloc(o.n_);
        copy_from(o);
    }
    device_floats(device_floats&& o) noexcept
        : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)), s_(o.s_), dev_(o.dev_) {}
    device_floats& operator=(const device_floats& o) {
        if (this == &o) return *this;
        s_ = o.s_;
        dev_ = o.dev_;
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
        }
        return *this;
    }
    ~device_floats() { release(); }

    float* data() { return p_; }
    const float* data() const { return p_; }
    std::size_t size() const { return n_; }
    cudaStream_t stream() const { return s_; }
    int device() const { return dev_; }
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
        n_ = cap_ = n;
        if (!n) return;
        device_guard on(dev_);
        CLOVER_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(float)));
    }
    void copy_from(const device_floats& o) {
        if (!n_) return;
        device_guard on(dev_);
        CLOVER_CUDA_CHECK(cudaMemcpyAsync(p_, o.p_, n_ * sizeof(float), cudaMemcpyDeviceToDevice, s_));
    }
    void release() noexcept {
        // cudaFree waits for the device to finish using the memory, so queued copies that read
        // or write it complete first.
        if (p_) (void)cudaFree(p_);
        p_ = nullptr;
        n_ = cap_ = 0;
    }
    float* p_ = nullptr;
    std::size_t n_ = 0, cap_ = 0;
    cudaStream_t s_ = nullptr;
    int dev_ = 0;
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

    floats floats_of(std::size_t n) const { return floats(n, stream, device); }
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
