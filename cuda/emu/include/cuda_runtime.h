#pragma once
// cuda_runtime.h of the emulated device (cuda/emu/): the kernel language and the runtime API that
// backend::cuda uses, for g++ (-DCLOVER_CUDA_EMU, this folder first on the include path). The
// runtime lives in cuda/emu/src/runtime.cpp, the fibers in fiber.cpp.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "clover_emu/core.hpp"

// ---- the kernel language
#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __launch_bounds__(...)
#define CLOVER_EMU_SHARED(T, name, ...) \
    decltype(auto) name = ::clover_emu::static_shared<std::type_identity_t<T __VA_ARGS__>>([] {})
#define CLOVER_EMU_DYNAMIC_SHARED(T, name) ::clover_emu::sptr<T> name = ::clover_emu::dynamic_shared<T>()
// The kernel's __launch_bounds__ restated as its first statement (a function pointer does not
// carry the attribute): runtime.cpp refuses a block larger than it.
#define CLOVER_EMU_LAUNCH_BOUND(n) ::clover_emu::launch_bound(n)

#define threadIdx (::clover_emu::current_thread->tid)
#define blockIdx (::clover_emu::current_block->bid)
#define blockDim (::clover_emu::current_block->bdim)
#define gridDim (::clover_emu::current_block->gdim)
inline constexpr int warpSize = 32;

inline void __syncthreads(std::source_location loc = std::source_location::current()) { ::clover_emu::syncthreads(loc); }
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location loc = std::source_location::current()) {
    ::clover_emu::syncwarp(mask, loc);
}

namespace clover_emu::detail {
template <class T>
T shfl_as(unsigned mask, T v, shfl_kind k, int arg, int width, loc_t loc) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle: a value of at most 8 bytes");
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = shfl(mask, bits, k, arg, width, loc);
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}
}  // namespace clover_emu::detail
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32, std::source_location loc = std::source_location::current()) {
    return ::clover_emu::detail::shfl_as(mask, v, ::clover_emu::shfl_kind::idx, src, width, loc);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, std::source_location loc = std::source_location::current()) {
    return ::clover_emu::detail::shfl_as(mask, v, ::clover_emu::shfl_kind::xor_, lane_mask, width, loc);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, std::source_location loc = std::source_location::current()) {
    return ::clover_emu::detail::shfl_as(mask, v, ::clover_emu::shfl_kind::down, int(delta), width, loc);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, std::source_location loc = std::source_location::current()) {
    return ::clover_emu::detail::shfl_as(mask, v, ::clover_emu::shfl_kind::up, int(delta), width, loc);
}

// Integer and float intrinsics: the device's exact results on host arithmetic (IEEE single, the
// default rounding mode; the emu build compiles with -ffp-contract=off so nothing fuses unasked).
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int(std::int8_t(unsigned(a) >> (8 * i))) * int(std::int8_t(unsigned(b) >> (8 * i)));
    return c;
}
inline int __dp4a(unsigned a, unsigned b, unsigned c) { return __dp4a(int(a), int(b), int(c)); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fdividef(float a, float b) { return a / b; }
inline int __float2int_rn(float v) { return int(std::nearbyint(v)); }
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned v; std::memcpy(&v, &f, 4); return v; }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }

// CUDA's overloads of min/max for device code (same-type pairs; a mixed call is a compile error,
// as it is ambiguous under nvcc too for most pairs).
#define CLOVER_EMU_MINMAX(T) \
    inline T min(T a, T b) { return b < a ? b : a; } \
    inline T max(T a, T b) { return a < b ? b : a; }
CLOVER_EMU_MINMAX(int)
CLOVER_EMU_MINMAX(unsigned)
CLOVER_EMU_MINMAX(long)
CLOVER_EMU_MINMAX(unsigned long)
CLOVER_EMU_MINMAX(long long)
CLOVER_EMU_MINMAX(unsigned long long)
#undef CLOVER_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// Atomics: fibers are not preemptive, so a plain read-modify-write is atomic.
template <class T>
T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <class T>
T atomicSub(T* p, T v) { T o = *p; *p = o - v; return o; }
template <class T>
T atomicMax(T* p, T v) { T o = *p; if (o < v) *p = v; return o; }
template <class T>
T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <class T>
T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <class T>
T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

// ---- the runtime API (runtime.cpp)
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v);
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*f)(P...), cudaFuncAttribute a, int v) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(f), a, v);
}
cudaError_t cudaMalloc(void** p, std::size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
cudaError_t cudaFree(void* p);
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned flags);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int v, std::size_t n);
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* st);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo* info);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
