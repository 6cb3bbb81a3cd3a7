// A block's threads as fibers (Boost.Context's fcontext: a switch is a few instructions, no
// syscall) and the scheduler that runs them between collectives, with synccheck's checks: every
// thread waiting at a barrier waits at the same call site, no thread exits while others wait,
// every lane a warp collective names takes part.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>

#include "internal.hpp"

namespace clover_emu::detail {
namespace {

// Stacks for up to 1024 fibers, reused by every block: mapped once, each with a guard page below
// it so an overflow faults instead of corrupting a neighbour. 64 KiB each by default
// (CLOVER_EMU_STACK_KB).
struct stack_pool {
    std::size_t size = 0, page = 0;
    std::vector<std::uint8_t*> stacks;
    stack_pool() {
        page = std::size_t(sysconf(_SC_PAGESIZE));
        std::size_t kb = 64;
        if (const char* e = std::getenv("CLOVER_EMU_STACK_KB")) kb = std::max<std::size_t>(16, std::strtoul(e, nullptr, 10));
        size = kb * 1024;
    }
    std::uint8_t* top(std::size_t i) {
        while (stacks.size() <= i) {
            void* m = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED) throw std::bad_alloc();
            mprotect(m, page, PROT_NONE);
            stacks.push_back(static_cast<std::uint8_t*>(m));
        }
        return stacks[i] + page + size;
    }
};
stack_pool& pool() {
    static stack_pool p;
    return p;
}

thread_local block_run* g_run = nullptr;
thread_local fiber* g_fiber = nullptr;
thread_local const std::function<void()>* g_body = nullptr;

void fiber_entry(bctx::transfer_t t) {
    block_run* b = g_run;
    b->sched = t.fctx;
    auto* me = static_cast<fiber*>(t.data);
    try {
        (*g_body)();
    } catch (const std::exception& e) {  // the emulator's own stops (a failed check) are reported already
        if (!b->failed) launch_error(std::string("exception in a kernel thread: ") + e.what());
    } catch (...) {
        if (!b->failed) launch_error("exception in a kernel thread");
    }
    me->done = true;
    me->wait = wait_kind::none;
    bctx::jump_fcontext(g_run->sched, nullptr);  // never resumed
}

// Back to the scheduler until the collective this fiber waits at is released.
void yield_to_scheduler() {
    block_run* b = g_run;
    bctx::transfer_t t = bctx::jump_fcontext(b->sched, nullptr);
    g_run->sched = t.fctx;
}

void resume(block_run& b, fiber& f) {
    g_fiber = &f;
    current_thread = &f;
    if (!f.started) {
        f.started = true;
        f.ctx = bctx::make_fcontext(pool().top(std::size_t(f.linear)), pool().size, fiber_entry);
    }
    bctx::transfer_t t = bctx::jump_fcontext(f.ctx, &f);
    f.ctx = t.fctx;
    (void)b;
}

const char* kind_name(wait_kind k) {
    switch (k) {
        case wait_kind::barrier: return "__syncthreads";
        case wait_kind::collective: return "a block collective (cub::BlockReduce)";
        case wait_kind::warp_shfl: return "a shuffle";
        case wait_kind::warp_sync: return "__syncwarp";
        case wait_kind::warp_mma: return "mma.sync";
        default: return "nothing";
    }
}
bool warp_wait(wait_kind k) { return k == wait_kind::warp_shfl || k == wait_kind::warp_sync || k == wait_kind::warp_mma; }
bool same_site(const loc_t& a, const loc_t& b) { return a.line() == b.line() && std::string_view(a.file_name()) == b.file_name(); }

std::string who(const fiber& f) {
    return "thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," + std::to_string(f.tid.z) + ")";
}

// Releases warp collectives whose lanes have all arrived; true if any was.
bool resolve_warps(block_run& b, std::string& stuck) {
    bool any = false;
    const int n = int(b.threads.size());
    for (int w0 = 0; w0 < n; w0 += 32) {
        const int lanes = std::min(32, n - w0);
        int first = -1;
        for (int l = 0; l < lanes; ++l)
            if (warp_wait(b.threads[std::size_t(w0 + l)].wait)) { first = l; break; }
        if (first < 0) continue;
        const fiber& f0 = b.threads[std::size_t(w0 + first)];
        const unsigned mask = f0.mask;
        bool ready = true;
        std::string missing;
        for (int l = 0; l < 32; ++l) {
            if (!(mask >> l & 1u)) continue;
            if (l >= lanes) {
                ready = false;
                missing = "lane " + std::to_string(l) + " does not exist (block of " + std::to_string(n) + " threads)";
                break;
            }
            const fiber& f = b.threads[std::size_t(w0 + l)];
            if (!warp_wait(f.wait)) {
                ready = false;
                if (missing.empty())
                    missing = "lane " + std::to_string(l) + (f.done ? " has exited" : std::string(" waits at ") + kind_name(f.wait) + " at " + where(f.wait_loc));
                continue;
            }
            if (f.wait != f0.wait || f.mask != mask) {
                launch_error(std::string("warp ") + std::to_string(w0 / 32) + ": lane " + std::to_string(first) + " at " +
                             kind_name(f0.wait) + " (" + where(f0.wait_loc) + ", mask " + std::to_string(mask) + ") but lane " +
                             std::to_string(l) + " at " + kind_name(f.wait) + " (" + where(f.wait_loc) + ", mask " +
                             std::to_string(f.mask) + ")");
                return false;
            }
        }
        if (!ready) {
            if (stuck.empty()) stuck = std::string(kind_name(f0.wait)) + " at " + where(f0.wait_loc) + " in warp " + std::to_string(w0 / 32) + ": " + missing;
            continue;
        }
        if (!(mask >> first & 1u)) {
            launch_error(std::string(kind_name(f0.wait)) + " at " + where(f0.wait_loc) + ": the mask leaves out the calling lane " + std::to_string(first));
            return false;
        }
        // Every lane in the mask is here: run the collective.
        if (f0.wait == wait_kind::warp_shfl) {
            std::uint64_t vals[32];
            for (int l = 0; l < lanes; ++l) vals[l] = b.threads[std::size_t(w0 + l)].value;
            for (int l = 0; l < lanes; ++l) {
                fiber& f = b.threads[std::size_t(w0 + l)];
                if (!(mask >> l & 1u)) continue;
                const int wd = f.swidth, base = l & ~(wd - 1);
                int src = l;
                switch (f.sk) {
                    case shfl_kind::idx: src = base + (f.sarg & (wd - 1)); break;
                    case shfl_kind::xor_: src = l ^ f.sarg; if (src >= base + wd || src < base) src = l; break;
                    case shfl_kind::down: src = (l - base) + f.sarg < wd ? l + f.sarg : l; break;
                    case shfl_kind::up: src = (l - base) - f.sarg >= 0 ? l - f.sarg : l; break;
                }
                if (src >= lanes || !(mask >> src & 1u)) {
                    launch_error("shuffle at " + where(f.wait_loc) + ": lane " + std::to_string(l) + " reads lane " + std::to_string(src) +
                                 ", which is not in the mask");
                    return false;
                }
                f.value = vals[src];
            }
        } else if (f0.wait == wait_kind::warp_sync) {
            b.warp_syncs[std::size_t(w0 / 32)]++;
        } else {  // mma: every lane's fragments in, every lane's D out
            if (lanes != 32 || mask != 0xffffffffu) {
                launch_error("mma.sync at " + where(f0.wait_loc) + " needs all 32 lanes of the warp");
                return false;
            }
            std::uint32_t a[32][4], bb[32][2];
            for (int l = 0; l < 32; ++l) {
                const fiber& f = b.threads[std::size_t(w0 + l)];
                if (f.mk != f0.mk) {
                    launch_error("mma.sync at " + where(f0.wait_loc) + ": lanes disagree on the shape");
                    return false;
                }
                std::copy(f.ma, f.ma + 4, a[l]);
                std::copy(f.mb, f.mb + 2, bb[l]);
            }
            int d[32][4];
            mma_compute(f0.mk, a, bb, d);
            for (int l = 0; l < 32; ++l) std::copy(d[l], d[l] + 4, b.threads[std::size_t(w0 + l)].md);
            b.warp_syncs[std::size_t(w0 / 32)]++;  // mma.sync.aligned: the warp converges
        }
        for (int l = 0; l < lanes; ++l)
            if (mask >> l & 1u) b.threads[std::size_t(w0 + l)].wait = wait_kind::none;
        any = true;
    }
    return any;
}

}  // namespace

block_run* current_run() { return g_run; }
std::string where(const loc_t& l) {
    std::string f = l.file_name();
    const auto p = f.find("include/clover/");
    if (p != std::string::npos) f = f.substr(p + 8);
    else if (const auto q = f.rfind('/'); q != std::string::npos) f = f.substr(q + 1);
    return f + ":" + std::to_string(l.line());
}

bool run_block(block_run& b, const std::function<void()>& body, order o, std::uint64_t seed) {
    g_run = &b;
    g_body = &body;
    current_block = &b;
    const int n = int(b.threads.size());
    std::vector<int> ord(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) ord[std::size_t(i)] = o == order::reverse ? n - 1 - i : i;
    std::mt19937_64 rng(seed);
    bool ok = true;
    while (!b.failed) {
        if (o == order::random) std::shuffle(ord.begin(), ord.end(), rng);
        for (int i : ord) {
            fiber& f = b.threads[std::size_t(i)];
            if (!f.done && f.wait == wait_kind::none) resume(b, f);
            if (b.failed) break;
        }
        if (b.failed) break;
        std::string stuck;
        if (resolve_warps(b, stuck)) continue;
        if (b.failed) break;
        int done = 0, at_bar = 0, at_warp = 0;
        const fiber* bar0 = nullptr;
        for (const fiber& f : b.threads) {
            if (f.done) ++done;
            else if (f.wait == wait_kind::barrier || f.wait == wait_kind::collective) {
                ++at_bar;
                if (!bar0) bar0 = &f;
            } else if (warp_wait(f.wait)) ++at_warp;
        }
        if (done == n) break;
        if (at_warp == 0 && at_bar > 0) {
            if (done > 0) {
                const fiber* gone = nullptr;
                for (const fiber& f : b.threads)
                    if (f.done) { gone = &f; break; }
                launch_error(who(*gone) + " exited while " + std::to_string(at_bar) + " threads wait at " + kind_name(bar0->wait) + " at " +
                             where(bar0->wait_loc));
                break;
            }
            for (const fiber& f : b.threads)
                if (f.wait != bar0->wait || !same_site(f.wait_loc, bar0->wait_loc)) {
                    launch_error("barrier at two call sites: " + who(*bar0) + " waits at " + where(bar0->wait_loc) + ", " + who(f) + " at " +
                                 where(f.wait_loc));
                    ok = false;
                    break;
                }
            if (!ok) break;
            if (bar0->wait == wait_kind::collective) {
                std::vector<std::uint64_t> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
                for (int i = 0; i < n; ++i) in[std::size_t(i)] = b.threads[std::size_t(i)].value;
                bar0->cfn(in.data(), n, out.data(), bar0->cctx);
                for (int i = 0; i < n; ++i) b.threads[std::size_t(i)].value = out[std::size_t(i)];
            }
            for (fiber& f : b.threads) f.wait = wait_kind::none;
            ++b.epoch;
            continue;
        }
        // Nothing can move: a warp collective that misses lanes, or warps and barriers mixed.
        launch_error(stuck.empty() ? std::string("deadlock: threads wait at both warp collectives and a block barrier") : stuck);
        break;
    }
    g_run = nullptr;
    current_block = nullptr;
    current_thread = nullptr;
    return !b.failed;
}

}  // namespace clover_emu::detail

namespace clover_emu {
using namespace detail;

static fiber& me(const char* what, const loc_t& loc) {
    if (!g_fiber || !g_run) {
        std::fprintf(stderr, "clover_emu: %s called outside a kernel (%s)\n", what, where(loc).c_str());
        std::abort();
    }
    return *g_fiber;
}

void syncthreads(loc_t loc) {
    fiber& f = me("__syncthreads", loc);
    f.wait = wait_kind::barrier;
    f.wait_loc = loc;
    yield_to_scheduler();
}

std::uint64_t block_collective(std::uint64_t bits, collective_fn fn, const void* ctx, loc_t loc) {
    fiber& f = me("a block collective", loc);
    f.wait = wait_kind::collective;
    f.wait_loc = loc;
    f.value = bits;
    f.cfn = fn;
    f.cctx = ctx;
    yield_to_scheduler();
    return f.value;
}

void syncwarp(unsigned mask, loc_t loc) {
    fiber& f = me("__syncwarp", loc);
    f.wait = wait_kind::warp_sync;
    f.wait_loc = loc;
    f.mask = mask;
    yield_to_scheduler();
}

std::uint64_t shfl(unsigned mask, std::uint64_t bits, shfl_kind kind, int arg, int width, loc_t loc) {
    fiber& f = me("a shuffle", loc);
    if (width <= 0 || width > 32 || (width & (width - 1))) report("shuffle at " + where(loc) + ": width " + std::to_string(width));
    f.wait = wait_kind::warp_shfl;
    f.wait_loc = loc;
    f.mask = mask;
    f.value = bits;
    f.sk = kind;
    f.sarg = arg;
    f.swidth = width;
    yield_to_scheduler();
    return f.value;
}

void mma_s8(int k, int (&d)[4], const std::uint32_t* a, const std::uint32_t* b, loc_t loc) {
    fiber& f = me("mma.sync", loc);
    f.wait = wait_kind::warp_mma;
    f.wait_loc = loc;
    f.mask = 0xffffffffu;
    f.mk = k;
    for (int i = 0; i < 4; ++i) f.ma[i] = k == 32 || i < 2 ? a[i] : 0;
    f.mb[0] = b[0];
    f.mb[1] = k == 32 ? b[1] : 0;
    yield_to_scheduler();
    std::copy(f.md, f.md + 4, d);
}

}  // namespace clover_emu
