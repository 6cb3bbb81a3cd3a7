// Defects a code read of the CUDA backend found (issue 37, item 6), each with the case that
// showed it: non-finite router logits (ids out of range, an out-of-bounds count), a kernel's
// shared-memory cap lowered under another model's launch, dynamic shared memory past 48 KB never
// raised or checked, attention over zero keys, a discarded capture's verify records, and blocks
// retired by a pass that moves between threads. Shapes are small enough for the emulated device's
// fibers: one head, a few rows; the shared-memory cases get past 48 KB through a wide head.
#include "cuda_test.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include <clover/clover.hpp>
#include <clover/backend/cpu/gdn_kernels.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_defects {

using namespace clover;
namespace cd = clover::backend::cuda_detail;
namespace cpud = clover::backend::cpu_detail;
using cudatest::dvec;
using cudatest::rel;

namespace {

// Errors the emulated device reported (and that the test expects none of); none on a GPU.
std::vector<std::string> emu_errors() {
#if defined(CLOVER_CUDA_EMU)
    return clover_emu::take_errors();
#else
    return {};
#endif
}

// Conv-output rows [n, C] of one QK head and Hv V heads: q and k L2-normalised (as l2norm_qk
// leaves them), v uniform.
std::vector<float> gdn_rows(std::int64_t n, std::int64_t dk, std::int64_t Hv, std::int64_t dv, std::uint64_t seed) {
    const std::int64_t C = 2 * dk + Hv * dv;
    auto y = testutil::random_vec(std::size_t(n * C), seed);
    for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t part = 0; part < 2; ++part) {
            float* x = y.data() + t * C + part * dk;
            double ss = 0;
            for (std::int64_t i = 0; i < dk; ++i) ss += double(x[i]) * x[i];
            for (std::int64_t i = 0; i < dk; ++i) x[i] = float(x[i] / std::sqrt(ss));
        }
    return y;
}

}  // namespace

// (a) A router row with NaN or infinite logits (an overflow upstream) gave NaN probabilities; the
// kernel's top-k then took no candidate and wrote the ids from uninitialised shared slots, which
// the expert grouping used as atomicAdd offsets. The rule, the same on the CPU (moe_route): a
// non-finite logit counts as -inf; a row with no finite logit is uniform, so its top k are the
// lowest allowed ids. Rows alone and in a preview block with a coreset.
CUDA_TEST_CASE("defects: non-finite router logits give in-range ids, the CPU's rule (NaN, +-inf rows, coreset)") {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (std::int64_t X : {37, 300}) {
        CAPTURE(X);
        const int k = 4;
        batch bt;
        bt.add(0, pass_kind::commit, std::vector<token>(7, 1), 0, 1);
        bt.add(1, pass_kind::preview, std::vector<token>(4, 1), 3, 4, 5);  // coreset 5
        const std::int64_t n = bt.rows();
        auto logits = testutil::random_vec(std::size_t(n * X), 900 + std::uint64_t(X), -4.f, 4.f);
        auto row = [&](std::int64_t t) { return logits.data() + t * X; };
        std::fill(row(1), row(1) + X, nan);                                    // no finite logit
        for (std::int64_t e = 0; e < X; e += 3) row(2)[e] = nan;               // some NaN
        row(3)[5] = inf;                                                       // one +inf
        std::fill(row(4), row(4) + X, -inf);                                   // all -inf
        for (std::int64_t e = 0; e < X; ++e) row(5)[e] = e % 3 == 0 ? nan : e % 3 == 1 ? inf : -inf;
        std::fill(row(7), row(7) + X, nan);                                    // in the coreset block
        for (std::int64_t e = 1; e < X; e += 2) row(8)[e] = nan;
        const backend::moe_shape ms{X, k, 0, 0};
        auto cprobs = logits;
        std::vector<std::int32_t> cids(std::size_t(n * k));
        std::vector<float> cw(cids.size());
        cpud::moe_route(bt, ms, cprobs.data(), cids.data(), cw.data());

        std::vector<cd::route_group> groups;
        cd::route_groups(bt, X, groups);
        dvec<float> dp(logits), dw(cw.size());
        dvec<int> did(cids.size());
        dvec<cd::route_group> dg(groups);
        cd::route(dp.p(), n, X, k, dg.p(), std::int64_t(groups.size()), did.p(), dw.p(), nullptr);
        const auto gp = dp.host();
        const auto gi = did.host();
        const auto gw = dw.host();
        for (std::size_t i = 0; i < gi.size(); ++i) {
            CAPTURE(i);
            REQUIRE(gi[i] >= 0);
            REQUIRE(gi[i] < X);
            REQUIRE(std::isfinite(gw[i]));
            REQUIRE(std::isfinite(cw[i]));
        }
        CHECK(rel(gp, cprobs) < 1e-6f);
        CHECK(rel(gw, cw) < 1e-6f);
        // No finite logit: uniform probabilities, the lowest ids (of the coreset in the block).
        for (std::int64_t t : {1, 4, 5}) {
            CAPTURE(t);
            for (int j = 0; j < k; ++j) {
                CHECK(gi[std::size_t(t * k + j)] == j);
                CHECK(cids[std::size_t(t * k + j)] == j);
                CHECK(gw[std::size_t(t * k + j)] == 0.25f);
            }
            CHECK(gp[std::size_t(t * X)] == cprobs[std::size_t(t * X)]);
            CHECK(gp[std::size_t(t * X)] == float(1.0 / double(X)));
        }
        // Non-finite logits get probability 0 and are never chosen beside finite ones.
        for (std::int64_t t : {2, 3, 8})
            for (int j = 0; j < k; ++j) {
                const std::int64_t e = gi[std::size_t(t * k + j)];
                CHECK(std::isfinite(logits[std::size_t(t * X + e)]));
                CHECK(cids[std::size_t(t * k + j)] == e);
            }
        for (std::int64_t e = 0; e < X; e += 3) CHECK(gp[std::size_t(2 * X + e)] == 0.f);
        CHECK(gp[std::size_t(3 * X + 5)] == 0.f);
        // The coreset block's ids are the coreset's, the same on both.
        const auto allowed = cpud::select_coreset(gp.data() + 7 * X, 4, X, 5);
        for (std::int64_t t = 7; t < 11; ++t)
            for (int j = 0; j < k; ++j) {
                const std::int32_t e = gi[std::size_t(t * k + j)];
                CHECK(std::find(allowed.begin(), allowed.end(), e) != allowed.end());
                CHECK(cids[std::size_t(t * k + j)] == e);
            }
        for (int j = 0; j < k; ++j) CHECK(gi[std::size_t(7 * k + j)] == allowed[std::size_t(j)]);  // uniform row: lowest allowed
    }
    CHECK(emu_errors().empty());
}

// (b) gdn_chunked set its kernel's dynamic shared-memory cap to its own launch's size. The cap
// belongs to the kernel, for every thread: a model with a small head calling it between another
// model's cudaFuncSetAttribute and launch made that launch fail. The interleaving, in order: the
// wide model's call raises the cap; the small model's call; the wide model's launch. (Threads
// calling it in turns do not hit the window on the emulated device.) The launches below name
// the kernel gdn_chunked raised only in the translation unit whose inline gdn_chunked the linker
// keeps: this file is in unity_a.cu, the first unit linked; the first launch checks that.
CUDA_TEST_CASE("defects: gdn_chunked raises its kernel's shared-memory cap to the device's, never lowers it") {
    struct head {
        std::int64_t dk, dv, C;
        cd::gdn_layout L;
        std::vector<float> y, beta, g, S;
        dvec<float> dy, db, dg;
        head(std::int64_t k, std::int64_t v, std::int64_t n, std::uint64_t seed)
            : dk(k), dv(v), C(2 * k + v), L{2 * k + v, 1, 1, k, v, false}, y(gdn_rows(n, k, 1, v, seed)),
              beta(testutil::random_vec(std::size_t(n), seed + 1, 0.f, 1.f)), g(testutil::random_vec(std::size_t(n), seed + 2, -2.f, 0.f)),
              S(testutil::random_vec(std::size_t(k * v), seed + 3, -0.3f, 0.3f)), dy(y), db(beta), dg(g) {}
        // The model's call: gdn_chunked (its attribute call, then its launch).
        std::vector<float> call(std::int64_t n) {
            dvec<float> dS(S), dout(std::size_t(n * dv));
            cd::gdn_chunked(dS.p(), dy.p(), db.p(), dg.p(), dout.p(), L, n, nullptr, 32);
            return dout.host();
        }
        // The launch alone, as gdn_chunked makes it after its attribute call.
        std::vector<float> launch(std::int64_t n) {
            dvec<float> dS(S), dout(std::size_t(n * dv));
            cd::launch(cd::gdn_chunked_kernel<256>, "gdn_chunked_kernel<256>", 1u, 256u, cd::gdn_chunked_smem(L, 32), nullptr, dS.p(), dy.p(),
                       db.p(), dg.p(), dout.p(), L, n, 32);
            cd::check_launch("gdn_chunked");
            return dout.host();
        }
    };
    const std::int64_t n = 32;
    head wide(96, 96, n, 1), small(16, 16, n, 11);
    REQUIRE(cd::gdn_chunked_smem(wide.L, 32) > 48 * 1024);
    REQUIRE(cd::gdn_chunked_smem(small.L, 32) < cd::gdn_chunked_smem(wide.L, 32));
    const auto want = wide.call(n);  // raises the cap
    REQUIRE_NOTHROW(wide.launch(n));  // the kernel gdn_chunked raised (see above)
    (void)small.call(n);             // another model's call in between
    std::vector<float> got;
    CHECK_NOTHROW(got = wide.launch(n));
    CHECK(emu_errors().empty());
    CHECK(got == want);
    // And the wide head's call computes the CPU's chunked form.
    std::vector<float> o(std::size_t(n * wide.dv));
    auto Sc = wide.S;
    cpud::gdn_chunk_scratch sc;
    const cpud::gdn_head_io io{wide.y.data(),    wide.y.data() + wide.dk, wide.y.data() + 2 * wide.dk, wide.g.data(), wide.beta.data(),
                               o.data(),         wide.C,                  wide.C,                      wide.C,        1,
                               wide.dv};
    cpud::gdn_chunked(Sc.data(), io, n, wide.dk, wide.dv, sc, 32);
    CHECK(rel(want, o) < 1e-5f);
}

// (c) block_softmax ([dk + B + 1] floats) and gdn_scan ([2·dk] floats) launched any size of
// dynamic shared memory without raising the 48 KB default cap: a preview of ~12K rows failed at
// launch with only the driver's message. Now past 48 KB the cap is raised to the device's opt-in
// limit, and past that the call refuses with one error naming the kernel and the limit. A wide
// head gets past 48 KB here with a few rows (fibers could not afford 12K rows).
CUDA_TEST_CASE("defects: block_softmax and gdn_scan past 48 KB of shared memory run; past the device's limit, one clear error") {
    {
        const std::int64_t B = 2, dk = 12300, dv = 3, C = 2 * dk + dv;  // (dk + B + 1) · 4 = 49,212 bytes
        const cd::gdn_layout L{C, 1, 1, dk, dv, false};
        const auto y = gdn_rows(B, dk, 1, dv, 11);
        const auto S = testutil::random_vec(std::size_t(dk * dv), 12);
        const std::vector<float> lam{4.f}, hb{0.3f}, hc{0.7f};
        std::vector<float> o(std::size_t(B * dv)), logit, r;
        const cpud::gdn_head_io io{y.data(), y.data() + dk, y.data() + 2 * dk, nullptr, nullptr, o.data(), C, C, C, 0, dv};
        cpud::block_softmax_mix(S.data(), io, B, dk, dv, lam[0], hb[0], hc[0], logit, r);
        dvec<float> dS(S), dy(y), dout(o.size()), dl(lam), dhb(hb), dhc(hc);
        CHECK_NOTHROW(cd::block_softmax(dS.p(), dy.p(), dout.p(), L, B, dl.p(), dhb.p(), dhc.p(), nullptr));
        CHECK(rel(dout.host(), o) < 1e-4f);
        const cd::gdn_layout huge{2 * 60000 + dv, 1, 1, 60000, dv, false};
        CHECK_THROWS_WITH_AS(cd::block_softmax(dS.p(), dy.p(), dout.p(), huge, B, dl.p(), dhb.p(), dhc.p(), nullptr),
                             doctest::Contains("block_softmax_kernel needs 240012 bytes of dynamic shared memory"), error);
    }
    {
        const std::int64_t n = 2, dk = 6200, dv = 3, C = 2 * dk + dv;  // 2 · dk · 4 = 49,600 bytes
        const cd::gdn_layout L{C, 1, 1, dk, dv, false};
        const auto y = gdn_rows(n, dk, 1, dv, 21);
        const auto beta = testutil::random_vec(std::size_t(n), 22, 0.f, 1.f), g = testutil::random_vec(std::size_t(n), 23, -1.f, 0.f);
        const auto S = testutil::random_vec(std::size_t(dk * dv), 24, -0.3f, 0.3f);
        std::vector<float> o(std::size_t(n * dv)), tmp;
        auto Sc = S;
        const cpud::gdn_head_io io{y.data(), y.data() + dk, y.data() + 2 * dk, g.data(), beta.data(), o.data(), C, C, C, 1, dv};
        cpud::gdn_recurrent(Sc.data(), io, n, dk, dv, tmp);
        dvec<float> dS(S), dy(y), db(beta), dg(g), dout(o.size());
        cd::gdn_scan_args a{dS.p(), dy.p(), db.p(), dg.p(), nullptr, nullptr, dout.p(), nullptr, nullptr, 1e-6f, n};
        CHECK_NOTHROW(cd::gdn_scan(a, L, nullptr));
        CHECK(rel(dout.host(), o) < 1e-4f);
        CHECK(rel(dS.host(), Sc) < 1e-4f);
        const cd::gdn_layout huge{2 * 30000 + dv, 1, 1, 30000, dv, false};
        CHECK_THROWS_WITH_AS(cd::gdn_scan(a, huge, nullptr), doctest::Contains("gdn_scan_kernel needs 240000 bytes of dynamic shared memory"),
                             error);
    }
    CHECK(emu_errors().empty());
}

// (d) attention_kernel over a row with no keys divided 0 by 0 (NaN rows). Defined as zeros, the
// empty sum of values. (The CPU's attend_group is not defined there: its softmax reads the first
// score. No pass asks for it: every row attends itself or its block.) A causal block whose first
// row has no cache keys (its second row, one key, against the CPU), and a preview row over an
// empty cache and an empty block.
CUDA_TEST_CASE("defects: attention over zero keys gives zeros") {
    const std::int64_t H = 2, Hkv = 1, hd = 8, kvw = Hkv * hd;
    const float scale = 1.f / std::sqrt(float(hd));
    const auto q = testutil::random_vec(std::size_t(2 * H * hd), 31), kc = testutil::random_vec(std::size_t(2 * kvw), 32),
               vc = testutil::random_vec(std::size_t(2 * kvw), 33);
    std::vector<float> cpu(q.size(), 0.f), p;
    const std::vector<cpud::kv_run> one_key{{kc.data(), vc.data(), kvw, 1, false}};
    for (std::int64_t th = H; th < 2 * H; ++th) cpud::attend_group(q.data() + th * hd, 1, one_key, hd, scale, cpu.data() + th * hd, p);
    dvec<float> dq(q), dkc(kc), dvc(vc), dout(std::vector<float>(q.size(), 7.f));
    cd::attn_args a{dq.p(), dout.p(), dkc.p(), dvc.p(), kvw, 0, true};
    a.H = H; a.Hkv = Hkv; a.hd = hd; a.scale = scale;
    cd::attention(a, 2, nullptr);
    const auto out = dout.host();
    for (std::int64_t i = 0; i < H * hd; ++i) CHECK(out[std::size_t(i)] == 0.f);
    CHECK(rel(out, cpu) < 1e-6f);  // row 1 as the CPU's
    dvec<float> dout2(std::vector<float>(std::size_t(H * hd), 7.f));
    cd::attn_args b{dq.p(), dout2.p(), dkc.p(), dvc.p(), kvw, 0, false, dkc.p(), dvc.p(), kvw, 0};
    b.H = H; b.Hkv = Hkv; b.hd = hd; b.scale = scale;
    cd::attention(b, 1, nullptr);
    for (float v : dout2.host()) CHECK(v == 0.f);
    CHECK(emu_errors().empty());
}

namespace {

// A backend driven primitive by primitive (cuda/tests/host's `mini`): an embedding, a GDN conv
// of one layer, a read-back of no rows. Graphs on: a shape's second pass is captured.
struct driver {
    static constexpr std::int64_t E = 16, dk = 4, dv = 4, K = 4, C = 2 * dk + dv;
    backend::cuda be;
    std::vector<float> table = testutil::random_vec(std::size_t(64 * E), 41), conv = testutil::random_vec(std::size_t(C * K), 42);
    weight emb, wc;
    backend::gdn_shape g{1, 1, dk, dv, K, C, 1e-6f, false};
    std::vector<backend::layer_state_spec> spec{{backend::layer_state_spec::kind::gdn, 0, 1, dk, dv, K - 1, C}};
    driver() {
        emb.data = reinterpret_cast<const std::byte*>(table.data());
        emb.type = dtype::f32;
        emb.rows = 64;
        emb.cols = E;
        emb.row_bytes = E * 4;
        emb.name = "token_embd.weight";
        wc.data = reinterpret_cast<const std::byte*>(conv.data());
        wc.type = dtype::f32;
        wc.rows = C;
        wc.cols = K;
        wc.row_bytes = K * 4;
        wc.name = "blk.0.ssm_conv1d.weight";
    }
    static batch rows(seq_id seq, pass_kind kind, std::int64_t pos0, std::int64_t n) {
        batch bt;
        bt.add(seq, kind, std::vector<token>(std::size_t(n), 3), pos0);
        return bt;
    }
    // A verify segment through gdn_conv; throw_mid: an exception leaves the pass after it.
    void verify(backend::cuda::state& st, const batch& bt, bool throw_mid = false) {
        const std::int64_t n = bt.rows();
        auto cx = be.begin_pass();
        be.embed(cx, bt, emb, cx.get(backend::buf::h, n, E));
        auto m = cx.get(backend::buf::conv_in, n, C), y = cx.get(backend::buf::conv_out, n, C);
        CLOVER_CUDA_CHECK(cudaMemsetAsync(m.data, 0, std::size_t(n * C) * 4, be.stream()));
        const backend::gdn_params w{&wc, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
        be.gdn_conv(cx, bt, st, 0, g, w, m, y);
        if (throw_mid) throw std::runtime_error("an error in the middle of the pass");
        be.read_logits(cx, cx.get(backend::buf::logits, 0, E), nullptr);
    }
};

}  // namespace

// (e) A verify pass records, per GDN layer, the copies a rollback replays (S0, ring0, the rows)
// and their count rec.n. Captured, the copies run only when the graph is launched; a capture
// discarded by an exception ran none of them, yet rec.n said the pass's rows were recorded, over
// arrays the discarded pass had reallocated: a rollback of the sequence's earlier verify then
// replayed garbage. A discarded capture now invalidates the records it wrote (rec.n = 0): the
// rollback refuses with a clear error.
CUDA_TEST_CASE("defects: a discarded capture leaves no verify record claiming copies that never ran") {
    driver d;
    auto st = d.be.make_state(d.spec, {});
    const seq_id a = st.open(64), b = st.open(64);
    d.verify(st, driver::rows(a, pass_kind::verify, 0, 5));  // eager: the 5-row verify shape is seen, captured next time
    const batch b3 = driver::rows(b, pass_kind::verify, 0, 3);
    d.verify(st, b3);
    st.advance(b3);
    CHECK(st.gdn(0, b).rec.n == 3);
    CHECK_THROWS_WITH(d.verify(st, driver::rows(b, pass_kind::verify, 3, 5), true), "an error in the middle of the pass");
    REQUIRE(st.gdn(0, b).rec.n == 0);  // (before: 5, over arrays the pass reallocated and never wrote)
    const auto replay = [&](auto& slot, std::int64_t keep) { d.be.replay_gdn(slot, keep, d.g); };
    CHECK_THROWS_WITH_AS(st.rollback(b, 2, replay), doctest::Contains("cannot keep 2 of 0 verified rows"), error);
    st.rollback(b, 0, replay);
    // The next pass of the shape runs eagerly and records again; the one after is captured.
    for (int i = 0; i < 2; ++i) {
        const batch b5 = driver::rows(b, pass_kind::verify, 0, 5);
        d.verify(st, b5);
        st.advance(b5);
        CHECK(st.gdn(0, b).rec.n == 5);
        st.rollback(b, 0, replay);
    }
    CHECK(emu_errors().empty());
}

// (f) Blocks a buffer gives up while a capture is open wait until the graph has run (nodes name
// them; a free inside a capture breaks it). Where they wait was a thread_local pointer set by the
// capturing thread: a pass captured on one thread and continued, launched or released on another
// freed its grown scratch at once (inside the capture) and left the first thread's pointer to a
// list that later frees of that thread fed. Retirement is process-wide now. The pass here begins
// (and its capture opens) on one thread, a scratch buffer grows and the pass ends on a second;
// meanwhile a third frees an unrelated buffer.
CUDA_TEST_CASE("defects: a pass captured on one thread and finished on another retires its blocks") {
    driver d;
    auto pass = [&](std::optional<backend::cuda::context>& cx, int part, std::int64_t grow) {
        const batch bt = driver::rows(0, pass_kind::commit, 0, 7);
        if (part & 1) {
            cx.emplace(d.be.begin_pass());
            (void)cx->get(backend::buf::y, 1, driver::E);
            d.be.embed(*cx, bt, d.emb, cx->get(backend::buf::h, 7, driver::E));
        }
        if (part & 2) {
            if (grow) (void)cx->get(backend::buf::y, grow, driver::E);
            d.be.read_logits(*cx, cx->get(backend::buf::logits, 0, driver::E), nullptr);
            cx.reset();
        }
    };
    std::optional<backend::cuda::context> cx;
    pass(cx, 3, 0);  // eager: the shape is seen
    pass(cx, 3, 0);  // captured, on this thread
    std::string failure;
    auto on_thread = [&](auto fn) {
        std::thread([&] {
            try {
                fn();
            } catch (const std::exception& e) {
                failure += e.what();
            }
        }).join();
    };
    on_thread([&] { pass(cx, 1, 0); });     // captured from here on
    on_thread([&] { cd::device_buffer unrelated(4096); });
    on_thread([&] { pass(cx, 2, 5000); });  // grows its scratch, launches the graph, ends
    CHECK(failure == "");
    CHECK(!cx);
    CHECK(emu_errors().empty());
    // The stream and the shape are usable: the next pass is captured and launched again.
    pass(cx, 3, 0);
    CHECK(emu_errors().empty());
}

}  // namespace cuda_test_defects
