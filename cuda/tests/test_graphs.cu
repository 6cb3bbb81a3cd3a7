// CUDA graphs (graph.cuh) on a GPU: a model whose passes are captured and launched as graphs
// gives the same logits, bit for bit, as the same model launching every kernel itself
// (options.graphs = false): prefill, decode steps at growing positions (the executable updated
// in place), previews with and without a coreset, verify and rollback, and a shape seen a third
// time. The graph runs the same kernels with the same arguments in the same order, so any
// difference is a capture bug: a copy reading its source too late or too early, a scratch block
// reused before the graph ran, an argument the update did not carry.
#include "cuda_test.hpp"

#include <cstring>

#include <clover/clover.hpp>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_graphs {

using namespace clover;

namespace {

using cuda_model = model<variants::from_file, backend::cuda>;

std::vector<token> toks(std::int64_t n, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(token(r.next() % 280));
    return v;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The same script on a model; every pass's logits appended to `out`, one vector per pass.
void script(cuda_model& m, std::vector<std::vector<float>>& out) {
    std::vector<float> lg;
    auto s = m.new_session({.ctx = 320});
    m.commit(s, toks(245, 1), logits_rows::all, lg);  // decode then crosses 256 keys: split attention adds its merge kernel
    out.push_back(lg);
    for (int i = 0; i < 24; ++i) {  // decode: eager, instantiated, then updated at every position (re-instantiated at 257)
        m.commit(s, toks(1, 100 + std::uint64_t(i)), logits_rows::last, lg);
        out.push_back(lg);
    }
    auto block = toks(8, 7);
    for (std::size_t i = 1; i < block.size(); ++i) block[i] = token(m.hp().mask_token_id);
    for (std::int64_t coreset : {std::int64_t(0), std::int64_t(3), std::int64_t(3), std::int64_t(3)}) {
        m.preview(s, block, coreset, lg);
        out.push_back(lg);
    }
    for (int round = 0; round < 3; ++round) {  // verify + rollback, the same shape three times
        m.verify(s, toks(6, 30 + std::uint64_t(round)), lg);
        out.push_back(lg);
        m.rollback(s, 2 + round);
        m.commit(s, toks(1, 40 + std::uint64_t(round)), logits_rows::last, lg);
        out.push_back(lg);
    }
    // Three sequences in one pass, twice (eager, then captured), then once more.
    std::vector<session> ss;
    for (int i = 0; i < 3; ++i) {
        ss.push_back(m.new_session({.ctx = 64}));
        m.commit(ss.back(), toks(5 + i, 50 + std::uint64_t(i)), logits_rows::none, lg);
    }
    for (int step = 0; step < 3; ++step) {
        const auto t = toks(3, 60 + std::uint64_t(step));
        std::vector<token> t1{t[0]}, t2{t[1]}, t3{t[2]};
        std::vector<pass_request> reqs{{&ss[0], pass_kind::commit, t1, 1}, {&ss[1], pass_kind::commit, t2, 1},
                                       {&ss[2], pass_kind::commit, t3, 1}};
        m.run(reqs, lg);
        out.push_back(lg);
    }
}

}  // namespace

CUDA_TEST_CASE("graphs: captured passes give the logits of eager ones bit for bit (clover_moe: decode, preview, verify)") {
    for (dtype t : {dtype::f32, dtype::q8_0}) {
        CAPTURE(dtype_name(t));
        auto s = synth::preset("tiny");
        s.arch = "clover_moe";
        s.n_layer = 8;
        s.interval = 4;
        s.n_embd = 32;
        s.n_vocab = 300;
        s.type = t;
        const auto path = testutil::synth_file("cu_graphs_" + std::string(dtype_name(t)) + ".gguf", s);
        cuda_model eager(load(path), {.graphs = false});
        cuda_model graphs(load(path));
        std::vector<std::vector<float>> a, b;
        script(eager, a);
        script(graphs, b);
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
            CAPTURE(i);
            CHECK(same(a[i], b[i]));
        }
    }
}

}  // namespace cuda_test_graphs
