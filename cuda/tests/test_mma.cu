// The tensor-core product (mma.cuh, mma_kernel in matmul.cuh) on a GPU: for every integer weight
// format, random matrices with odd output counts and 8..39 rows, the mma kernel's rows equal
// mm_kernel's (the single-row decode step's kernel) bit for bit, dense and gathered (xmap, ldy
// past N), and the product agrees with the CPU's reference within tolerance; the expert-grouped
// products (moe.cuh) stay row-exact when their big experts run on the tensor cores.
// cuda/tests/host/test_mma_host.cu runs the same warp code on the host with an emulated mma.
#include "cuda_test.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_mma {

using namespace clover;
namespace cd = clover::backend::cuda_detail;
using cudatest::dvec;
using cudatest::rel;

namespace {

// y [n, ldy] on the device: mma = true through launch_mm (n >= 8: mma_kernel), false through
// mm_kernel's launch directly (tiles of mm_rows), everything else equal.
std::vector<float> product(dtype t, dvec<std::uint8_t>& w, std::size_t wrb, std::int64_t N, dvec<std::uint8_t>& x, std::size_t xrb,
                           const int* xmap, std::int64_t n, std::int64_t K, std::int64_t ldy, bool mma) {
    dvec<float> y(std::size_t(n * ldy));
    CLOVER_CUDA_CHECK(cudaMemset(y.p(), 0xff, std::size_t(n * ldy) * 4));  // NaN: unwritten entries show
    cd::mm_args a{};
    a.w = w.p();
    a.row_bytes = wrb;
    a.mat_bytes = wrb * std::size_t(N);
    a.x = x.p();
    a.x_row_bytes = xrb;
    a.xmap = xmap;
    a.y = y.p();
    a.ldy = ldy;
    a.N = N;
    a.K = K;
    a.n = n;
    if (mma) {
        REQUIRE(n >= cd::mma_min_rows);
        cd::launch_mm(t, a, (n + cd::mm_rows - 1) / cd::mm_rows, nullptr);
    } else {
        a.tile0 = 0;
        cd::launch_mm_tiles(t, a, dim3(cd::blocks_for("mm_kernel", N, cd::mm_warps), unsigned((n + cd::mm_rows - 1) / cd::mm_rows)), nullptr);
    }
    return y.host();
}

}  // namespace

CUDA_TEST_CASE("tensor-core product (mma) equals mm_kernel bit for bit and the CPU within tolerance, every integer format") {
    for (auto [t, K] : {std::pair{dtype::q8_0, std::int64_t(2304)}, {dtype::q8_0, 96}, {dtype::q4_k, 768}, {dtype::q4_k, 2304},
                        {dtype::q5_k, 1280}, {dtype::q6_k, 768}, {dtype::q6_k, 2304}}) {
        CAPTURE(dtype_name(t));
        CAPTURE(K);
        const dtype at = quant::activation_type(t);
        const std::int64_t N = 101;
        cudatest::random_weight hw(t, N, K, 41 + std::uint64_t(t) + std::uint64_t(K));
        std::vector<std::uint8_t> wb(hw.bytes.size());
        std::memcpy(wb.data(), hw.bytes.data(), wb.size());
        dvec<std::uint8_t> dw(wb);
        const std::size_t wrb = hw.w.row_bytes, xrb = quant::row_bytes(at, K);
        for (std::int64_t n : {8, 9, 15, 23, 33, 39}) {
            CAPTURE(n);
            const auto xf = testutil::random_vec(std::size_t(n * K), 57 + std::uint64_t(n));
            std::vector<std::uint8_t> xq(xrb * std::size_t(n));
            for (std::int64_t p = 0; p < n; ++p) quant::quantize_row(at, xf.data() + p * K, xq.data() + std::size_t(p) * xrb, K);
            dvec<std::uint8_t> dx(xq);
            const auto ym = product(t, dw, wrb, N, dx, xrb, nullptr, n, K, N, true);
            const auto yk = product(t, dw, wrb, N, dx, xrb, nullptr, n, K, N, false);
            CHECK(std::memcmp(ym.data(), yk.data(), ym.size() * 4) == 0);
            std::vector<float> yr(ym.size());
            backend::cpu::matmul_ref(hw.w, xf.data(), yr.data(), n);
            CHECK(rel(ym, yr) < 1e-5f);
            // Gathered rows into a wider y: the padding columns stay unwritten (NaN).
            std::vector<int> map;
            for (std::int64_t p = 0; p < n; ++p) map.push_back(int((p * 7 + 3) % n));
            dvec<int> dmap(map);
            const std::int64_t ldy = N + 5;
            const auto gm = product(t, dw, wrb, N, dx, xrb, dmap.p(), n, K, ldy, true);
            const auto gk = product(t, dw, wrb, N, dx, xrb, dmap.p(), n, K, ldy, false);
            CHECK(std::memcmp(gm.data(), gk.data(), gm.size() * 4) == 0);
            for (std::int64_t p = 0; p < n; ++p) {
                CHECK(std::memcmp(gm.data() + p * ldy, ym.data() + std::int64_t(map[std::size_t(p)]) * N, std::size_t(N) * 4) == 0);
                for (std::int64_t o = N; o < ldy; ++o) CHECK(std::isnan(gm[std::size_t(p * ldy + o)]));
            }
        }
    }
}

// The grouped expert products with device-side ids and counts: experts with 8 rows or more run
// on mma_kernel in tiles of 8, the others (and a single row's) on mm_kernel; every row of a
// 37-row call equals that row's own call bit for bit, shared expert (a dense product) included.
// test_kernels.cu compares the same call with the CPU experts loop.
CUDA_TEST_CASE("expert-grouped products on the tensor cores are row-exact: each row equals its single-row call") {
    for (auto t : {dtype::q8_0, dtype::q4_k}) {
        CAPTURE(dtype_name(t));
        auto s = t == dtype::q4_k ? cudatest::kquant_tiny(t) : synth::preset("tiny");
        s.type = t;
        s.n_expert = 11;
        s.n_expert_used = 3;
        auto path = testutil::synth_file("cuda_mma_moe_" + std::string(dtype_name(t)) + ".gguf", s);
        model<variants::from_file, backend::cpu> m(load(path), {.threads = 2, .rearrange = false});  // the GPU reads the file's layout
        backend::cuda be;
        const auto& mw = m.weights().layers[1].moe;
        const dims<variants::from_file> d = m.dim();
        const std::int64_t E = d.n_embd(), X = d.n_expert(), n = 37;
        const int k = int(d.n_expert_used());
        auto x = testutil::random_vec(std::size_t(n * E), 211);
        auto probs = testutil::random_vec(std::size_t(n * X), 212, 0.f, 1.f);
        std::vector<std::int32_t> ids(std::size_t(n * k));
        std::vector<float> w(ids.size());
        for (std::int64_t r = 0; r < n; ++r)
            backend::cpu_detail::route_row(probs.data() + r * X, X, k, {}, ids.data() + r * k, w.data() + r * k);
        std::vector<int> count(static_cast<std::size_t>(X));
        for (int e : ids) ++count[std::size_t(e)];
        REQUIRE(*std::max_element(count.begin(), count.end()) >= cd::mma_min_rows);  // the mma tiles are used
        const auto& gate = be.upload(mw.gate_exps);
        const auto& up = be.upload(mw.up_exps);
        const auto& down = be.upload(mw.down_exps);
        cd::moe_shared shared;
        shared.gate = &be.upload(mw.gate_shexp);
        shared.up = &be.upload(mw.up_shexp);
        shared.down = &be.upload(mw.down_shexp);
        shared.input_gate = &be.upload(mw.shexp_gate);
        CLOVER_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
        dvec<float> dx(x), dw(w), dout(std::size_t(n * E));
        dvec<int> did(std::vector<int>(ids.begin(), ids.end()));
        cd::moe_scratch sc;
        cd::moe_experts(gate, &up, down, dx.p(), did.p(), dw.p(), dout.p(), n, k, sc, nullptr, &shared);
        const auto all = dout.host();
        for (std::int64_t r = 0; r < n; ++r) {
            CAPTURE(r);
            dvec<float> one(static_cast<std::size_t>(E));
            cd::moe_experts(gate, &up, down, dx.p() + r * E, did.p() + r * k, dw.p() + r * k, one.p(), 1, k, sc, nullptr, &shared);
            CHECK(std::memcmp(one.host().data(), all.data() + r * E, std::size_t(E) * 4) == 0);
        }
    }
}

}  // namespace cuda_test_mma
