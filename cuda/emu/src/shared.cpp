// Shared memory of the emulated device: each block's arena (dynamic shared memory first, then the
// static declarations in the order threads reach them), poisoned when the block starts, with
// the device's limits; and the race detector over accesses through sptr/sref (racecheck's idea:
// within one barrier interval, a word written by one thread and read or written by another is a
// hazard unless a __syncwarp of their common warp came between).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "internal.hpp"

namespace clover_emu {
using namespace detail;

void* static_shared_alloc(const void* key, std::size_t bytes, std::size_t align) {
    block_run* b = current_run();
    if (!b) {
        report("__shared__ variable used outside a kernel");
        std::abort();
    }
    if (auto it = b->statics.find(key); it != b->statics.end()) return b->arena + it->second;
    std::size_t off = (b->used + align - 1) / align * align;
    const std::size_t static_bytes = off + bytes - b->dyn;
    if (static_bytes > b->static_limit || off + bytes > b->total_limit || off + bytes > b->arena_cap) {
        launch_error("static shared memory of " + std::to_string(static_bytes) + " bytes (with " + std::to_string(b->dyn) +
                     " dynamic) is past the device's limit (" + std::to_string(b->static_limit) + " static, " +
                     std::to_string(b->total_limit) + " in all)");
        throw std::length_error("static shared memory");  // ends this thread; the launch has failed
    }
    b->used = off + bytes;
    b->statics.emplace(key, off);
    if (b->shadows.size() < (b->used + 3) / 4) b->shadows.resize((b->used + 3) / 4);
    return b->arena + off;
}

void* dynamic_shared_base(std::size_t* bytes) {
    block_run* b = current_run();
    if (!b) {
        report("extern __shared__ used outside a kernel");
        std::abort();
    }
    *bytes = b->dyn;
    return b->arena;
}

void shared_access(const void* p, std::size_t bytes, bool write, loc_t loc) {
    block_run* b = current_run();
    if (!b || !current_thread) return;
    const auto* c = static_cast<const std::uint8_t*>(p);
    if (c < b->arena || c + bytes > b->arena + b->used) {
        launch_error(std::string(write ? "write" : "read") + " of shared memory out of the block's " + std::to_string(b->used) +
                     " bytes (offset " + std::to_string(c - b->arena) + ") at " + where(loc));
        return;
    }
    const int t = current_thread->linear, warp = t / 32;
    const std::uint32_t ws = b->warp_syncs[std::size_t(warp)];
    // An earlier access by thread o in interval e (warp sync count s) is ordered before this one?
    auto ordered = [&](int o, std::uint32_t e, std::uint32_t s) {
        return o < 0 || o == t || e != b->epoch || (o / 32 == warp && s != ws);
    };
    const std::size_t off = std::size_t(c - b->arena), w0 = off / 4, w1 = (off + bytes + 3) / 4;
    for (std::size_t w = w0; w < w1; ++w) {
        // The bytes of word w this access touches.
        const std::size_t lo = std::max(off, w * 4), hi = std::min(off + bytes, w * 4 + 4);
        const auto m = std::uint8_t(((1u << (hi - lo)) - 1u) << (lo - w * 4));
        shadow& s = b->shadows[w];
        const char* hazard = nullptr;
        loc_t other;
        int who = -1;
        const bool w_unordered = !ordered(s.w, s.we, s.ws);
        if (w_unordered && (s.wm & m)) {
            hazard = write ? "write after write" : "read after write";
            other = s.wl;
            who = s.w;
        } else if (write && (s.r1m & m) && !ordered(s.r1, s.r1e, s.r1s)) {
            hazard = "write after read";
            other = s.r1l;
            who = s.r1;
        } else if (write && (s.r2m & m) && !ordered(s.r2, s.r2e, s.r2s)) {
            hazard = "write after read";
            other = s.r2l;
            who = s.r2;
        }
        if (hazard && b->races < 8) {  // reported, not fatal: racecheck goes on too
            ++b->races;
            report(std::string("shared-memory race (") + hazard + ") on byte offset " + std::to_string(w * 4) + ": thread " +
                         std::to_string(t) + " at " + where(loc) + ", thread " + std::to_string(who) + " at " + where(other) +
                         " with no barrier between");
        }
        if (write) {
            // The bytes of the same interval's earlier writes stay in the mask (this thread's, or
            // another's unordered write of a neighbouring byte, then named as this writer's).
            const bool same = s.w == t && s.we == b->epoch && s.ws == ws;
            s.wm = w_unordered || same ? std::uint8_t(s.wm | m) : m;
            s.w = t, s.we = b->epoch, s.ws = ws, s.wl = loc;
            if ((s.r1m &= std::uint8_t(~m)) == 0) s.r1 = -1;
            if ((s.r2m &= std::uint8_t(~m)) == 0) s.r2 = -1;
        } else if (s.r1 == t && s.r1e == b->epoch) {
            s.r1m |= m, s.r1s = ws, s.r1l = loc;
        } else if (s.r2 == t && s.r2e == b->epoch) {
            s.r2m |= m, s.r2s = ws, s.r2l = loc;
        } else if (s.r1 < 0 || s.r1e != b->epoch) {
            s.r1 = t, s.r1e = b->epoch, s.r1s = ws, s.r1l = loc, s.r1m = m;
        } else {
            s.r2 = t, s.r2e = b->epoch, s.r2s = ws, s.r2l = loc, s.r2m = m;
        }
    }
}

}  // namespace clover_emu

namespace clover_emu {
void index_error(std::ptrdiff_t i, std::size_t n, loc_t loc) {
    detail::launch_error("index " + std::to_string(i) + " of a shared array of " + std::to_string(n) + " at " + detail::where(loc));
    throw std::out_of_range("shared array index");  // ends this thread; the launch has failed
}
}  // namespace clover_emu
