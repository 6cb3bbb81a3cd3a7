// The emulated device's runtime: lazy streams, graphs that keep captured arguments, and the
// warp-collective mma against a scalar int8 GEMM through mma.cuh's own fragment functions (two
// independent readings of the PTX ISA's tables: a shared mistake would have to be made twice).
#include <doctest/doctest.h>

#include <clover/backend/cuda/mma.cuh>

#include <cstdint>
#include <random>
#include <vector>

#include "emu_test_util.hpp"

namespace {
using emutest::dev;
namespace cd = clover::backend::cuda_detail;

__global__ void fill(float* p, float v, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) p[i] = v;
}

// One warp: A (16 × K, row-major int8) and B (K × 8, column j's K values consecutive) into the
// fragments by mma.cuh's frag_* functions, the emulated mma, D out by frag_c_*.
template <int K>
__global__ void mma_gemm(const std::int8_t* A, const std::int8_t* B, int* D) {
    const int lane = int(threadIdx.x);
    std::uint32_t a[4] = {}, b[2] = {};
    for (int r = 0; r < K / 8; ++r)
        for (int by = 0; by < 4; ++by)
            a[r] |= std::uint32_t(std::uint8_t(A[cd::frag_a_row(lane, r) * K + cd::frag_a_k(lane, r, by)])) << (8 * by);
    for (int r = 0; r < K / 16; ++r)
        for (int by = 0; by < 4; ++by)
            b[r] |= std::uint32_t(std::uint8_t(B[cd::frag_b_col(lane) * K + cd::frag_b_k(lane, r, by)])) << (8 * by);
    int d[4];
    if constexpr (K == 32) clover_emu::mma_m16n8k32_s8(d, a, b);
    else clover_emu::mma_m16n8k16_s8(d, a, b);
    for (int r = 0; r < 4; ++r) D[cd::frag_c_row(lane, r) * 8 + cd::frag_c_col(lane, r)] = d[r];
}

template <int K>
void check_mma() {
    std::mt19937 rng(K);
    std::vector<std::int8_t> A(16 * K), B(8 * K);
    for (auto& v : A) v = std::int8_t(int(rng() % 256) - 128);
    for (auto& v : B) v = std::int8_t(int(rng() % 256) - 128);
    dev<std::int8_t> a(A), b(B);
    dev<int> d(16 * 8);
    clover_emu::launch(mma_gemm<K>, "mma_gemm", 1, 32, 0, nullptr, a.p, b.p, d.p);
    const auto D = d.host();
    int bad = 0;
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            int s = 0;
            for (int k = 0; k < K; ++k) s += int(A[std::size_t(m * K + k)]) * int(B[std::size_t(n * K + k)]);
            bad += D[std::size_t(m * 8 + n)] != s;
        }
    CHECK(bad == 0);
}

}  // namespace

TEST_CASE("emu: mma m16n8k32 / m16n8k16 s8 equal a scalar int8 GEMM through mma.cuh's fragment layout") {
    check_mma<32>();
    check_mma<16>();
}

TEST_CASE("emu: lazy mode — a host read without a synchronisation sees poison, after it the result") {
    clover_emu::set_lazy(true);
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    dev<float> d(64);
    float* pinned = nullptr;
    REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 64 * 4, cudaHostAllocMapped) == cudaSuccess);
    clover_emu::launch(fill, "fill", 2, 32, 0, s, d.p, 3.f, 64);
    REQUIRE(cudaMemcpyAsync(pinned, d.p, 64 * 4, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    const std::uint8_t* raw = reinterpret_cast<const std::uint8_t*>(pinned);
    CHECK(raw[0] == clover_emu::poison());  // nothing ran yet
    // A synchronous copy on the legacy stream does not wait for a non-blocking stream either.
    std::vector<float> h(64, 0.f);
    REQUIRE(cudaMemcpy(h.data(), d.p, 64 * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(reinterpret_cast<const std::uint8_t*>(h.data())[0] == clover_emu::poison());
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(pinned[0] == 3.f);
    CHECK(pinned[63] == 3.f);
    clover_emu::set_lazy(false);
    CHECK(cudaFreeHost(pinned) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("emu: a graph replays the arguments it captured; an update takes the new capture's") {
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    dev<float> d(32);
    float v = 1.f;
    const auto capture = [&] {
        cudaGraph_t g = nullptr;
        REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        clover_emu::launch(fill, "fill", 1, 32, 0, s, d.p, v, 32);
        REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
        return g;
    };
    cudaGraph_t g = capture();
    CHECK(d.host()[0] != 1.f);  // captured, not run
    cudaGraphExec_t e = nullptr;
    REQUIRE(cudaGraphInstantiate(&e, g, 0) == cudaSuccess);
    v = 2.f;  // too late for the captured node
    REQUIRE(cudaGraphLaunch(e, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(d.host()[0] == 1.f);
    v = 3.f;
    cudaGraph_t g2 = capture();
    cudaGraphExecUpdateResultInfo info{};
    REQUIRE(cudaGraphExecUpdate(e, g2, &info) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(e, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(d.host()[31] == 3.f);
    // A synchronisation inside a capture invalidates it.
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    cudaGraph_t g3 = nullptr;
    CHECK(cudaStreamEndCapture(s, &g3) == cudaErrorStreamCaptureInvalidated);
    CHECK(g3 == nullptr);
    CHECK(clover_emu::take_errors().size() == 1);
    (void)cudaGetLastError();
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    cudaGraphDestroy(g2);
    cudaStreamDestroy(s);
}
