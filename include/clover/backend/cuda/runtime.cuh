#pragma once
// CUDA runtime plumbing for backend::cuda: error checks that throw clover::error, move-only RAII
// owners of device memory, pinned host memory and streams, and small device helpers shared by
// the kernels (warp reductions, half/bfloat16 conversions bit-exact with quant/half.hpp).
// Included only by nvcc translation units (through backend/cuda/cuda.hpp), or by g++ over the
// emulated device (cuda/emu/, CLOVER_CUDA_EMU), whose shim headers then answer these includes.
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/quant/half.hpp"

// Device code: nvcc's device pass, or every pass under the emulated device (where the kernels
// are host functions run by fibers, cuda/emu/). Tested instead of __CUDA_ARCH__ so the emulator
// runs the device paths, not the host twins.
#if defined(__CUDA_ARCH__) || defined(CLOVER_CUDA_EMU)
#define CLOVER_DEVICE_CODE 1
#else
#define CLOVER_DEVICE_CODE 0
#endif
// Loops the device compiler must unroll (constant register indices); other compilers would warn.
#if defined(__CUDA_ARCH__)
#define CLOVER_DEVICE_UNROLL _Pragma("unroll")
#else
#define CLOVER_DEVICE_UNROLL
#endif

// Shared memory, declared through macros so the emulated device can hand each block a fresh
// poisoned arena and check the 48 KB / opt-in limits (under nvcc they are the plain declarations):
//   CLOVER_SHARED(float, x, [8]);          __shared__ float x[8];
//   CLOVER_DYNAMIC_SHARED(float, sh);      CLOVER_DYNAMIC_SHARED(float, sh);
// Pointers into shared memory are smem_ptr<T> (T* under nvcc): the emulator's is a checked
// pointer whose reads and writes feed its race detector (per barrier interval, racecheck-like).
// Numbers and arrays of numbers declared with CLOVER_SHARED are checked there too (bounds, races);
// such an array is handed to a function as smem_ptr<T>, so its accesses there stay checked.
#if defined(CLOVER_CUDA_EMU)
#define CLOVER_SHARED(T, name, ...) CLOVER_EMU_SHARED(T, name, __VA_ARGS__)
#define CLOVER_DYNAMIC_SHARED(T, name) CLOVER_EMU_DYNAMIC_SHARED(T, name)
#else
#define CLOVER_SHARED(T, name, ...) __shared__ T name __VA_ARGS__
#define CLOVER_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

// A kernel's __launch_bounds__(n), restated as the kernel's first statement: the emulated device
// (whose function pointers carry no attribute) refuses a launch of more than n threads per block,
// as the driver does (cudaErrorInvalidValue); under nvcc it is only a compile-time check of n.
// The kernel is declared `__launch_bounds__(128) name(...)` and its body opens with
// `CLOVER_LAUNCH_BOUND(128);` (cuda/emu/kernels_summary.cmake checks that the two agree).
#if defined(CLOVER_CUDA_EMU)
#define CLOVER_LAUNCH_BOUND(n) CLOVER_EMU_LAUNCH_BOUND(n)
#else
#define CLOVER_LAUNCH_BOUND(n) static_assert((n) > 0 && (n) <= 1024, "launch bound")
#endif

#define CLOVER_CUDA_CHECK(expr) ::clover::backend::cuda_detail::check((expr), #expr, __FILE__, __LINE__)

namespace clover::backend::cuda_detail {

#if defined(CLOVER_CUDA_EMU)
template <class T>
using smem_ptr = ::clover_emu::sptr<T>;
#else
template <class T>
using smem_ptr = T*;
#endif

inline void check(cudaError_t e, const char* what, const char* file, int line) {
    if (e != cudaSuccess) fail("CUDA error '", cudaGetErrorString(e), "' from ", what, " at ", file, ":", line);
}

// Devices usable by this process; 0 (not an exception) when there is no driver or no GPU, so
// tests and the CLI can say "no CUDA device" and move on.
inline int device_count() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

// Blocks given up (cudaFree, cudaFreeHost) while a stream capture is open: a pass being
// captured into a CUDA graph (graph.cuh). Such a block may not be freed yet: nodes captured
// earlier in the pass may still name it and run only when the graph is launched, and a free
// while a capture is open is an implicit device synchronisation that breaks the capture. They
// wait here until no capture holds the list (capture_hold), then are freed.
// Process-wide, not per thread: a pass may be captured on one thread and continued, launched or
// released on another (a thread_local list lost those blocks and left the first thread pointing
// at the pass's list), and a buffer another thread frees meanwhile (another model's) must wait
// too. Frees go through the lock, so none can slip between a capture's hold and its begin.
class retirements {
public:
    static retirements& get() noexcept {
        static retirements* r = new retirements;  // never destroyed: buffers may be freed by static destructors
        return *r;
    }
    void hold() {
        std::lock_guard lk(mu_);
        ++holds_;
    }
    // The last hold gone: every retired block is freed.
    void release() noexcept {
        std::lock_guard lk(mu_);
        if (holds_ > 0 && --holds_ == 0) {
            for (void* p : device_) (void)cudaFree(p);
            for (void* p : host_) (void)cudaFreeHost(p);
            device_.clear();
            host_.clear();
        }
    }
    // Frees p (cudaFree or cudaFreeHost) now, or keeps it while a capture holds the list.
    void free(void* p, bool host) noexcept {
        if (!p) return;
        std::lock_guard lk(mu_);
        if (holds_ > 0) {
            try {
                (host ? host_ : device_).push_back(p);
            } catch (...) {  // no host memory for the list: leaked, since freeing could break the graph
            }
            return;
        }
        (void)(host ? cudaFreeHost(p) : cudaFree(p));
    }

private:
    retirements() = default;
    std::mutex mu_;
    int holds_ = 0;
    std::vector<void*> device_, host_;
};

// One pass's hold on the retirements: taken before its capture begins, given back once the graph
// has run (or the capture was discarded); on any thread. Released when destroyed.
class capture_hold {
public:
    capture_hold() = default;
    capture_hold(const capture_hold&) = delete;
    capture_hold& operator=(const capture_hold&) = delete;
    ~capture_hold() { release(); }
    void hold() {
        if (held_) return;
        retirements::get().hold();
        held_ = true;
    }
    void release() noexcept {
        if (!held_) return;
        held_ = false;
        retirements::get().release();
    }

private:
    bool held_ = false;
};

inline void free_or_retire(void* p, bool host) noexcept { retirements::get().free(p, host); }

// Grow-only device allocation (the hot path reuses it; it never shrinks).
class device_buffer {
public:
    device_buffer() = default;
    explicit device_buffer(std::size_t bytes) { reserve(bytes); }
    ~device_buffer() { release(); }
    device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    device_buffer& operator=(device_buffer&& o) noexcept {
        if (this != &o) {
            release();
            p_ = std::exchange(o.p_, nullptr);
            n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;

    void reserve(std::size_t bytes) {
        if (bytes <= n_) return;
        release();
        CLOVER_CUDA_CHECK(cudaMalloc(&p_, bytes));
        n_ = bytes;
    }
    template <class T = void>
    T* get() const { return static_cast<T*>(p_); }
    template <class T>
    T* get(std::size_t count) { reserve(count * sizeof(T)); return static_cast<T*>(p_); }
    std::size_t size() const { return n_; }

private:
    void release() noexcept {
        free_or_retire(p_, false);
        p_ = nullptr;
        n_ = 0;
    }
    void* p_ = nullptr;
    std::size_t n_ = 0;
};

// Page-locked host memory: the only kind cudaMemcpyAsync copies without a hidden staging copy,
// and the kind a kernel may read directly over PCIe (mapped).
class pinned_buffer {
public:
    pinned_buffer() = default;
    ~pinned_buffer() { release(); }
    pinned_buffer(pinned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    pinned_buffer& operator=(pinned_buffer&& o) noexcept {
        if (this != &o) {
            release();
            p_ = std::exchange(o.p_, nullptr);
            n_ = std::exchange(o.n_, 0);
        }
        return *this;
    }
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;
    void reserve(std::size_t bytes) {
        if (bytes <= n_) return;
        release();
        CLOVER_CUDA_CHECK(cudaHostAlloc(&p_, bytes, cudaHostAllocMapped));
        n_ = bytes;
    }
    template <class T = void>
    T* get() const { return static_cast<T*>(p_); }
    std::size_t size() const { return n_; }

private:
    void release() noexcept {
        free_or_retire(p_, true);
        p_ = nullptr;
        n_ = 0;
    }
    void* p_ = nullptr;
    std::size_t n_ = 0;
};

class stream {
public:
    stream() { CLOVER_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~stream() {
        if (s_) (void)cudaStreamDestroy(s_);
    }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    cudaStream_t get() const { return s_; }
    void sync() const { CLOVER_CUDA_CHECK(cudaStreamSynchronize(s_)); }

private:
    cudaStream_t s_ = nullptr;
};

// Checks the last launch (launch errors are otherwise only seen at the next synchronisation).
inline void check_launch(const char* what) { check(cudaGetLastError(), what, __FILE__, __LINE__); }

// Every kernel launch of the backend: kernel<<<grid, block, smem, s>>>(args...) under nvcc; the
// emulated device also gets the kernel's name (its registry of kernels run, its error messages)
// and the arguments converted to the kernel's parameter types by value, as a graph node keeps them.
template <class... P, class... A>
inline void launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
                   A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "launch: one argument per kernel parameter");
#if defined(CLOVER_CUDA_EMU)
    ::clover_emu::launch(kernel, name, grid, block, smem, s, static_cast<P>(std::forward<A>(args))...);
#else
    (void)name;
    kernel<<<grid, block, smem, s>>>(static_cast<P>(std::forward<A>(args))...);
#endif
}

// Dynamic shared memory past the 48 KB every kernel may take needs the kernel's cap raised
// (cudaFuncSetAttribute), up to the device's opt-in limit; past that limit the call fails here
// with one error naming the kernel, the bytes, `detail...` (the shape) and the limit, not at the
// launch with the driver's "invalid argument". The cap is raised to the device's limit, not to
// this launch's need: it belongs to the kernel, for every thread, and another thread launching a
// larger shape (a second model) between its own call and its launch must never find it lowered.
// Set at every call that needs it (cheap runtime queries, no stream work: allowed in a capture),
// so each device of the process gets it for its own context.
inline constexpr std::size_t smem_default_cap = 48 * 1024;
template <class... P, class... D>
inline void dynamic_smem(void (*kernel)(P...), const char* name, std::size_t bytes, const D&... detail) {
    if (bytes <= smem_default_cap) return;
    int dev = 0, max_smem = 0;
    CLOVER_CUDA_CHECK(cudaGetDevice(&dev));
    CLOVER_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > std::size_t(max_smem))
        fail("cuda: kernel ", name, " needs ", bytes, " bytes of dynamic shared memory", detail..., "; the device allows ", max_smem);
    CLOVER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
}

// Launch bounds of the hardware (every GPU since compute capability 3.0): a grid's x extent and
// its y and z extents. A launch past them fails at run time with only "invalid configuration
// argument", so every launch whose grid comes from a run-time size checks it on the host first.
inline constexpr std::int64_t max_grid_x = 2147483647, max_grid_yz = 65535;

// The grid x extent for `blocks` blocks of `kernel`, or one clear error naming the kernel.
inline unsigned grid_x(const char* kernel, std::int64_t blocks) {
    if (blocks < 0 || blocks > max_grid_x)
        fail("cuda: kernel ", kernel, " needs ", blocks, " blocks in grid x; the limit is ", max_grid_x);
    return unsigned(blocks);
}
inline unsigned grid_yz(const char* kernel, std::int64_t blocks) {
    if (blocks < 0 || blocks > max_grid_yz)
        fail("cuda: kernel ", kernel, " needs ", blocks, " blocks in grid y/z; the limit is ", max_grid_yz);
    return unsigned(blocks);
}
// Blocks of `per_block` threads covering n items, as a checked grid x extent.
inline unsigned blocks_for(const char* kernel, std::int64_t n, unsigned per_block) {
    return grid_x(kernel, (n + per_block - 1) / per_block);
}

// Makes `device` the calling thread's current device for the guard's life, restoring the
// previous one after. The CUDA runtime keeps the current device per host thread, so a backend
// built on one thread and called from another (a server worker) would otherwise allocate and
// launch on that thread's device (0 by default).
class device_guard {
public:
    explicit device_guard(int device) {
        int cur = 0;
        CLOVER_CUDA_CHECK(cudaGetDevice(&cur));
        if (cur != device) {
            CLOVER_CUDA_CHECK(cudaSetDevice(device));
            prev_ = cur;
        }
    }
    ~device_guard() {
        if (prev_ >= 0) (void)cudaSetDevice(prev_);
    }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;

private:
    int prev_ = -1;  // the device to restore, or -1 when nothing was changed
};

// ---- device helpers ---------------------------------------------------------------------------
// Kernels in these headers are `static __global__` (or templates): every nvcc translation unit
// that includes them gets its own copy, as header-only C++ requires (no -rdc device linking).

// Butterfly reductions: every lane ends with the same value, and the summation tree is fixed, so
// a result never depends on how many rows a launch covers (row-exactness, see matmul.cuh).
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The decoders below are __host__ __device__: the per-format dot products (quant_dot.cuh) run on
// the host too, in tests that need no GPU; the host side is quant/half.hpp's bit-exact rule.
__host__ __device__ inline float f16_to_f32(std::uint16_t h) {
#if CLOVER_DEVICE_CODE
    return __half2float(__ushort_as_half(h));
#else
    return quant::f16_to_f32(h);
#endif
}
// Round to nearest even with overflow to inf: the same rule as quant::f32_to_f16.
__device__ inline std::uint16_t f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__host__ __device__ inline float bf16_to_f32(std::uint16_t h) {
#if CLOVER_DEVICE_CODE
    return __uint_as_float(std::uint32_t(h) << 16);
#else
    return quant::bf16_to_f32(h);
#endif
}
// Bit-for-bit quant::f32_to_bf16 (RNE, NaN kept quiet).
__device__ inline std::uint16_t f32_to_bf16(float f) {
    const std::uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 64u);
    return std::uint16_t((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// Unaligned little-endian reads: GGUF blocks (34, 144, 210 bytes) leave fields at odd offsets.
__host__ __device__ inline std::uint16_t load_u16(const std::uint8_t* p) { return std::uint16_t(p[0] | (p[1] << 8)); }
__host__ __device__ inline float load_f32(const std::uint8_t* p) {
    const std::uint32_t u = std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) | (std::uint32_t(p[3]) << 24);
#if CLOVER_DEVICE_CODE
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ inline float silu(float x) { return x / (1.f + expf(-x)); }
__device__ inline float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

}  // namespace clover::backend::cuda_detail
