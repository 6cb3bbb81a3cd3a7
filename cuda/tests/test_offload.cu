// backend::offload<cuda, cpu> (backend/offload.hpp): backend::cuda composed with backend::cpu
// for --n-cpu-moe. With nothing placed on the host it makes no CPU backend and gives
// backend::cuda's logits bit for bit; placement is decided when the model binds its weights,
// before any pass, and host-placed experts are never uploaded; the device's host round trip
// (the only thing the composition asks of backend::cuda) copies, waits, runs and copies back.
// The whole-model comparison with experts on the host is test_model.cu's "--n-cpu-moe" case.
#include "cuda_test.hpp"

#include <cstring>

#include <clover/backend/offload.hpp>
#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_offload {

using namespace clover;
using hybrid = backend::offload<backend::cuda, backend::cpu>;
using cuda_model = model<variants::from_file, backend::cuda>;
using hybrid_model = model<variants::from_file, hybrid>;

// What the composition needs of each side, and the combinations it refuses (its static_asserts
// name these concepts).
static_assert(backend::backend_for<hybrid>);
static_assert(backend::host_round_trip_device<backend::cuda>);
static_assert(!backend::host_round_trip_device<backend::cpu>);  // offload<cpu, cpu> does not compile
static_assert(backend::host_memory_views<backend::cpu>);

namespace {

std::vector<float> commit_all(auto& m, std::int64_t n, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> p;
    for (std::int64_t i = 0; i < n; ++i) p.push_back(token(r.next() % std::uint64_t(m.n_vocab())));
    auto s = m.new_session({.ctx = 64});
    std::vector<float> out;
    m.commit(s, p, logits_rows::all, out);
    return out;
}

}  // namespace

CUDA_TEST_CASE("offload with nothing on the host: no CPU backend is made, logits equal backend::cuda's bit for bit") {
    auto path = testutil::synth_file("cu_odd.gguf", testutil::odd_spec());
    cuda_model plain(load(path));
    hybrid_model none(load(path));  // host_moe_layers = 0
    CHECK(none.backend().host() == nullptr);
    CHECK(none.backend().threads() == 0);
    CHECK(none.backend().host_layers().empty());
    const auto a = commit_all(plain, 19, 3), b = commit_all(none, 19, 3);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    CHECK(none.backend().host() == nullptr);  // and no pass made one
    CHECK(none.backend().device().uploaded_bytes() == plain.backend().uploaded_bytes());
}

CUDA_TEST_CASE("offload placement is decided when the weights are bound; host experts are never uploaded") {
    auto path = testutil::synth_file("cu_odd.gguf", testutil::odd_spec());
    hybrid unbound({.host = {.threads = 2}, .host_moe_layers = 3});
    CHECK(unbound.host() == nullptr);  // nothing bound, nothing placed
    CHECK(!unbound.on_host(0));
    CHECK_THROWS_AS((void)hybrid({.host_moe_layers = -1}), clover::error);

    hybrid_model all(load(path));
    hybrid_model some(load(path), {.host = {.threads = 2}, .host_moe_layers = 3});
    // Before any pass: the layers, the host backend and its threads.
    auto& be = some.backend();
    CHECK(be.host_layers() == std::vector<std::int64_t>{0, 1, 2});
    CHECK(be.on_host(2));
    CHECK(!be.on_host(3));
    REQUIRE(be.host() != nullptr);
    CHECK(be.threads() == 2);
    const auto& L = some.weights().layers;
    CHECK(be.on_host(L[0].moe.down_exps));
    CHECK(be.on_host(L[2].moe.gate_exps.expert(1)));  // a view into a placed matrix
    CHECK(!be.on_host(L[3].moe.down_exps));
    CHECK(!be.on_host(L[0].moe.router));  // routing stays on the device
    // A placement larger than the model places every layer and no more.
    hybrid_model every(load(path), {.host = {.threads = 1}, .host_moe_layers = 1000});
    CHECK(std::int64_t(every.backend().host_layers().size()) == some.hp().n_layer);

    (void)commit_all(all, 7, 5);
    (void)commit_all(some, 7, 5);
    // The three layers' routed experts stay in host memory: fewer bytes reach the device.
    CHECK(be.device().uploaded_bytes() < all.backend().device().uploaded_bytes());
    CHECK(be.host_layers() == std::vector<std::int64_t>{0, 1, 2});  // passes change nothing
}

CUDA_TEST_CASE("cuda host round trip: refused until enabled; x and the routing reach f, f's output reaches the device") {
    backend::cuda be;
    const std::int64_t n = 5, E = 7, k = 3;
    auto cx = be.begin_pass();
    backend::cuda::tensor x = cx.get(backend::buf::u, n, E), out = cx.get(backend::buf::y, n, E);
    backend::cuda::route r = cx.get_route(n, k);
    std::vector<float> hx(std::size_t(n * E)), hw(std::size_t(n * k));
    std::vector<std::int32_t> hids(std::size_t(n * k));
    for (std::size_t i = 0; i < hx.size(); ++i) hx[i] = float(i) * 0.5f - 3.f;
    for (std::size_t i = 0; i < hw.size(); ++i) {
        hw[i] = 1.f / float(i + 1);
        hids[i] = std::int32_t(i % 11);
    }
    CLOVER_CUDA_CHECK(cudaMemcpy(x.data, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CLOVER_CUDA_CHECK(cudaMemcpy(r.w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    CLOVER_CUDA_CHECK(cudaMemcpy(r.ids, hids.data(), hids.size() * 4, cudaMemcpyHostToDevice));
    int calls = 0;
    auto f = [&](backend::host_tensor tx, backend::host_route tr, backend::host_tensor ty) {
        ++calls;
        REQUIRE(tx.rows == n);
        REQUIRE(tx.cols == E);
        REQUIRE(tr.k == k);
        CHECK(std::memcmp(tx.data, hx.data(), hx.size() * 4) == 0);
        CHECK(std::memcmp(tr.ids, hids.data(), hids.size() * 4) == 0);
        CHECK(std::memcmp(tr.w, hw.data(), hw.size() * 4) == 0);
        for (std::int64_t i = 0; i < n * E; ++i) ty.data[i] = tx.data[i] * 2.f + float(tr.ids[(i / E) * k]);
    };
    CHECK_THROWS_AS(be.host_round_trip(cx, x, r, out, f), clover::error);  // a graph could be capturing
    CHECK(calls == 0);
    be.enable_host_round_trips();
    be.host_round_trip(cx, x, r, out, f);
    CHECK(calls == 1);
    std::vector<float> got(hx.size());
    CLOVER_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
    CLOVER_CUDA_CHECK(cudaMemcpy(got.data(), out.data, got.size() * 4, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i] == hx[i] * 2.f + float(hids[(i / std::size_t(E)) * std::size_t(k)]));
    }
}

}  // namespace cuda_test_offload
