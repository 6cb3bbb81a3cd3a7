// The emulator's launch-bound check and the race detector on the shared memory that it once did
// not see: route_kernel's arrays (handed to functions as smem_ptr), mma_kernel's staging buffer
// (mma_tile's Warp hands out smem_ptr views) and CUB's TempStorage. Each mutation is a broken copy
// of the backend's pattern built from the backend's own functions (the barrier left out); the
// same copy with the barrier is clean, in both scheduling orders.
#include <doctest/doctest.h>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "clover/backend/cuda/mma.cuh"
#include "clover/backend/cuda/moe.cuh"
#include "emu_test_util.hpp"

namespace {
using emutest::contains;
using emutest::dev;
namespace cd = clover::backend::cuda_detail;

__global__ void __launch_bounds__(64) bounded_first(int* out) {
    CLOVER_LAUNCH_BOUND(64);
    out[threadIdx.x] = 1;
}
__global__ void __launch_bounds__(64) bounded_known(int* out) {
    CLOVER_LAUNCH_BOUND(64);
    out[threadIdx.x] = 1;
}

// Two CUB reductions into one TempStorage (softmax_rows_kernel's pattern): thread 0 reads the
// warps' slots of the first after its barrier; the second's warp leaders overwrite them.
__global__ void two_reductions(const double* in, double* out, bool barrier) {
    using reduce = cub::BlockReduce<double, 128>;
    CLOVER_SHARED(typename reduce::TempStorage, tmp);
    const double a = reduce(tmp).Sum(in[threadIdx.x]);
    if (barrier) __syncthreads();
    const double b = reduce(tmp).Sum(2.0 * in[threadIdx.x]);
    if (threadIdx.x == 0) out[0] = a + b;
}

// route_kernel's coreset steps: scores, then the mask from coreset_rank over every score.
__global__ void coreset_mask(const double* scores, int X, int C, std::uint8_t* out, bool barrier) {
    CLOVER_SHARED(double, score, [cd::max_experts]);
    CLOVER_SHARED(std::uint8_t, mask, [cd::max_experts]);
    for (int e = int(threadIdx.x); e < X; e += int(blockDim.x)) score[e] = scores[e];
    if (barrier) __syncthreads();
    for (int e = int(threadIdx.x); e < X; e += int(blockDim.x)) mask[e] = cd::coreset_rank(score, X, e, C) < C;
    __syncthreads();
    for (int e = int(threadIdx.x); e < X; e += int(blockDim.x)) out[e] = mask[e];
}

// route_kernel's mask, then warp_topk over it (one row per warp).
__global__ void topk_after_mask(const float* probs, int X, int k, int* ids, float* w, bool barrier) {
    CLOVER_SHARED(std::uint8_t, mask, [cd::max_experts]);
    CLOVER_SHARED(float, top_p, [cd::route_warps][cd::max_experts_used]);
    CLOVER_SHARED(int, top_id, [cd::route_warps][cd::max_experts_used]);
    for (int e = int(threadIdx.x); e < X; e += int(blockDim.x)) mask[e] = e % 3 != 0;
    if (barrier) __syncthreads();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    float v[8];
    for (int i = 0; i < 8; ++i) v[i] = lane + 32 * i < X ? probs[warp * X + lane + 32 * i] : 0.f;
    cd::warp_topk(v, X, k, mask, top_p[warp], top_id[warp], ids + warp * k, w + warp * k);
}

// mma_kernel's warp over its staging buffer, with mma_tile's __syncwarp between staging and
// loading (sync) or without it.
struct unsynced_warp : cd::mma_device_warp {
    void sync() {}
};
__global__ void mma_staging(cd::mma_job j, bool sync) {
    CLOVER_SHARED(cd::mma_stage_buf, buf);
    const int lane = int(threadIdx.x % 32);
    if (sync) {
        cd::mma_device_warp wp{lane, {}, &buf};
        cd::mma_tile<clover::dtype::q8_0>(j, wp);
    } else {
        unsynced_warp wp{{lane, {}, &buf}};
        cd::mma_tile<clover::dtype::q8_0>(j, wp);
    }
}

// Runs fn under the forward and the reverse order.
template <class F>
void both_orders(F fn) {
    for (clover_emu::order o : {clover_emu::order::forward, clover_emu::order::reverse}) {
        CAPTURE(int(o));
        clover_emu::set_order(o);
        fn();
    }
    clover_emu::set_order(clover_emu::order::forward);
}

// The errors of the last launch: one race at least, each naming `file`.
void check_race(const char* file) {
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    const auto e = clover_emu::take_errors();
    REQUIRE(!e.empty());
    CHECK(contains(e[0], "shared-memory race ("));
    CHECK(contains(e[0], file));
}
void check_clean() {
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(clover_emu::take_errors().empty());
}

}  // namespace

TEST_CASE("emu: a launch past the kernel's __launch_bounds__ is refused, naming both numbers; one at the bound runs") {
    dev<int> out(128);
    (void)cudaMemset(out.p, 0, 128 * sizeof(int));
    // The first launch of a kernel: refused at its first statement, before any thread stores.
    cd::launch(bounded_first, "bounded_first", 1u, 96u, 0, nullptr, out.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    auto e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "launch of bounded_first: 96 threads per block, past the kernel's __launch_bounds__(64)"));
    CHECK(contains(e[0], "test_emu_coverage.cpp:"));
    for (int v : out.host()) CHECK(v == 0);
    // At the bound it runs; past it again, the known bound refuses the launch at the call.
    cd::launch(bounded_known, "bounded_known", 1u, 64u, 0, nullptr, out.p);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(clover_emu::take_errors().empty());
    (void)cudaMemset(out.p, 0, 128 * sizeof(int));
    cd::launch(bounded_known, "bounded_known", 1u, dim3(32, 4), 0, nullptr, out.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "launch of bounded_known: 128 threads per block, past the kernel's __launch_bounds__(64)"));
    for (int v : out.host()) CHECK(v == 0);
    // Through CLOVER_LAUNCH_BOUND the backend's kernels carry theirs: route_kernel's is 256.
    dev<float> probs(cd::route_warps * 8);
    dev<int> ids(cd::route_warps);
    dev<float> w(cd::route_warps);
    cd::launch(cd::route_kernel<8>, "route_kernel<8>", 1u, 512u, 0, nullptr, probs.p, 8, 1, nullptr, 1, ids.p, w.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "512 threads per block, past the kernel's __launch_bounds__(256)"));
}

TEST_CASE("emu: racecheck sees CUB's TempStorage: two reductions into one storage need a barrier between") {
    dev<double> in(std::vector<double>(128, 1.0));
    dev<double> out(1);
    both_orders([&] {
        clover_emu::launch(two_reductions, "two_reductions", 1, 128, 0, nullptr, in.p, out.p, false);
        check_race("test_emu_coverage.cpp:");
        clover_emu::launch(two_reductions, "two_reductions", 1, 128, 0, nullptr, in.p, out.p, true);
        check_clean();
        CHECK(out.host()[0] == 384.0);
    });
}

TEST_CASE("emu: racecheck sees route_kernel's shared arrays through coreset_rank and warp_topk") {
    constexpr int X = 200, k = 4;
    std::vector<double> s(X);
    for (int e = 0; e < X; ++e) s[std::size_t(e)] = double((e * 37) % X);
    dev<double> scores(s);
    dev<std::uint8_t> mask(X);
    std::vector<float> p(std::size_t(cd::route_warps) * X);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = float((i * 13) % 101) / 101.f;
    dev<float> probs(p);
    dev<int> ids(cd::route_warps * k);
    dev<float> w(cd::route_warps * k);
    both_orders([&] {
        clover_emu::launch(coreset_mask, "coreset_mask", 1, cd::route_threads, 0, nullptr, scores.p, X, 10, mask.p, false);
        check_race("moe.cuh:");
        clover_emu::launch(coreset_mask, "coreset_mask", 1, cd::route_threads, 0, nullptr, scores.p, X, 10, mask.p, true);
        check_clean();
        int kept = 0;
        for (std::uint8_t m : mask.host()) kept += m;
        CHECK(kept == 10);
        clover_emu::launch(topk_after_mask, "topk_after_mask", 1, cd::route_threads, 0, nullptr, probs.p, X, k, ids.p, w.p, false);
        check_race("moe.cuh:");
        clover_emu::launch(topk_after_mask, "topk_after_mask", 1, cd::route_threads, 0, nullptr, probs.p, X, k, ids.p, w.p, true);
        check_clean();
        for (int id : ids.host()) CHECK(id % 3 != 0);
    });
}

TEST_CASE("emu: racecheck sees mma_kernel's staging buffer: loading fragments needs the __syncwarp after staging") {
    constexpr int K = 32;
    const std::size_t rb = clover::quant::row_bytes(clover::dtype::q8_0, K);
    std::vector<std::uint8_t> wh(rb * cd::mma_m), xh(rb * cd::mma_n);
    for (std::size_t i = 0; i < wh.size(); ++i) wh[i] = std::uint8_t(i * 7);
    for (std::size_t i = 0; i < xh.size(); ++i) xh[i] = std::uint8_t(i * 5);
    for (std::size_t r = 0; r < std::size_t(cd::mma_m); ++r) wh[r * rb] = 0, wh[r * rb + 1] = 0x3c;  // F16 scale 1
    for (std::size_t r = 0; r < std::size_t(cd::mma_n); ++r) xh[r * rb] = 0, xh[r * rb + 1] = 0x3c;
    dev<std::uint8_t> wd(wh), xd(xh);
    dev<float> y(cd::mma_m * cd::mma_n);
    cd::mma_job j{};
    j.w = wd.p;
    j.row_bytes = rb;
    j.o0 = 0;
    j.N = cd::mma_m;
    j.x = xd.p;
    j.x_row_bytes = rb;
    j.xmap = nullptr;
    j.p0 = 0;
    j.nr = cd::mma_n;
    j.y = y.p;
    j.ldy = cd::mma_m;
    j.n_items = 1;
    both_orders([&] {
        clover_emu::launch(mma_staging, "mma_staging", 1, 32, 0, nullptr, j, false);
        check_race("mma.cuh:");
        clover_emu::launch(mma_staging, "mma_staging", 1, 32, 0, nullptr, j, true);
        check_clean();
    });
}
