// Every CUDA kernel against its CPU twin on random data with odd sizes (ggml backend-test style):
// activation conversion bit for bit, the per-row ops, the GDN pieces, attention over the cache,
// routing and the expert-grouped products. (The products of every weight format and their
// row-exactness are the conformance table's: test_conformance.cu.)
#include "cuda_test.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <clover/clover.hpp>
#include <clover/backend/cpu/gdn_kernels.hpp>
#include <clover/backend/cpu/rope.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_kernels {

using namespace clover;
namespace cd = clover::backend::cuda_detail;
using cudatest::dvec;
using cudatest::rel;

namespace {

using host_weight = cudatest::random_weight;

hparams gdn_hparams(std::int64_t Hk, std::int64_t Hv, std::int64_t dk, std::int64_t dv, std::int64_t K, bool grouped) {
    hparams h;
    h.ssm_n_group = Hk;
    h.ssm_dt_rank = Hv;
    h.ssm_d_state = dk;
    h.ssm_d_inner = Hv * dv;
    h.ssm_conv = K;
    h.gdn_grouped_heads = grouped;
    return h;
}

weight f32_weight(const std::vector<float>& v) {
    weight w;
    w.data = reinterpret_cast<const std::byte*>(v.data());
    w.type = dtype::f32;
    w.cols = std::int64_t(v.size());
    w.rows = 1;
    w.row_bytes = v.size() * 4;
    return w;
}

using gdn_layer = layers::gated_deltanet<variants::from_file>;
namespace cpud = backend::cpu_detail;

}  // namespace

CUDA_TEST_CASE("activation conversion is bit-identical to the CPU's (F16, BF16, Q8_0, Q8_K)") {
    for (auto at : {dtype::f16, dtype::bf16, dtype::q8_0, dtype::q8_k}) {
        CAPTURE(dtype_name(at));
        const std::int64_t n = 5, K = 768;
        auto x = testutil::random_vec(static_cast<std::size_t>(n * K), 11, -3.f, 3.f);
        x[7] = 0.f;
        std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // an all-zero Q8_K block and Q8_0 blocks
        x[600] = 3.f;
        x[601] = -3.f;  // equal magnitudes: the first wins
        const std::size_t rb = quant::row_bytes(at, K);
        std::vector<std::uint8_t> want(rb * n);
        for (std::int64_t t = 0; t < n; ++t) quant::quantize_row(at, x.data() + t * K, want.data() + t * rb, K);
        dvec<float> dx(x);
        dvec<std::uint8_t> dq(want.size());
        cd::quantize_activations(at, dx.p(), dq.p(), n, K, nullptr);
        CHECK(dq.host() == want);
    }
}

CUDA_TEST_CASE("rms_norm (strided heads), softmax rows and rope equal the CPU functions") {
    const std::int64_t rows = 7, n = 301;
    auto x = testutil::random_vec(static_cast<std::size_t>(rows * n), 41, -4.f, 4.f), w = testutil::random_vec(static_cast<std::size_t>(n), 42);
    std::vector<float> want(x.size());
    for (std::int64_t r = 0; r < rows; ++r) math::rms_norm(x.data() + r * n, w.data(), want.data() + r * n, n, 1e-6f);
    dvec<float> dx(x), dw(w), dy(x.size());
    cd::rms_norm(dx.p(), n, dw.p(), dy.p(), n, rows, n, 1e-6f, nullptr);
    CHECK(rel(dy.host(), want) < 1e-6f);

    auto sm = x;
    for (std::int64_t r = 0; r < rows; ++r) math::softmax(sm.data() + r * n, n);
    cd::softmax_rows(dx.p(), rows, n, nullptr);
    CHECK(rel(dx.host(), sm) < 1e-6f);

    // rope over [tokens, heads, hd] with interleaved sections leaving a slot unrotated
    for (auto sec : {std::array<int, 4>{0, 0, 0, 0}, {1, 1, 0, 1}, {11, 11, 10, 0}}) {
        const std::int64_t T = 5, H = 3, hd = 70, n_rot = sec[0] == 11 ? 64 : 8, pos0 = 1234;
        cpud::rope_params rp{n_rot, 1e7f, sec};
        auto q = testutil::random_vec(static_cast<std::size_t>(T * H * hd), 43);
        auto want_q = q;
        std::vector<float> cs(static_cast<std::size_t>(n_rot));
        for (std::int64_t t = 0; t < T; ++t) {
            cpud::rope_cache(rp, pos0 + t, cs.data());
            for (std::int64_t h = 0; h < H; ++h) cpud::rope_apply(want_q.data() + (t * H + h) * hd, n_rot, cs.data());
        }
        cd::rope_args ra;
        ra.n_rot = int(n_rot);
        ra.scale = std::pow(rp.theta, -2.0f / float(n_rot));
        for (int i = 0; i < 4; ++i) ra.sections[i] = sec[i];
        dvec<float> dq(q);
        cd::rope(dq.p(), H * hd, hd, H, T, pos0, ra, nullptr);
        CHECK(rel(dq.host(), want_q) < 1e-5f);
    }
}

CUDA_TEST_CASE("GDN conv + SiLU (with look-ahead taps), ring advance and q/k L2 norm equal the layer's") {
    for (auto [n, K] : {std::pair{std::int64_t(1), std::int64_t(4)}, {7, 4}, {2, 3}, {33, 4}}) {
        CAPTURE(n);
        auto hp = gdn_hparams(2, 6, 5, 7, K, false);
        dims<variants::from_file> d{&hp};
        const std::int64_t C = d.conv_channels();
        auto ring = testutil::random_vec(static_cast<std::size_t>((K - 1) * C), 51), m = testutil::random_vec(static_cast<std::size_t>(n * C), 52);
        auto wc = testutil::random_vec(static_cast<std::size_t>(C * K), 53), right = testutil::random_vec(static_cast<std::size_t>(C * (K - 1)), 54);
        layers::gdn_weights gw;
        gw.conv = f32_weight(wc);
        for (bool look : {false, true}) {
            std::vector<float> y(static_cast<std::size_t>(n * C));
            cpud::conv_silu(gdn_layer::shape(d), gw.conv.f32(), ring.data(), m.data(), y.data(), n, look ? right.data() : nullptr, 0, C);
            dvec<float> dr(ring), dm(m), dwc(wc), drt(right), dy(y.size());
            cd::conv_silu(dr.p(), dm.p(), dwc.p(), look ? drt.p() : nullptr, dy.p(), n, C, int(K), nullptr);
            CHECK(rel(dy.host(), y) < 1e-6f);
            // normalize_qk in place on both
            cpud::normalize_qk(gdn_layer::shape(d), y.data(), n, 0.37f);
            cd::gdn_layout L{C, d.qk_heads(), d.v_heads(), d.dk(), d.dv(), false};
            cd::l2norm_qk(dy.p(), n, L, hp.rms_eps, 0.37f, nullptr);
            CHECK(rel(dy.host(), y) < 1e-6f);
        }
        auto r2 = ring;
        cpud::advance_ring(gdn_layer::shape(d), r2.data(), m.data(), n, 0, C);
        dvec<float> dr(ring), dm(m), dout(ring.size());
        cd::advance_ring(dr.p(), dm.p(), dout.p(), n, C, int(K), nullptr);
        CHECK(dout.host() == r2);
    }
}

namespace {
// Random normalised GDN rows [n, C] as the layer feeds the recurrence.
std::vector<float> gdn_rows(const dims<variants::from_file>& d, std::int64_t n, std::uint64_t seed) {
    auto y = testutil::random_vec(static_cast<std::size_t>(n * d.conv_channels()), seed);
    cpud::normalize_qk(gdn_layer::shape(d), y.data(), n, 1.f / std::sqrt(float(d.dk())));
    return y;
}
}  // namespace

CUDA_TEST_CASE("fused GDN step (gates + recurrence + gated norm) equals the CPU recurrence, grouped and tiled heads") {
    for (auto [n, Hk, Hv, dk, dv, grouped] : {std::tuple{std::int64_t(1), std::int64_t(2), std::int64_t(6), std::int64_t(5), std::int64_t(7), false},
                                              {9, 2, 6, 5, 7, true}, {1, 4, 8, 33, 65, false}, {3, 2, 4, 128, 128, true}}) {
        CAPTURE(n); CAPTURE(dk); CAPTURE(dv); CAPTURE(grouped);
        auto hp = gdn_hparams(Hk, Hv, dk, dv, 4, grouped);
        dims<variants::from_file> d{&hp};
        const std::int64_t C = d.conv_channels(), inner = Hv * dv;
        auto y = gdn_rows(d, n, 61);
        auto braw = testutil::random_vec(static_cast<std::size_t>(n * Hv), 62, -2.f, 2.f), araw = testutil::random_vec(static_cast<std::size_t>(n * Hv), 63);
        auto A = testutil::random_vec(static_cast<std::size_t>(Hv), 64, -1.f, -0.1f), dt = testutil::random_vec(static_cast<std::size_t>(Hv), 65);
        auto S = testutil::random_vec(static_cast<std::size_t>(Hv * dk * dv), 66, -0.3f, 0.3f);
        auto z = testutil::random_vec(static_cast<std::size_t>(n * inner), 67), nw = testutil::random_vec(static_cast<std::size_t>(dv), 68, 0.5f, 1.5f);
        // CPU: the layer's gate formulas, gdn_recurrent per head, then the gated norm.
        std::vector<float> beta(braw.size()), g(araw.size()), o(static_cast<std::size_t>(n * inner)), tmp;
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < Hv; ++h) {
                beta[t * Hv + h] = math::sigmoid(braw[t * Hv + h]);
                g[t * Hv + h] = A[h] * math::softplus(araw[t * Hv + h] + dt[h]);
            }
        auto Sc = S;
        for (std::int64_t h = 0; h < Hv; ++h) {
            const std::int64_t kh = hp.gdn_qk_head_of(h);
            cpud::gdn_head_io io{y.data() + kh * dk, y.data() + Hk * dk + kh * dk, y.data() + 2 * Hk * dk + h * dv,
                                   g.data() + h, beta.data() + h, o.data() + h * dv, C, C, C, Hv, inner};
            cpud::gdn_recurrent(Sc.data() + h * dk * dv, io, n, dk, dv, tmp);
        }
        auto o_raw = o;
        for (std::int64_t r = 0; r < n * Hv; ++r) {
            math::rms_norm(o.data() + r * dv, nw.data(), o.data() + r * dv, dv, 1e-6f);
            for (std::int64_t j = 0; j < dv; ++j) o[r * dv + j] *= math::silu(z[r * dv + j]);
        }
        cd::gdn_layout L{C, Hk, Hv, dk, dv, grouped};
        dvec<float> dS(S), dy(y), db(braw), dg(araw), dA(A), ddt(dt), dz(z), dnw(nw), dout(o.size());
        cd::gdn_scan_args a{dS.p(), dy.p(), db.p(), dg.p(), dA.p(), ddt.p(), dout.p(), dnw.p(), dz.p(), 1e-6f, n};
        cd::gdn_scan(a, L, nullptr);
        CHECK(rel(dout.host(), o) < 1e-5f);
        CHECK(rel(dS.host(), Sc) < 1e-5f);
        // The register-resident form (what gdn_scan launches for dk <= 128) is the global-memory
        // kernel's arithmetic in the same order: the same bits, outputs and state.
        dvec<float> dSg(S), doutg(o.size());
        cd::gdn_scan_args ag{dSg.p(), dy.p(), db.p(), dg.p(), dA.p(), ddt.p(), doutg.p(), dnw.p(), dz.p(), 1e-6f, n};
        cd::gdn_scan(ag, L, nullptr, /*force_global=*/true);
        CHECK(doutg.host() == dout.host());
        CHECK(dSg.host() == dS.host());
        // Unfused: pre-gated inputs, no norm.
        dvec<float> dS2(S), db2(beta), dg2(g), dout2(o.size());
        cd::gdn_scan_args a2{dS2.p(), dy.p(), db2.p(), dg2.p(), nullptr, nullptr, dout2.p(), nullptr, nullptr, 1e-6f, n};
        cd::gdn_scan(a2, L, nullptr);
        CHECK(rel(dout2.host(), o_raw) < 1e-5f);
        // And the separate gated-norm kernel.
        cd::gated_norm(dout2.p(), dz.p(), dnw.p(), n * Hv, dv, 1e-6f, nullptr);
        CHECK(rel(dout2.host(), o) < 1e-5f);
    }
}

CUDA_TEST_CASE("chunked GDN prefill kernel equals the CPU chunked form and the recurrence") {
    for (auto [n, dk, dv] : {std::tuple{std::int64_t(1), std::int64_t(5), std::int64_t(7)}, {31, 5, 7}, {32, 16, 16},
                             {77, 9, 11}, {130, 128, 128}}) {
        CAPTURE(n); CAPTURE(dk); CAPTURE(dv);
        const std::int64_t Hk = 2, Hv = 4;
        auto hp = gdn_hparams(Hk, Hv, dk, dv, 4, false);
        dims<variants::from_file> d{&hp};
        const std::int64_t C = d.conv_channels(), inner = Hv * dv;
        auto y = gdn_rows(d, n, 71);
        auto g = testutil::random_vec(static_cast<std::size_t>(n * Hv), 72, -2.f, 0.f), beta = testutil::random_vec(static_cast<std::size_t>(n * Hv), 73, 0.f, 1.f);
        auto S = testutil::random_vec(static_cast<std::size_t>(Hv * dk * dv), 74, -0.3f, 0.3f);
        std::vector<float> oc(static_cast<std::size_t>(n * inner)), orr(oc.size()), tmp;
        auto Sc = S, Sr = S;
        cpud::gdn_chunk_scratch sc;
        for (std::int64_t h = 0; h < Hv; ++h) {
            const std::int64_t kh = hp.gdn_qk_head_of(h);
            cpud::gdn_head_io io{y.data() + kh * dk, y.data() + Hk * dk + kh * dk, y.data() + 2 * Hk * dk + h * dv,
                                   g.data() + h, beta.data() + h, oc.data() + h * dv, C, C, C, Hv, inner};
            cpud::gdn_chunked(Sc.data() + h * dk * dv, io, n, dk, dv, sc, 32);
            io.o = orr.data() + h * dv;
            cpud::gdn_recurrent(Sr.data() + h * dk * dv, io, n, dk, dv, tmp);
        }
        cd::gdn_layout L{C, Hk, Hv, dk, dv, false};
        dvec<float> dS(S), dy(y), dg(g), db(beta), dout(oc.size());
        cd::gdn_chunked(dS.p(), dy.p(), db.p(), dg.p(), dout.p(), L, n, nullptr, 32);
        auto og = dout.host(), Sg = dS.host();
        CHECK(rel(og, oc) < 1e-5f);
        CHECK(rel(Sg, Sc) < 1e-5f);
        CHECK(rel(og, orr) < 5e-5f);
        CHECK(rel(Sg, Sr) < 5e-5f);
    }
}

CUDA_TEST_CASE("preview block softmax with history slot equals block_softmax_mix") {
    for (auto [B, dk, dv] : {std::tuple{std::int64_t(1), std::int64_t(5), std::int64_t(7)}, {13, 9, 11}, {32, 128, 128}}) {
        CAPTURE(B);
        const std::int64_t Hk = 2, Hv = 6;
        auto hp = gdn_hparams(Hk, Hv, dk, dv, 4, false);
        dims<variants::from_file> d{&hp};
        const std::int64_t C = d.conv_channels(), inner = Hv * dv;
        auto y = testutil::random_vec(static_cast<std::size_t>(B * C), 81);
        cpud::normalize_qk(gdn_layer::shape(d), y.data(), B, 1.f);
        auto S = testutil::random_vec(static_cast<std::size_t>(Hv * dk * dv), 82);
        auto lam = testutil::random_vec(static_cast<std::size_t>(Hv), 83, 1.f, 8.f), hb = testutil::random_vec(static_cast<std::size_t>(Hv), 84),
             hc = testutil::random_vec(static_cast<std::size_t>(Hv), 85);
        std::vector<float> o(static_cast<std::size_t>(B * inner)), logit(static_cast<std::size_t>(B + 1)), r(static_cast<std::size_t>(dv));
        for (std::int64_t h = 0; h < Hv; ++h) {
            const std::int64_t kh = hp.gdn_qk_head_of(h);
            cpud::gdn_head_io io{y.data() + kh * dk, y.data() + Hk * dk + kh * dk, y.data() + 2 * Hk * dk + h * dv,
                                   nullptr, nullptr, o.data() + h * dv, C, C, C, 0, inner};
            cpud::block_softmax_mix(S.data() + h * dk * dv, io, B, dk, dv, lam[h], hb[h], hc[h], logit, r);
        }
        cd::gdn_layout L{C, Hk, Hv, dk, dv, false};
        dvec<float> dS(S), dy(y), dout(o.size()), dl(lam), dhb(hb), dhc(hc);
        cd::block_softmax(dS.p(), dy.p(), dout.p(), L, B, dl.p(), dhb.p(), dhc.p(), nullptr);
        CHECK(rel(dout.host(), o) < 1e-5f);
    }
}

namespace {
std::vector<std::uint16_t> to_f16(const std::vector<float>& v) {
    std::vector<std::uint16_t> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = quant::f32_to_f16(v[i]);
    return h;
}
}  // namespace

// Cache K/V as F32 or as F16 pages (state_options::kv_f16, the default), and the preview block's
// fresh rows as F32 (what the model passes) or F16: the CPU twin is attend_group over runs of the
// same element types.
CUDA_TEST_CASE("attention over the KV cache equals the CPU: causal rows and preview blocks, GQA, odd head dims, F32/F16 K/V") {
    for (auto [H, Hkv, hd, pos0, n] : {std::tuple{std::int64_t(6), std::int64_t(2), std::int64_t(12), std::int64_t(0), std::int64_t(5)},
                                       {4, 2, 33, 17, 3}, {16, 2, 256, 300, 2}, {3, 3, 7, 1, 1}, {8, 1, 65, 41, 7}}) {
        for (auto [a16, b16] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
            CAPTURE(H); CAPTURE(hd); CAPTURE(pos0); CAPTURE(n); CAPTURE(a16); CAPTURE(b16);
            const std::int64_t kvw = Hkv * hd, ctx = pos0 + n + 1;
            const float scale = 1.f / std::sqrt(float(hd));
            auto q = testutil::random_vec(static_cast<std::size_t>(n * H * hd), 91, -2.f, 2.f);
            auto kc = testutil::random_vec(static_cast<std::size_t>(ctx * kvw), 92, -2.f, 2.f), vc = testutil::random_vec(static_cast<std::size_t>(ctx * kvw), 93);
            auto kb = testutil::random_vec(static_cast<std::size_t>(n * kvw), 94, -2.f, 2.f), vb = testutil::random_vec(static_cast<std::size_t>(n * kvw), 95);
            const auto kc16 = to_f16(kc), vc16 = to_f16(vc), kb16 = to_f16(kb), vb16 = to_f16(vb);
            const void* ka_h = a16 ? static_cast<const void*>(kc16.data()) : kc.data();
            const void* va_h = a16 ? static_cast<const void*>(vc16.data()) : vc.data();
            const void* kb_h = b16 ? static_cast<const void*>(kb16.data()) : kb.data();
            const void* vb_h = b16 ? static_cast<const void*>(vb16.data()) : vb.data();
            const std::size_t ea = a16 ? 2 : 4, eb = b16 ? 2 : 4;  // element bytes of each span
            auto off = [](const void* p, std::size_t bytes) { return static_cast<const void*>(static_cast<const std::byte*>(p) + bytes); };
            std::vector<float> causal(q.size()), prev(q.size()), p;
            const std::int64_t group = H / Hkv;
            for (std::int64_t th = 0; th < n * H; ++th) {
                const std::int64_t t = th / H, kvh = (th % H) / group;
                const std::size_t ha = std::size_t(kvh * hd) * ea, hb = std::size_t(kvh * hd) * eb;
                const std::vector<cpud::kv_run> causal_runs{{off(ka_h, ha), off(va_h, ha), kvw, pos0 + t + 1, a16}};
                cpud::attend_group(q.data() + th * hd, 1, causal_runs, hd, scale, causal.data() + th * hd, p);
                const std::vector<cpud::kv_run> block_runs{{off(ka_h, ha), off(va_h, ha), kvw, pos0, a16},
                                                           {off(kb_h, hb), off(vb_h, hb), kvw, n, b16}};
                cpud::attend_group(q.data() + th * hd, 1, block_runs, hd, scale, prev.data() + th * hd, p);
            }
            dvec<float> dq(q), dkc(kc), dvc(vc), dkb(kb), dvb(vb), dout(q.size());
            dvec<std::uint16_t> dkc16(kc16), dvc16(vc16), dkb16(kb16), dvb16(vb16);
            const void* dka = a16 ? static_cast<const void*>(dkc16.p()) : dkc.p();
            const void* dva = a16 ? static_cast<const void*>(dvc16.p()) : dvc.p();
            const void* dkbp = b16 ? static_cast<const void*>(dkb16.p()) : dkb.p();
            const void* dvbp = b16 ? static_cast<const void*>(dvb16.p()) : dvb.p();
            cd::attn_args a{dq.p(), dout.p(), dka, dva, kvw, pos0 + 1, true};
            a.H = H; a.Hkv = Hkv; a.hd = hd; a.scale = scale; a.a_f16 = a16;
            cd::attention(a, n, nullptr);
            CHECK(rel(dout.host(), causal) < 1e-5f);
            cd::attn_args b{dq.p(), dout.p(), dka, dva, kvw, pos0, false, dkbp, dvbp, kvw, n};
            b.H = H; b.Hkv = Hkv; b.hd = hd; b.scale = scale; b.a_f16 = a16; b.b_f16 = b16;
            cd::attention(b, n, nullptr);
            CHECK(rel(dout.host(), prev) < 1e-5f);
        }
    }
}

// The fused routing kernel (one launch per layer) against the CPU's moe_route on the same batch:
// decode rows, prefill rows (groups of 8 and a remainder), a preview block with a coreset, one
// whose coreset is smaller than k, one without and one with C >= X; odd expert counts; ties
// forced (equal logits within a row, whole rows equal so coreset scores tie too, rows where seven
// of every eight experts are 200 below the rest: probability exactly 0, tied). The device softmax
// agrees with math::softmax to rounding (its exp and summation order are the device's), and so do
// the weights; given the device's probabilities, the coreset, the top-k ids and the weights are
// the CPU's bit for bit. (Ids against the CPU's own probabilities could differ at a near tie of
// two probabilities within an ulp or two, so only the weights are compared there.)
CUDA_TEST_CASE("fused routing (softmax, coreset, top-k in one kernel) equals the CPU's moe_route: ties, odd expert counts, mixed batches") {
    for (std::int64_t X : {7, 37, 256, 512}) {
        for (int k : {1, 2, 3, 4, 5, 6, 7, 8, 64}) {
            if (k > X) continue;
            for (bool mixed : {true, false}) {
                CAPTURE(X); CAPTURE(k); CAPTURE(mixed);
                auto toks = [](std::int64_t n) { return std::vector<token>(std::size_t(n), 1); };
                const std::int64_t C = std::max<std::int64_t>(1, X / 4);
                batch bt;
                std::int64_t wide0 = 0, wide1 = 0, flat0 = 0, flat1 = 0;  // rows with zero probabilities, with equal logits
                if (mixed) {
                    bt.add(0, pass_kind::commit, toks(1), 10, 1);
                    bt.add(1, pass_kind::preview, toks(32), 4, 32, C);
                    bt.add(2, pass_kind::preview, toks(5), 7, 5, 0);
                    wide0 = bt.rows();
                    bt.add(3, pass_kind::commit, toks(11), 0, 1);
                    wide1 = flat0 = bt.rows();
                    bt.add(4, pass_kind::preview, toks(5), 2, 5, 2);  // coreset 2, smaller than k for k > 2
                    flat1 = bt.rows();
                    bt.add(5, pass_kind::preview, toks(3), 1, 3, X);  // C >= X: no restriction
                } else {
                    bt.add(0, pass_kind::commit, toks(11), 0, 1);
                    bt.add(1, pass_kind::commit, toks(1), 3, 1);
                    bt.add(2, pass_kind::verify, toks(3), 5, 3);
                    wide0 = 0;
                    wide1 = 6;
                    flat0 = 11;
                    flat1 = 12;
                }
                const std::int64_t n = bt.rows();
                auto logits = testutil::random_vec(std::size_t(n * X), 500 + std::uint64_t(X * 100 + k), -4.f, 4.f);
                for (std::int64_t t = 0; t < n; ++t) {
                    float* l = logits.data() + t * X;
                    if (t >= wide0 && t < wide1)
                        for (std::int64_t e = 0; e < X; ++e)
                            if (e % 8 != 0) l[e] -= 200.f;  // exp(-196) underflows to 0 on both sides
                    if (t >= flat0 && t < flat1) std::fill(l, l + X, 0.25f);
                    l[X - 1] = l[X / 2];  // a tie in every row
                    if (t == 0) std::fill(l, l + X, -1.5f);
                }
                const backend::moe_shape ms{X, k, 0, 0};
                auto cprobs = logits;
                std::vector<std::int32_t> cids(std::size_t(n * k));
                std::vector<float> cw(cids.size());
                cpud::moe_route(bt, ms, cprobs.data(), cids.data(), cw.data());

                std::vector<cd::route_group> groups;
                cd::route_groups(bt, X, groups);
                CHECK(groups.empty() == !mixed);
                dvec<float> dp(logits), dw(cw.size());
                dvec<int> did(cids.size());
                dvec<cd::route_group> dg(groups);
                cd::route(dp.p(), n, X, k, groups.empty() ? nullptr : dg.p(), std::int64_t(groups.size()), did.p(), dw.p(), nullptr);
                const auto gp = dp.host();
                const auto gi = did.host();
                const auto gw = dw.host();
                CHECK(rel(gp, cprobs) < 1e-6f);
                CHECK(rel(gw, cw) < 1e-6f);

                std::vector<std::int32_t> rids(cids.size()), cand;
                std::vector<float> rw(cw.size());
                for (const segment& sg : bt.segments()) {
                    const auto allowed = sg.kind == pass_kind::preview ? cpud::select_coreset(gp.data() + sg.row0 * X, sg.n, X, sg.coreset)
                                                                       : std::vector<std::int32_t>{};
                    for (std::int64_t t = sg.row0; t < sg.row0 + sg.n; ++t)
                        cpud::route_row(gp.data() + t * X, X, k, allowed, rids.data() + t * k, rw.data() + t * k, cand);
                }
                CHECK(std::equal(gi.begin(), gi.end(), rids.begin()));
                CHECK(std::memcmp(gw.data(), rw.data(), rw.size() * sizeof(float)) == 0);
            }
        }
    }
}

// With and without the shared expert: its gate/up/down products over every row and the input
// gate sigmoid(x·g) added after the routed experts (cpu moe_ffn's order).
CUDA_TEST_CASE("expert-grouped products (CUB sort/scan grouping) and the shared expert equal the CPU experts loop") {
    for (auto t : {dtype::f32, dtype::q8_0, dtype::q4_k, dtype::bf16}) {
        CAPTURE(dtype_name(t));
        auto s = t == dtype::q4_k ? cudatest::kquant_tiny(t) : synth::preset("tiny");
        s.type = t;
        s.n_expert = 11;
        s.n_expert_used = 3;
        auto path = testutil::synth_file("cuda_moe_" + std::string(dtype_name(t)) + ".gguf", s);
        model<variants::from_file, backend::cpu> m(load(path), {.threads = 2, .rearrange = false});  // the GPU reads the file's layout
        backend::cuda be;
        const auto& mw = m.weights().layers[1].moe;
        const dims<variants::from_file> d = m.dim();
        using moe = layers::sparse_moe<variants::from_file>;
        REQUIRE(moe::shape(d, mw).n_ff_shared > 0);  // the tiny models have a shared expert
        for (bool with_shared : {false, true}) {
            for (std::int64_t n : {1, 6, 37}) {
                CAPTURE(with_shared); CAPTURE(n);
                const std::int64_t E = d.n_embd(), X = d.n_expert();
                const int k = int(d.n_expert_used());
                auto x = testutil::random_vec(static_cast<std::size_t>(n * E), 111 + std::uint64_t(n));
                auto probs = testutil::random_vec(static_cast<std::size_t>(n * X), 112, 0.f, 1.f);
                std::vector<std::int32_t> ids(static_cast<std::size_t>(n * k));
                std::vector<float> w(ids.size());
                for (std::int64_t r = 0; r < n; ++r) cpud::route_row(probs.data() + r * X, X, k, {}, ids.data() + r * k, w.data() + r * k);
                std::vector<float> want(static_cast<std::size_t>(n * E));
                auto sh = moe::shape(d, mw);
                auto mp = moe::params(mw);
                if (!with_shared) {
                    sh.n_ff_shared = 0;
                    mp.gate_shexp = nullptr;
                }
                cpud::gemm_scratch gs;
                cpud::moe_scratch ms;
                cpud::thread_pool pool(2);
                cpud::moe_ffn(pool, gs, ms, sh, mp, x.data(), n, ids.data(), w.data(), want.data(), E, true);
                const auto& gate = be.upload(mw.gate_exps);
                const auto& up = be.upload(mw.up_exps);
                const auto& down = be.upload(mw.down_exps);
                cd::moe_shared shared;
                if (with_shared) {
                    shared.gate = &be.upload(mw.gate_shexp);
                    shared.up = &be.upload(mw.up_shexp);
                    shared.down = &be.upload(mw.down_shexp);
                    shared.input_gate = &be.upload(mw.shexp_gate);
                }
                // Uploads are ordered on the backend's stream; these kernels run on the legacy one.
                CLOVER_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
                dvec<float> dx(x), dw(w), dout(want.size());
                dvec<int> did(std::vector<int>(ids.begin(), ids.end()));
                cd::moe_scratch sc;
                cd::moe_experts(gate, &up, down, dx.p(), did.p(), dw.p(), dout.p(), n, k, sc, nullptr, &shared);
                CHECK(rel(dout.host(), want) < 1e-5f);
            }
        }
    }
}

// Host-side parts of the routing kernel (no GPU needed): the group table, and the __host__
// __device__ helpers the kernel runs (coreset ranks, the renormalisation) against the CPU twins.
TEST_CASE("routing groups: one per preview segment with a coreset, up to 8 rows otherwise, no table without a coreset") {
    auto toks = [](std::int64_t n) { return std::vector<token>(std::size_t(n), 1); };
    std::vector<cd::route_group> g;
    batch plain;
    plain.add(0, pass_kind::commit, toks(20), 0);
    plain.add(1, pass_kind::preview, toks(4), 3, 4, 0);
    plain.add(2, pass_kind::preview, toks(4), 3, 4, 64);  // C >= X: no restriction
    cd::route_groups(plain, 64, g);
    CHECK(g.empty());
    batch mixed;
    mixed.add(0, pass_kind::commit, toks(1), 9);
    mixed.add(1, pass_kind::preview, toks(32), 4, 32, 16);
    mixed.add(2, pass_kind::commit, toks(17), 0);
    mixed.add(3, pass_kind::preview, toks(3), 4, 3, 0);
    cd::route_groups(mixed, 64, g);
    const std::vector<std::array<int, 3>> want{{0, 1, 0}, {1, 32, 16}, {33, 8, 0}, {41, 8, 0}, {49, 1, 0}, {50, 3, 0}};
    REQUIRE(g.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        CAPTURE(i);
        CHECK(g[i].row0 == want[i][0]);
        CHECK(g[i].n == want[i][1]);
        CHECK(g[i].coreset == want[i][2]);
    }
}

TEST_CASE("routing kernel helpers: coreset ranks select select_coreset's experts, route_finish writes route_row's slots") {
    for (auto [n, X] : {std::pair{std::int64_t(1), 7}, {5, 37}, {32, 256}, {3, 512}}) {
        CAPTURE(n); CAPTURE(X);
        auto probs = testutil::random_vec(std::size_t(n * X), 700 + std::uint64_t(X), 0.f, 1.f);
        for (std::int64_t t = 0; t < n; ++t) {
            probs[t * X + X - 1] = probs[t * X + 1];  // scores tie: lower index first
            probs[t * X + X / 2] = probs[t * X + 1];
        }
        std::vector<double> score(std::size_t(X), 0.0);  // as the kernel: double, rows in order
        for (std::int64_t t = 0; t < n; ++t)
            for (int e = 0; e < X; ++e) score[std::size_t(e)] += probs[t * X + e];
        for (std::int64_t C : {std::int64_t(1), std::int64_t(2), std::int64_t(X / 3 + 1), std::int64_t(X - 1)}) {
            if (C >= X) continue;
            CAPTURE(C);
            const auto allowed = cpud::select_coreset(probs.data(), n, X, C);
            std::vector<std::int32_t> got;
            for (int e = 0; e < X; ++e)
                if (cd::coreset_rank(score.data(), X, e, int(C)) < C) got.push_back(e);
            CHECK(got == allowed);
            // The kernel's slots: the allowed experts in route_before order, then route_finish.
            for (int k : {1, 3, 8}) {
                CAPTURE(k);
                for (std::int64_t t = 0; t < n; ++t) {
                    const float* p = probs.data() + t * X;
                    std::vector<std::int32_t> order = allowed;
                    std::sort(order.begin(), order.end(), [&](int a, int b) { return cd::route_before(p[a], a, p[b], b); });
                    const int kk = std::min<int>(k, int(order.size()));
                    std::vector<float> top_p(static_cast<std::size_t>(kk));
                    for (int j = 0; j < kk; ++j) top_p[std::size_t(j)] = p[order[std::size_t(j)]];
                    std::vector<int> ids(static_cast<std::size_t>(k)), want_ids(ids.size());
                    std::vector<float> w(ids.size()), want_w(ids.size());
                    std::vector<std::int32_t> cand;
                    cd::route_finish(top_p.data(), order.data(), kk, k, ids.data(), w.data());
                    cpud::route_row(p, X, k, allowed, want_ids.data(), want_w.data(), cand);
                    CHECK(ids == want_ids);
                    CHECK(std::memcmp(w.data(), want_w.data(), w.size() * sizeof(float)) == 0);
                }
            }
        }
    }
}

}  // namespace cuda_test_kernels
