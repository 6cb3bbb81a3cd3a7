// Launch bounds, weight upload and device selection of the CUDA backend: products and grouped
// expert products past grid.y's 65,535 tiles (split launches), arguments past a kernel's limits
// (one clear error naming it, checked on the host: these run without a GPU too), uploads through
// a staging buffer smaller than the weight, and a backend called from a thread whose current
// device is not the backend's.
#include "cuda_test.hpp"

#include <cstring>
#include <list>
#include <thread>

#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_launch {

using namespace clover;
namespace cd = clover::backend::cuda_detail;
namespace cpud = clover::backend::cpu_detail;
using cudatest::dvec;
using cudatest::rel;

namespace {

using host_matrix = cudatest::random_weight;

}  // namespace

TEST_CASE("launch bounds: grids past the hardware limits fail on the host with the kernel's name") {
    CHECK(cd::grid_x("k", cd::max_grid_x) == unsigned(cd::max_grid_x));
    CHECK_THROWS_WITH_AS(cd::grid_x("rms_norm_rows", cd::max_grid_x + 1), doctest::Contains("rms_norm_rows"), error);
    CHECK_THROWS_WITH_AS(cd::grid_x("rms_norm_rows", cd::max_grid_x + 1), doctest::Contains("2147483647"), error);
    CHECK(cd::grid_yz("k", 65535) == 65535u);
    CHECK_THROWS_WITH_AS(cd::grid_yz("mm_kernel", 65536), doctest::Contains("mm_kernel needs 65536 blocks in grid y/z; the limit is 65535"), error);
    CHECK(cd::blocks_for("k", 256 * std::int64_t(cd::max_grid_x), 256) == unsigned(cd::max_grid_x));
    CHECK_THROWS_WITH_AS(cd::blocks_for("swiglu_kernel", 256 * std::int64_t(cd::max_grid_x) + 1, 256),
                         doctest::Contains("swiglu_kernel"), error);
}

TEST_CASE("argument checks before any launch: k past max_experts_used, ungrouped heads") {
    cd::device_matrix m;
    m.n_mat = 8;
    m.cols = 64;
    m.rows = 64;
    cd::moe_scratch sc;
    const int k = cd::max_experts_used + 1;
    CHECK_THROWS_WITH_AS(cd::moe_experts(m, nullptr, m, nullptr, nullptr, nullptr, nullptr, 3, k, sc, nullptr),
                         doctest::Contains("k = 65 experts per row is out of range (1..64)"), error);
    CHECK_THROWS_WITH_AS(cd::moe_experts(m, nullptr, m, nullptr, nullptr, nullptr, nullptr, 3, 0, sc, nullptr),
                         doctest::Contains("k = 0"), error);
    CHECK_THROWS_WITH_AS(cd::route(nullptr, 3, 100, k, nullptr, 0, nullptr, nullptr, nullptr),
                         doctest::Contains("k = 65 experts per row is out of range"), error);
    CHECK_THROWS_WITH_AS(cd::route(nullptr, 3, cd::max_experts + 1, 8, nullptr, 0, nullptr, nullptr, nullptr),
                         doctest::Contains("513 experts are outside the kernel's 1..512"), error);
    cd::attn_args a{};
    a.H = 6;
    a.Hkv = 4;
    a.hd = 8;
    CHECK_THROWS_WITH_AS(cd::attention(a, 1, nullptr), doctest::Contains("6 query heads do not group over 4 KV heads"), error);
}

CUDA_TEST_CASE("dense product over more than 65,535 row tiles (split launches) equals the CPU, row-exact at the seams") {
    backend::cuda be;
    backend::cpu cpu({.threads = 2});
    const std::int64_t N = 5, K = 64, n = 4 * 65535 + 4 * 3 + 3;  // tiles 0..65537, the last one partial
    host_matrix hw(dtype::q8_0, N, K, 7);
    auto x = testutil::random_vec(std::size_t(n * K), 8);
    std::vector<float> yc(std::size_t(n * N)), yg(yc.size());
    cpu.matmul(hw.w, x.data(), yc.data(), n);
    be.matmul(hw.w, x.data(), yg.data(), n);
    CHECK(rel(yg, yc) < 1e-5f);
    for (const std::int64_t r : std::vector<std::int64_t>{0, 4 * 65535 - 1, 4 * 65535, 4 * 65535 + 1, n - 1}) {
        CAPTURE(r);
        std::vector<float> one(static_cast<std::size_t>(N));
        be.matmul(hw.w, x.data() + r * K, one.data(), 1);
        CHECK(std::memcmp(one.data(), yg.data() + r * N, std::size_t(N) * 4) == 0);
    }
}

CUDA_TEST_CASE("expert-grouped products over more than 65,535 tiles equal the CPU experts loop") {
    auto s = synth::preset("tiny");
    s.type = dtype::f32;
    s.n_expert = 5;
    s.n_expert_used = 3;
    auto path = testutil::synth_file("cuda_moe_many_tiles.gguf", s);
    model<variants::from_file, backend::cpu> m(load(path), {2});
    backend::cuda be;
    const auto& mw = m.weights().layers[1].moe;
    const dims<variants::from_file> d = m.dim();
    const std::int64_t E = d.n_embd(), X = d.n_expert(), n = 87'401;  // n·k / 4 > 65,535 tiles
    const int k = int(d.n_expert_used());
    auto x = testutil::random_vec(std::size_t(n * E), 9);
    auto probs = testutil::random_vec(std::size_t(n * X), 10, 0.f, 1.f);
    std::vector<std::int32_t> ids(std::size_t(n * k));
    std::vector<float> w(ids.size());
    for (std::int64_t r = 0; r < n; ++r) cpud::route_row(probs.data() + r * X, X, k, {}, ids.data() + r * k, w.data() + r * k);
    using moe = layers::sparse_moe<variants::from_file>;
    std::vector<float> want(std::size_t(n * E));
    cpud::gemm_scratch gs;
    cpud::moe_scratch ms;
    cpud::thread_pool pool(2);
    cpud::moe_ffn(pool, gs, ms, moe::shape(d, mw), moe::params(mw), x.data(), n, ids.data(), w.data(), want.data(), E, true);
    cd::moe_shared shared{&be.upload(mw.gate_shexp), &be.upload(mw.up_shexp), &be.upload(mw.down_shexp), &be.upload(mw.shexp_gate)};
    const auto& up = be.upload(mw.up_exps);
    const auto& gate = be.upload(mw.gate_exps);
    const auto& down = be.upload(mw.down_exps);
    CLOVER_CUDA_CHECK(cudaStreamSynchronize(be.stream()));  // uploads are ordered on the backend's stream only
    dvec<float> dx(x), dw(w), dout(want.size());
    dvec<int> did(std::vector<int>(ids.begin(), ids.end()));
    cd::moe_scratch sc;
    cd::moe_experts(gate, &up, down, dx.p(), did.p(), dw.p(), dout.p(), n, k, sc,
                    nullptr, &shared);
    CHECK(rel(dout.host(), want) < 1e-5f);
}

CUDA_TEST_CASE("weights uploaded through a staging buffer smaller than the weight give the same products") {
    backend::cuda chunked({.staging_bytes = 4099});  // odd: chunks end mid-block
    backend::cuda whole;
    backend::cpu cpu({.threads = 2});
    // Alive as long as the backends: their device copies are keyed by host address and rows, and
    // a freed weight's address reused by the next one would find the stale copy (test_kernels.cu).
    std::list<host_matrix> weights;
    for (auto [t, K] : {std::pair{dtype::q4_k, std::int64_t(768)}, {dtype::f32, 301}, {dtype::q6_k, 512}}) {
        CAPTURE(dtype_name(t));
        const std::int64_t N = 37, n = 5;
        const host_matrix& hw = weights.emplace_back(t, N, K, 11 + std::uint64_t(t));
        REQUIRE(hw.bytes.size() > 3 * 4099);
        auto x = testutil::random_vec(std::size_t(n * K), 12);
        std::vector<float> ya(std::size_t(n * N)), yb(ya.size()), yc(ya.size());
        chunked.matmul(hw.w, x.data(), ya.data(), n);
        whole.matmul(hw.w, x.data(), yb.data(), n);
        cpu.matmul(hw.w, x.data(), yc.data(), n);
        CHECK(ya == yb);
        CHECK(rel(ya, yc) < 1e-5f);
        // The device copy holds the weight's bytes exactly.
        const auto& dm = chunked.upload(hw.w);
        CLOVER_CUDA_CHECK(cudaStreamSynchronize(chunked.stream()));
        std::vector<std::byte> back(hw.bytes.size());
        CLOVER_CUDA_CHECK(cudaMemcpy(back.data(), dm.data, back.size(), cudaMemcpyDeviceToHost));
        CHECK(back == hw.bytes);
    }
}

CUDA_TEST_CASE("a backend on the last device, called from a new thread, computes there and leaves the thread's device alone") {
    const int last = cd::device_count() - 1;
    backend::cuda be({.device = last});
    backend::cpu cpu({.threads = 2});
    host_matrix hw(dtype::q8_0, 19, 96, 13);
    auto x = testutil::random_vec(std::size_t(3 * 96), 14);
    std::vector<float> yg(3 * 19), yc(yg.size());
    cpu.matmul(hw.w, x.data(), yc.data(), 3);
    int after = -1, where = -1;
    std::thread worker([&] {
        CLOVER_CUDA_CHECK(cudaSetDevice(0));  // what a fresh server thread has
        be.matmul(hw.w, x.data(), yg.data(), 3);
        cudaPointerAttributes attr{};
        CLOVER_CUDA_CHECK(cudaPointerGetAttributes(&attr, be.upload(hw.w).data));
        where = attr.device;
        CLOVER_CUDA_CHECK(cudaGetDevice(&after));
    });
    worker.join();
    CHECK(rel(yg, yc) < 1e-5f);
    CHECK(where == last);
    CHECK(after == 0);
}

}  // namespace cuda_test_launch
