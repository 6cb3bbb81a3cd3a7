// Whole-model logits, backend::cuda vs backend::cpu: the same model type, session API and
// decoders. Tiny and odd synthetic models in several weight formats, decode after prefill,
// preview and verify passes of clover_moe (verify rows bit-identical to single-row steps on
// CUDA too), --n-cpu-moe, and a synthesized full-width model with few layers.
#include "cuda_test.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>

#include <clover/backend/offload.hpp>
#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_model {

using namespace clover;
using cudatest::rel;

namespace {

using cpu_model = model<variants::from_file, backend::cpu>;
using cuda_model = model<variants::from_file, backend::cuda>;
using offload_model = model<variants::from_file, backend::offload<backend::cuda, backend::cpu>>;

std::vector<token> ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(token(r.next() % std::uint64_t(vocab)));
    return v;
}

template <class M>
std::vector<float> commit_all(M& m, const std::vector<token>& prompt, std::int64_t ctx = 256, bool kv_f16 = true) {
    auto s = m.new_session({.ctx = ctx, .kv_f16 = kv_f16});
    std::vector<float> out;
    m.commit(s, prompt, logits_rows::all, out);
    return out;
}

}  // namespace

CUDA_TEST_CASE("commit logits: CUDA equals CPU on the tiny and odd models (F32, F16, BF16, Q8_0)") {
    for (auto [t, tol] : {std::pair{dtype::f32, 1e-5f}, {dtype::f16, 2e-3f}, {dtype::bf16, 2e-3f}, {dtype::q8_0, 2e-3f}}) {
        CAPTURE(dtype_name(t));
        auto s = synth::preset("tiny");
        s.type = t;
        auto path = testutil::synth_file("cu_tiny_" + std::string(dtype_name(t)) + ".gguf", s);
        cpu_model c(load(path), {2});
        cuda_model g(load(path));
        auto p = ids(45, c.n_vocab(), 1);
        // Quantized activations: a value on the other side of a rounding boundary (after the
        // float sums differ in order) moves one code; that, not a bug, sets the tolerance.
        CHECK(rel(commit_all(g, p), commit_all(c, p)) < tol);
    }
    auto odd = testutil::synth_file("cu_odd.gguf", testutil::odd_spec());
    cpu_model c(load(odd), {2});
    cuda_model g(load(odd));
    auto p = ids(67, c.n_vocab(), 2);
    // F32 KV: the odd model has two attention layers, where an F16 cache turns the backends'
    // ulp-level differences in K and V (each primitive agrees to <= 4e-7 relative on the same
    // inputs) into whole F16 steps (2^-11 relative) now and then: 6.8e-5 here with F16 KV, 3.2e-6
    // with F32 (tests/model/test_model.cpp compares the CPU with its reference the same way).
    // The tiny models above keep the F16 cache (one attention layer, the last).
    CHECK(rel(commit_all(g, p, 256, false), commit_all(c, p, 256, false)) < 1e-5f);
}

CUDA_TEST_CASE("K-quant model (Q4_K, Q6_K matrices): CUDA equals CPU") {
    for (auto t : {dtype::q4_k, dtype::q6_k}) {
        CAPTURE(dtype_name(t));
        auto s = cudatest::kquant_tiny(t);
        auto path = testutil::synth_file("cu_tiny_" + std::string(dtype_name(t)) + ".gguf", s);
        cpu_model c(load(path), {2});
        cuda_model g(load(path));
        auto p = ids(21, c.n_vocab(), 3);
        // Both backends quantize a K-quant product's activations to Q8_K identically (given the
        // same floats, every primitive agrees to <= 3e-7 relative), but a Q8_K code is 1/127 of
        // its block's largest value (~0.06 here) and the floats differ by ~1e-6 after a few sums
        // in another order: a value that close to a rounding boundary moves one code about once
        // per 10^4-10^5 values, i.e. in some of this model's products (Q4_K: at blk.1.ssm_out,
        // 3e-3 on its outputs). Every later quantization then sees differences far above an
        // ulp, and the logits differ by O(one code) ~ 1e-2 (Q4_K 1.2e-2, Q6_K 3.4e-5: no code
        // moved). A wrong kernel or a misread block is off by O(1).
        CHECK(rel(commit_all(g, p), commit_all(c, p)) < 3e-2f);
    }
}

CUDA_TEST_CASE("decode after prefill on CUDA equals one long CUDA prefill") {
    auto path = testutil::synth_file("cu_odd.gguf", testutil::odd_spec());
    cuda_model g(load(path));
    auto p = ids(40, g.n_vocab(), 4);
    auto all = commit_all(g, p, 64);
    session s = g.new_session({.ctx = 64});
    std::vector<float> part;
    g.commit(s, std::span<const token>(p.data(), 17), logits_rows::all, part);
    float err = testutil::max_abs_diff(part.data(), all.data(), part.size());
    for (std::size_t i = 17; i < p.size(); ++i) {
        std::vector<float> one;
        g.commit(s, std::span<const token>(p.data() + i, 1), logits_rows::last, one);
        err = std::max(err, testutil::max_abs_diff(one.data(), all.data() + i * static_cast<std::size_t>(g.n_vocab()), one.size()));
    }
    CHECK(err < 1e-4f * (1 + testutil::max_abs(all)));
}

CUDA_TEST_CASE("clover_moe on CUDA: preview equals CPU; verify rows equal single-row steps bit for bit") {
    auto s = testutil::odd_spec();
    s.arch = "clover_moe";
    auto path = testutil::synth_file("cu_clover_odd.gguf", s);
    cpu_model c(load(path), {2});
    cuda_model g(load(path));
    auto prefix = ids(11, 290, 5), block = ids(8, 290, 6);
    for (std::int64_t coreset : {std::int64_t(-1), std::int64_t(0), std::int64_t(2)}) {
        CAPTURE(coreset);
        auto sc = c.new_session({.ctx = 64});
        auto sg = g.new_session({.ctx = 64});
        std::vector<float> tmp, lc, lg;
        c.commit(sc, prefix, logits_rows::none, tmp);
        g.commit(sg, prefix, logits_rows::none, tmp);
        c.preview(sc, block, coreset, lc);
        g.preview(sg, block, coreset, lg);
        CHECK(rel(lg, lc) < 1e-5f);
    }
    auto sg = g.new_session({.ctx = 64});
    auto tg = g.new_session({.ctx = 64});
    std::vector<float> tmp, vl;
    g.commit(sg, prefix, logits_rows::none, tmp);
    g.commit(tg, prefix, logits_rows::none, tmp);
    g.verify(sg, block, vl);
    g.rollback(sg, 5);
    for (std::int64_t i = 0; i < 5; ++i) {
        std::vector<token> one = {block[static_cast<std::size_t>(i)]};
        g.commit(tg, one, logits_rows::last, tmp);
        CHECK(std::memcmp(tmp.data(), vl.data() + i * g.n_vocab(), tmp.size() * 4) == 0);
    }
    CHECK(g.same_state(sg, tg));
}

CUDA_TEST_CASE("--n-cpu-moe: experts of the first layers computed on the host give the same logits") {
    auto path = testutil::synth_file("cu_odd.gguf", testutil::odd_spec());
    cuda_model all_gpu(load(path));
    offload_model some_cpu(load(path), {.host = {.threads = 2}, .host_moe_layers = 3});
    auto p = ids(23, all_gpu.n_vocab(), 7);
    CHECK(some_cpu.backend().on_host(some_cpu.weights().layers[2].moe.gate_exps.expert(1)));
    CHECK(!some_cpu.backend().on_host(some_cpu.weights().layers[3].moe.gate_exps.expert(1)));
    // F32 KV, as the odd model's check above says why (F16 KV: 4.2e-5; F32: 8e-7).
    CHECK(rel(commit_all(some_cpu, p, 256, false), commit_all(all_gpu, p, 256, false)) < 1e-5f);
}

CUDA_TEST_CASE("synthesized full-width model (4 layers, 32 experts, Q8_0): CUDA equals CPU") {
    auto s = synth::preset("clover-35b-a3b");
    s.n_layer = 4;        // three GDN layers and one attention layer, at full width
    s.n_vocab = 4096;     // the vocabulary and expert count are cut to keep the file ~0.6 GB
    s.n_expert = 32;
    s.type = dtype::q8_0;
    auto path = testutil::synth_file("cu_fullwidth_q8_0.gguf", s);
    cpu_model c(load(path), {0});
    cuda_model g(load(path));
    auto p = ids(9, s.n_vocab, 8);
    const auto t0 = std::chrono::steady_clock::now();
    auto lc = commit_all(c, p, 32);
    const auto t1 = std::chrono::steady_clock::now();
    auto lg = commit_all(g, p, 32);
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("full-width 4-layer Q8_0, 9 tokens: CPU %.3f s, CUDA (host-interface step) %.3f s\n",
                std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
    // Given the same inputs every primitive agrees to <= 4e-7 relative, except moe_ffn (<= 4e-5:
    // its hidden rows, summed in another order, are quantized to Q8_0 again for the down
    // product). But at this width a Q8_0 code (1/127 of a 32-value block's largest value) moves
    // in every product: ~37K activations per product input differ by ~1e-6 against codes of
    // ~0.05, ~1 moved code each, each moving outputs by code * |w| (7e-5 at blk.0.ssm_out). From
    // then on every quantization sees differences far above an ulp, and a router near-tie picks
    // another expert for one row (seen at blk.1: expert 28 for 3, the row's 8th choice). The
    // logits differ by 3.5e-2; a wrong kernel, index or tile at full width is off by O(1).
    CHECK(rel(lg, lc) < 1e-1f);
}

// Issue 40, item 1 on the device: the layers split into stages (backend::cuda's write_rows and
// the read-back of h), and a CUDA stage feeding a CPU stage (stages across devices in one process).
CUDA_TEST_CASE("stages on CUDA: a split model's logits equal the whole model's bit for bit; a CUDA stage feeds a CPU one") {
    auto sp = testutil::odd_spec();
    sp.arch = "clover_moe";
    const auto f = load(testutil::synth_file("cu_clover_odd.gguf", sp));
    // The CUDA models first: the file is then never rearranged for the CPU's kernels.
    cuda_model whole(f), g0(f, stage_range{0, 2}), g1(f, stage_range{2, 5});
    cpu_model c1(f, stage_range{2, 5}, {2}), cw(f, {2});
    const session_options o{.ctx = 64};
    session sw = whole.new_session(o), s0 = g0.new_session(o), s1 = g1.new_session(o), sc1 = c1.new_session(o),
            scw = cw.new_session(o);
    auto pass = [&](pass_kind kind, const std::vector<token>& t, std::int64_t coreset = -1) {
        const auto n = std::int64_t(t.size());
        const pass_request rw{&sw, kind, t, n, coreset}, r0{&s0, kind, t, n, coreset}, r1{&s1, kind, t, n, coreset},
            rc{&sc1, kind, t, n, coreset}, rcw{&scw, kind, t, n, coreset};
        std::vector<float> want, h, got, mixed, cpu_want;
        whole.run(std::span(&rw, 1), want, true);
        g0.run_stage(std::span(&r0, 1), nullptr, h, true);
        REQUIRE(std::int64_t(h.size()) == n * whole.hp().n_embd);
        g1.run_stage(std::span(&r1, 1), h.data(), got, true);
        c1.run_stage(std::span(&rc, 1), h.data(), mixed, true);
        cw.run(std::span(&rcw, 1), cpu_want, true);
        REQUIRE(got.size() == want.size());
        CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
        CHECK(rel(mixed, cpu_want) < 1e-4f);
    };
    pass(pass_kind::commit, ids(9, 290, 11));
    for (std::uint64_t i = 0; i < 4; ++i) pass(pass_kind::commit, ids(1, 290, 12 + i));  // later ones replayed as graphs
    auto block = ids(4, 290, 20);
    block[1] = token(whole.hp().mask_token_id);
    pass(pass_kind::preview, block, 2);
    pass(pass_kind::verify, ids(4, 290, 21));
    whole.rollback(sw, 2);
    g0.rollback(s0, 2);
    g1.rollback(s1, 2);
    c1.rollback(sc1, 2);
    cw.rollback(scw, 2);
    pass(pass_kind::commit, ids(1, 290, 22));
}

}  // namespace cuda_test_model
