// The split-K paged attention of pass.cuh (kernel 1 per (row, KV head, split of S keys), kernel 2
// merging the splits) against backend::cpu's attention, through the backends' attn_prepare and
// attention primitives over their own state pools: key counts around the split size S, GQA groups
// 1, 2 and 8, head dims 64, 128, 256 and 97 (odd: the odd key stride and the lane guards), F16
// and F32 pages spread over several pages in scattered order; a mixed batch; and row-exactness
// (a verify row bit for bit the same inside a 9-row batch as alone). GPU tests (CUDA_TEST_CASE);
// the plain TEST_CASEs check the launch plan and the split/merge algebra on the host.
#include "cuda_test.hpp"
#include "pass_test_util.hpp"

#include <algorithm>
#include <cmath>

#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_split_attention {

using namespace clover;
using namespace clover::backend;
using gpu = clover::backend::cuda;
using host = clover::backend::cpu;
using cudatest::rel;
namespace cd = clover::backend::cuda_detail;

namespace {

constexpr std::int64_t S = cd::sattn_split;

using cudatest::f32_weight;
using cudatest::get;
using cudatest::host_tensor;
using cudatest::put;
using cudatest::toks;

// One attention layer's shapes and norm weights, and the pools' spec and options.
struct layer {
    std::int64_t H, Hkv, hd;
    attention_shape as;
    std::vector<float> qn, kn;
    weight qw, kw;
    std::vector<layer_state_spec> spec;
    state_options o;
    layer(std::int64_t group, std::int64_t head_dim, bool f16)
        : H(2 * group), Hkv(2), hd(head_dim),
          as{H, Hkv, hd, 24, 5000.f, 1e-6f, 1.f / std::sqrt(float(hd)), {4, 4, 3, 0}},
          qn(testutil::random_vec(std::size_t(hd), 1, 0.5f, 1.5f)), kn(testutil::random_vec(std::size_t(hd), 2, 0.5f, 1.5f)),
          qw(f32_weight(qn)), kw(f32_weight(kn)) {
        layer_state_spec s;
        s.k = layer_state_spec::kind::attention;
        s.kv_width = Hkv * hd;
        s.n_head = H;  // so that make_state checks the kernel's limits
        s.head_dim = hd;
        spec = {s};
        o.kv_f16 = f16;
        o.page = 16;  // several pages per sequence, and sequences across 16-page chunks
    }
    attention_norms norms() const { return {&qw, &kw}; }
};

// A pass's inputs: qg [n, H·2·hd], k and v [n, Hkv·hd].
struct inputs {
    std::vector<float> qg, k, v;
    inputs(const layer& L, std::int64_t n, std::uint64_t seed)
        : qg(testutil::random_vec(std::size_t(n * L.H * 2 * L.hd), seed)),
          k(testutil::random_vec(std::size_t(n * L.Hkv * L.hd), seed + 1)),
          v(testutil::random_vec(std::size_t(n * L.Hkv * L.hd), seed + 2)) {}
    // Rows [r0, r0 + n) only.
    inputs(const inputs& o, const layer& L, std::int64_t r0, std::int64_t n) {
        const std::int64_t qw = L.H * 2 * L.hd, kw = L.Hkv * L.hd;
        qg.assign(o.qg.begin() + r0 * qw, o.qg.begin() + (r0 + n) * qw);
        k.assign(o.k.begin() + r0 * kw, o.k.begin() + (r0 + n) * kw);
        v.assign(o.v.begin() + r0 * kw, o.v.begin() + (r0 + n) * kw);
    }
};

// attn_prepare + attention of bt on the device; the output [n, H·hd] (and q after its norm and
// rope, when asked). The pool advances past the batch's commit/verify rows.
std::vector<float> gpu_pass(gpu& gb, gpu::state& gs, const batch& bt, const layer& L, const inputs& in,
                            std::vector<float>* q_out = nullptr) {
    const std::int64_t n = bt.rows(), kvw = L.Hkv * L.hd;
    auto cx = gb.begin_pass();
    gpu::tensor dqg = cx.get(buf::qg, n, L.H * 2 * L.hd), dk = cx.get(buf::k, n, kvw), dv = cx.get(buf::v, n, kvw),
                dq = cx.get(buf::q, n, L.H * L.hd), dg = cx.get(buf::gate, n, L.H * L.hd), dout = cx.get(buf::attn, n, L.H * L.hd);
    put(dqg, in.qg), put(dk, in.k), put(dv, in.v);
    gb.attn_prepare(cx, bt, gs, 0, L.as, L.norms(), dqg, dk, dv, dq, dg);
    gb.attention(cx, bt, gs, 0, L.as, dq, dg, dk, dv, dout);
    auto out = get(dout);
    if (q_out) *q_out = get(dq);
    gs.advance(bt);
    return out;
}
std::vector<float> cpu_pass(host& cb, host::state& cs, const batch& bt, const layer& L, const inputs& in) {
    const std::int64_t n = bt.rows();
    std::vector<float> qg = in.qg, k = in.k, v = in.v, q(std::size_t(n * L.H * L.hd)), gate(q.size()), out(q.size());
    auto cx = cb.begin_pass();
    cb.attn_prepare(cx, bt, cs, 0, L.as, L.norms(), host_tensor(qg, n), host_tensor(k, n), host_tensor(v, n), host_tensor(q, n),
                    host_tensor(gate, n));
    cb.attention(cx, bt, cs, 0, L.as, host_tensor(q, n), host_tensor(gate, n), host_tensor(k, n), host_tensor(v, n),
                 host_tensor(out, n));
    cs.advance(bt);
    return out;
}

// Scrambles the pool's free pages: three sequences of 5 pages each opened, then closed out of
// order, so the next sequences get pages 14..10, 4..0, 9..5 (then fresh ones, from 15 on).
template <class Pool>
void scatter_pages(Pool& p, std::int64_t page) {
    const seq_id a = p.open(5 * page), b = p.open(5 * page), c = p.open(5 * page);
    p.close(b);
    p.close(a);
    p.close(c);
}

// The two backends and their pools, opened and advanced together.
struct twin {
    const layer& L;
    host cb{host::options{2}};
    gpu gb{gpu::options{}};
    host::state cs;
    gpu::state gs;
    std::uint64_t seed = 100;
    explicit twin(const layer& l) : L(l), cs(cb.make_state(l.spec, l.o)), gs(gb.make_state(l.spec, l.o)) {
        scatter_pages(cs, L.o.page);
        scatter_pages(gs, L.o.page);
    }
    seq_id open(std::int64_t cap) {
        const seq_id s = cs.open(cap);
        REQUIRE(gs.open(cap) == s);
        return s;
    }
    // Runs bt on both; the relative difference of the outputs.
    float pass(const batch& bt) {
        const inputs in(L, bt.rows(), seed += 10);
        const auto want = cpu_pass(cb, cs, bt, L, in);
        const auto got = gpu_pass(gb, gs, bt, L, in);
        return rel(got, want);
    }
};

constexpr float tol = 2e-5f;

}  // namespace

TEST_CASE("split attention: the launch plan (splits, rows per launch, scratch) and the limits") {
    const std::int64_t H = 16, Hkv = 2, hd = 256;
    auto p = cd::plan_split_attention(1, 1, H, Hkv, hd);
    CHECK(p.splits == 1);
    CHECK(p.rows_per_launch == 1);
    CHECK(p.scratch_floats == 0);  // one split: kernel 1 writes the output, no partials
    CHECK(cd::plan_split_attention(300, S, H, Hkv, hd).splits == 1);
    CHECK(cd::plan_split_attention(300, S, H, Hkv, hd).rows_per_launch == 300);
    p = cd::plan_split_attention(1, S + 1, H, Hkv, hd);
    CHECK(p.splits == 2);
    CHECK(p.scratch_floats == std::size_t(H * 2 * (hd + 2)));
    p = cd::plan_split_attention(1, 3 * S + 7, H, Hkv, hd);
    CHECK(p.splits == 4);
    // A prefill chunk over a long cache: launches of fewer rows keep the partials bounded.
    p = cd::plan_split_attention(512, 32768, H, Hkv, hd);
    CHECK(p.splits == 128);
    CHECK(p.rows_per_launch == std::int64_t(cd::sattn_scratch_floats) / (H * 128 * (hd + 2)));
    CHECK(p.rows_per_launch >= 1);
    CHECK(p.scratch_floats <= cd::sattn_scratch_floats);
    // One row whose partials alone pass the budget still runs (one row per launch).
    p = cd::plan_split_attention(4, std::int64_t(1) << 22, 64, 8, 256);
    CHECK(p.rows_per_launch == 1);
    CHECK(p.scratch_floats == std::size_t(64 * p.splits * 258));
    // Shared memory: queries and accumulators [G, hd], m and l, a tile of keys (odd stride) and values.
    CHECK(cd::split_attention_smem(8, 256) == std::size_t(2 * 8 * 256 + 16 + 32 * (257 + 256)) * 4);
    CHECK(cd::split_attention_smem(1, 97) == std::size_t(2 * 97 + 2 + 32 * (97 + 97)) * 4);
    const int h200 = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin of an H100/H200
    CHECK(cd::split_attention_fits(16, 2, 256, h200));  // Clover-35B-A3B
    CHECK(cd::split_attention_fits(6, 2, 40, 49152));
    CHECK_FALSE(cd::split_attention_fits(16, 2, 257, h200));
    CHECK_FALSE(cd::split_attention_fits(16, 3, 128, h200));
    CHECK_FALSE(cd::split_attention_fits(16, 0, 128, h200));
    CHECK_FALSE(cd::split_attention_fits(2, 4, 128, h200));
    CHECK_FALSE(cd::split_attention_fits(128, 1, 256, h200));  // 128 query heads' state does not fit
}

// The kernels' algebra on the host, in their order: tiles of 32 keys within splits of S, each
// tile's max, the running (m, l, acc) rescaled by exp(m_old - m_new), then the splits merged in
// order — against the plain softmax. Not the kernel code, but the arithmetic it must implement.
TEST_CASE("split attention: online softmax over tiles and splits, merged in split order, equals the plain softmax") {
    const std::int64_t hd = 5;
    for (std::int64_t n : {std::int64_t(1), S - 1, S, S + 1, 3 * S + 7}) {
        CAPTURE(n);
        const auto s = testutil::random_vec(std::size_t(n), 7, -8.f, 8.f), v = testutil::random_vec(std::size_t(n * hd), 8);
        // Plain.
        float mx = -INFINITY;
        for (float x : s) mx = std::max(mx, x);
        double den = 0;
        std::vector<double> want(std::size_t(hd), 0.0);
        for (std::int64_t j = 0; j < n; ++j) {
            const double e = std::exp(double(s[std::size_t(j)] - mx));
            den += e;
            for (std::int64_t i = 0; i < hd; ++i) want[std::size_t(i)] += e * v[std::size_t(j * hd + i)];
        }
        // Split, as the kernels do.
        const std::int64_t ns = (n + S - 1) / S;
        const auto nz = static_cast<std::size_t>(ns);
        std::vector<float> m(nz), l(nz), acc(nz * std::size_t(hd));
        for (std::int64_t z = 0; z < ns; ++z) {
            float mz = -INFINITY, lz = 0.f, *az = acc.data() + z * hd;
            for (std::int64_t i = 0; i < hd; ++i) az[i] = 0.f;
            for (std::int64_t b0 = z * S; b0 < std::min((z + 1) * S, n); b0 += cd::sattn_tile) {
                const std::int64_t b1 = std::min({b0 + cd::sattn_tile, (z + 1) * S, n});
                float tmax = -INFINITY;
                for (std::int64_t j = b0; j < b1; ++j) tmax = std::max(tmax, s[std::size_t(j)]);
                const float mn = std::max(mz, tmax), corr = std::exp(mz - mn);
                float psum = 0.f;
                for (std::int64_t i = 0; i < hd; ++i) az[i] *= corr;
                for (std::int64_t j = b0; j < b1; ++j) {
                    const float p = std::exp(s[std::size_t(j)] - mn);
                    psum += p;
                    for (std::int64_t i = 0; i < hd; ++i) az[i] += p * v[std::size_t(j * hd + i)];
                }
                lz = lz * corr + psum;
                mz = mn;
            }
            m[std::size_t(z)] = mz;
            l[std::size_t(z)] = lz;
        }
        float M = -INFINITY, L = 0.f;
        for (std::int64_t z = 0; z < ns; ++z) M = std::max(M, m[std::size_t(z)]);
        for (std::int64_t z = 0; z < ns; ++z) L += l[std::size_t(z)] * std::exp(m[std::size_t(z)] - M);
        for (std::int64_t i = 0; i < hd; ++i) {
            float o = 0.f;
            for (std::int64_t z = 0; z < ns; ++z) o += acc[std::size_t(z * hd + i)] * std::exp(m[std::size_t(z)] - M);
            CHECK(std::abs(o / L - float(want[std::size_t(i)] / den)) < 1e-5f);
        }
    }
}

CUDA_TEST_CASE("split attention equals the CPU's: key counts 1, S-1, S, S+1, 3S+7; groups 1, 2, 8; head dims 64, 128, 256, 97; F16 and F32 pages") {
    for (std::int64_t group : {1, 2, 8})
        for (std::int64_t hd : {64, 128, 256, 97})
            for (bool f16 : {true, false}) {
                CAPTURE(group);
                CAPTURE(hd);
                CAPTURE(f16);
                const layer L(group, hd, f16);
                twin tw(L);
                const seq_id a = tw.open(3 * S + 7), b = tw.open(40);
                batch bt;
                bt.add(a, pass_kind::commit, toks(S - 2), 0);  // rows with 1 .. S-2 keys
                bt.add(b, pass_kind::commit, toks(1), 0);      // a row with one key
                CHECK(tw.pass(bt) < tol);
                for (std::int64_t pos : {S - 2, S - 1, S}) {  // decode rows with S-1, S, S+1 keys
                    CAPTURE(pos);
                    bt.clear();
                    bt.add(a, pass_kind::commit, toks(1), pos);
                    CHECK(tw.pass(bt) < tol);
                }
                bt.clear();
                bt.add(a, pass_kind::commit, toks(2 * S + 5), S + 1);  // prefill over the cache: S+2 .. 3S+6 keys
                CHECK(tw.pass(bt) < tol);
                bt.clear();
                bt.add(a, pass_kind::commit, toks(1), 3 * S + 6);  // 3S+7 keys: 4 splits, the last of 7
                bt.add(b, pass_kind::preview, toks(5), 1);         // 1 cached key and the block's 5
                CHECK(tw.pass(bt) < tol);
            }
}

CUDA_TEST_CASE("split attention equals the CPU's on a mixed batch: decode rows of two sequences, a preview block, prefill rows") {
    for (bool f16 : {true, false}) {
        CAPTURE(f16);
        const layer L(8, 128, f16);
        twin tw(L);
        const seq_id a = tw.open(4 * S), b = tw.open(2 * S), c = tw.open(2 * S), d = tw.open(2 * S);
        batch bt;
        bt.add(a, pass_kind::commit, toks(3 * S + 6), 0);
        bt.add(b, pass_kind::commit, toks(S), 0);
        bt.add(c, pass_kind::commit, toks(S + 3), 0);
        CHECK(tw.pass(bt) < tol);
        bt.clear();
        bt.add(a, pass_kind::commit, toks(1), 3 * S + 6);   // 3S+7 keys
        bt.add(b, pass_kind::commit, toks(1), S);           // S+1 keys
        bt.add(c, pass_kind::preview, toks(7), S + 3);      // S+3 cached keys and 7 fresh: S+10
        bt.add(d, pass_kind::commit, toks(S + 41), 0);      // prefill rows across the first split boundary
        CHECK(tw.pass(bt) < tol);
        bt.clear();
        bt.add(c, pass_kind::verify, toks(4), S + 3);       // verify rows after the preview
        bt.add(a, pass_kind::commit, toks(1), 3 * S + 7);
        CHECK(tw.pass(bt) < tol);
    }
}

CUDA_TEST_CASE("split attention is row-exact: a row inside a 9-row batch equals the row alone, bit for bit") {
    for (bool f16 : {true, false}) {
        CAPTURE(f16);
        const layer L(8, 256, f16);
        gpu gb;
        gpu::state g1 = gb.make_state(L.spec, L.o), g2 = gb.make_state(L.spec, L.o);
        seq_id a = -1, b = -1, c = -1;
        for (gpu::state* gs : {&g1, &g2}) {
            scatter_pages(*gs, L.o.page);
            a = gs->open(4 * S);
            b = gs->open(2 * S);
            c = gs->open(64);
        }
        // The same caches in both pools.
        batch fill;
        fill.add(a, pass_kind::commit, toks(3 * S + 2), 0);
        fill.add(b, pass_kind::commit, toks(S), 0);
        fill.add(c, pass_kind::commit, toks(10), 0);
        const inputs fin(L, fill.rows(), 500);
        (void)gpu_pass(gb, g1, fill, L, fin);
        (void)gpu_pass(gb, g2, fill, L, fin);
        // 9 rows: 5 verify rows of a (3S+3 .. 3S+7 keys, 4 splits), a decode row of b (S+1
        // keys, 2 splits), a preview block of 3 rows of c (13 keys, 1 split).
        batch nine;
        nine.add(a, pass_kind::verify, toks(5), 3 * S + 2);
        nine.add(b, pass_kind::commit, toks(1), S);
        nine.add(c, pass_kind::preview, toks(3), 10);
        REQUIRE(nine.rows() == 9);
        const inputs in9(L, 9, 600);
        std::vector<float> q9;
        const auto out9 = gpu_pass(gb, g1, nine, L, in9, &q9);
        const std::int64_t w = L.H * L.hd;
        auto row = [&](const std::vector<float>& x, std::int64_t r) {
            return std::vector<float>(x.begin() + r * w, x.begin() + (r + 1) * w);
        };
        // a's first 4 verify rows into g2's cache, then its last row alone.
        batch four;
        four.add(a, pass_kind::commit, toks(4), 3 * S + 2);
        (void)gpu_pass(gb, g2, four, L, inputs(in9, L, 0, 4));
        batch alone;
        alone.add(a, pass_kind::commit, toks(1), 3 * S + 6);
        std::vector<float> q1;
        auto out1 = gpu_pass(gb, g2, alone, L, inputs(in9, L, 4, 1), &q1);
        CHECK(q1 == row(q9, 4));  // the same query (else the difference is not the attention's)
        CHECK(out1 == row(out9, 4));
        // b's decode row alone.
        alone.clear();
        alone.add(b, pass_kind::commit, toks(1), S);
        out1 = gpu_pass(gb, g2, alone, L, inputs(in9, L, 5, 1), &q1);
        CHECK(q1 == row(q9, 5));
        CHECK(out1 == row(out9, 5));
        // c's preview block alone: its rows depend on the block, not on the rest of the batch.
        alone.clear();
        alone.add(c, pass_kind::preview, toks(3), 10);
        const auto out3 = gpu_pass(gb, g2, alone, L, inputs(in9, L, 6, 3));
        CHECK(out3 == std::vector<float>(out9.begin() + 6 * w, out9.end()));
    }
}

}  // namespace cuda_test_split_attention
