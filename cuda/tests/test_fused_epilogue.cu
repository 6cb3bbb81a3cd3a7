// The fused epilogues of issue 16 against the plain kernels they replace, bit for bit:
// - norm_act (add + RMSNorm + conversion of the output rows) vs add, rms_norm, then
//   quantize_activations, for every activation type, odd widths, in place and with a residual;
// - swiglu_act (SwiGLU written as the down product's activation rows) vs swiglu, then
//   quantize_activations;
// - backend::cuda's deferred norms: add_rms_norm then matmul (products of four activation types
//   sharing x, each type converted once) vs the plain kernels and one matmul per product.
// Those need a GPU (CUDA_TEST_CASE). The per-block quantizer pieces of matmul.cuh are
// __host__ __device__: the first test emulates the warp algorithms with them on the host and
// compares with quant::quantize_row, so it runs on every machine.
#include "cuda_test.hpp"

#include <array>
#include <cmath>
#include <cstring>

#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_fused_epilogue {

using namespace clover;
namespace cd = clover::backend::cuda_detail;
using cudatest::dvec;
using gpu = clover::backend::cuda;

namespace {

// Bytes of a host vector, for exact comparisons of floats (NaN-safe, -0 kept apart).
template <class T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
    std::vector<std::uint8_t> b(v.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Random rows of n with the cases the quantizers branch on: an all-zero row, a zero block, equal
// magnitudes of opposite signs (the first wins in Q8_K), and values far apart in size.
std::vector<float> test_rows(std::int64_t rows, std::int64_t n, std::uint64_t seed) {
    auto x = testutil::random_vec(std::size_t(rows * n), seed, -3.f, 3.f);
    if (rows > 1) std::fill(x.begin() + n, x.begin() + 2 * n, 0.f);                  // row 1: zeros
    if (rows > 2 && n >= 64) std::fill(x.begin() + 2 * n + 32, x.begin() + 2 * n + 64, 0.f);  // one zero Q8_0 block
    if (rows > 3 && n >= 8) {  // a tie of magnitude in one block (one Q8_K super-block if n >= 256)
        x[std::size_t(3 * n + 1)] = 4.f;
        x[std::size_t(3 * n + (n >= 256 ? 200 : n - 2))] = -4.f;
    }
    if (rows > 4) x[std::size_t(4 * n)] = 1000.f;
    return x;
}

// The host emulation of q8_0_block_warp / q8_k_block_warp (lanes in a loop, the butterfly as the
// warp runs it) over one row of n values.
std::vector<std::uint8_t> emulate_q8_0(const float* x, std::int64_t n) {
    std::vector<std::uint8_t> out(std::size_t(n / 32) * cd::q8_0_bytes);
    for (std::int64_t b = 0; b < n / 32; ++b) {
        const float* v = x + b * 32;
        float amax = 0.f;
        for (int l = 0; l < 32; ++l) amax = std::fmax(amax, std::fabs(v[l]));
        std::uint8_t* blk = out.data() + b * cd::q8_0_bytes;
        const std::uint16_t d = cd::q8_0_scale_bits(amax);
        blk[0] = std::uint8_t(d & 0xff);
        blk[1] = std::uint8_t(d >> 8);
        for (int l = 0; l < 32; ++l) blk[2 + l] = std::uint8_t(cd::q8_0_code(v[l], cd::q8_0_inv_scale(amax)));
    }
    return out;
}
std::vector<std::uint8_t> emulate_q8_k(const float* x, std::int64_t n) {
    std::vector<std::uint8_t> out(std::size_t(n / 256) * cd::q8_k_bytes);
    for (std::int64_t b = 0; b < n / 256; ++b) {
        const float* v = x + b * 256;
        std::array<float, 32> amax{}, mx{};
        std::array<int, 32> idx{};
        for (int l = 0; l < 32; ++l) {
            idx[std::size_t(l)] = 1 << 30;
            for (int i = 0; i < 8; ++i)
                if (std::fabs(v[l * 8 + i]) > amax[std::size_t(l)]) {
                    amax[std::size_t(l)] = std::fabs(v[l * 8 + i]);
                    mx[std::size_t(l)] = v[l * 8 + i];
                    idx[std::size_t(l)] = l * 8 + i;
                }
        }
        for (int o = 16; o > 0; o >>= 1) {  // every lane reads its partner's value from before the step
            const auto a0 = amax;
            const auto m0 = mx;
            const auto i0 = idx;
            for (std::size_t l = 0; l < 32; ++l) {
                const std::size_t p = l ^ std::size_t(o);
                if (cd::q8_k_beats(a0[p], i0[p], a0[l], i0[l])) {
                    amax[l] = a0[p];
                    mx[l] = m0[p];
                    idx[l] = i0[p];
                }
            }
        }
        std::uint8_t* blk = out.data() + b * cd::q8_k_bytes;
        for (std::size_t l = 1; l < 32; ++l) REQUIRE(idx[l] == idx[0]);  // every lane agrees
        float d = 0.f;
        std::array<std::int16_t, 16> bsums{};
        if (amax[0] != 0.f) {
            const float iscale = cd::q8_k_iscale(mx[0]);
            for (int i = 0; i < 256; ++i) {
                const std::int8_t q = cd::q8_k_code(v[i], iscale);
                blk[4 + i] = std::uint8_t(q);
                bsums[std::size_t(i / 16)] = std::int16_t(bsums[std::size_t(i / 16)] + q);
            }
            d = 1.f / iscale;
        }
        std::memcpy(blk, &d, 4);
        std::memcpy(blk + 260, bsums.data(), 32);
    }
    return out;
}

}  // namespace

TEST_CASE("fused epilogues' per-block quantizer pieces reproduce quant::quantize_row (Q8_0, Q8_K), on the host") {
    const std::int64_t rows = 6, n = 768;
    const auto x = test_rows(rows, n, 5);
    for (std::int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        const float* xr = x.data() + r * n;
        std::vector<std::uint8_t> want0(quant::row_bytes(dtype::q8_0, n)), wantk(quant::row_bytes(dtype::q8_k, n));
        quant::quantize_row(dtype::q8_0, xr, want0.data(), n);
        quant::quantize_row(dtype::q8_k, xr, wantk.data(), n);
        CHECK(emulate_q8_0(xr, n) == want0);
        CHECK(emulate_q8_k(xr, n) == wantk);
    }
    // Halfway cases round to even, as std::nearbyint: 2.5 -> 2, -3.5 -> -4.
    CHECK(cd::round_even(2.5f) == 2);
    CHECK(cd::round_even(-3.5f) == -4);
    CHECK(cd::q8_k_code(200.f, 1.f) == 127);  // clamped above only (-127 is the largest magnitude)
}

CUDA_TEST_CASE("norm_act: (add +) RMSNorm + conversion in one kernel equals add, rms_norm, quantize_activations, every type") {
    const std::int64_t rows = 7;
    const float eps = 1e-6f;
    for (auto [at, n] : {std::pair{dtype::f32, std::int64_t(1001)}, {dtype::f16, 1001}, {dtype::f16, 77}, {dtype::bf16, 333},
                         {dtype::q8_0, 32}, {dtype::q8_0, 1120}, {dtype::q8_k, 768}, {dtype::q8_k, 2304}}) {
        for (int mode = 0; mode < 3; ++mode) {  // 0: x -> out, 1: h += y, h -> out, 2: in place, no weight
            CAPTURE(dtype_name(at));
            CAPTURE(n);
            CAPTURE(mode);
            const auto x = test_rows(rows, n, 17 + std::uint64_t(n));
            const auto y = testutil::random_vec(std::size_t(rows * n), 23, -1.f, 1.f);
            const auto w = testutil::random_vec(std::size_t(n), 29, 0.5f, 1.5f);
            const std::size_t rb = at == dtype::f32 ? 4 : quant::row_bytes(at, n);
            // The plain path.
            dvec<float> px(x), py(y), pw(w), pout(std::size_t(rows * n));
            dvec<std::uint8_t> pact(rb * rows);
            float* pdst = mode == 2 ? px.p() : pout.p();
            const float* wp = mode == 2 ? nullptr : pw.p();
            if (mode == 1) cd::add(px.p(), py.p(), rows * n, nullptr);
            cd::rms_norm(px.p(), n, wp, pdst, n, rows, n, eps, nullptr);
            cd::quantize_activations(at, pdst, pact.p(), rows, n, nullptr);
            // The fused kernel.
            dvec<float> fx(x), fy(y), fw(w), fout(std::size_t(rows * n));
            dvec<std::uint8_t> fact(rb * rows);
            cd::pending_norm p;
            p.on = true;
            p.x = fx.p();
            p.add = mode == 1 ? fy.p() : nullptr;
            p.w = mode == 2 ? nullptr : fw.p();
            p.out = mode == 2 ? fx.p() : fout.p();
            p.xs = p.ys = n;
            p.rows = rows;
            p.n = n;
            p.eps = eps;
            cd::norm_act(p, at, fact.p(), nullptr);
            CHECK(bytes_of(fx.host()) == bytes_of(px.host()));  // the residual after the add (or the in-place output)
            CHECK(bytes_of(fout.host()) == bytes_of(pout.host()));
            if (at != dtype::f32) CHECK(fact.host() == pact.host());
        }
    }
}

CUDA_TEST_CASE("swiglu_act: SwiGLU written as activation rows equals swiglu, then quantize_activations, every type") {
    const std::int64_t rows = 7;
    for (auto [at, F] : {std::pair{dtype::f32, std::int64_t(333)}, {dtype::f16, 333}, {dtype::bf16, 77}, {dtype::q8_0, 160},
                         {dtype::q8_k, 512}}) {
        CAPTURE(dtype_name(at));
        CAPTURE(F);
        auto gu = testutil::random_vec(std::size_t(rows * 2 * F), 41 + std::uint64_t(F), -6.f, 6.f);
        std::fill(gu.begin() + 2 * F, gu.begin() + 3 * F, 0.f);  // row 1's gate is zero: h = 0 there
        dvec<float> dgu(gu), h(std::size_t(rows * F));
        const std::size_t rb = quant::row_bytes(at, F);
        dvec<std::uint8_t> want(rb * rows), got(rb * rows);
        cd::swiglu(dgu.p(), h.p(), rows, F, nullptr);
        if (at == dtype::f32) CHECK(cudaMemcpy(want.p(), h.p(), rb * rows, cudaMemcpyDeviceToDevice) == cudaSuccess);
        else cd::quantize_activations(at, h.p(), want.p(), rows, F, nullptr);
        cd::swiglu_act(at, dgu.p(), got.p(), rows, F, nullptr);
        CHECK(got.host() == want.host());
    }
}

CUDA_TEST_CASE("backend::cuda: add_rms_norm deferred into matmul (four activation types sharing x) equals the plain kernels") {
    gpu gb;
    const std::int64_t n = 5, K = 512;
    const float eps = 1e-6f;
    // One product per partner type: F32, F16, Q8_0, Q8_K (Q4_K), and a second Q8_0 one that
    // reads the same converted rows.
    cudatest::random_weight w32(dtype::f32, 9, K, 1), w16(dtype::f16, 11, K, 2), w80(dtype::q8_0, 13, K, 3),
        wk(dtype::q4_k, 15, K, 4), w80b(dtype::q8_0, 3, K, 5);
    const std::array<const weight*, 5> ws{&w32.w, &w16.w, &w80.w, &wk.w, &w80b.w};
    const auto norm_v = testutil::random_vec(std::size_t(K), 7, 0.5f, 1.5f);
    weight nw;
    nw.data = reinterpret_cast<const std::byte*>(norm_v.data());
    nw.type = dtype::f32;
    nw.rows = 1;
    nw.cols = K;
    nw.row_bytes = std::size_t(K) * 4;
    nw.name = "norm";
    const auto h0 = test_rows(n, K, 31);
    const auto y0 = testutil::random_vec(std::size_t(n * K), 37);

    // Plain: add, rms_norm, then each product converting x itself.
    dvec<float> ph(h0), py(y0), pu(std::size_t(n * K));
    // Copies on the legacy stream finish before the backend's (non-blocking) stream reads them.
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    cd::add(ph.p(), py.p(), n * K, gb.stream());
    cd::rms_norm(ph.p(), K, reinterpret_cast<const float*>(gb.dev(nw).data), pu.p(), K, n, K, eps, gb.stream());
    std::vector<dvec<float>> want;
    dvec<std::uint8_t> act(cd::act_bytes(dtype::q8_0, n, K) + cd::act_bytes(dtype::q4_k, n, K) + cd::act_bytes(dtype::f16, n, K));
    for (const weight* w : ws) {
        want.emplace_back(std::size_t(n * w->rows));
        cd::matmul(gb.dev(*w), pu.p(), want.back().p(), n, act.p(), gb.stream());
    }

    // Deferred and fused, through the primitives.
    batch bt;
    const std::vector<token> toks(std::size_t(n), 1);
    bt.add(0, pass_kind::commit, toks, 0);
    auto cx = gb.begin_pass();
    gpu::tensor h = cx.get(backend::buf::h, n, K), y = cx.get(backend::buf::y, n, K), u = cx.get(backend::buf::u, n, K);
    CHECK(cudaMemcpy(h.data, h0.data(), h0.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(y.data, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<dvec<float>> got;
    std::vector<backend::product_of<gpu::tensor>> prods;
    for (const weight* w : ws) {
        got.emplace_back(std::size_t(n * w->rows));
        prods.push_back({w, gpu::tensor{got.back().p(), n, w->rows}});
    }
    gb.add_rms_norm(cx, h, y, nw, u, eps);
    gb.matmul(cx, bt, u, prods);
    CHECK(cudaStreamSynchronize(gb.stream()) == cudaSuccess);
    std::vector<float> hh(std::size_t(n * K)), uh(std::size_t(n * K));
    CHECK(cudaMemcpy(hh.data(), h.data, hh.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(uh.data(), u.data, uh.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(bytes_of(hh) == bytes_of(ph.host()));
    CHECK(bytes_of(uh) == bytes_of(pu.host()));
    for (std::size_t i = 0; i < ws.size(); ++i) {
        CAPTURE(dtype_name(ws[i]->type));
        CHECK(bytes_of(got[i].host()) == bytes_of(want[i].host()));
    }

    // A norm no product reads: flush_norm runs it (one kernel) with the same bits.
    CHECK(cudaMemcpy(h.data, h0.data(), h0.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemset(u.data, 0, std::size_t(n * K) * 4) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    gb.add_rms_norm(cx, h, y, nw, u, eps);
    gb.flush_norm(cx);
    CHECK(cudaStreamSynchronize(gb.stream()) == cudaSuccess);
    CHECK(cudaMemcpy(uh.data(), u.data, uh.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(bytes_of(uh) == bytes_of(pu.host()));
}

}  // namespace cuda_test_fused_epilogue
