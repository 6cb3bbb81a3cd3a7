#pragma once
// Shared between the emulator's sources: a block's fibers and its shared-memory arena.
#include <boost/context/detail/fcontext.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "clover_emu/core.hpp"

namespace clover_emu::detail {

namespace bctx = boost::context::detail;

enum class wait_kind { none, barrier, collective, warp_shfl, warp_sync, warp_mma };

struct fiber : thread_view {
    bctx::fcontext_t ctx = nullptr;
    bool started = false, done = false;
    wait_kind wait = wait_kind::none;
    loc_t wait_loc;
    unsigned mask = 0;
    // shuffle / collective payload
    std::uint64_t value = 0;
    shfl_kind sk = shfl_kind::idx;
    int sarg = 0, swidth = 32;
    collective_fn cfn = nullptr;
    const void* cctx = nullptr;
    // mma payload
    int mk = 0;
    std::uint32_t ma[4] = {}, mb[2] = {};
    int md[4] = {};
};

// Per word of the arena: the last writer and up to two readers of the current interval, each with
// the bytes of the word it touched (byte arrays: neighbours' bytes share a word, not a hazard).
struct shadow {
    int w = -1, r1 = -1, r2 = -1;            // thread (linear id) or -1
    std::uint32_t we = 0, r1e = 0, r2e = 0;  // barrier interval of each access
    std::uint32_t ws = 0, r1s = 0, r2s = 0;  // its warp's __syncwarp count then
    std::uint8_t wm = 0, r1m = 0, r2m = 0;   // bytes of the word (bit b: byte b)
    loc_t wl, r1l, r2l;
};

struct block_run : block_view {
    std::string kernel;        // name of the running kernel (messages)
    const void* fn = nullptr;  // the kernel (its __launch_bounds__ entry)
    bool bound_checked = false;  // this launch's block size was checked against the bound
    std::vector<fiber> threads;
    bctx::fcontext_t sched = nullptr;
    bool failed = false;
    // shared memory: [0, dyn) dynamic, then static allocations
    std::uint8_t* arena = nullptr;
    std::size_t arena_cap = 0, dyn = 0, used = 0, static_limit = 0, total_limit = 0;
    std::unordered_map<const void*, std::size_t> statics;  // declaration → offset
    std::vector<shadow> shadows;                           // one per 4-byte word in use
    std::uint32_t epoch = 1;                               // barrier intervals so far
    std::vector<std::uint32_t> warp_syncs;                 // per warp: __syncwarp count
    int races = 0;
};
block_run* current_run();
std::string where(const loc_t& l);
// The error of the current launch: recorded, marks the block failed (runtime.cpp).
void launch_error(const std::string& msg);
// Runs one block to completion (fiber.cpp); false when it failed.
bool run_block(block_run& b, const std::function<void()>& body, order o, std::uint64_t seed);
std::uint8_t* arena_buffer(std::size_t bytes);
// D = A·B of one warp's mma.m16n8k{32,16} .s8 from every lane's fragments (mma.cpp).
void mma_compute(int k, const std::uint32_t (&a)[32][4], const std::uint32_t (&b)[32][2], int (&d)[32][4]);

}  // namespace clover_emu::detail
