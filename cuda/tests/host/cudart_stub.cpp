// The recording CUDA runtime of tests_cuda_host (see cudart_stub.hpp): every entry point that
// backend::cuda, CUB's host side and nvcc's launch stubs reach, with host memory for the device
// and launches recorded instead of run. Compiled by the host compiler; nvcc links the test with
// `-cudart none`, so these definitions are the only runtime in the process.
//
// What it answers is a plausible sm_90 device (an H200's limits), so host code that sizes
// launches from device attributes takes the branches it takes on the real machine. What it cannot
// see: the order of work on streams (work on a stream that is not capturing runs at once), so a
// copy on the wrong stream or a reuse before the device is done passes here; static shared
// memory and register limits (known only to the compiled kernel). Graphs: see cudart_stub.hpp;
// an update is accepted when the node lists match in kind and kernel, in order (stricter than
// a GPU, which also takes another kernel in a node); kernel arguments are not kept.
#include "cudart_stub.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <utility>

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

// ---- streams, capture and graphs (all under mu)

struct node {
    enum kind_t { kernel, copy, set } kind;
    launch k{};              // kernel: as recorded
    const void* fun = nullptr;
    void* dst = nullptr;     // copy, set
    const void* src = nullptr;
    std::size_t n = 0;
    cudaMemcpyKind copy_kind = cudaMemcpyDefault;
    int value = 0;
};
struct graph_obj {
    std::vector<node> nodes;
};
struct exec_obj {
    std::vector<node> nodes;
    std::int64_t id;
};
struct stream_box {
    graph_obj* capture = nullptr;  // open capture: work becomes its nodes
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    bool invalidated = false;
};
std::set<stream_box*> capturing;  // streams with an open capture
std::int64_t n_execs = 0, execs_alive = 0;
std::map<const char*, std::size_t> pinned;  // cudaHostAlloc'd blocks: base → bytes

// Null for the legacy stream and the special handles (cudaStreamLegacy, cudaStreamPerThread).
stream_box* box_of(cudaStream_t s) { return reinterpret_cast<std::uintptr_t>(s) <= 2 ? nullptr : reinterpret_cast<stream_box*>(s); }
graph_obj* capture_of(cudaStream_t s) {
    stream_box* b = box_of(s);
    return b && b->capture ? b->capture : nullptr;
}
// A call a capture forbids: counted, every open capture invalidated (its EndCapture fails), and
// the call itself fails, as on a GPU.
cudaError_t violation() {
    ++rec.capture_violations;
    for (stream_box* b : capturing) b->invalidated = true;
    last_error = cudaErrorStreamCaptureUnsupported;
    return cudaErrorStreamCaptureUnsupported;
}
bool is_pinned(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    auto it = pinned.upper_bound(c);
    if (it == pinned.begin()) return false;
    --it;
    return c >= it->first && c + n <= it->first + it->second;
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
std::int64_t live_execs() {
    std::lock_guard lk(mu);
    return execs_alive;
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

static cudaError_t record_launch(const void* fun, dim3 g, dim3 b, std::size_t smem, cudaStream_t s) {
    std::lock_guard lk(mu);
    const auto lim = smem_limits().find(fun);
    const std::size_t smem_max = std::size_t(lim == smem_limits().end() ? smem_default : lim->second);
    const bool bad = g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535 || b.x == 0 ||
                     b.y == 0 || b.z == 0 || std::uint64_t(b.x) * b.y * b.z > std::uint64_t(max_threads) || b.z > 64 ||
                     smem > smem_max;
    auto it = kernel_names().find(fun);
    const launch l{it == kernel_names().end() ? std::string("?") : it->second, g.x, g.y, g.z, b.x, b.y, b.z, smem};
    if (bad) {  // refused at the launch call, captured or not
        rec.launches.push_back(l);
        ++rec.bad_launches;
        last_error = cudaErrorInvalidConfiguration;
        return cudaErrorInvalidConfiguration;
    }
    if (graph_obj* c = capture_of(s)) {
        node nd{node::kernel};
        nd.k = l;
        nd.fun = fun;
        c->nodes.push_back(nd);
        return cudaSuccess;
    }
    rec.launches.push_back(l);
    ++rec.direct_launches;
    return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void**, std::size_t smem, cudaStream_t s) {
    return record_launch(reinterpret_cast<kernel_box*>(k)->fun, g, b, smem, s);
}

}  // extern "C"

cudaError_t cudaLaunchKernel(const void* fun, dim3 g, dim3 b, void**, std::size_t smem, cudaStream_t s) {
    return record_launch(fun, g, b, smem, s);
}

// ---------------------------------------------------------------- errors and devices

cudaError_t cudaGetLastError() {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
        case cudaErrorIllegalState: return "operation not permitted in the stream's capture state";
        default: return "stub error";
    }
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
    if (!capturing.empty()) return violation();
    ++rec.host_waits;
    return cudaSuccess;
}

// ---------------------------------------------------------------- memory

static cudaError_t stub_alloc(void** p, std::size_t bytes, bool host) {
    std::lock_guard lk(mu);
    // Allocation inside a capture is allowed in relaxed mode only (cudaStreamCaptureModeRelaxed).
    for (stream_box* b : capturing)
        if (b->mode != cudaStreamCaptureModeRelaxed) return violation();
    *p = host_alloc(bytes);
    if (!*p) return fail(cudaErrorMemoryAllocation);
    ++rec.mallocs;
    rec.alloc_bytes.push_back(bytes);
    if (host) pinned[static_cast<const char*>(*p)] = std::max<std::size_t>(bytes, 1);
    return cudaSuccess;
}
static cudaError_t stub_free(void* p, bool host) {
    if (!p) return cudaSuccess;
    std::lock_guard lk(mu);
    // A free is a device-wide wait: refused while a capture is open (the block stays allocated).
    if (!capturing.empty()) return violation();
    if (host) pinned.erase(static_cast<const char*>(p));
    std::free(p);
    ++rec.frees;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, std::size_t bytes) { return stub_alloc(p, bytes, false); }
cudaError_t cudaFree(void* p) { return stub_free(p, false); }
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) { return stub_alloc(p, bytes, true); }
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return stub_alloc(p, bytes, true); }
cudaError_t cudaFreeHost(void* p) { return stub_free(p, true); }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
    *d = h;  // one address space here
    return cudaSuccess;
}

static void run_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
    if (n) std::memmove(dst, src, n);
    count_copy(kind);
}
static void run_set(void* p, int v, std::size_t n) {
    if (n) std::memset(p, v, n);
    std::lock_guard lk(mu);
    ++rec.memsets;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    {
        std::lock_guard lk(mu);
        if (graph_obj* c = capture_of(s)) {
            // A graph's copy node needs page-locked host memory (a pageable copy is staged
            // synchronously, which a capture refuses).
            if ((kind == cudaMemcpyHostToDevice && !is_pinned(src, n)) || (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, n)))
                return violation();
            node nd{node::copy};
            nd.dst = dst;
            nd.src = src;
            nd.n = n;
            nd.copy_kind = kind;
            c->nodes.push_back(nd);
            return cudaSuccess;
        }
    }
    run_copy(dst, src, n, kind);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
    {
        std::lock_guard lk(mu);
        if (!capturing.empty()) return violation();  // a synchronous copy waits for the device
    }
    run_copy(dst, src, n, kind);
    std::lock_guard lk(mu);
    ++rec.host_waits;  // a synchronous copy waits for the device
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t s) {
    {
        std::lock_guard lk(mu);
        if (graph_obj* c = capture_of(s)) {
            node nd{node::set};
            nd.dst = p;
            nd.n = n;
            nd.value = v;
            c->nodes.push_back(nd);
            return cudaSuccess;
        }
    }
    run_set(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, std::size_t n) {
    {
        std::lock_guard lk(mu);
        if (!capturing.empty()) return violation();
    }
    return cudaMemsetAsync(p, v, n, nullptr);
}

// ---------------------------------------------------------------- streams

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    *s = reinterpret_cast<cudaStream_t>(new stream_box{});
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard lk(mu);
    stream_box* b = box_of(s);
    if (b && b->capture) {  // destroyed mid-capture: the capture goes with it
        capturing.erase(b);
        delete b->capture;
    }
    delete b;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::lock_guard lk(mu);
    if (capture_of(s)) return violation();  // the bug class graphs must not have: a wait inside the pass
    ++rec.host_waits;
    return cudaSuccess;
}

// ---------------------------------------------------------------- capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    std::lock_guard lk(mu);
    stream_box* b = box_of(s);
    if (!b) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
    if (b->capture) return fail(cudaErrorIllegalState);
    b->capture = new graph_obj;
    b->mode = mode;
    b->invalidated = false;
    capturing.insert(b);
    ++rec.captures;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
    std::lock_guard lk(mu);
    stream_box* b = box_of(s);
    *g = nullptr;
    if (!b || !b->capture) return fail(cudaErrorIllegalState);
    graph_obj* c = std::exchange(b->capture, nullptr);
    capturing.erase(b);
    if (b->invalidated) {  // capture ends, no graph
        delete c;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = reinterpret_cast<cudaGraph_t>(c);
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* st) {
    std::lock_guard lk(mu);
    stream_box* b = box_of(s);
    *st = !b || !b->capture ? cudaStreamCaptureStatusNone
          : b->invalidated  ? cudaStreamCaptureStatusInvalidated
                            : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete reinterpret_cast<graph_obj*>(g);
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
    std::lock_guard lk(mu);
    if (!g) return fail(cudaErrorInvalidValue);
    *e = reinterpret_cast<cudaGraphExec_t>(new exec_obj{reinterpret_cast<graph_obj*>(g)->nodes, ++n_execs});
    ++execs_alive;
    ++rec.instantiations;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags) {
    return cudaGraphInstantiate(e, g, flags);
}
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo* info) {
    std::lock_guard lk(mu);
    auto* x = reinterpret_cast<exec_obj*>(e);
    auto* gr = reinterpret_cast<graph_obj*>(g);
    if (info) *info = cudaGraphExecUpdateResultInfo{};
    cudaGraphExecUpdateResult r = cudaGraphExecUpdateSuccess;
    if (x->nodes.size() != gr->nodes.size()) r = cudaGraphExecUpdateErrorTopologyChanged;
    for (std::size_t i = 0; r == cudaGraphExecUpdateSuccess && i < gr->nodes.size(); ++i) {
        if (x->nodes[i].kind != gr->nodes[i].kind) r = cudaGraphExecUpdateErrorNodeTypeChanged;
        else if (x->nodes[i].fun != gr->nodes[i].fun) r = cudaGraphExecUpdateErrorFunctionChanged;
    }
    if (info) info->result = r;
    if (r != cudaGraphExecUpdateSuccess) {
        ++rec.update_refusals;
        return fail(cudaErrorGraphExecUpdateFailure);
    }
    x->nodes = gr->nodes;  // the new parameters: grids, copies' addresses and sizes
    ++rec.updates;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    std::lock_guard lk(mu);
    delete reinterpret_cast<exec_obj*>(e);
    --execs_alive;
    ++rec.exec_destroys;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    std::vector<node> nodes;
    {
        std::lock_guard lk(mu);
        if (capture_of(s)) return violation();  // a graph launched into a capture: not used here
        const auto* x = reinterpret_cast<const exec_obj*>(e);
        nodes = x->nodes;
        ++rec.graph_launches;
        rec.graph_execs.push_back(x->id);
    }
    for (const node& nd : nodes) {  // in capture order: the nodes form one chain
        switch (nd.kind) {
            case node::kernel: {
                std::lock_guard lk(mu);
                rec.launches.push_back(nd.k);
                ++rec.graph_kernels;
                break;
            }
            case node::copy: run_copy(nd.dst, nd.src, nd.n, nd.copy_kind); break;
            case node::set: run_set(nd.dst, nd.value, nd.n); break;
        }
    }
    return cudaSuccess;
}
