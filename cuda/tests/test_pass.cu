// backend::cuda's primitives against backend::cpu's, one primitive group at a time, on mixed
// batches (a prefill, a decode row, a verify segment, a preview block in one pass) over each
// backend's own state pool: embedding rows for every weight format, gated attention over F16 and
// F32 pages (what lands in the pages too), the GDN conv and mix for every segment kind plus the
// verify rollback. Odd sizes throughout.
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

CUDA_TEST_CASE("embed: token rows dequantized on the device equal quant::dequantize_row, every format") {
    gpu gb({.threads = 2});
    const std::int64_t cols = 768, rows = 37;
    std::vector<std::vector<std::byte>> files;  // alive with the backend: its weight cache is keyed by address
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_k, dtype::q5_k, dtype::q6_k}) {
        CAPTURE(dtype_name(t));
        const std::size_t rb = quant::row_bytes(t, cols);
        std::vector<std::byte>& bytes = files.emplace_back(rb * rows);
        auto f = testutil::random_vec(std::size_t(rows * cols), 11 + int(t));
        for (std::int64_t r = 0; r < rows; ++r) quant::quantize_row(t, f.data() + r * cols, bytes.data() + r * rb, cols);
        weight w;
        w.data = bytes.data();
        w.type = t;
        w.rows = rows;
        w.cols = cols;
        w.row_bytes = rb;
        w.name = "token_embd.weight";
        const std::vector<token> ids = {0, 36, 5, 5, 17, 1, 30};
        batch bt;
        bt.add(0, pass_kind::commit, ids, 0);
        auto cx = gb.begin_pass();
        gpu::tensor h = cx.get(buf::h, bt.rows(), cols);
        gb.embed(cx, bt, w, h);
        std::vector<float> want(ids.size() * std::size_t(cols));
        for (std::size_t i = 0; i < ids.size(); ++i) quant::dequantize_row(t, w.row(ids[i]), want.data() + i * cols, cols);
        // Bit for bit, except where the host compiler may contract the CPU's d·sc·q − dmin·m into
        // an fma (-ffp-contract=fast, GCC's default): Q4_K and Q5_K then differ by an ulp.
        if (t == dtype::q4_k || t == dtype::q5_k) CHECK(rel(get(h), want) < 1e-6f);
        else CHECK(get(h) == want);
    }
}

CUDA_TEST_CASE("attention primitives equal the CPU's on a mixed batch (prefill, decode, preview), GQA, F16 and F32 pages") {
    const std::int64_t H = 6, Hkv = 2, hd = 40, kvw = Hkv * hd;
    attention_shape as{H, Hkv, hd, 24, 5000.f, 1e-6f, 1.f / std::sqrt(float(hd)), {4, 4, 3, 0}};
    auto qn = testutil::random_vec(std::size_t(hd), 1, 0.5f, 1.5f), kn = testutil::random_vec(std::size_t(hd), 2, 0.5f, 1.5f);
    const weight qw = f32_weight(qn), kw = f32_weight(kn);
    const attention_norms norms{&qw, &kw};
    const std::vector<layer_state_spec> spec = {{layer_state_spec::kind::attention, kvw, 0, 0, 0, 0, 0}};
    for (bool f16 : {true, false}) {
        CAPTURE(f16);
        host cb({2});
        gpu gb({.threads = 2});
        state_options o;
        o.kv_f16 = f16;
        o.page = 4;
        auto cs = cb.make_state(spec, o);
        auto gs = gb.make_state(spec, o);
        std::vector<seq_id> seqs;
        for (int i = 0; i < 3; ++i) {
            seqs.push_back(cs.open(40));
            REQUIRE(gs.open(40) == seqs.back());
        }
        // Pass 1 fills the caches (6, 9, 5 rows); pass 2 continues: 3 rows, a decode row, a preview block.
        std::uint64_t seed = 10;
        for (int pass = 0; pass < 2; ++pass) {
            batch bt;
            if (pass == 0) {
                bt.add(seqs[0], pass_kind::commit, toks(6), 0);
                bt.add(seqs[1], pass_kind::commit, toks(9), 0);
                bt.add(seqs[2], pass_kind::commit, toks(5), 0);
            } else {
                bt.add(seqs[0], pass_kind::commit, toks(3), 6);
                bt.add(seqs[1], pass_kind::commit, toks(1), 9);
                bt.add(seqs[2], pass_kind::preview, toks(4), 5);
            }
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
            CHECK(rel(get(dq), q) < 1e-5f);
            CHECK(get(dg) == gate);
            CHECK(rel(get(dk), hk) < 1e-5f);
            gb.attention(gcx, bt, gs, 0, as, dq, dg, dk, dv, dout);
            CHECK(rel(get(dout), out) < 1e-5f);
            cb.advance(cs, bt);
            gb.advance(gs, bt);
        }
        // What reached the pages: positions [0, 9) of seq 0 and [0, 10) of seq 1; seq 2's preview
        // rows never did.
        CHECK(gs.n_past(seqs[2]) == 5);
        for (int si = 0; si < 2; ++si)
            for (std::int64_t p = 0; p < cs.n_past(seqs[si]); ++p)
                for (int which = 0; which < 2; ++which) {
                    const std::size_t eb = f16 ? 2 : 4, bytes = std::size_t(kvw) * eb;
                    std::vector<std::byte> dev_row(bytes);
                    gs.store().read(dev_row.data(), gs.kv(0, seqs[si], p, which), bytes);
                    std::vector<float> a(static_cast<std::size_t>(kvw)), b(static_cast<std::size_t>(kvw));
                    const void* host_row = cs.kv(0, seqs[si], p, which);
                    for (std::int64_t i = 0; i < kvw; ++i) {
                        a[std::size_t(i)] = f16 ? quant::f16_to_f32(reinterpret_cast<const quant::f16_bits*>(dev_row.data())[i])
                                                : reinterpret_cast<const float*>(dev_row.data())[i];
                        b[std::size_t(i)] = f16 ? quant::f16_to_f32(static_cast<const quant::f16_bits*>(host_row)[i])
                                                : static_cast<const float*>(host_row)[i];
                    }
                    CHECK(rel(a, b) < 2e-3f);
                }
    }
}

CUDA_TEST_CASE("GDN primitives equal the CPU's: commit (chunked), verify (recorded), preview in one batch; rollback replays") {
    gdn_shape g{2, 6, 16, 12, 4, 0, 1e-6f, true};
    g.channels = 2 * g.qk_heads * g.dk + g.v_heads * g.dv;
    const std::int64_t C = g.channels, K = g.conv, Hv = g.v_heads, inner = Hv * g.dv;
    auto conv = testutil::random_vec(std::size_t(C * K), 1), right = testutil::random_vec(std::size_t(C * (K - 1)), 2),
         dt = testutil::random_vec(std::size_t(Hv), 3), A = testutil::random_vec(std::size_t(Hv), 4, -1.f, -0.1f),
         lam = testutil::random_vec(std::size_t(Hv), 5, 0.5f, 2.f), hb = testutil::random_vec(std::size_t(Hv), 6),
         hc = testutil::random_vec(std::size_t(Hv), 7, 0.5f, 1.5f), nw = testutil::random_vec(std::size_t(g.dv), 8, 0.5f, 1.5f);
    const weight wconv = f32_weight(conv, C), wright = f32_weight(right, C), wdt = f32_weight(dt), wa = f32_weight(A),
                 wl = f32_weight(lam), wb = f32_weight(hb), wc = f32_weight(hc), wn = f32_weight(nw);
    const gdn_params gp{&wconv, &wright, &wdt, &wa, &wl, &wb, &wc};
    const std::vector<layer_state_spec> spec = {{layer_state_spec::kind::gdn, 0, Hv, g.dk, g.dv, K - 1, C}};
    host cb({2});
    gpu gb({.threads = 2});
    auto cs = cb.make_state(spec, {});
    auto gs = gb.make_state(spec, {});
    std::vector<seq_id> seqs;
    for (int i = 0; i < 3; ++i) {
        seqs.push_back(cs.open(64));
        REQUIRE(gs.open(64) == seqs.back());
    }
    auto compare_states = [&] {
        for (seq_id s : seqs) {
            const auto& hs = cs.gdn(0, s);
            auto& ds = gs.gdn(0, s);
            std::vector<float> S(ds.S.size()), ring(ds.ring.size());
            gs.store().read(S.data(), ds.S.data(), S.size() * 4);
            gs.store().read(ring.data(), ds.ring.data(), ring.size() * 4);
            CHECK(rel(S, std::vector<float>(hs.S.begin(), hs.S.end())) < 1e-5f);
            CHECK(rel(ring, std::vector<float>(hs.ring.begin(), hs.ring.end())) < 1e-6f);
        }
    };
    std::uint64_t seed = 20;
    for (int pass = 0; pass < 2; ++pass) {
        batch bt;
        if (pass == 0) {
            bt.add(seqs[0], pass_kind::commit, toks(37), 0);  // chunked, more than one chunk
            bt.add(seqs[1], pass_kind::commit, toks(5), 0);
            bt.add(seqs[2], pass_kind::commit, toks(1), 0);   // the recurrence
        } else {
            bt.add(seqs[0], pass_kind::commit, toks(1), 37);
            bt.add(seqs[1], pass_kind::verify, toks(6), 5);
            bt.add(seqs[2], pass_kind::preview, toks(5), 1);
        }
        const std::int64_t n = bt.rows();
        auto m = testutil::random_vec(std::size_t(n * C), ++seed), beta = testutil::random_vec(std::size_t(n * Hv), ++seed, -2.f, 2.f),
             alpha = testutil::random_vec(std::size_t(n * Hv), ++seed), z = testutil::random_vec(std::size_t(n * inner), ++seed);
        std::vector<float> y(std::size_t(n * C)), o(std::size_t(n * inner));
        auto ccx = cb.begin_pass();
        auto hb2 = beta, ha2 = alpha;
        cb.gdn_conv(ccx, bt, cs, 0, g, gp, host_tensor(m, n), host_tensor(y, n));
        cb.gdn_mix(ccx, bt, cs, 0, g, gp, host_tensor(y, n), host_tensor(hb2, n), host_tensor(ha2, n), host_tensor(o, n));
        cb.gated_norm(ccx, g, wn, host_tensor(o, n), host_tensor(z, n));
        auto gcx = gb.begin_pass();
        gpu::tensor dm = gcx.get(buf::conv_in, n, C), dy = gcx.get(buf::conv_out, n, C), db = gcx.get(buf::beta, n, Hv),
                     da = gcx.get(buf::alpha, n, Hv), dz = gcx.get(buf::z, n, inner), dout = gcx.get(buf::o, n, inner);
        put(dm, m), put(db, beta), put(da, alpha), put(dz, z);
        gb.gdn_conv(gcx, bt, gs, 0, g, gp, dm, dy);
        CHECK(rel(get(dy), y) < 1e-5f);
        gb.gdn_mix(gcx, bt, gs, 0, g, gp, dy, db, da, dout);
        gb.gated_norm(gcx, g, wn, dout, dz);
        CHECK(rel(get(dout), o) < 1e-4f);
        cb.advance(cs, bt);
        gb.advance(gs, bt);
        compare_states();
    }
    // Keep 2 of the 6 verified rows of seq 1.
    const std::int64_t layers[] = {0};
    cb.rollback(cs, seqs[1], 2, layers, g);
    gb.rollback(gs, seqs[1], 2, layers, g);
    CHECK(gs.n_past(seqs[1]) == 7);
    compare_states();
}


CUDA_TEST_CASE("MoE and LM head primitives equal the CPU's: per-block coresets (one smaller than k), shared expert, gathered logits rows") {
    const std::int64_t X = 12, k = 4, E = 64, F = 32, Fs = 64, V = 45;
    for (dtype t : {dtype::f32, dtype::q8_0}) {
        CAPTURE(dtype_name(t));
        using rw = cudatest::random_weight;
        rw router(dtype::f32, X, E, 1, "blk.0.ffn_gate_inp.weight"), gate(t, F, E, 2, "blk.0.ffn_gate_exps.weight", X),
            up(t, F, E, 3, "blk.0.ffn_up_exps.weight", X), down(t, E, F, 4, "blk.0.ffn_down_exps.weight", X),
            sg(t, Fs, E, 5, "blk.0.ffn_gate_shexp.weight"), su(t, Fs, E, 6, "blk.0.ffn_up_shexp.weight"),
            sd(t, E, Fs, 7, "blk.0.ffn_down_shexp.weight"), gin(dtype::f32, 1, E, 8, "blk.0.ffn_gate_inp_shexp.weight"),
            out(t, V, E, 9, "output.weight");
        const moe_shape ms{X, k, F, Fs};
        const moe_params mp{&gate.w, &up.w, nullptr, &down.w, &gin.w, &sg.w, &su.w, &sd.w};
        host cb({2});
        gpu gb({.threads = 2});
        batch bt;
        bt.add(0, pass_kind::commit, toks(5), 0, 2);
        bt.add(1, pass_kind::preview, toks(6), 3, 6, 3);  // coreset 3 < k: padded slots
        bt.add(2, pass_kind::preview, toks(4), 9, 0, 6);
        bt.add(3, pass_kind::commit, toks(1), 7, 1);
        const std::int64_t n = bt.rows(), nl = bt.n_logits();
        auto x = testutil::random_vec(std::size_t(n * E), 30);
        auto ccx = cb.begin_pass();
        std::vector<std::int32_t> hids(std::size_t(n * k));
        std::vector<float> hw(std::size_t(n * k)), hout(std::size_t(n * E)), hlog(std::size_t(nl * V));
        const host::route hr{hids.data(), hw.data(), n, k};
        cb.moe_route(ccx, bt, ms, router.w, host_tensor(x, n), hr);
        cb.moe_ffn(ccx, bt, ms, mp, host_tensor(x, n), hr, host_tensor(hout, n));
        cb.lm_head(ccx, bt, out.w, host_tensor(x, n), host_tensor(hlog, nl));
        auto gcx = gb.begin_pass();
        gpu::tensor dx = gcx.get(buf::u, n, E), dout = gcx.get(buf::y, n, E), dlog = gcx.get(buf::logits, nl, V);
        put(dx, x);
        const gpu::route dr = gcx.get_route(n, k);
        gb.moe_route(gcx, bt, ms, router.w, dx, dr);
        std::vector<std::int32_t> gids(hids.size());
        std::vector<float> gw(hw.size()), glog(hlog.size());
        CLOVER_CUDA_CHECK(cudaDeviceSynchronize());
        CLOVER_CUDA_CHECK(cudaMemcpy(gids.data(), dr.ids, gids.size() * 4, cudaMemcpyDeviceToHost));
        CLOVER_CUDA_CHECK(cudaMemcpy(gw.data(), dr.w, gw.size() * 4, cudaMemcpyDeviceToHost));
        CHECK(gids == hids);
        CHECK(rel(gw, hw) < 1e-6f);
        gb.moe_ffn(gcx, bt, ms, mp, dx, dr, dout);
        CHECK(rel(get(dout), hout) < (t == dtype::f32 ? 1e-5f : 2e-3f));
        gb.lm_head(gcx, bt, out.w, dx, dlog);
        gb.read_logits(gcx, dlog, glog.data());
        CHECK(rel(glog, hlog) < (t == dtype::f32 ? 1e-5f : 2e-3f));
    }
}

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
        gpu gb({.threads = 2});
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
            cb.advance(cs, bt);
            gb.advance(gs, bt);
        }
    }
    gpu gb({.threads = 2});
    auto bad = spec;
    bad[0].head_dim = 320;  // past 256 dims
    bad[0].kv_width = Hkv * 320;
    CHECK_THROWS_AS((void)gb.make_state(bad, {}), clover::error);
    bad = spec;
    bad[0].n_head = 7;  // 7 query heads do not group over 2 KV heads
    CHECK_THROWS_AS((void)gb.make_state(bad, {}), clover::error);
}

}  // namespace cuda_test_pass
