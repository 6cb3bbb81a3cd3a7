// The recording CUDA runtime of tests_cuda_host (see cudart_stub.hpp): every entry point that
// backend::cuda, CUB's host side and nvcc's launch stubs reach, with host memory for the device
// and launches recorded instead of run. Compiled by the host compiler; nvcc links the test with
// `-cudart none`, so these definitions are the only runtime in the process.
//
// What it answers is a plausible sm_90 device (an H200's limits), so host code that sizes
// launches from device attributes takes the branches it takes on the real machine. What it cannot
// see: the order of work on streams (copies run at once, the stream argument is dropped), so a
// copy on the wrong stream or a reuse before the device is done passes here; static shared
// memory and register limits (known only to the compiled kernel).
#include "cudart_stub.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace cudastub {
namespace {

std::mutex mu;
counters rec;
std::map<const void*, std::string>& kernel_names() {  // host stub → registered device name
    static std::map<const void*, std::string> m;
    return m;
}
thread_local cudaError_t last_error = cudaSuccess;
struct call_config {
    dim3 grid, block;
    std::size_t smem;
    void* stream;
};
thread_local std::vector<call_config> pending;  // <<<...>>> pushes, the launch stub pops

// Dynamic shared memory a kernel may take: 48 KiB unless cudaFuncSetAttribute raised it (up to
// the opt-in limit), as on the device — a larger launch without the attribute fails there.
std::map<const void*, int>& smem_limits() {
    static std::map<const void*, int> m;
    return m;
}
constexpr int smem_default = 49152;

// A kernel handle (cudaKernel_t) is the host stub's address, boxed once.
struct kernel_box {
    const void* fun;
};

constexpr int sm_count = 132, smem_optin = 232448, max_threads = 1024;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

void* host_alloc(std::size_t bytes) {
    // 256-byte alignment, as cudaMalloc guarantees; zeroed so unrun kernels leave defined bytes.
    const std::size_t n = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, n);
    if (p) std::memset(p, 0, n);
    return p;
}

void count_copy(cudaMemcpyKind kind) {
    std::lock_guard lk(mu);
    switch (kind) {
        case cudaMemcpyDeviceToHost: ++rec.d2h; break;
        case cudaMemcpyHostToDevice: ++rec.h2d; break;
        case cudaMemcpyDeviceToDevice: ++rec.d2d; break;
        default: ++rec.d2h; break;  // cudaMemcpyDefault / HostToHost: counted as the costlier kind
    }
}

}  // namespace

counters snapshot() {
    std::lock_guard lk(mu);
    return rec;
}
void reset() {
    std::lock_guard lk(mu);
    rec = {};
}

}  // namespace cudastub

using namespace cudastub;

// ---------------------------------------------------------------- nvcc's registration and launch stubs

extern "C" {

void** __cudaRegisterFatBinary(void*) {
    static void* handle = nullptr;
    return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char* hostFun, char*, const char* deviceName, int, uint3*, uint3*, dim3*, dim3*,
                            int*) {
    std::lock_guard lk(mu);
    kernel_names()[hostFun] = deviceName;
}
void __cudaRegisterVar(void**, char*, char*, const char*, int, std::size_t, int, int) {}
char __cudaInitModule(void**) { return 1; }

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, std::size_t smem, struct CUstream_st* stream) {
    pending.push_back({grid, block, smem, stream});
    return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, std::size_t* smem, void* stream) {
    if (pending.empty()) return fail(cudaErrorInvalidConfiguration);
    const call_config c = pending.back();
    pending.pop_back();
    *grid = c.grid;
    *block = c.block;
    *smem = c.smem;
    *static_cast<void**>(stream) = c.stream;
    return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* k, const void* fun) {
    std::lock_guard lk(mu);
    static std::map<const void*, kernel_box*> boxes;
    auto& b = boxes[fun];
    if (!b) b = new kernel_box{fun};  // one per kernel for the process's life, as the real handles
    *k = reinterpret_cast<cudaKernel_t>(b);
    return cudaSuccess;
}

static cudaError_t record_launch(const void* fun, dim3 g, dim3 b, std::size_t smem) {
    std::lock_guard lk(mu);
    const auto lim = smem_limits().find(fun);
    const std::size_t smem_max = std::size_t(lim == smem_limits().end() ? smem_default : lim->second);
    const bool bad = g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 || b.x == 0 ||
                     b.y == 0 || b.z == 0 || std::uint64_t(b.x) * b.y * b.z > std::uint64_t(max_threads) || b.z > 64 ||
                     smem > smem_max;
    auto it = kernel_names().find(fun);
    rec.launches.push_back({it == kernel_names().end() ? std::string("?") : it->second, g.x, g.y, g.z, b.x, b.y, b.z, smem});
    if (bad) {
        ++rec.bad_launches;
        last_error = cudaErrorInvalidConfiguration;
        return cudaErrorInvalidConfiguration;
    }
    return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void**, std::size_t smem, cudaStream_t) {
    return record_launch(reinterpret_cast<kernel_box*>(k)->fun, g, b, smem);
}

}  // extern "C"

cudaError_t cudaLaunchKernel(const void* fun, dim3 g, dim3 b, void**, std::size_t smem, cudaStream_t) {
    return record_launch(fun, g, b, smem);
}

// ---------------------------------------------------------------- errors and devices

cudaError_t cudaGetLastError() {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : e == cudaErrorInvalidConfiguration ? "invalid configuration argument" : "stub error";
}
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorStub"; }

cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
    if (d != 0) return fail(cudaErrorInvalidDevice);
    switch (a) {
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = smem_optin; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *v = 49152; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 233472; break;
        case cudaDevAttrMultiProcessorCount: *v = sm_count; break;
        case cudaDevAttrMaxThreadsPerBlock: *v = max_threads; break;
        case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
        case cudaDevAttrWarpSize: *v = 32; break;
        case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
        case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
        case cudaDevAttrMaxGridDimY:
        case cudaDevAttrMaxGridDimZ: *v = 65535; break;
        case cudaDevAttrMaxBlockDimX:
        case cudaDevAttrMaxBlockDimY: *v = 1024; break;
        case cudaDevAttrMaxBlockDimZ: *v = 64; break;
        case cudaDevAttrL2CacheSize: *v = 50 << 20; break;
        case cudaDevAttrMaxRegistersPerBlock: *v = 65536; break;
        default: *v = 0; break;
    }
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return fail(cudaErrorInvalidDevice);
    *p = cudaDeviceProp{};
    std::strncpy(p->name, "cudart stub (no GPU; launches recorded, not run)", sizeof(p->name) - 1);
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = std::size_t(141) << 30;
    p->multiProcessorCount = sm_count;
    p->sharedMemPerBlock = 49152;
    p->sharedMemPerBlockOptin = smem_optin;
    p->sharedMemPerMultiprocessor = 233472;
    p->maxThreadsPerBlock = max_threads;
    p->maxThreadsPerMultiProcessor = 2048;
    p->warpSize = 32;
    p->regsPerBlock = 65536;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, const void*) {
    *a = cudaFuncAttributes{};
    a->maxThreadsPerBlock = max_threads;
    a->numRegs = 32;
    a->ptxVersion = 90;
    a->binaryVersion = 90;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v) {
    if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || v > smem_optin) return fail(cudaErrorInvalidValue);
        std::lock_guard lk(mu);
        smem_limits()[f] = v;
    }
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int block, std::size_t) {
    *n = block > 0 ? std::max(1, 2048 / block) : 0;
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void* f, int block, std::size_t smem,
                                                                    unsigned) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, f, block, smem);
}
cudaError_t cudaDeviceSynchronize() {
    std::lock_guard lk(mu);
    ++rec.host_waits;
    return cudaSuccess;
}

// ---------------------------------------------------------------- memory

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
    *p = host_alloc(bytes);
    if (!*p) return fail(cudaErrorMemoryAllocation);
    std::lock_guard lk(mu);
    ++rec.mallocs;
    rec.alloc_bytes.push_back(bytes);
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    std::free(p);
    std::lock_guard lk(mu);
    ++rec.frees;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
    *d = h;  // one address space here
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t) {
    if (n) std::memmove(dst, src, n);
    count_copy(kind);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
    cudaMemcpyAsync(dst, src, n, kind, nullptr);
    std::lock_guard lk(mu);
    ++rec.host_waits;  // a synchronous copy waits for the device
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t) {
    if (n) std::memset(p, v, n);
    std::lock_guard lk(mu);
    ++rec.memsets;
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, std::size_t n) { return cudaMemsetAsync(p, v, n, nullptr); }

// ---------------------------------------------------------------- streams

namespace {
struct stream_box {
    int id;
};
}  // namespace
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    *s = reinterpret_cast<cudaStream_t>(new stream_box{1});
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete reinterpret_cast<stream_box*>(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    std::lock_guard lk(mu);
    ++rec.host_waits;
    return cudaSuccess;
}
