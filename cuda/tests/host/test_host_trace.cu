// backend::cuda's host side in CI, without a GPU (the CUDA issue's "trace figures hold for the
// CUDA backend's host side"): this executable links the recording runtime of cudart_stub.cpp
// instead of cudart, so the real backend::cuda code runs every pass kind of a model with the
// 40-layer pattern of Clover-35B-A3B while the runtime counts what the pass asks of the device.
// Kernels do not run, so no value is checked here (tests_cuda does that on a GPU); what is
// checked is the shape of the host's work:
// - one read-back (device → host copy) per pass, whatever the pass kind or number of sequences;
// - no allocation or free once the pools and scratch have grown (each is a device-wide wait);
// - uploads per pass that do not grow with the number of layers;
// - every launch configuration one an sm_90 device accepts (grid and block limits; dynamic
//   shared memory above 48 KiB only where the kernel's attribute was raised);
// - the same launch sequence (kernel, grid, block, shared memory) for other token values of the
//   same shape: what a CUDA graph captured once per (pass kind, rows) needs first. Not enough
//   on its own: arguments are not compared, and pointers differ from pass to pass (the
//   sequences' states, scratch from the pass's context), so a replayable graph also needs them
//   in fixed places or its nodes' parameters updated.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <string_view>

#include <clover/backend/cuda/cuda.hpp>
#include <clover/backend/trace.hpp>
#include <clover/clover.hpp>

#include "../../../tests/common/test_util.hpp"
#include "cudart_stub.hpp"

using namespace clover;

namespace {

using traced = model<variants::from_file, backend::trace<backend::cuda>>;

synth::spec pattern_40(std::int64_t n_layer, dtype t) {
    auto s = synth::preset("tiny");
    s.arch = "clover_moe";
    s.preset = "pattern40";
    s.n_layer = n_layer;
    s.interval = 4;
    s.n_embd = 32;
    s.n_vocab = 300;
    s.type = t;
    return s;
}

std::vector<token> ids(std::int64_t n, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(token(r.next() % 280));
    return v;
}

struct pass_record {
    cudastub::counters dev;
    std::int64_t passes = 0, readbacks = 0;  // as the trace backend saw them (concept level)
    std::int64_t rows_read = 0;              // read_logits calls that asked for at least one row
};

template <class F>
pass_record record(traced& m, F&& f) {
    m.backend().clear();
    cudastub::reset();
    f();
    pass_record r{cudastub::snapshot(), m.backend().passes(), m.backend().readbacks()};
    for (const auto& c : m.backend().calls())
        if (std::string_view(c.name) == "read_logits" && c.rows > 0) ++r.rows_read;
    return r;
}

// One pass of each kind on a fresh session: a 40-token prompt, a decode row, a 32-row preview
// with coreset 16, 8 verify rows, and a decode step of 3 sequences together.
std::map<std::string, pass_record> pass_kinds(traced& m, std::uint64_t seed) {
    std::map<std::string, pass_record> out;
    auto s = m.new_session({.ctx = 256});
    std::vector<float> lg;
    const auto prompt = ids(40, seed);
    out["prefill"] = record(m, [&] { m.commit(s, prompt, logits_rows::last, lg); });
    const auto one = ids(1, seed + 1);
    out["decode"] = record(m, [&] { m.commit(s, one, logits_rows::last, lg); });
    auto block = ids(32, seed + 2);
    for (std::size_t i = 1; i < block.size(); ++i) block[i] = token(m.hp().mask_token_id);
    out["preview"] = record(m, [&] { m.preview(s, block, 16, lg); });
    const auto draft = ids(8, seed + 3);
    out["verify"] = record(m, [&] { m.verify(s, draft, lg); });

    std::vector<session> ss;
    for (int i = 0; i < 3; ++i) ss.push_back(m.new_session({.ctx = 64}));
    for (auto& x : ss) m.commit(x, ids(4, seed + 4), logits_rows::none, lg);
    const auto t = ids(3, seed + 5);
    std::vector<token> t1{t[0]}, t2{t[1]}, t3{t[2]};
    std::vector<pass_request> reqs{{&ss[0], pass_kind::commit, t1, 1}, {&ss[1], pass_kind::commit, t2, 1},
                                   {&ss[2], pass_kind::commit, t3, 1}};
    out["decode x3"] = record(m, [&] { m.run(reqs, lg); });
    return out;
}

}  // namespace

TEST_CASE("cuda host side: one read-back per pass, no steady-state allocation, valid and token-independent launches") {
    for (dtype t : {dtype::f32, dtype::q8_0}) {
        CAPTURE(dtype_name(t));
        const std::string path = testutil::synth_file("h_pattern40_" + std::string(dtype_name(t)) + ".gguf", pattern_40(40, t));
        traced m(load(path), {.threads = 2});
        REQUIRE(m.hp().n_layer == 40);
        REQUIRE(m.hp().n_attention_layers() == 10);
        const std::int64_t L = m.hp().n_layer;
        (void)pass_kinds(m, 7);  // warm-up: weights uploaded, pools and scratch grown
        auto a = pass_kinds(m, 1), b = pass_kinds(m, 99);
        for (auto& [name, r] : a) {
            CAPTURE(name);
            const auto& d = r.dev;
            std::printf("cuda host side (%s) %-9s: %lld launches (%.1f per layer), %lld read-backs, %lld uploads, %lld "
                        "device copies, %lld memsets, %lld host waits, %lld allocations\n",
                        std::string(dtype_name(t)).c_str(), name.c_str(), (long long)d.launches.size(), double(d.launches.size()) / double(L),
                        (long long)d.d2h, (long long)d.h2d, (long long)d.d2d, (long long)d.memsets, (long long)d.host_waits,
                        (long long)d.mallocs);
            CHECK(r.passes == 1);
            CHECK(r.readbacks == 1);
            CHECK(d.d2h == 1);            // the pass's one read-back, at the device level
            CHECK(d.host_waits >= 1);     // ... which the host waits for,
            CHECK(d.host_waits <= 2);     // and the pass's release (an idle stream by then)
            CHECK(d.mallocs == 0);        // steady state: no cudaMalloc/cudaHostAlloc ...
            CHECK(d.frees == 0);          // ... and no cudaFree (each synchronises the device)
            CHECK(d.bad_launches == 0);
            CHECK(d.launches == b[name].dev.launches);  // the same launches for other tokens (see above)
            CHECK(d.h2d == b[name].dev.h2d);
        }
        // Opening and closing sequences once the pool has grown: no cudaMalloc, no cudaFree (a
        // server does this for every request while other sequences' passes are queued).
        // With a GDN checkpoint taken and dropped with its sequence, as a prefix cache does.
        auto open_close = [&] {
            for (int i = 0; i < 3; ++i) {
                auto s = m.new_session({.ctx = 256});
                std::vector<float> lg;
                m.commit(s, ids(5, 11 + std::uint64_t(i)), logits_rows::last, lg);
                m.checkpoint(s);
                REQUIRE(m.checkpoints(s).size() == 1);
            }
        };
        open_close();  // the first checkpoint's arrays are new
        auto churn = record(m, open_close);
        CHECK(churn.dev.mallocs == 0);
        CHECK(churn.dev.frees == 0);
        // Uploads per pass are the batch's description (tokens, positions, rows), not per layer:
        // a 4-layer model of the same pattern uploads as often.
        const std::string path4 = testutil::synth_file("h_pattern4_" + std::string(dtype_name(t)) + ".gguf", pattern_40(4, t));
        traced m4(load(path4), {.threads = 2});
        (void)pass_kinds(m4, 7);
        auto c = pass_kinds(m4, 1);
        for (auto& [name, r] : a) {
            CAPTURE(name);
            CHECK(r.dev.h2d == c[name].dev.h2d);
            CHECK(r.dev.host_waits == c[name].dev.host_waits);
        }
    }
}

TEST_CASE("cuda host side: generation reads back once per pass (AR, LowConfidence, self-speculative)") {
    const std::string path = testutil::synth_file("h_pattern40_f32.gguf", pattern_40(40, dtype::f32));
    traced m(load(path), {.threads = 2});
    decode::generate_options o;
    o.max_tokens = 24;
    o.ignore_eos = true;
    const auto prompt = ids(9, 3);
    auto run = [&](auto dec, const char* name) {
        CAPTURE(name);
        std::int64_t n = 0;
        decode::generate_stats st;
        {  // warm-up: weights uploaded, scratch and the pool's arrays grown for this decoder
            auto s = m.new_session({.ctx = 128});
            (void)decode::generate(m, s, prompt, o, [&](token) { return true; }, dec);
        }
        auto s = m.new_session({.ctx = 128});
        auto r = record(m, [&] { st = decode::generate(m, s, prompt, o, [&](token) { ++n; return true; }, dec); });
        std::printf("cuda host side: %s: %lld tokens, %lld passes, %lld read-backs, %lld allocations\n", name,
                    (long long)st.tokens, (long long)st.passes(), (long long)r.dev.d2h, (long long)r.dev.mallocs);
        CHECK(n == 24);
        CHECK(st.passes() == r.passes);
        // One read-back for each pass that asks for logits rows (a LowConfidence block's commit
        // pass asks for none: the next block's preview gives its tokens), none hidden elsewhere.
        CHECK(r.dev.d2h == r.rows_read);
        CHECK(r.dev.d2h <= r.passes);
        CHECK(r.dev.d2h >= st.tokens / 8);
        CHECK(r.dev.bad_launches == 0);
        CHECK(r.dev.mallocs == 0);  // a second generation of the same shape allocates nothing ...
        CHECK(r.dev.frees == 0);    // ... and frees nothing (cudaFree waits for the device)
        if (r.dev.mallocs) {
            std::map<std::size_t, int> by_size;
            for (std::size_t b : r.dev.alloc_bytes) ++by_size[b];
            for (auto [b, k] : by_size) std::printf("  %d allocations of %zu bytes\n", k, b);
        }
    };
    run(decode::ar{}, "ar");
    run(decode::low_confidence{.block = 8, .threshold = 0.95f}, "low_confidence");
    run(decode::self_speculative{.block = 4}, "self_speculative");
}
