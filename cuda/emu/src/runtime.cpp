// The CUDA runtime of the emulated device: host memory for the device (each cudaMalloc its exact
// size, filled with the poison byte), streams whose work runs at once or — lazy mode — only at a
// synchronisation point, stream capture into graphs whose kernel nodes keep their arguments as
// captured, and launches run block by block on fibers (fiber.cpp). Errors found while a kernel
// runs fail the launch: cudaGetLastError and the next synchronisation return
// cudaErrorLaunchFailure, whose cudaGetErrorString is the emulator's message.
//
// Settings (environment, read once; the test API overrides them):
//   CLOVER_EMU_ORDER=forward|reverse|random:SEED   order of threads between collectives (and of blocks)
//   CLOVER_EMU_POISON=0xNN                          the byte fresh device and shared memory holds (0xff)
//   CLOVER_EMU_LAZY=1                               queued work runs only at a synchronisation point
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include "cuda_runtime.h"
#include "internal.hpp"

namespace clover_emu {
namespace {
using namespace detail;

constexpr int smem_default = 49152, smem_optin = 232448, sm_count = 132;

struct settings {
    order ord = order::forward;
    std::uint64_t seed = 0;
    std::uint8_t poison = 0xff;
    bool lazy = false;
    settings() {
        if (const char* e = std::getenv("CLOVER_EMU_ORDER")) {
            const std::string s = e;
            if (s == "reverse") ord = order::reverse;
            else if (s.rfind("random", 0) == 0) {
                ord = order::random;
                if (s.size() > 7) seed = std::strtoull(s.c_str() + 7, nullptr, 10);
            }
        }
        if (const char* e = std::getenv("CLOVER_EMU_POISON")) poison = std::uint8_t(std::strtoul(e, nullptr, 0));
        if (const char* e = std::getenv("CLOVER_EMU_LAZY")) lazy = std::string(e) == "1";
    }
};

struct op {
    std::function<void()> run;
    const void* kernel = nullptr;  // kernel nodes: the kernel (a graph update must find the same)
    int kind = 0;                  // 0 kernel, 1 copy, 2 set, 3 host work, 4 graph
};
struct graph_obj {
    std::vector<op> nodes;
};
struct exec_obj {
    std::vector<op> nodes;
};
struct stream_obj {
    unsigned flags = 0;
    std::deque<op> queue;
    graph_obj* capture = nullptr;
    bool invalidated = false;
};
struct alloc_info {
    std::size_t n;
    bool host;
};

struct state {
    std::recursive_mutex mu;
    settings cfg;
    std::vector<std::string> errors;
    std::size_t taken = 0;
    std::string last_message = "no error";
    cudaError_t pending = cudaSuccess;  // an asynchronous error, for the next synchronisation
    std::map<std::uintptr_t, alloc_info> allocs;
    std::set<stream_obj*> streams;
    stream_obj legacy;  // the default stream (blocking)
    std::map<const void*, int> smem_limit;
    std::map<const void*, int> bounds;  // kernel → its __launch_bounds__, once a launch has run it
    std::set<std::string> launched;
    std::uint64_t launches = 0;
    int captures_open = 0;
    block_run run;  // the block running now (one kernel at a time: the device is one queue)
    std::vector<std::uint8_t> arena;
};
state& S() {
    static state* s = new state;  // never destroyed: streams may be freed by static destructors after main
    return *s;
}
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e, const std::string& msg) {
    report(msg);
    last_error = e;
    return e;
}

stream_obj* stream_of(cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return &S().legacy;
    return reinterpret_cast<stream_obj*>(s);
}

void run_op(op& o) { o.run(); }
void flush(stream_obj* st) {
    while (!st->queue.empty()) {
        op o = std::move(st->queue.front());
        st->queue.pop_front();
        run_op(o);
    }
}
void flush_all() {
    flush(&S().legacy);
    for (stream_obj* st : S().streams) flush(st);
}
// The legacy default stream waits for (and is waited on by) every blocking stream.
void flush_legacy() {
    flush(&S().legacy);
    for (stream_obj* st : S().streams)
        if (!(st->flags & cudaStreamNonBlocking)) flush(st);
}
void submit(cudaStream_t s, op o) {
    stream_obj* st = stream_of(s);
    if (st->capture) {
        st->capture->nodes.push_back(std::move(o));
        return;
    }
    if (S().cfg.lazy) st->queue.push_back(std::move(o));
    else run_op(o);
}
cudaError_t take_pending() {
    const cudaError_t e = S().pending;
    S().pending = cudaSuccess;
    return e;
}
// A call that a capture forbids (it would wait for the device): fails and invalidates every capture.
bool capture_violation(const char* what) {
    if (S().captures_open == 0) return false;
    for (stream_obj* st : S().streams)
        if (st->capture) st->invalidated = true;
    fail(cudaErrorStreamCaptureImplicit, std::string(what) + " while a stream capture is open");
    return true;
}

const alloc_info* find_alloc(const void* p, std::size_t n, std::uintptr_t* base = nullptr) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = S().allocs.upper_bound(a);
    if (it == S().allocs.begin()) return nullptr;
    --it;
    if (a + n > it->first + it->second.n) return nullptr;
    if (base) *base = it->first;
    return &it->second;
}

std::string base_name(const char* name) {
    std::string n = name;
    if (const auto p = n.find('<'); p != std::string::npos) n.resize(p);
    return n;
}

std::string bounds_message(const std::string& kernel, std::uint64_t threads, int bound) {
    return "launch of " + kernel + ": " + std::to_string(threads) + " threads per block, past the kernel's __launch_bounds__(" +
           std::to_string(bound) + ")";
}

void run_grid(const void* kernel, const std::string& name, dim3 grid, dim3 block, std::size_t smem, const std::function<void()>& body) {
    state& st = S();
    st.launched.insert(base_name(name.c_str()));
    const std::uint64_t launch_no = st.launches++;
    const int nt = int(block.x * block.y * block.z);
    block_run& b = st.run;
    b.kernel = name;
    b.fn = kernel;
    b.bound_checked = false;
    b.gdim = grid;
    b.bdim = block;
    b.threads.assign(std::size_t(nt), fiber{});
    for (int i = 0; i < nt; ++i) {
        fiber& f = b.threads[std::size_t(i)];
        f.linear = i;
        f.tid = {unsigned(i) % block.x, unsigned(i) / block.x % block.y, unsigned(i) / (block.x * block.y)};
    }
    b.warp_syncs.assign(std::size_t((nt + 31) / 32), 0);
    const auto lim = st.smem_limit.find(kernel);
    b.dyn = smem;
    b.static_limit = smem_default;
    b.total_limit = smem_optin;
    (void)lim;
    if (st.arena.size() < smem_optin + 64) st.arena.assign(smem_optin + 64, st.cfg.poison);
    b.arena = st.arena.data();
    b.arena_cap = smem_optin;
    const std::uint64_t nblocks = std::uint64_t(grid.x) * grid.y * grid.z;
    std::vector<std::uint64_t> ord;
    if (st.cfg.ord != order::forward) {
        ord.resize(nblocks);
        for (std::uint64_t i = 0; i < nblocks; ++i) ord[i] = st.cfg.ord == order::reverse ? nblocks - 1 - i : i;
        if (st.cfg.ord == order::random) std::shuffle(ord.begin(), ord.end(), std::mt19937_64(st.cfg.seed ^ (launch_no * 0x9e3779b97f4a7c15ull)));
    }
    std::size_t dirty = st.arena.size();
    for (std::uint64_t k = 0; k < nblocks; ++k) {
        const std::uint64_t i = ord.empty() ? k : ord[k];
        b.bid = {unsigned(i % grid.x), unsigned(i / grid.x % grid.y), unsigned(i / (std::uint64_t(grid.x) * grid.y))};
        std::memset(b.arena, st.cfg.poison, std::min(dirty, st.arena.size()));
        b.used = smem;
        dirty = 0;
        b.statics.clear();
        b.shadows.assign((smem + 3) / 4, shadow{});
        b.epoch = 1;
        std::fill(b.warp_syncs.begin(), b.warp_syncs.end(), 0u);
        b.races = 0;
        b.failed = false;
        for (fiber& f : b.threads) {
            f.started = f.done = false;
            f.wait = wait_kind::none;
        }
        const bool ok = run_block(b, body, st.cfg.ord, st.cfg.seed + launch_no * 7919 + i);
        dirty = b.used;
        if (!ok) break;
    }
    b.kernel.clear();
}

}  // namespace

// ---- errors and settings
void report(std::string msg) {
    state& st = S();
    std::lock_guard lk(st.mu);
    block_run& b = st.run;
    if (!b.kernel.empty() && current_block)
        msg = "kernel " + b.kernel + ", block (" + std::to_string(b.bid.x) + "," + std::to_string(b.bid.y) + "," + std::to_string(b.bid.z) +
              "): " + msg;
    msg = "emu: " + msg;
    std::fprintf(stderr, "%s\n", msg.c_str());
    st.errors.push_back(msg);
    st.last_message = msg;
    if (!b.kernel.empty()) {
        st.pending = cudaErrorLaunchFailure;
        last_error = cudaErrorLaunchFailure;
    }
}
namespace detail {
void launch_error(const std::string& msg) {
    report(msg);
    S().run.failed = true;
}
}  // namespace detail
std::vector<std::string> take_errors() {
    std::lock_guard lk(S().mu);
    std::vector<std::string> r(S().errors.begin() + std::ptrdiff_t(S().taken), S().errors.end());
    S().taken = S().errors.size();
    S().pending = cudaSuccess;
    last_error = cudaSuccess;
    return r;
}
int error_count() { return int(S().errors.size() - S().taken); }
void set_order(order o, std::uint64_t seed) { S().cfg.ord = o, S().cfg.seed = seed; }
order get_order() { return S().cfg.ord; }
void set_poison(std::uint8_t byte) { S().cfg.poison = byte; S().arena.clear(); }
std::uint8_t poison() { return S().cfg.poison; }
void set_lazy(bool lazy) {
    std::lock_guard lk(S().mu);
    if (!lazy) flush_all();
    S().cfg.lazy = lazy;
}
std::vector<std::string> kernels_launched() {
    std::lock_guard lk(S().mu);
    return {S().launched.begin(), S().launched.end()};
}
bool device_range(const void* p, std::size_t n) {
    std::lock_guard lk(S().mu);
    return find_alloc(p, n) != nullptr;
}

// ---- launches
void launch_bound(int max_threads, loc_t loc) {
    block_run* r = current_run();
    if (r && current_thread && r->bound_checked) return;  // once per launch: every block has the launch's size
    state& st = S();
    std::lock_guard lk(st.mu);
    block_run& b = st.run;
    if (!r || !current_thread) {
        report("launch bound at " + where(loc) + " outside a kernel");
        return;
    }
    b.bound_checked = true;
    st.bounds[b.fn] = max_threads;
    const std::uint64_t threads = std::uint64_t(b.bdim.x) * b.bdim.y * b.bdim.z;
    if (threads <= std::uint64_t(max_threads)) return;
    // The first statement of the first thread to run: nothing of the kernel has run, as when the
    // driver refuses the launch.
    report(bounds_message(b.kernel, threads, max_threads) + " (" + where(loc) + ")");
    b.failed = true;
    st.pending = cudaErrorInvalidValue;
    last_error = cudaErrorInvalidValue;
    throw std::invalid_argument("launch bounds");  // ends this thread; the launch has failed
}

void launch_erased(const void* kernel, const char* name, dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
                   std::function<void()> body) {
    state& st = S();
    std::lock_guard lk(st.mu);
    const std::string n = name;
    const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) {
        fail(cudaErrorInvalidConfiguration, "launch of " + n + ": block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," +
                                                std::to_string(block.z) + ") is past the device's limits (1024 threads; 1024, 1024, 64)");
        return;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        fail(cudaErrorInvalidConfiguration, "launch of " + n + ": grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
                                                std::to_string(grid.z) + ") is past the device's limits");
        return;
    }
    if (const auto bd = st.bounds.find(kernel); bd != st.bounds.end() && threads > std::uint64_t(bd->second)) {
        fail(cudaErrorInvalidValue, bounds_message(n, threads, bd->second));
        return;
    }
    const auto lim = st.smem_limit.find(kernel);
    const std::size_t dyn_limit = lim == st.smem_limit.end() ? smem_default : std::size_t(lim->second);
    if (smem > dyn_limit) {
        fail(cudaErrorInvalidValue, "launch of " + n + ": " + std::to_string(smem) + " bytes of dynamic shared memory; the kernel may take " +
                                        std::to_string(dyn_limit) + (lim == st.smem_limit.end() ? " (no cudaFuncSetAttribute raised it)" : ""));
        return;
    }
    op o;
    o.kernel = kernel;
    o.kind = 0;
    o.run = [kernel, n, grid, block, smem, body = std::move(body)] { run_grid(kernel, n, grid, block, smem, body); };
    submit(s, std::move(o));
}

void enqueue_host(cudaStream_t s, const char* what, std::function<void()> fn) {
    std::lock_guard lk(S().mu);
    op o;
    o.kind = 3;
    o.kernel = what;
    o.run = std::move(fn);
    submit(s, std::move(o));
}

}  // namespace clover_emu

// ---- the runtime API
using namespace clover_emu;

cudaError_t cudaGetLastError() {
    std::lock_guard lk(S().mu);
    cudaError_t e = last_error != cudaSuccess ? last_error : S().pending;
    last_error = cudaSuccess;
    S().pending = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return last_error != cudaSuccess ? last_error : S().pending; }
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        default: {
            std::lock_guard lk(S().mu);
            static thread_local std::string msg;
            msg = S().last_message;
            return msg.c_str();
        }
    }
}
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(d) + ")"); }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
    if (d != 0) return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute on device " + std::to_string(d));
    switch (a) {
        case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
        case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *v = 1024; break;
        case cudaDevAttrMaxBlockDimZ: *v = 64; break;
        case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
        case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *v = 65535; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *v = smem_default; break;
        case cudaDevAttrWarpSize: *v = 32; break;
        case cudaDevAttrMultiProcessorCount: *v = sm_count; break;
        case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 233472; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = smem_optin; break;
        default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(int(a)) + " unknown to the emulator");
    }
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties on device " + std::to_string(d));
    *p = cudaDeviceProp{};
    std::snprintf(p->name, sizeof p->name, "clover emulated device (sm_90-like, cuda/emu)");
    p->totalGlobalMem = std::size_t(80) << 30;
    p->sharedMemPerBlock = smem_default;
    p->sharedMemPerBlockOptin = smem_optin;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = sm_count;
    p->maxThreadsPerMultiProcessor = 2048;
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    std::lock_guard lk(S().mu);
    if (capture_violation("cudaDeviceSynchronize")) return cudaErrorStreamCaptureImplicit;
    flush_all();
    return take_pending();
}
cudaError_t cudaDeviceReset() { return cudaDeviceSynchronize(); }
cudaError_t cudaFuncSetAttribute(const void* f, cudaFuncAttribute a, int v) {
    std::lock_guard lk(S().mu);
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (v < 0 || v > smem_optin)
        return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(v) + " bytes of dynamic shared memory; the opt-in limit is " +
                                               std::to_string(smem_optin));
    S().smem_limit[f] = v;
    return cudaSuccess;
}

// ---- memory
static cudaError_t emu_alloc(void** p, std::size_t bytes, bool host) {
    std::lock_guard lk(S().mu);
    void* m = std::malloc(bytes ? bytes : 1);
    if (!m) return fail(cudaErrorMemoryAllocation, "allocation of " + std::to_string(bytes) + " bytes");
    std::memset(m, S().cfg.poison, bytes);
    S().allocs[reinterpret_cast<std::uintptr_t>(m)] = {bytes, host};
    *p = m;
    return cudaSuccess;
}
static cudaError_t emu_free(void* p, bool host) {
    if (!p) return cudaSuccess;
    std::lock_guard lk(S().mu);
    if (capture_violation(host ? "cudaFreeHost" : "cudaFree")) return cudaErrorStreamCaptureImplicit;
    flush_all();  // a free waits for the device
    auto it = S().allocs.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == S().allocs.end() || it->second.host != host)
        return fail(cudaErrorInvalidDevicePointer, std::string(host ? "cudaFreeHost" : "cudaFree") + " of a pointer it did not allocate");
    S().allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, std::size_t bytes) { return emu_alloc(p, bytes, false); }
cudaError_t cudaFree(void* p) { return emu_free(p, false); }
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) { return emu_alloc(p, bytes, true); }
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return emu_alloc(p, bytes, true); }
cudaError_t cudaFreeHost(void* p) { return emu_free(p, true); }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
    std::lock_guard lk(S().mu);
    const alloc_info* a = find_alloc(h, 1);
    if (!a || !a->host) return fail(cudaErrorInvalidValue, "cudaHostGetDevicePointer of memory not from cudaHostAlloc");
    *d = h;
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* at, const void* p) {
    std::lock_guard lk(S().mu);
    const alloc_info* a = find_alloc(p, 1);
    *at = cudaPointerAttributes{};
    at->device = a ? 0 : -2;
    at->type = !a ? cudaMemoryTypeUnregistered : a->host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    at->devicePointer = a ? const_cast<void*>(p) : nullptr;
    at->hostPointer = a && a->host ? const_cast<void*>(p) : nullptr;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(std::size_t* f, std::size_t* t) {
    *t = std::size_t(80) << 30;
    *f = *t / 2;
    return cudaSuccess;
}

// The device side of a copy must lie inside one allocation (memcheck's view of a copy).
static bool copy_ok(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, const char* what) {
    if (n == 0) return true;
    const bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dd && !find_alloc(dst, n)) || (sd && !find_alloc(src, n))) {
        fail(cudaErrorInvalidValue, std::string(what) + " of " + std::to_string(n) + " bytes: the " + (dd && !find_alloc(dst, n) ? "destination" : "source") +
                                        " is not inside one device allocation");
        return false;
    }
    return true;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
    std::lock_guard lk(S().mu);
    if (capture_violation("cudaMemcpy")) return cudaErrorStreamCaptureImplicit;
    if (!copy_ok(dst, src, n, kind, "cudaMemcpy")) return cudaErrorInvalidValue;
    flush_legacy();
    std::memmove(dst, src, n);
    return take_pending();
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    std::lock_guard lk(S().mu);
    if (!copy_ok(dst, src, n, kind, "cudaMemcpyAsync")) return cudaErrorInvalidValue;
    stream_obj* st = stream_of(s);
    const bool pageable_src = kind == cudaMemcpyHostToDevice && !find_alloc(src, n);
    const bool pageable_dst = kind == cudaMemcpyDeviceToHost && !find_alloc(dst, n);
    if (st->capture && (pageable_src || pageable_dst)) {
        st->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync to or from pageable host memory in a stream capture");
    }
    op o;
    o.kind = 1;
    if (pageable_src) {  // staged at the call, as the driver does: the caller may reuse src at once
        auto copy = std::make_shared<std::vector<std::uint8_t>>(static_cast<const std::uint8_t*>(src), static_cast<const std::uint8_t*>(src) + n);
        o.run = [dst, copy] { std::memcpy(dst, copy->data(), copy->size()); };
    } else {
        o.run = [dst, src, n] { std::memmove(dst, src, n); };
    }
    if (pageable_dst && !st->capture) {  // synchronous for pageable memory: done when the call returns
        flush(st);
        o.run();
        return cudaSuccess;
    }
    submit(s, std::move(o));
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, std::size_t n) {
    std::lock_guard lk(S().mu);
    if (capture_violation("cudaMemset")) return cudaErrorStreamCaptureImplicit;
    if (n && !find_alloc(p, n)) return fail(cudaErrorInvalidValue, "cudaMemset of " + std::to_string(n) + " bytes outside one device allocation");
    flush_legacy();
    std::memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t n, cudaStream_t s) {
    std::lock_guard lk(S().mu);
    if (n && !find_alloc(p, n)) return fail(cudaErrorInvalidValue, "cudaMemsetAsync of " + std::to_string(n) + " bytes outside one device allocation");
    op o;
    o.kind = 2;
    o.run = [p, v, n] { std::memset(p, v, n); };
    submit(s, std::move(o));
    return cudaSuccess;
}

// ---- streams, capture, graphs
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    std::lock_guard lk(S().mu);
    auto* st = new stream_obj;
    st->flags = flags;
    S().streams.insert(st);
    *s = reinterpret_cast<cudaStream_t>(st);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard lk(S().mu);
    stream_obj* st = stream_of(s);
    if (st == &S().legacy || !S().streams.count(st)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of an unknown stream");
    flush(st);  // work already queued still runs
    S().streams.erase(st);
    delete st->capture;
    delete st;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    std::lock_guard lk(S().mu);
    stream_obj* st = stream_of(s);
    if (st->capture) {
        st->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize of a capturing stream");
    }
    if (st == &S().legacy) flush_legacy();
    else flush(st);
    return take_pending();
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    std::lock_guard lk(S().mu);
    stream_obj* st = stream_of(s);
    if (st == &S().legacy) return fail(cudaErrorStreamCaptureUnsupported, "stream capture of the legacy default stream");
    if (st->capture) return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture of a stream already capturing");
    flush(st);  // work queued before the capture is not part of it
    st->capture = new graph_obj;
    st->invalidated = false;
    ++S().captures_open;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
    std::lock_guard lk(S().mu);
    stream_obj* st = stream_of(s);
    if (!st->capture) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture of a stream not capturing");
    graph_obj* gr = st->capture;
    st->capture = nullptr;
    --S().captures_open;
    if (st->invalidated) {
        delete gr;
        *g = nullptr;
        last_error = cudaErrorStreamCaptureInvalidated;
        return cudaErrorStreamCaptureInvalidated;
    }
    *g = reinterpret_cast<cudaGraph_t>(gr);
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    std::lock_guard lk(S().mu);
    stream_obj* st = stream_of(s);
    *status = !st->capture ? cudaStreamCaptureStatusNone : st->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    std::lock_guard lk(S().mu);
    delete reinterpret_cast<graph_obj*>(g);
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
    std::lock_guard lk(S().mu);
    if (!g) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate of a null graph");
    auto* x = new exec_obj;
    x->nodes = reinterpret_cast<graph_obj*>(g)->nodes;
    *e = reinterpret_cast<cudaGraphExec_t>(x);
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long f) { return cudaGraphInstantiate(e, g, f); }
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo* info) {
    std::lock_guard lk(S().mu);
    auto* x = reinterpret_cast<exec_obj*>(e);
    auto* gr = reinterpret_cast<graph_obj*>(g);
    bool same = x && gr && x->nodes.size() == gr->nodes.size();
    for (std::size_t i = 0; same && i < gr->nodes.size(); ++i)
        same = x->nodes[i].kind == gr->nodes[i].kind && (x->nodes[i].kind != 0 || x->nodes[i].kernel == gr->nodes[i].kernel);
    if (info) *info = {same ? cudaGraphExecUpdateSuccess : cudaGraphExecUpdateErrorTopologyChanged, nullptr, nullptr};
    if (!same) {
        last_error = cudaErrorGraphExecUpdateFailure;
        return cudaErrorGraphExecUpdateFailure;
    }
    x->nodes = gr->nodes;  // the new arguments, as captured
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    std::lock_guard lk(S().mu);
    delete reinterpret_cast<exec_obj*>(e);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    std::lock_guard lk(S().mu);
    if (!e) return fail(cudaErrorInvalidValue, "cudaGraphLaunch of a null executable");
    op o;
    o.kind = 4;
    o.run = [nodes = reinterpret_cast<exec_obj*>(e)->nodes]() mutable {
        for (op& n : nodes) n.run();
    };
    submit(s, std::move(o));
    return cudaSuccess;
}
