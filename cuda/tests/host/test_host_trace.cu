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
//   in fixed places or its nodes' parameters updated;
// - CUDA graphs (graph.cuh): after warm-up every pass is one graph launch and no direct kernel
//   launch, a repeated shape updates its executable instead of instantiating one, decode steps
//   at growing positions launch one executable, and nothing inside a capture waits, frees or
//   copies pageable memory (the recording runtime refuses it, as a GPU does); with experts on the host (offload) or
//   options.graphs = false nothing is captured. A capture that an exception interrupts ends,
//   discarded, and the stream stays usable.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string_view>

#include <clover/backend/cuda/cuda.hpp>
#include <clover/backend/offload.hpp>
#include <clover/backend/trace.hpp>
#include <clover/clover.hpp>

#include "../../../tests/common/test_util.hpp"
#include "cudart_stub.hpp"

using namespace clover;

namespace {

using traced = model<variants::from_file, backend::trace<backend::cuda>>;
// The experts of some layers on the host: backend::cuda composed with backend::cpu.
using traced_offload = model<variants::from_file, backend::trace<backend::offload<backend::cuda, backend::cpu>>>;

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

template <class M, class F>
pass_record record(M& m, F&& f) {
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
template <class M>
std::map<std::string, pass_record> pass_kinds(M& m, std::uint64_t seed) {
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
        traced m(load(path));
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
            // Graphs: the pass is captured and launched as one graph; the second pass of the
            // shape after warm-up updates the executable the first one instantiated.
            const auto& e = b[name].dev;
            std::printf("  graphs: %lld captures, %lld graph launches (%lld kernels), %lld direct launches, %lld/%lld "
                        "instantiations, %lld/%lld updates\n",
                        (long long)d.captures, (long long)d.graph_launches, (long long)d.graph_kernels, (long long)d.direct_launches,
                        (long long)d.instantiations, (long long)e.instantiations, (long long)d.updates, (long long)e.updates);
            CHECK(d.captures == 1);
            CHECK(d.graph_launches == 1);
            CHECK(d.direct_launches == 0);
            CHECK(d.graph_kernels == std::int64_t(d.launches.size()));
            CHECK(d.capture_violations == 0);
            CHECK(d.instantiations + d.updates == 1);
            CHECK(e.graph_launches == 1);
            CHECK(e.direct_launches == 0);
            CHECK(e.instantiations == 0);  // the same shape again: updated, not instantiated
            CHECK(e.updates == 1);
            CHECK(e.update_refusals == 0);
            CHECK(e.capture_violations == 0);
            CHECK(e.graph_execs == d.graph_execs);  // ... the same executable
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
        traced m4(load(path4));
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
    traced m(load(path));
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
        std::printf("cuda host side: %s: %lld tokens, %lld passes, %lld read-backs, %lld allocations; %lld graph launches, "
                    "%lld instantiations, %lld updates, %lld kernels launched directly\n",
                    name, (long long)st.tokens, (long long)st.passes(), (long long)r.dev.d2h, (long long)r.dev.mallocs,
                    (long long)r.dev.graph_launches, (long long)r.dev.instantiations, (long long)r.dev.updates,
                    (long long)r.dev.direct_launches);
        CHECK(r.dev.capture_violations == 0);
        CHECK(r.dev.graph_launches > 0);
        CHECK(r.dev.graph_launches <= r.passes);
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

TEST_CASE("cuda host side, graphs: decode steps at growing positions launch one executable, updated in place") {
    const std::string path = testutil::synth_file("h_pattern40_f32.gguf", pattern_40(40, dtype::f32));
    traced m(load(path));
    auto s = m.new_session({.ctx = 256});
    std::vector<float> lg;
    m.commit(s, ids(9, 5), logits_rows::last, lg);
    for (int i = 0; i < 3; ++i) m.commit(s, ids(1, 50 + std::uint64_t(i)), logits_rows::last, lg);  // eager, then captured
    const int steps = 40;  // positions 12 .. 51: the rope and cache-length arguments change every step
    auto r = record(m, [&] {
        for (int i = 0; i < steps; ++i) m.commit(s, ids(1, 100 + std::uint64_t(i)), logits_rows::last, lg);
    });
    const auto& d = r.dev;
    CHECK(r.passes == steps);
    CHECK(d.graph_launches == steps);
    CHECK(d.direct_launches == 0);
    CHECK(d.captures == steps);
    CHECK(d.instantiations == 0);
    CHECK(d.updates == steps);
    CHECK(d.capture_violations == 0);
    REQUIRE(d.graph_execs.size() == std::size_t(steps));
    for (std::int64_t x : d.graph_execs) CHECK(x == d.graph_execs.front());
    CHECK(d.d2h == steps);
    CHECK(d.host_waits <= 2 * steps);
    CHECK(d.mallocs == 0);
    CHECK(d.frees == 0);
}

TEST_CASE("cuda host side, graphs: none with experts on the host (offload) or graphs = false; the old figures hold") {
    const std::string path = testutil::synth_file("h_pattern40_f32.gguf", pattern_40(40, dtype::f32));
    for (int mode = 0; mode < 2; ++mode) {
        CAPTURE(mode);  // 0: graphs = false, 1: the experts of layers 0 and 1 on the host (--n-cpu-moe 2)
        std::map<std::string, pass_record> a, b;
        if (mode == 0) {
            traced m(load(path), {.graphs = false});
            (void)pass_kinds(m, 7);
            a = pass_kinds(m, 1);
            b = pass_kinds(m, 99);
        } else {
            traced_offload m(load(path), {.host = {.threads = 2}, .host_moe_layers = 2});
            CHECK(m.backend().inner().host_layers() == std::vector<std::int64_t>{0, 1});
            (void)pass_kinds(m, 7);
            a = pass_kinds(m, 1);
            b = pass_kinds(m, 99);
        }
        for (auto& [name, r] : a) {
            CAPTURE(name);
            const auto& d = r.dev;
            CHECK(d.captures == 0);
            CHECK(d.graph_launches == 0);
            CHECK(d.instantiations == 0);
            CHECK(d.direct_launches == std::int64_t(d.launches.size()));
            CHECK(d.direct_launches > 0);
            CHECK(d.capture_violations == 0);
            CHECK(d.mallocs == 0);
            CHECK(d.frees == 0);
            CHECK(d.bad_launches == 0);
            CHECK(d.launches == b[name].dev.launches);
            if (mode == 0) {
                CHECK(d.d2h == 1);
                CHECK(d.host_waits >= 1);
                CHECK(d.host_waits <= 2);
            } else {
                CHECK(d.d2h > 1);  // the host experts' round trips (their input and routing)
            }
        }
    }
}

namespace {

// A standalone backend driven primitive by primitive: an embedding of `rows` tokens and a
// read-back of no rows, the smallest whole pass.
struct mini {
    backend::cuda be;
    std::vector<std::byte> table = std::vector<std::byte>(std::size_t(64 * 16 * 4), std::byte{1});
    weight w;
    mini() {
        w.data = table.data();
        w.type = dtype::f32;
        w.rows = 64;
        w.cols = 16;
        w.row_bytes = 16 * 4;
        w.name = "token_embd.weight";
    }
    // throw_mid: an exception leaves the pass after embed; grow: a scratch buffer grows after it.
    void pass(std::int64_t rows, const weight& emb, bool throw_mid = false, std::int64_t grow = 0) {
        std::vector<token> t(std::size_t(rows), 3);
        batch bt;
        bt.add(0, pass_kind::commit, t, 0);
        auto cx = be.begin_pass();
        auto h = cx.get(backend::buf::h, rows, 16);
        (void)cx.get(backend::buf::y, 1, 16);
        be.embed(cx, bt, emb, h);
        if (throw_mid) throw std::runtime_error("an error in the middle of the pass");
        if (grow) (void)cx.get(backend::buf::y, grow, 16);
        auto lg = cx.get(backend::buf::logits, 0, 16);
        be.read_logits(cx, lg, nullptr);
    }
    bool capturing() {
        cudaStreamCaptureStatus st{};
        REQUIRE(cudaStreamIsCapturing(be.stream(), &st) == cudaSuccess);
        return st != cudaStreamCaptureStatusNone;
    }
};

}  // namespace

TEST_CASE("cuda host side, graphs: an exception ends the capture; a weight or a buffer new inside one") {
    const std::int64_t execs0 = cudastub::live_execs();
    {
        mini g;
        g.pass(7, g.w);  // eager: the shape is new
        cudastub::reset();
        g.pass(7, g.w);
        auto c = cudastub::snapshot();
        CHECK(c.captures == 1);
        CHECK(c.instantiations == 1);
        CHECK(c.graph_launches == 1);
        CHECK(c.direct_launches == 0);

        // An exception in the middle: the capture is discarded, nothing launched, the stream
        // leaves capture mode and the next pass of the shape runs eagerly, the one after is
        // captured again.
        cudastub::reset();
        CHECK_THROWS_WITH(g.pass(7, g.w, true), "an error in the middle of the pass");
        c = cudastub::snapshot();
        CHECK(c.captures == 1);
        CHECK(c.graph_launches == 0);
        CHECK(c.capture_violations == 0);
        CHECK_FALSE(g.capturing());
        cudastub::reset();
        g.pass(7, g.w);
        c = cudastub::snapshot();
        CHECK(c.captures == 0);
        CHECK(c.direct_launches == 1);
        cudastub::reset();
        g.pass(7, g.w);
        c = cudastub::snapshot();
        CHECK(c.captures == 1);
        CHECK(c.graph_launches == 1);

        // A weight first used inside a capture is uploaded on the upload stream and waited for
        // there (a wait on the capturing stream would be refused): in place when dev() returns.
        std::vector<std::byte> other(g.table.size());
        for (std::size_t i = 0; i < other.size(); ++i) other[i] = std::byte(i * 7 + 1);
        weight w2 = g.w;
        w2.data = other.data();
        cudastub::reset();
        g.pass(7, w2);
        c = cudastub::snapshot();
        CHECK(c.capture_violations == 0);
        CHECK(c.graph_launches == 1);
        const auto& dm = g.be.dev(w2);
        CHECK(std::memcmp(dm.data, other.data(), other.size()) == 0);

        // A scratch buffer that grows inside a capture keeps its old block until the graph ran
        // (earlier nodes name it; a free inside a capture is refused): freed after, not during.
        cudastub::reset();
        g.pass(7, g.w, false, 1000);
        c = cudastub::snapshot();
        CHECK(c.capture_violations == 0);
        CHECK(c.graph_launches == 1);
        CHECK(c.mallocs == 1);
        CHECK(c.frees == 1);

        // At most 16 shapes keep an executable (least recently used evicted).
        for (std::int64_t rows = 1; rows <= 20; ++rows) {
            g.pass(rows, g.w);
            g.pass(rows, g.w);
        }
        CHECK(cudastub::live_execs() - execs0 == std::int64_t(backend::cuda_detail::graph_cache::default_capacity));
    }
    CHECK(cudastub::live_execs() == execs0);  // destroyed with the backend
}

static __global__ void stub_probe_kernel(int* p) { *p = 1; }
static __global__ void stub_probe_kernel2(int* p) { *p = 2; }

TEST_CASE("recording runtime: capture records, a launch runs the nodes then; what breaks a capture fails") {
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    int *dev = nullptr, *pin = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev), 4) == cudaSuccess);
    REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pin), 4, 0) == cudaSuccess);
    auto capture = [&](bool second_kernel) {
        REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        CHECK(cudaMemcpyAsync(dev, pin, 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
        stub_probe_kernel<<<1, 32, 0, s>>>(dev);
        if (second_kernel) stub_probe_kernel2<<<1, 32, 0, s>>>(dev);
        cudaGraph_t g = nullptr;
        REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
        return g;
    };
    cudastub::reset();
    *pin = 5;
    cudaGraph_t g = capture(false);
    *pin = 9;  // a copy node reads its source when the graph runs
    auto c = cudastub::snapshot();
    CHECK(c.h2d == 0);
    CHECK(c.launches.empty());
    cudaGraphExec_t x = nullptr;
    REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(x, s) == cudaSuccess);
    CHECK(*dev == 9);
    c = cudastub::snapshot();
    CHECK(c.h2d == 1);
    CHECK(c.graph_launches == 1);
    CHECK(c.graph_kernels == 1);
    CHECK(c.direct_launches == 0);
    REQUIRE(c.launches.size() == 1);

    // Update: the same nodes are taken, another topology is refused.
    g = capture(false);
    cudaGraphExecUpdateResultInfo info{};
    CHECK(cudaGraphExecUpdate(x, g, &info) == cudaSuccess);
    CHECK(info.result == cudaGraphExecUpdateSuccess);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
    g = capture(true);
    CHECK(cudaGraphExecUpdate(x, g, &info) == cudaErrorGraphExecUpdateFailure);
    CHECK(info.result == cudaGraphExecUpdateErrorTopologyChanged);
    CHECK(cudaGetLastError() == cudaErrorGraphExecUpdateFailure);
    REQUIRE(cudaGraphDestroy(g) == cudaSuccess);
    REQUIRE(cudaGraphExecDestroy(x) == cudaSuccess);

    // A wait on the capturing stream, a synchronous copy, a free and a pageable copy fail and
    // invalidate the capture.
    std::vector<int> pageable(1, 0);
    for (int what = 0; what < 4; ++what) {
        CAPTURE(what);
        cudastub::reset();
        REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        cudaError_t e = cudaSuccess;
        if (what == 0) e = cudaStreamSynchronize(s);
        if (what == 1) e = cudaMemcpy(pin, dev, 4, cudaMemcpyDeviceToHost);
        if (what == 2) e = cudaFree(dev);
        if (what == 3) e = cudaMemcpyAsync(dev, pageable.data(), 4, cudaMemcpyHostToDevice, s);
        CHECK(e == cudaErrorStreamCaptureUnsupported);
        (void)cudaGetLastError();
        cudaStreamCaptureStatus st{};
        REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
        CHECK(st == cudaStreamCaptureStatusInvalidated);
        g = nullptr;
        CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
        CHECK(g == nullptr);
        (void)cudaGetLastError();
        CHECK(cudastub::snapshot().capture_violations == 1);
    }
    // Outside a capture the same calls are fine.
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaFree(dev) == cudaSuccess);
    CHECK(cudaFreeHost(pin) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}
