// backend::cuda's attention primitive against backend::cpu's over more than one split of keys,
// and the attention limits make_state checks. The primitives on mixed batches (every segment
// kind, weight type and KV page format) are the conformance table's (test_conformance.cu,
// tests/backend/conformance_table.hpp).
#include "cuda_test.hpp"
#include "pass_test_util.hpp"

#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_pass {

using namespace clover;
using namespace clover::backend;
using gpu = clover::backend::cuda;
using host = clover::backend::cpu;
using cudatest::rel;

using cudatest::f32_weight;
using cudatest::get;
using cudatest::host_tensor;
using cudatest::put;
using cudatest::toks;

CUDA_TEST_CASE("attention primitive over more than one split of keys (prefill and verify rows, 1-3 splits) equals the CPU's; shapes past the kernel's limits fail at make_state") {
    const std::int64_t H = 6, Hkv = 2, hd = 40, kvw = Hkv * hd, S = cuda_detail::sattn_split;
    attention_shape as{H, Hkv, hd, 24, 5000.f, 1e-6f, 1.f / std::sqrt(float(hd)), {4, 4, 3, 0}};
    auto qn = testutil::random_vec(std::size_t(hd), 3, 0.5f, 1.5f), kn = testutil::random_vec(std::size_t(hd), 4, 0.5f, 1.5f);
    const weight qw = f32_weight(qn), kw = f32_weight(kn);
    const attention_norms norms{&qw, &kw};
    layer_state_spec sp{layer_state_spec::kind::attention, kvw, 0, 0, 0, 0, 0};
    sp.n_head = H;
    sp.head_dim = hd;
    const std::vector<layer_state_spec> spec = {sp};
    for (bool f16 : {true, false}) {
        CAPTURE(f16);
        host cb({2});
        gpu gb;
        state_options o;
        o.kv_f16 = f16;
        o.page = 8;
        auto cs = cb.make_state(spec, o);
        auto gs = gb.make_state(spec, o);
        const seq_id sq = cs.open(3 * S);
        REQUIRE(gs.open(3 * S) == sq);
        std::uint64_t seed = 40;
        for (int pass = 0; pass < 2; ++pass) {
            batch bt;
            if (pass == 0) bt.add(sq, pass_kind::commit, toks(2 * S + 20), 0);  // rows of 1 .. 2S+20 keys
            else bt.add(sq, pass_kind::verify, toks(5), 2 * S + 20);
            const std::int64_t n = bt.rows();
            auto qg = testutil::random_vec(std::size_t(n * H * 2 * hd), ++seed), k = testutil::random_vec(std::size_t(n * kvw), ++seed),
                 v = testutil::random_vec(std::size_t(n * kvw), ++seed);
            std::vector<float> q(std::size_t(n * H * hd)), gate(q.size()), out(q.size());
            auto ccx = cb.begin_pass();
            auto hk = k;
            cb.attn_prepare(ccx, bt, cs, 0, as, norms, host_tensor(qg, n), host_tensor(hk, n), host_tensor(v, n), host_tensor(q, n),
                            host_tensor(gate, n));
            cb.attention(ccx, bt, cs, 0, as, host_tensor(q, n), host_tensor(gate, n), host_tensor(hk, n), host_tensor(v, n),
                         host_tensor(out, n));
            auto gcx = gb.begin_pass();
            gpu::tensor dqg = gcx.get(buf::qg, n, H * 2 * hd), dk = gcx.get(buf::k, n, kvw), dv = gcx.get(buf::v, n, kvw),
                         dq = gcx.get(buf::q, n, H * hd), dg = gcx.get(buf::gate, n, H * hd), dout = gcx.get(buf::attn, n, H * hd);
            put(dqg, qg), put(dk, k), put(dv, v);
            gb.attn_prepare(gcx, bt, gs, 0, as, norms, dqg, dk, dv, dq, dg);
            gb.attention(gcx, bt, gs, 0, as, dq, dg, dk, dv, dout);
            CHECK(rel(get(dout), out) < 2e-5f);
            cs.advance(bt);
            gs.advance(bt);
        }
    }
    gpu gb;
    auto bad = spec;
    bad[0].head_dim = 320;  // past 256 dims
    bad[0].kv_width = Hkv * 320;
    CHECK_THROWS_AS((void)gb.make_state(bad, {}), clover::error);
    bad = spec;
    bad[0].n_head = 7;  // 7 query heads do not group over 2 KV heads
    CHECK_THROWS_AS((void)gb.make_state(bad, {}), clover::error);
}

}  // namespace cuda_test_pass
