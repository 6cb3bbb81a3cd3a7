// The performance restructurings against their plain versions: multi-product calls with row
// gathers, the fused MoE block against experts() + shared_expert(), the F16 KV cache against
// the F32 one, whole models in the K-quants against the independent reference, and the
// vector helpers against plain loops.
#include <doctest/doctest.h>

#include <cstring>

#include <clover/backend/cpu/vec_ops.hpp>
#include <clover/clover.hpp>

#include "../common/test_util.hpp"
#include "../reference/reference_model.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;

std::vector<token> ids_of(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> ids;
    for (std::int64_t i = 0; i < n; ++i) ids.push_back(token(r.next() % std::uint64_t(vocab)));
    return ids;
}

// Every matrix width a multiple of 256 (so K-quants apply everywhere), 8 layers.
synth::spec k256_spec(dtype t, bool q4_k_m) {
    synth::spec s;
    s.preset = "k256";
    s.n_vocab = 600; s.n_embd = 256; s.n_layer = 8; s.interval = 4;
    s.n_head = 2; s.n_head_kv = 1; s.head_dim = 128; s.n_rot = 32; s.sections = {6, 5, 5, 0};
    s.rope_theta = 1000.f;
    s.ssm_conv = 4; s.ssm_d_state = 32; s.ssm_n_group = 4; s.ssm_dt_rank = 8; s.ssm_d_inner = 256;
    s.n_expert = 8; s.n_expert_used = 2; s.n_ff_exp = 256; s.n_ff_shexp = 256;
    s.type = t;
    s.q4_k_m = q4_k_m;
    s.seed = 9;
    return s;
}

}  // namespace

TEST_CASE("matmul_many: per-job inputs, row gathers and widths equal separate matmuls (bitwise)") {
    backend::cpu be({2});
    backend::cpu::exact_rows_scope exact(be);  // F32: matmul would otherwise take Eigen's GEMM
    rng r(3);
    for (dtype t : {dtype::q8_0, dtype::q4_k, dtype::q6_k, dtype::bf16, dtype::f32}) {
        CAPTURE(dtype_name(t));
        const std::int64_t K1 = 512, K2 = 256;
        auto make = [&](std::int64_t rows, std::int64_t cols, std::vector<std::byte>& buf) {
            auto f = testutil::random_vec(std::size_t(rows * cols), r.next());
            const std::size_t rb = quant::row_bytes(t, cols);
            buf.resize(rb * std::size_t(rows));
            for (std::int64_t i = 0; i < rows; ++i) quant::quantize_row(t, f.data() + i * cols, buf.data() + i * rb, cols);
            weight w;
            w.data = buf.data(); w.type = t; w.cols = cols; w.rows = rows; w.row_bytes = rb; w.name = "m";
            return w;
        };
        std::vector<std::byte> b1, b2, b3;
        const weight w1 = make(37, K1, b1), w2 = make(64, K1, b2), w3 = make(21, K2, b3);
        const auto x = testutil::random_vec(std::size_t(40 * K1), 5);
        const auto x3 = testutil::random_vec(std::size_t(9 * K2), 6);
        const std::int32_t rows[5] = {39, 0, 7, 7, 21};
        std::vector<float> y1(40 * 37), y2(5 * 64), y3(9 * 21);
        const backend::matmul_job jobs[3] = {{&w1, y1.data()}, {&w2, y2.data(), x.data(), 5, rows}, {&w3, y3.data(), x3.data(), 9}};
        be.matmul_many(jobs, x.data(), 40);
        std::vector<float> e1(y1.size()), e3(y3.size()), one(64), gathered(std::size_t(5 * K1));
        be.matmul(w1, x.data(), e1.data(), 40);
        be.matmul(w3, x3.data(), e3.data(), 9);
        CHECK(std::memcmp(y1.data(), e1.data(), y1.size() * 4) == 0);
        CHECK(std::memcmp(y3.data(), e3.data(), y3.size() * 4) == 0);
        for (int i = 0; i < 5; ++i) {
            be.matmul(w2, x.data() + rows[i] * K1, one.data(), 1);
            CHECK(std::memcmp(one.data(), y2.data() + i * 64, 64 * 4) == 0);
        }
    }
}

TEST_CASE("MoE primitive over many rows equals its one-row twin bit for bit (1 and many rows, odd shapes)") {
    for (auto spec : {testutil::odd_spec(), k256_spec(dtype::q4_k, true)}) {
        CAPTURE(spec.preset);
        const std::string path = testutil::synth_file("fused_moe_" + spec.preset + ".gguf", spec);
        rt_model m(load(path), {2});
        const auto d = m.dim();
        const auto& w = m.weights().layers[1].moe;
        using moe = layers::sparse_moe<variants::from_file>;
        const auto sh = moe::shape(d, w);
        const std::int64_t E = d.n_embd(), k = d.n_expert_used(), F = d.n_ff_exp(), Fs = sh.n_ff_shared;
        auto& be = m.backend();
        for (std::int64_t n : {1, 3, 37}) {
            CAPTURE(n);
            const auto x = testutil::random_vec(std::size_t(n * E), std::uint64_t(n) + 1);
            std::vector<float> probs(std::size_t(n * d.n_expert()));
            be.matmul(w.router, x.data(), probs.data(), n);
            std::vector<std::int32_t> ids(std::size_t(n * k));
            std::vector<float> wts(std::size_t(n * k));
            for (std::int64_t t = 0; t < n; ++t) {
                math::softmax(probs.data() + t * d.n_expert(), d.n_expert());
                backend::cpu_detail::route_row(probs.data() + t * d.n_expert(), d.n_expert(), k, {}, ids.data() + t * k, wts.data() + t * k);
            }
            std::vector<float> fused(std::size_t(n * E)), plain(std::size_t(n * E), 0.f);
            backend::cpu_detail::gemm_scratch gs;
            backend::cpu_detail::moe_scratch ms;
            backend::cpu_detail::thread_pool pool(2);
            backend::cpu_detail::moe_ffn(pool, gs, ms, sh, moe::params(w), x.data(), n, ids.data(), wts.data(), fused.data(), E, true);
            // The twin: one row at a time, experts in ascending id, then the shared expert.
            backend::cpu::exact_rows_scope exact(be);
            auto swiglu = [&](const weight& g, const weight& u, const weight& dn, const float* xr, std::int64_t ff, float* yr) {
                std::vector<float> a(static_cast<std::size_t>(ff)), b(static_cast<std::size_t>(ff));
                be.matmul(g, xr, a.data(), 1);
                be.matmul(u, xr, b.data(), 1);
                for (std::int64_t i = 0; i < ff; ++i) a[std::size_t(i)] = math::silu(a[std::size_t(i)]) * b[std::size_t(i)];
                be.matmul(dn, a.data(), yr, 1);
            };
            std::vector<float> yr(static_cast<std::size_t>(E));
            for (std::int64_t t = 0; t < n; ++t) {
                const float* xr = x.data() + t * E;
                float* o = plain.data() + t * E;
                std::vector<std::int64_t> order(static_cast<std::size_t>(k));
                for (std::int64_t j = 0; j < k; ++j) order[std::size_t(j)] = j;
                std::sort(order.begin(), order.end(), [&](auto a, auto b) { return ids[std::size_t(t * k + a)] < ids[std::size_t(t * k + b)]; });
                for (std::int64_t j : order) {
                    const std::int32_t e = ids[std::size_t(t * k + j)];
                    weight g, u;
                    if (w.gate_up_exps) {
                        g = w.gate_up_exps.expert(e).row_slice(0, F);
                        u = w.gate_up_exps.expert(e).row_slice(F, F);
                    } else {
                        g = w.gate_exps.expert(e);
                        u = w.up_exps.expert(e);
                    }
                    swiglu(g, u, w.down_exps.expert(e), xr, F, yr.data());
                    for (std::int64_t i = 0; i < E; ++i) o[i] += wts[std::size_t(t * k + j)] * yr[std::size_t(i)];
                }
                if (Fs) {
                    swiglu(w.gate_shexp, w.up_shexp, w.down_shexp, xr, Fs, yr.data());
                    float dot = 0.f;
                    for (std::int64_t i = 0; i < E; ++i) dot += xr[i] * w.shexp_gate.f32()[i];
                    const float sg = math::sigmoid(dot);
                    for (std::int64_t i = 0; i < E; ++i) o[i] += sg * yr[std::size_t(i)];
                }
            }
            CHECK(std::memcmp(fused.data(), plain.data(), fused.size() * 4) == 0);
        }
    }
}

TEST_CASE("F16 KV cache: logits within F16 rounding of the F32 cache; prefill+decode equals one prefill") {
    const std::string path = testutil::synth_file("fused_kv.gguf", testutil::odd_spec());
    rt_model m(load(path), {2});
    const auto ids = ids_of(50, 300, 4);
    std::vector<float> a, b, c;
    auto s32 = m.new_session({.ctx = 64, .kv_f16 = false});
    auto s16 = m.new_session({.ctx = 64, .kv_f16 = true});
    m.commit(s32, ids, logits_rows::all, a);
    m.commit(s16, ids, logits_rows::all, b);
    REQUIRE(a.size() == b.size());
    const float rel = testutil::max_abs_diff(a.data(), b.data(), a.size()) / testutil::max_abs(a);
    MESSAGE("F16 vs F32 KV cache: max |logit diff| / max |logit| = " << rel);
    CHECK(rel < 5e-3f);
    CHECK(rel > 0.f);  // the cache really is rounded
    // the same prompt as 30 + 20 one-row passes, against the single prefill (F16 cache both)
    auto s2 = m.new_session({.ctx = 64, .kv_f16 = true});
    m.commit(s2, std::span<const token>(ids.data(), 30), logits_rows::none, c);
    std::vector<float> last;
    for (int i = 30; i < 50; ++i) m.commit(s2, std::span<const token>(&ids[i], 1), logits_rows::last, last);
    const std::int64_t V = m.n_vocab();
    CHECK(testutil::max_abs_diff(last.data(), b.data() + 49 * V, std::size_t(V)) < 1e-4f * testutil::max_abs(a));
}

TEST_CASE("whole model in Q4_K, Q5_K, Q6_K and the Q4_K_M mix equals the independent reference") {
    for (auto [t, mix] : {std::pair{dtype::q4_k, false}, {dtype::q5_k, false}, {dtype::q6_k, false}, {dtype::q4_k, true}}) {
        const auto spec = k256_spec(t, mix);
        const std::string name = std::string("fused_ref_") + (mix ? "q4_k_m" : std::string(dtype_name(t))) + ".gguf";
        CAPTURE(name);
        const std::string path = testutil::synth_file(name, spec);
        rt_model m(load(path), {2});
        auto s = m.new_session({.ctx = 32, .kv_f16 = false});  // the reference keeps K/V in full precision
        const auto ids = ids_of(12, spec.n_vocab - 7, 7);
        std::vector<float> ours;
        m.commit(s, ids, logits_rows::all, ours);
        ref::model r(path);
        std::vector<float> theirs;
        for (token id : ids) {
            auto row = r.step(id);
            theirs.insert(theirs.end(), row.begin(), row.end());
        }
        REQUIRE(ours.size() == theirs.size());
        // both round activations to Q8_K blocks; a rounding-boundary flip explains the tolerance
        const float rel = testutil::max_abs_diff(ours.data(), theirs.data(), ours.size()) / testutil::max_abs(theirs);
        MESSAGE(name << ": " << rel);
        CHECK(rel < 0.1f);
        // one-token prompts (one pass through every layer, a flip is rare): most agree to rounding
        int tight = 0;
        for (int k = 0; k < 6; ++k) {
            const token id = token((k * 97 + 5) % (spec.n_vocab - 7));
            auto s1 = m.new_session({.ctx = 4, .kv_f16 = false});
            std::vector<float> a;
            m.commit(s1, std::span<const token>(&id, 1), logits_rows::all, a);
            ref::model r1(path);
            const auto b = r1.step(id);
            tight += testutil::max_abs_diff(a.data(), b.data(), a.size()) < 1e-4f * testutil::max_abs(b);
        }
        MESSAGE(name << ": " << tight << " of 6 one-token prompts agree to 1e-4");
        CHECK(tight >= 4);
    }
}

TEST_CASE("vec_ops: dot, axpy, acc_rows, acc_rows2, scale_add equal plain loops (odd sizes, every lane tail)") {
    namespace cd = backend::cpu_detail;
    for (std::int64_t n : {1, 5, 16, 17, 63, 64, 65, 128, 129, 257}) {
        CAPTURE(n);
        const auto a = testutil::random_vec(std::size_t(n), 1), b = testutil::random_vec(std::size_t(n), 2);
        double ref = 0;
        for (std::int64_t i = 0; i < n; ++i) ref += double(a[i]) * double(b[i]);
        CHECK(cd::dot_f32(a.data(), b.data(), n) == doctest::Approx(ref).epsilon(1e-5));
        std::vector<quant::f16_bits> bh(static_cast<std::size_t>(n));
        double refh = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            bh[i] = quant::f32_to_f16(b[i]);
            refh += double(a[i]) * double(quant::f16_to_f32(bh[i]));
        }
        CHECK(cd::dot_f32_f16(a.data(), bh.data(), n) == doctest::Approx(refh).epsilon(1e-5));
        std::vector<float> y = b, yh = b;
        cd::axpy(0.37f, a.data(), y.data(), n);
        cd::axpy_f16(0.37f, bh.data(), yh.data(), n);
        for (std::int64_t i = 0; i < n; ++i) {
            CHECK(y[i] == doctest::Approx(b[i] + 0.37f * a[i]).epsilon(1e-6));
            CHECK(yh[i] == doctest::Approx(b[i] + 0.37f * quant::f16_to_f32(bh[i])).epsilon(1e-6));
        }
        // acc_rows: y = beta·y + Σ_r alpha·coef[r]·X[r]
        const std::int64_t m = 7, ld = n + 3;
        const auto X = testutil::random_vec(std::size_t(m * ld), 3), coef = testutil::random_vec(std::size_t(m), 4);
        std::vector<float> acc = a;
        cd::acc_rows(acc.data(), 0.5f, -2.f, coef.data(), X.data(), m, ld, n);
        for (std::int64_t i = 0; i < n; ++i) {
            double e = 0.5 * a[i];
            for (std::int64_t r = 0; r < m; ++r) e += -2.0 * coef[r] * X[r * ld + i];
            CHECK(acc[i] == doctest::Approx(e).epsilon(1e-5).scale(1.0));
        }
        // acc_rows2: two coefficient vectors, one pass; scale_add: y = a·y + b·x
        std::vector<float> y1 = a, y2 = b;
        const auto coef2 = testutil::random_vec(std::size_t(m), 5);
        cd::acc_rows2(y1.data(), y2.data(), coef.data(), coef2.data(), X.data(), m, ld, n);
        std::vector<float> sa = a;
        cd::scale_add(sa.data(), 0.75f, -1.5f, b.data(), n);
        for (std::int64_t i = 0; i < n; ++i) {
            double e1 = a[i], e2 = b[i];
            for (std::int64_t r = 0; r < m; ++r) {
                e1 += double(coef[r]) * X[r * ld + i];
                e2 += double(coef2[r]) * X[r * ld + i];
            }
            CHECK(y1[i] == doctest::Approx(e1).epsilon(1e-5).scale(1.0));
            CHECK(y2[i] == doctest::Approx(e2).epsilon(1e-5).scale(1.0));
            CHECK(sa[i] == doctest::Approx(0.75 * a[i] - 1.5 * b[i]).epsilon(1e-6).scale(1.0));
        }
    }
}

TEST_CASE("attention softmax: the vector form equals the plain definition bit for bit; exp within an ulp; close to math::softmax") {
    namespace cd = backend::cpu_detail;
    double worst_exp = 0;
    for (int k = 0; k <= 100000; ++k) {
        const float x = -87.f * float(k) / 100000.f;
        const double e = std::exp(double(x));
        worst_exp = std::max(worst_exp, std::fabs(double(cd::softmax_detail::exp_one(x)) - e) / e);
    }
    MESSAGE("exp: max relative error " << worst_exp);
    CHECK(worst_exp < 1.2e-7);  // about one ulp
    CHECK(cd::softmax_detail::exp_one(0.f) == 1.f);
    CHECK(cd::softmax_detail::exp_one(-1e30f) < 1.3e-38f);
    std::uint64_t seed = 500;
    for (std::int64_t n : {1, 2, 7, 15, 16, 17, 31, 32, 33, 100, 517, 3001}) {
        for (float spread : {0.01f, 3.f, 60.f}) {
            CAPTURE(n);
            CAPTURE(spread);
            const auto a = testutil::random_vec(std::size_t(n), seed++, -spread, spread);
            auto plain = a, rows = a, ref = a;
            cd::softmax_plain(plain.data(), n);
            cd::softmax_rows(rows.data(), n);
            CHECK(std::memcmp(plain.data(), rows.data(), std::size_t(n) * 4) == 0);
            math::softmax(ref.data(), n);
            double worst = 0, sum = 0;
            for (std::int64_t i = 0; i < n; ++i) {
                sum += plain[i];
                if (ref[i] > 1e-30f) worst = std::max(worst, std::fabs(double(plain[i]) - ref[i]) / ref[i]);
            }
            CHECK(worst < 1e-6);
            CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
        }
    }
}

TEST_CASE("attend_group and attend_rows equal the plain twin bit for bit (GQA groups, F16/F32 runs, odd key counts, every head size, serial scores)") {
    namespace cd = backend::cpu_detail;
    // P::transpose: r[d] lane t = r[t] lane d (the key blocks of the fast form).
    {
        using P = cd::native;
        std::vector<float> raw = testutil::random_vec(std::size_t(P::lanes * P::lanes), 9);
        typename P::f32v v[P::lanes];
        for (int k = 0; k < P::lanes; ++k) v[k] = P::load(raw.data() + k * P::lanes);
        P::transpose(v);
        std::vector<float> got(raw.size());
        for (int k = 0; k < P::lanes; ++k) P::store(got.data() + k * P::lanes, v[k]);
        for (int d = 0; d < P::lanes; ++d)
            for (int t = 0; t < P::lanes; ++t) CHECK(got[std::size_t(d * P::lanes + t)] == raw[std::size_t(t * P::lanes + d)]);
    }
    // dot_serial is one FMA chain in order (what makes a score independent of the vector layout).
    {
        const float q[3] = {1e8f, 1.f, -1e8f}, k[3] = {1.f, 1.f, 1.f};
        CHECK(cd::dot_serial(q, k, 3) == std::fma(-1e8f, 1.f, std::fma(1.f, 1.f, 1e8f)));
    }
    for (std::int64_t hd : {16, 48, 64, 72, 128, 256}) {
        for (std::int64_t G : {1, 2, 3, 5, 8, 11}) {
            for (int layout = 0; layout < 3; ++layout) {
                CAPTURE(hd);
                CAPTURE(G);
                CAPTURE(layout);
                // Runs as the cache makes them: pages of 32 keys (F16 or F32), a strided row layout
                // (several KV heads side by side), then for layout 2 a preview block of fresh F32 rows.
                const std::int64_t stride = hd * 3, lens[] = {32, 32, 17, 1, 32, 9};
                std::vector<std::vector<quant::f16_bits>> kh, vh;
                std::vector<std::vector<float>> kf, vf;
                std::vector<cd::kv_run> runs;
                std::uint64_t seed = 100 + std::uint64_t(hd * 31 + G * 7 + layout);
                for (std::int64_t len : lens) {
                    const bool f16 = layout != 1;
                    const auto k = testutil::random_vec(std::size_t(len * stride), seed++), v = testutil::random_vec(std::size_t(len * stride), seed++);
                    if (f16) {
                        kh.emplace_back(k.size());
                        vh.emplace_back(v.size());
                        for (std::size_t i = 0; i < k.size(); ++i) {
                            kh.back()[i] = quant::f32_to_f16(k[i] * 3.f);
                            vh.back()[i] = quant::f32_to_f16(v[i]);
                        }
                        runs.push_back({kh.back().data() + hd, vh.back().data() + hd, stride, len, true});
                    } else {
                        kf.push_back(k);
                        vf.push_back(v);
                        runs.push_back({kf.back().data() + hd, vf.back().data() + hd, stride, len, false});
                    }
                }
                if (layout == 2) {
                    kf.push_back(testutil::random_vec(std::size_t(13 * stride), seed++));
                    vf.push_back(testutil::random_vec(std::size_t(13 * stride), seed++));
                    runs.push_back({kf.back().data(), vf.back().data(), stride, 13, false});
                }
                // (the inner vectors move when the outer ones grow; their buffers, which the runs point into, stay)
                const auto q = testutil::random_vec(std::size_t(G * hd), seed++);
                std::vector<float> fast(std::size_t(G * hd)), plain(std::size_t(G * hd)), p1, p2;
                cd::attend_group(q.data(), G, runs, hd, 0.125f, fast.data(), p1);
                cd::attend_group_ref(q.data(), G, runs, hd, 0.125f, plain.data(), p2);
                CHECK(std::memcmp(fast.data(), plain.data(), fast.size() * 4) == 0);
                // Keys split differently into runs: the same bits again (rows never depend on blocks).
                std::vector<cd::kv_run> split;
                for (const cd::kv_run& r : runs) {
                    const std::size_t eb = r.f16 ? 2 : 4;
                    const std::int64_t a = r.n / 3;
                    if (a == 0) {
                        split.push_back(r);
                        continue;
                    }
                    split.push_back({r.k, r.v, r.stride, a, r.f16});
                    split.push_back({static_cast<const std::byte*>(r.k) + std::size_t(a * r.stride) * eb,
                                     static_cast<const std::byte*>(r.v) + std::size_t(a * r.stride) * eb, r.stride, r.n - a, r.f16});
                }
                std::vector<float> again(fast.size());
                cd::attend_group(q.data(), G, split, hd, 0.125f, again.data(), p1);
                CHECK(std::memcmp(again.data(), plain.data(), fast.size() * 4) == 0);

                // attend_rows: R rows over the same runs, each its own number of keys (a causal
                // block, then arbitrary counts, from 1 key to all); every row the same bits as the
                // twin over its own first keys.
                std::int64_t n = 0;
                for (const cd::kv_run& r : runs) n += r.n;
                for (const std::vector<std::int64_t>& nk : {std::vector<std::int64_t>{n - 3, n - 2, n - 1, n},
                                                            std::vector<std::int64_t>{1, 17, n, 33, n - 1},
                                                            std::vector<std::int64_t>{n}, std::vector<std::int64_t>{32, 31}}) {
                    const int R = int(nk.size());
                    CAPTURE(R);
                    const auto qr = testutil::random_vec(std::size_t(R * G * hd), seed++);
                    std::vector<float> outs(qr.size());
                    std::vector<const float*> qp;
                    std::vector<float*> op;
                    for (int i = 0; i < R; ++i) {
                        qp.push_back(qr.data() + i * G * hd);
                        op.push_back(outs.data() + i * G * hd);
                    }
                    std::vector<cd::kv_run> cut, mine;
                    cd::attend_rows(qp.data(), nk.data(), R, G, runs, hd, 0.125f, op.data(), p1, cut);
                    for (int i = 0; i < R; ++i) {
                        CAPTURE(i);
                        cd::first_keys(runs, nk[std::size_t(i)], mine);
                        std::vector<float> want(std::size_t(G * hd));
                        cd::attend_group_ref(qp[std::size_t(i)], G, mine, hd, 0.125f, want.data(), p2);
                        CHECK(std::memcmp(op[std::size_t(i)], want.data(), want.size() * 4) == 0);
                    }
                }
            }
        }
    }
}
