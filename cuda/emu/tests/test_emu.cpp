// The emulated device's kernel-side checks, each shown to fire on a kernel with the defect it
// names, and to stay quiet on the fixed kernel.
#include <doctest/doctest.h>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "emu_test_util.hpp"

namespace {
using emutest::contains;
using emutest::dev;

__global__ void two_sites(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void early_exit(int* out) {
    if (threadIdx.x == 3) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void shfl_missing_lane(float* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, float(threadIdx.x), 1);
}
__global__ void shfl_ok(float* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, float(threadIdx.x), 1); }

constexpr int racy_line = __LINE__ + 5;  // the read below
__global__ void racy(float* out, bool barrier) {
    CLOVER_EMU_DYNAMIC_SHARED(float, sh);
    sh[threadIdx.x] = float(threadIdx.x);
    if (barrier) __syncthreads();
    out[threadIdx.x] = sh[(threadIdx.x + 1) % blockDim.x];
}
// The same exchange without a barrier in a static shared array: its output depends on the order
// the threads run in (and the race detector sees it too).
__global__ void missing_barrier(float* out) {
    CLOVER_EMU_SHARED(float, sh, [64]);
    sh[threadIdx.x] = float(threadIdx.x);
    out[threadIdx.x] = sh[(threadIdx.x + 1) % 64];
}
__global__ void copy_kernel(const float* in, float* out, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = in[i];
}
__global__ void warp_exchange(float* out, bool sync) {
    CLOVER_EMU_DYNAMIC_SHARED(float, sh);
    sh[threadIdx.x] = float(threadIdx.x);
    if (sync) __syncwarp();
    out[threadIdx.x] = sh[threadIdx.x ^ 1];
}
__global__ void block_sum(const double* in, double* out) {
    using reduce = cub::BlockReduce<double, 64>;
    CLOVER_EMU_SHARED(reduce::TempStorage, tmp);
    out[threadIdx.x] = reduce(tmp).Sum(in[threadIdx.x]);
}
__global__ void nothing(int) {}
__global__ void big_static(float* out) {
    CLOVER_EMU_SHARED(float, sh, [13000]);  // 52,000 bytes: past the 48 KB of static shared memory
    sh[threadIdx.x] = 1.f;
    out[threadIdx.x] = sh[threadIdx.x];
}

}  // namespace

TEST_CASE("emu: threads waiting at two different __syncthreads are an error naming both sites") {
    dev<int> out(32);
    clover_emu::launch(two_sites, "two_sites", 1, 32, 0, nullptr, out.p);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    const auto e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "two call sites"));
    CHECK(contains(e[0], "kernel two_sites"));
    CHECK(contains(e[0], "test_emu.cpp:"));
}

TEST_CASE("emu: a thread that exits while the others wait at a barrier is an error") {
    dev<int> out(32);
    clover_emu::launch(early_exit, "early_exit", 1, 32, 0, nullptr, out.p);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    const auto e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "thread (3,0,0) exited while 31 threads wait at __syncthreads"));
}

TEST_CASE("emu: a shuffle whose mask names a lane that exited is an error; a full warp is not") {
    dev<float> out(32);
    clover_emu::launch(shfl_missing_lane, "shfl_missing_lane", 1, 32, 0, nullptr, out.p);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    auto e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "lane 5 has exited"));
    clover_emu::launch(shfl_ok, "shfl_ok", 1, 32, 0, nullptr, out.p);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto h = out.host();
    for (int l = 0; l < 32; ++l) CHECK(h[std::size_t(l)] == float(l ^ 1));
    // A block of 16 threads: lanes 16..31 of the full mask do not exist.
    clover_emu::launch(shfl_ok, "shfl_ok", 1, 16, 0, nullptr, out.p);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    e = clover_emu::take_errors();
    REQUIRE(e.size() == 1);
    CHECK(contains(e[0], "does not exist"));
}

TEST_CASE("emu: a shared-memory race is reported with kernel, file and line; the barrier silences it") {
    dev<float> out(64);
    clover_emu::launch(racy, "racy", 1, 64, 64 * 4, nullptr, out.p, false);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    auto e = clover_emu::take_errors();
    REQUIRE(!e.empty());
    CHECK(contains(e[0], "kernel racy"));
    CHECK(contains(e[0], "shared-memory race ("));
    CHECK(contains(e[0], "test_emu.cpp:" + std::to_string(racy_line)));
    clover_emu::launch(racy, "racy", 1, 64, 64 * 4, nullptr, out.p, true);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(clover_emu::take_errors().empty());
    // Within a warp, __syncwarp orders the lanes' accesses; without it they race.
    clover_emu::launch(warp_exchange, "warp_exchange", 1, 32, 32 * 4, nullptr, out.p, false);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    CHECK(!clover_emu::take_errors().empty());
    clover_emu::launch(warp_exchange, "warp_exchange", 1, 32, 32 * 4, nullptr, out.p, true);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(clover_emu::take_errors().empty());
}

TEST_CASE("emu: a missing __syncthreads shows as different output under forward and reverse order") {
    dev<float> out(64);
    const auto run = [&](clover_emu::order o) {
        clover_emu::set_order(o, 1);
        clover_emu::launch(missing_barrier, "missing_barrier", 1, 64, 0, nullptr, out.p);
        return out.host();
    };
    const auto saved = clover_emu::get_order();
    const auto fwd = run(clover_emu::order::forward), rev = run(clover_emu::order::reverse);
    clover_emu::set_order(saved, 0);
    const auto e = clover_emu::take_errors();
    REQUIRE(!e.empty());
    CHECK(contains(e[0], "kernel missing_barrier"));
    CHECK(contains(e[0], "shared-memory race"));
    CHECK(fwd != rev);
    CHECK(rev[0] == 1.f);           // thread 1 had written before thread 0 read
    CHECK(std::isnan(fwd[0]));      // forward: thread 0 read the poisoned arena (0xff bytes: NaN)
}

TEST_CASE("emu: a read of memory nothing wrote differs under two poison bytes") {
    const auto run = [](std::uint8_t poison) {
        const std::uint8_t saved = clover_emu::poison();
        clover_emu::set_poison(poison);
        dev<float> in(100), out(100);
        clover_emu::set_poison(saved);
        std::vector<float> h(100, 2.f);
        CHECK(cudaMemcpy(in.p, h.data(), 90 * 4, cudaMemcpyHostToDevice) == cudaSuccess);  // the last 10 never written
        clover_emu::launch(copy_kernel, "copy_kernel", 4, 32, 0, nullptr, in.p, out.p, 100);
        return out.host();
    };
    const auto a = run(0x00), b = run(0x7f);
    CHECK(std::equal(a.begin(), a.begin() + 90, b.begin()));
    CHECK(a[95] != b[95]);
}

TEST_CASE("emu: cub::BlockReduce's sum is on thread 0 only; the others get poison") {
    std::vector<double> h(64);
    for (int i = 0; i < 64; ++i) h[std::size_t(i)] = i + 0.5;
    dev<double> in(h), out(64);
    clover_emu::launch(block_sum, "block_sum", 1, 64, 0, nullptr, in.p, out.p);
    const auto r = out.host();
    CHECK(r[0] == 2048.0);
    for (int i = 1; i < 64; ++i) CHECK(std::isnan(r[std::size_t(i)]));
}

TEST_CASE("emu: launch limits — threads per block, grid, dynamic and static shared memory") {
    REQUIRE(clover_emu::take_errors().empty());
    dev<float> out(64);
    clover_emu::launch(nothing, "nothing", 1, 1025, 0, nullptr, 0);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    clover_emu::launch(nothing, "nothing", dim3(1, 65536), 32, 0, nullptr, 0);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    clover_emu::launch(racy, "racy", 1, 64, 49153, nullptr, out.p, true);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(racy, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000) == cudaSuccess);
    clover_emu::launch(racy, "racy", 1, 64, 49153, nullptr, out.p, true);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFuncSetAttribute(racy, cudaFuncAttributeMaxDynamicSharedMemorySize, 300000) == cudaErrorInvalidValue);
    clover_emu::launch(big_static, "big_static", 1, 32, 0, nullptr, out.p);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    const auto e = clover_emu::take_errors();
    REQUIRE(e.size() == 5);
    CHECK(contains(e[0], "1024 threads"));
    CHECK(contains(e[1], "grid (1,65536,1)"));
    CHECK(contains(e[2], "no cudaFuncSetAttribute raised it"));
    CHECK(contains(e[3], "opt-in limit"));
    CHECK(contains(e[4], "static shared memory of 52000 bytes"));
}
