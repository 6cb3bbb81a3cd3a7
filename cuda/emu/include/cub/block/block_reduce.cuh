#pragma once
// cub::BlockReduce on the emulated device: one block-wide collective (a barrier at this header's
// call site; every thread of the block must reach it). CUB's default algorithm's order of
// operations (BLOCK_REDUCE_WARP_REDUCTIONS): each warp reduces its lanes by shuffle-down steps of
// 1, 2, 4, 8, 16 (lane 0 holds the warp's result), then thread 0 folds the warps' results in warp
// order. The result is valid on thread 0 only, as CUB documents; other threads get poison (a NaN
// or 0xBAADF00D...) so a kernel that reads it elsewhere differs from the device visibly.
#include <cstdint>
#include <cstring>
#include <limits>
#include <source_location>
#include <string>
#include <type_traits>

#include "cuda_runtime.h"

namespace cub {

template <class T, int BLOCK_DIM_X, int ALGORITHM = 0, int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1, int ARCH = 0>
class BlockReduce {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "emulated BlockReduce: values of at most 8 bytes");
    static constexpr int threads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

public:
    // CUB's storage is one value per warp plus one. The emulator computes from the values it
    // collects at the barrier, but the storage is used as CUB uses it, for the race detector: lane
    // 0 of each warp writes its warp's slot before the reduction's barrier, thread 0 reads the
    // other warps' slots after it, and nothing orders that read before the next reduction's writes
    // into the same storage but a __syncthreads between the two.
    struct TempStorage {
        T slot[threads / 32 + 1];
    };
    explicit BlockReduce(TempStorage& t) : tmp_(t) {}

    // loc: the kernel's call (barrier and race messages name it).
    T Sum(T v, std::source_location loc = std::source_location::current()) { return Reduce(v, plus{}, threads, loc); }
    T Sum(T v, int num_valid, std::source_location loc = std::source_location::current()) {
        return Reduce(v, plus{}, num_valid, loc);
    }
    template <class Op>
    T Reduce(T v, Op op, std::source_location loc = std::source_location::current()) { return Reduce(v, op, threads, loc); }
    template <class Op>
    T Reduce(T v, Op, int num_valid, std::source_location loc = std::source_location::current()) {
        static_assert(std::is_empty_v<Op> && std::is_default_constructible_v<Op>, "emulated BlockReduce: a stateless operator");
        if (int(blockDim.x * blockDim.y * blockDim.z) != threads)
            ::clover_emu::report("cub::BlockReduce<" + std::to_string(threads) + "> in a block of " +
                                 std::to_string(blockDim.x * blockDim.y * blockDim.z) + " threads");
        const int t = ::clover_emu::current_thread->linear;
        if (t % 32 == 0) ::clover_emu::shared_access(&tmp_.slot[t / 32], sizeof(T), true, loc);
        std::uint64_t bits = 0;
        std::memcpy(&bits, &v, sizeof(T));
        bits = ::clover_emu::block_collective(bits, &reduce<Op>, &num_valid, loc);
        std::memcpy(&v, &bits, sizeof(T));
        if (t == 0)
            for (int w = 1; w * 32 < (num_valid < threads ? num_valid : threads); ++w)
                ::clover_emu::shared_access(&tmp_.slot[w], sizeof(T), false, loc);
        return v;
    }

private:
    struct plus {
        T operator()(const T& a, const T& b) const { return a + b; }
    };
    static T get(const std::uint64_t* in, int i) {
        T v;
        std::memcpy(&v, &in[i], sizeof(T));
        return v;
    }
    static std::uint64_t poison() {
        if constexpr (std::is_floating_point_v<T>) {
            const T nan = std::numeric_limits<T>::quiet_NaN();
            std::uint64_t b = 0;
            std::memcpy(&b, &nan, sizeof(T));
            return b;
        } else {
            return 0xBAADF00DBAADF00Dull;
        }
    }
    template <class Op>
    static void reduce(const std::uint64_t* in, int n, std::uint64_t* out, const void* ctx) {
        const int valid = *static_cast<const int*>(ctx) < n ? *static_cast<const int*>(ctx) : n;
        Op op{};
        T total{};
        for (int w = 0; w * 32 < valid; ++w) {
            const int lanes = valid - w * 32 < 32 ? valid - w * 32 : 32;
            T v[32];
            for (int l = 0; l < lanes; ++l) v[l] = get(in, w * 32 + l);
            for (int off = 1; off < 32; off *= 2)
                for (int l = 0; l + off < lanes; l += 2 * off) v[l] = op(v[l], v[l + off]);
            total = w == 0 ? v[0] : op(total, v[0]);
        }
        for (int i = 0; i < n; ++i) out[i] = poison();
        std::memcpy(&out[0], &total, sizeof(T));
    }
    TempStorage& tmp_;
};

}  // namespace cub
