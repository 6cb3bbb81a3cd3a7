// Rank 0 driving a model split by layers (include/clover/pipeline/, issue 40): ranks as threads of
// one process (dist::local_group), 2 and 3 of them, on the bundled model and a synthesized
// qwen35moe file. Through the pipeline, logits equal the whole model's bit for bit in exact mode
// (prefill, decode, preview with a coreset, verify + rollback, checkpoints, prefix sharing, a
// batch of four); generate / generate_many / the engine with its prefix cache give the whole
// model's tokens; a killed or stuck rank fails rank 0's next operation naming the stage; a bad
// split is one clear error before anything is loaded.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <variant>

#include <clover/clover.hpp>
#include <clover/decode/engine.hpp>
#include <clover/dist/local.hpp>
#include <clover/pipeline/pipeline.hpp>

#include "../common/test_util.hpp"

using namespace clover;
using namespace std::chrono_literals;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
using rt_pipe = pipeline::pipeline<variants::from_file, backend::cpu>;

const std::string bundled_pl = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";
constexpr dist::duration patience{20000};  // a correct test never comes near it

std::shared_ptr<const io::gguf_file> qwen_file() { return load(testutil::synth_file("pl_odd.gguf", testutil::odd_spec())); }

// The ranks of a local group: ranks 1..n-1 on threads, each running `body` (by default: load its
// stage of the split and serve it); rank 0's endpoint is the test's. Destroy the pipeline first
// (it shuts the ranks down), then this (it joins them).
struct ranks {
    using body_fn = std::function<std::string(int, dist::communicator&)>;
    dist::local_group g;
    std::unique_ptr<dist::local_communicator> c0;
    std::vector<std::thread> ts;
    std::vector<std::string> result;  // per rank: serve_stage's result, or "threw: ..."

    ranks(int n, body_fn body) : g(n), c0(g.endpoint(0)), result(std::size_t(n)) {
        for (int r = 1; r < n; ++r)
            ts.emplace_back([this, r, body, ep = std::shared_ptr<dist::local_communicator>(g.endpoint(r))]() mutable {
                try {
                    result[std::size_t(r)] = body(r, *ep);
                } catch (const std::exception& e) {
                    result[std::size_t(r)] = std::string("threw: ") + e.what();
                }
                ep.reset();  // the rank is gone
            });
    }
    ranks(int n, std::shared_ptr<const io::gguf_file> f, std::vector<std::int64_t> counts = {})
        : ranks(n, serving(std::move(f), std::move(counts))) {}
    ~ranks() {
        c0.reset();  // a rank still waiting on rank 0 stops
        for (auto& t : ts) t.join();
    }
    static body_fn serving(std::shared_ptr<const io::gguf_file> f, std::vector<std::int64_t> counts) {
        return [f, counts](int, dist::communicator& c) {
            rt_model m(f, pipeline::stage_of_rank(*f, c, counts), backend::cpu_options{.threads = 1});
            return pipeline::serve_stage(m, c, {patience});
        };
    }
};

// One sequence on both sides.
struct seq_pair {
    session whole, pipe;
};
struct step {
    seq_pair* s;
    pass_kind kind;
    std::vector<token> ids;
    std::int64_t logits;
    std::int64_t coreset = -1;
};

struct side_by_side {
    rt_model& whole;
    rt_pipe& pipe;
    seq_pair open(session_options o = {.ctx = 128}) { return {whole.new_session(o), pipe.new_session(o)}; }
    void check(const std::vector<step>& steps) {
        std::vector<pass_request> w, p;
        for (const step& x : steps) {
            w.push_back({&x.s->whole, x.kind, x.ids, x.logits, x.coreset});
            p.push_back({&x.s->pipe, x.kind, x.ids, x.logits, x.coreset});
        }
        std::vector<float> want, got;
        whole.run(w, want, true);
        pipe.run(p, got, true);
        REQUIRE(!want.empty());
        CHECK(testutil::same_bits(want, got));
        for (const step& x : steps) CHECK(x.s->whole.tokens() == x.s->pipe.tokens());
    }
    // A session operation on both sides.
    template <class F>
    void each(seq_pair& s, F f) {
        f(whole, s.whole);
        f(pipe, s.pipe);
    }
};

std::vector<token> pl_ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) { return testutil::random_ids(n, vocab, seed); }

// Every segment kind, the session operations between passes, prefix sharing, a batch of four.
void exercise(side_by_side& p, bool diffusion) {
    const std::int64_t V = p.whole.n_vocab();
    CHECK(p.pipe.page_bytes(1) == p.whole.page_bytes(1));
    CHECK(p.pipe.checkpoint_bytes() == p.whole.checkpoint_bytes());
    CHECK(p.pipe.page_size() == p.whole.page_size());
    seq_pair a = p.open();
    p.check({{&a, pass_kind::commit, pl_ids(9, V, 1), 9}});  // prefill, every row's logits
    p.check({{&a, pass_kind::commit, pl_ids(1, V, 2), 1}});  // decode
    if (diffusion) {
        auto block = pl_ids(4, V, 3);
        block[1] = block[3] = token(p.whole.hp().mask_token_id);
        p.check({{&a, pass_kind::preview, block, 4, 2}});  // preview with an expert coreset
    }
    p.check({{&a, pass_kind::verify, pl_ids(4, V, 4), 4}});
    p.each(a, [](auto& m, session& s) { m.rollback(s, 2); });
    CHECK(a.pipe.n_past() == 12);
    p.check({{&a, pass_kind::commit, pl_ids(1, V, 5), 1}});

    // A checkpoint, a turn taken back, a second session started from the prefix.
    p.each(a, [](auto& m, session& s) { m.checkpoint(s); });
    const std::int64_t at = a.whole.n_past();
    CHECK(p.pipe.checkpoints(a.pipe) == p.whole.checkpoints(a.whole));
    p.check({{&a, pass_kind::commit, pl_ids(3, V, 7), 3}});
    p.each(a, [at](auto& m, session& s) { m.restore(s, at); });
    CHECK(a.pipe.n_past() == at);
    p.check({{&a, pass_kind::commit, pl_ids(2, V, 8), 2}});
    seq_pair b = p.open();
    p.whole.copy_prefix(b.whole, a.whole, at);
    p.pipe.copy_prefix(b.pipe, a.pipe, at);
    p.check({{&b, pass_kind::commit, pl_ids(2, V, 9), 2}});
    CHECK_THROWS_WITH_AS(p.pipe.restore(a.pipe, at - 1), doctest::Contains("no GDN checkpoint at position"), error);
    CHECK(p.pipe.broken().empty());  // refused by rank 0's stage: nothing was sent

    // Prefix sharing as a prefix cache does it: pages held, GDN states saved, a session from them.
    const std::int64_t P = p.whole.page_size();
    const std::vector<token> prefix(a.whole.tokens().begin(), a.whole.tokens().begin() + at);
    auto from = [&](auto& m, session& src) {
        const auto pages = m.hold_pages(src, 0, (at + P - 1) / P);
        session s = m.new_session_from({.ctx = 128}, pages, prefix, m.save_state(src, at));
        m.drop_pages(src.pool(), pages);
        return s;
    };
    seq_pair c{from(p.whole, a.whole), from(p.pipe, a.pipe)};
    p.check({{&c, pass_kind::commit, pl_ids(2, V, 10), 2}});
    {  // take_state moves the checkpoint out on every stage
        auto sw = p.whole.take_state(b.whole, at);
        auto sp = p.pipe.take_state(b.pipe, at);
        CHECK(bool(sw) == bool(sp));
        CHECK(p.pipe.checkpoints(b.pipe) == p.whole.checkpoints(b.whole));
    }

    // A batch of four sequences at their own positions, mixed segments; then rollback and decode.
    std::vector<seq_pair> four;
    for (int i = 0; i < 4; ++i) four.push_back(p.open());
    for (int i = 0; i < 4; ++i) p.check({{&four[std::size_t(i)], pass_kind::commit, pl_ids(2 + 3 * i, V, 20 + std::uint64_t(i)), 1}});
    auto block = pl_ids(5, V, 30);
    block[2] = token(p.whole.hp().mask_token_id);
    p.check({{&four[0], pass_kind::commit, pl_ids(4, V, 31), 4},
             {&four[1], pass_kind::commit, pl_ids(1, V, 32), 1},
             diffusion ? step{&four[2], pass_kind::preview, block, 5, 3} : step{&four[2], pass_kind::commit, pl_ids(1, V, 33), 1},
             {&four[3], pass_kind::verify, pl_ids(3, V, 34), 3}});
    p.each(four[3], [](auto& m, session& s) { m.rollback(s, 1); });
    p.check({{&four[3], pass_kind::commit, pl_ids(1, V, 35), 1}, {&four[0], pass_kind::commit, pl_ids(1, V, 36), 1}});
    four.clear();  // closed on every stage; the ids are reused by the next sessions
    seq_pair d = p.open();
    p.check({{&d, pass_kind::commit, pl_ids(3, V, 37), 1}});

    // Bad input fails on rank 0's stage with the model's message and leaves the pipeline working.
    const std::vector<token> bad = {token(V)};
    const pass_request r{&d.pipe, pass_kind::commit, bad, 1};
    std::vector<float> out;
    CHECK_THROWS_WITH_AS(p.pipe.run(std::span(&r, 1), out), doctest::Contains("out of range"), error);
    session other = p.whole.new_session({.ctx = 16});
    const std::vector<token> one = pl_ids(1, V, 38);
    const pass_request r2{&other, pass_kind::commit, one, 1};
    CHECK_THROWS_WITH_AS(p.pipe.run(std::span(&r2, 1), out), doctest::Contains("opened by another model"), error);
    CHECK(p.pipe.broken().empty());
    p.check({{&d, pass_kind::commit, pl_ids(1, V, 39), 1}});
}

}  // namespace

TEST_CASE("pipeline: 2 and 3 ranks give the whole model's logits bit for bit (exact), every segment kind and operation") {
    struct config {
        std::shared_ptr<const io::gguf_file> f;
        int n;
        std::vector<std::int64_t> counts;
        bool diffusion;
    };
    const auto clover_file = load(bundled_pl);
    const auto qwen = qwen_file();  // 5 layers, attention at 1 and 3: stage 0 of {1, 2, 2} keeps no KV
    for (const config& cf : std::vector<config>{{clover_file, 2, {}, true},
                                                {clover_file, 3, {3, 2, 3}, true},
                                                {qwen, 2, {}, false},
                                                {qwen, 3, {1, 2, 2}, false}}) {
        CAPTURE(cf.n);
        CAPTURE(cf.counts.size());
        rt_model whole(cf.f, backend::cpu_options{.threads = 1});
        ranks rk(cf.n, cf.f, cf.counts);
        {
            rt_pipe pipe(cf.f, *rk.c0, {.layer_split = cf.counts, .timeout = patience}, backend::cpu_options{.threads = 1});
            REQUIRE(pipe.split().size() == std::size_t(cf.n));
            side_by_side p{whole, pipe};
            exercise(p, cf.diffusion);
        }
        rk.c0.reset();
        for (auto& t : rk.ts) t.join();
        rk.ts.clear();
        for (int r = 1; r < cf.n; ++r) CHECK(rk.result[std::size_t(r)] == "");  // a clean shutdown
    }
}

TEST_CASE("pipeline: generate, generate_many (AR, diffusion, speculative) and the engine's prefix cache equal the whole model") {
    using any_decoder = std::variant<decode::ar, decode::low_confidence, decode::self_speculative>;
    const auto f = load(bundled_pl);
    rt_model whole(f, backend::cpu_options{.threads = 1});
    const std::int64_t V = whole.n_vocab();
    for (int n : {2, 3}) {
        CAPTURE(n);
        ranks rk(n, f);
        rt_pipe pipe(f, *rk.c0, {.timeout = patience}, backend::cpu_options{.threads = 1});
        decode::generate_options o;
        o.max_tokens = 12;
        o.ignore_eos = true;
        const auto prompt = pl_ids(7, V, 50);
        auto one = [&](auto& m) {
            session s = m.new_session({.ctx = 64});
            std::vector<token> out;
            decode::generate<decode::ar>(m, s, prompt, o, [&](token t) { out.push_back(t); return true; });
            return out;
        };
        const auto want = one(whole);
        CHECK(want.size() == 12);
        CHECK(one(pipe) == want);

        std::vector<any_decoder> decs = {decode::ar{}, decode::low_confidence{8, 0.9f, 3}, decode::self_speculative{6, 1, 0.95f, -1},
                                         decode::low_confidence{4, 0.5f, -1}};
        std::vector<std::vector<token>> prompts;
        for (int i = 0; i < 4; ++i) prompts.push_back(pl_ids(3 + 4 * i, V, 60 + std::uint64_t(i)));
        auto many = [&](auto& m) {
            std::vector<std::vector<token>> out(decs.size());
            std::vector<decode::sequence_job<any_decoder>> jobs(decs.size());
            for (std::size_t k = 0; k < jobs.size(); ++k) {
                jobs[k].prompt = prompts[k];
                jobs[k].o = &o;
                jobs[k].dec = decs[k];
                jobs[k].on_token = [&out, k](token t) { out[k].push_back(t); return true; };
            }
            decode::generate_many(m, std::span(jobs), 0, true);
            return out;
        };
        const auto many_want = many(whole);
        CHECK(many(pipe) == many_want);
        for (const auto& v : many_want) CHECK(v.size() == 12);

        // The engine with a prefix cache: the second prompt resumes at the first's cut on every stage.
        constexpr token boundary = 7;  // stands for <|im_start|>: a cut after it
        auto turn1 = pl_ids(40, V, 70);
        for (auto& t : turn1)
            if (t == boundary) t = boundary + 1;
        turn1[20] = boundary;  // a cut at 21
        auto turn2 = turn1;
        for (token t : pl_ids(10, V, 71)) turn2.push_back(t == boundary ? boundary + 1 : t);
        auto serve = [&](auto& m) {
            using model_t = std::remove_reference_t<decltype(m)>;
            decode::engine<model_t> e(m, {.token_budget = 16, .exact = true, .cache_bytes = std::size_t(64) << 20, .boundary = boundary, .boundary_gap = 16});
            std::vector<std::vector<token>> out(2);
            std::vector<std::int64_t> cached(2);
            for (int i = 0; i < 2; ++i) {
                decode::engine_request<> r;
                r.prompt = i == 0 ? turn1 : turn2;
                r.gen.max_tokens = 6;
                r.gen.ignore_eos = true;
                r.dec = decode::ar{};
                r.sink.on_token = [&out, i](token t) { out[std::size_t(i)].push_back(t); return true; };
                r.sink.on_end = [&cached, i](const decode::engine_result& x) { cached[std::size_t(i)] = x.stats.cached_tokens; };
                e.submit(std::move(r));
                e.run_until_idle();
            }
            return std::pair{out, cached};
        };
        const auto [ew, cw] = serve(whole);
        const auto [ep, cp] = serve(pipe);
        CHECK(ep == ew);
        CHECK(cp == cw);
        CHECK(cw[1] == 21);  // the second request did resume from the cache
    }
}

TEST_CASE("pipeline: a killed rank fails rank 0's next operation, naming its stage, at once and for good") {
    const auto f = qwen_file();
    for (int victim : {1, 2}) {
        CAPTURE(victim);
        ranks rk(3, f);
        rt_pipe pipe(f, *rk.c0, {.timeout = patience}, backend::cpu_options{.threads = 1});
        session s = pipe.new_session({.ctx = 32});
        std::vector<float> out;
        const std::vector<token> ids = {1, 2, 3};
        const pass_request r{&s, pass_kind::commit, ids, 1};
        pipe.run(std::span(&r, 1), out, true);
        rk.g.kill(victim);
        const std::string name = pipeline::stage_name(victim, pipe.split()[std::size_t(victim)]);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string msg = testutil::error_of([&] { pipe.run(std::span(&r, 1), out, true); });
        CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // the deadline is 20 s: it did not wait for it
        CHECK(msg.find(name + " failed") != std::string::npos);
        CHECK(msg.find("killed") != std::string::npos);
        // Broken for good: every later operation says the same, and so does a session operation.
        CHECK(testutil::error_of([&] { pipe.checkpoint(s); }) == msg);
        CHECK(pipe.broken() == msg);
        bool threw = false;
        try {
            pipe.run(std::span(&r, 1), out, true);
        } catch (const pipeline::stage_error& e) {
            threw = true;
            CHECK(e.stage() == victim);
        }
        CHECK(threw);
    }
}

namespace {
// A stage that fails where the test says: its pass number `bad_pass` (0: the first), or every
// checkpoint. serve_stage calls these in place of the model's.
struct faulty : rt_model {
    using rt_model::rt_model;
    int bad_pass = -1;
    bool bad_checkpoint = false;
    void run_stage(std::span<const pass_request> reqs, const float* h, std::vector<float>& out, bool exact = false) {
        if (bad_pass-- == 0) fail("injected pass failure");
        rt_model::run_stage(reqs, h, out, exact);
    }
    void checkpoint(session& s) {
        if (bad_checkpoint) fail("checkpoint refused");
        rt_model::checkpoint(s);
    }
};
ranks::body_fn faulty_ranks(std::shared_ptr<const io::gguf_file> f, int rank, int bad_pass, bool bad_checkpoint) {
    return [=](int r, dist::communicator& c) {
        faulty m(f, pipeline::stage_of_rank(*f, c), backend::cpu_options{.threads = 1});
        if (r == rank) {
            m.bad_pass = bad_pass;
            m.bad_checkpoint = bad_checkpoint;
        }
        return pipeline::serve_stage(m, c, {patience});
    };
}
}  // namespace

TEST_CASE("pipeline: a stage's own failure comes back to rank 0 naming the stage; the pipeline stays broken") {
    const auto f = qwen_file();
    const std::vector<token> ids = {1, 2, 3};
    std::vector<float> out;
    {  // the last stage fails its second pass: the failure comes back in place of the logits
        ranks rk(3, faulty_ranks(f, 2, 1, false));
        rt_pipe pipe(f, *rk.c0, {.timeout = patience}, backend::cpu_options{.threads = 1});
        session s = pipe.new_session({.ctx = 32});
        const pass_request r{&s, pass_kind::commit, ids, 1};
        pipe.run(std::span(&r, 1), out, true);
        const std::string msg = testutil::error_of([&] { pipe.run(std::span(&r, 1), out, true); });
        CHECK(msg == "pipeline: " + pipeline::stage_name(2, pipe.split()[2]) + " failed: injected pass failure");
        CHECK(s.n_past() == 3);  // the failed pass added nothing
        CHECK(testutil::error_of([&] { (void)pipe.new_session({.ctx = 8}); }) == msg);
    }
    {  // a middle stage refuses a command: the next pass fails naming it (the chain passes it on)
        ranks rk(3, faulty_ranks(f, 1, -1, true));
        rt_pipe pipe(f, *rk.c0, {.timeout = patience}, backend::cpu_options{.threads = 1});
        session s = pipe.new_session({.ctx = 32});
        const pass_request r{&s, pass_kind::commit, ids, 1};
        pipe.run(std::span(&r, 1), out, true);
        pipe.checkpoint(s);  // no round trip: rank 0's own stage took it
        const std::string msg = testutil::error_of([&] { pipe.run(std::span(&r, 1), out, true); });
        CHECK(msg == "pipeline: " + pipeline::stage_name(1, pipe.split()[1]) + " failed: checkpoint refused");
        CHECK(pipe.broken() == msg);
    }
}

TEST_CASE("pipeline: a rank that does not answer fails within the deadline, naming its stage") {
    const auto f = qwen_file();
    // Rank 1 takes its endpoint but never serves: the hello waits for it until the deadline.
    ranks rk(2, [](int, dist::communicator&) {
        std::this_thread::sleep_for(1500ms);
        return std::string("slept");
    });
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = testutil::error_of([&] { rt_pipe p(f, *rk.c0, {.timeout = dist::duration(300)}, backend::cpu_options{.threads = 1}); });
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took >= 300ms);
    CHECK(took < 1400ms);
    CHECK(msg.find("stage 1 (rank 1, layers [3, 5)) failed") != std::string::npos);
    CHECK(msg.find("within 300 ms") != std::string::npos);
}

TEST_CASE("pipeline: a bad split is one clear error before anything is loaded; a rank of another split is named") {
    const auto f = qwen_file();  // 5 layers
    const std::vector<std::int64_t> three = {3, 2, 1};
    CHECK_THROWS_WITH_AS(pipeline::split_layers(5, 2, three), doctest::Contains("gives 3 stages but there are 2 ranks"), error);
    CHECK_THROWS_WITH_AS(pipeline::split_layers(5, 2, std::vector<std::int64_t>{3, 3}), doctest::Contains("adds up to 6 layers but the model has 5"), error);
    CHECK_THROWS_WITH_AS(pipeline::split_layers(5, 2, std::vector<std::int64_t>{5, 0}), doctest::Contains("gives rank 1 0 layers"), error);
    CHECK_THROWS_WITH_AS(pipeline::split_layers(5, 6), doctest::Contains("5 layers cannot be split over 6 ranks"), error);
    CHECK_THROWS_WITH_AS(pipeline::parse_layer_split("3,x"), doctest::Contains("'x' is not a count of layers"), error);
    CHECK_THROWS_WITH_AS(pipeline::parse_layer_split("3,,5"), doctest::Contains("'' is not a count"), error);
    CHECK(pipeline::parse_layer_split("3,5") == std::vector<std::int64_t>{3, 5});
    CHECK(pipeline::split_layers(8, 3) == std::vector<stage_range>{{0, 3}, {3, 6}, {6, 8}});
    CHECK(pipeline::split_layers(8, 2, std::vector<std::int64_t>{3, 5}) == std::vector<stage_range>{{0, 3}, {3, 8}});

    {  // rank 0 refuses the split before loading: the ranks' own split fails alike, and they stop
        ranks rk(2, f, {2, 2});
        CHECK_THROWS_WITH_AS(rt_pipe(f, *rk.c0, {.layer_split = {2, 2}, .timeout = patience}, backend::cpu_options{.threads = 1}),
                             doctest::Contains("the layer split adds up to 4 layers but the model has 5"), error);
        rk.c0.reset();
        for (auto& t : rk.ts) t.join();
        rk.ts.clear();
        CHECK(rk.result[1].find("adds up to 4 layers") != std::string::npos);
    }
    {  // a rank loaded with another split than rank 0's: the hello names it; it stops at shutdown
        ranks rk(2, ranks::serving(f, {2, 3}));
        const std::string msg = testutil::error_of([&] {
            rt_pipe p(f, *rk.c0, {.layer_split = {3, 2}, .timeout = patience}, backend::cpu_options{.threads = 1});
        });
        CHECK(msg.find("stage 1 (rank 1, layers [3, 5)): it runs layers [2, 5) but rank 0's split gives it [3, 5)") != std::string::npos);
        rk.c0.reset();
        for (auto& t : rk.ts) t.join();
        rk.ts.clear();
        CHECK(rk.result[1].find("it runs layers [2, 5)") != std::string::npos);
    }
    {  // serve_stage on rank 0, or with the first stage, is refused
        dist::local_group g(2);
        auto c0 = g.endpoint(0), c1 = g.endpoint(1);
        rt_model first(f, stage_range{0, 3}, backend::cpu_options{.threads = 1});
        CHECK_THROWS_WITH_AS(pipeline::serve_stage(first, *c0), doctest::Contains("rank 0 drives the pipeline"), error);
        CHECK_THROWS_WITH_AS(pipeline::serve_stage(first, *c1), doctest::Contains("holds the first stage"), error);
    }
}

namespace {

// Seven sequences in every pass, of every segment kind at once (prefill, decode, preview with and
// without a coreset, verify, a segment without logits), then rollbacks and a decode of them all:
// cut into micro-batches, the whole model's bits.
void many(side_by_side& p, bool diffusion, std::uint64_t seed) {
    const std::int64_t V = p.whole.n_vocab();
    std::vector<seq_pair> s;
    for (int i = 0; i < 7; ++i) s.push_back(p.open());
    auto at = [&](int i) { return &s[std::size_t(i)]; };
    std::vector<step> pre;
    for (int i = 0; i < 7; ++i) {
        const std::int64_t n = 2 + 3 * i;
        pre.push_back({at(i), pass_kind::commit, pl_ids(n, V, seed + std::uint64_t(i)), i % 2 ? n : 1});
    }
    p.check(pre);
    auto block = pl_ids(4, V, seed + 10);
    block[1] = token(p.whole.hp().mask_token_id);
    auto preview_or_decode = [&](int i, std::int64_t coreset) {
        return diffusion ? step{at(i), pass_kind::preview, block, 4, coreset} : step{at(i), pass_kind::commit, pl_ids(1, V, seed + 11), 1};
    };
    p.check({{at(0), pass_kind::commit, pl_ids(1, V, seed + 12), 1},
             {at(1), pass_kind::verify, pl_ids(3, V, seed + 13), 3},
             preview_or_decode(2, 2),
             {at(3), pass_kind::commit, pl_ids(1, V, seed + 14), 1},
             {at(4), pass_kind::verify, pl_ids(2, V, seed + 15), 2},
             preview_or_decode(5, -1),
             {at(6), pass_kind::commit, pl_ids(5, V, seed + 16), 0}});
    p.each(*at(1), [](auto& m, session& x) { m.rollback(x, 1); });
    p.each(*at(4), [](auto& m, session& x) { m.rollback(x, 2); });
    std::vector<step> dec;
    for (int i = 6; i >= 0; --i) dec.push_back({at(i), pass_kind::commit, pl_ids(1, V, seed + 20 + std::uint64_t(i)), 1});
    p.check(dec);  // another order than the sessions were opened in
}

}  // namespace

TEST_CASE("pipeline: micro_batch_cuts cuts by request, in order, about equal rows, never more groups than requests") {
    using v = std::vector<std::size_t>;
    const std::vector<std::int64_t> eight = {64, 1, 1, 1, 1, 1, 1, 64};
    CHECK(pipeline::micro_batch_cuts(eight, 2) == v{0, 4, 8});  // 67 rows each
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>(8, 1), 2) == v{0, 4, 8});
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>(8, 1), 3) == v{0, 3, 6, 8});
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>(8, 1), 2, 4) == v{0, 2, 4, 6, 8});
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>{1, 1, 1}, 2, 9) == v{0, 1, 2, 3});  // one per request at most
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>{1, 1, 100}, 3) == v{0, 1, 2, 3});  // every group gets one
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>{100, 1, 1}, 3) == v{0, 1, 2, 3});
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>{5}, 4) == v{0, 1});      // one request: one message per boundary
    CHECK(pipeline::micro_batch_cuts(std::vector<std::int64_t>{1, 2, 3}, 1) == v{0, 3});  // one stage: one pass
    CHECK_THROWS_WITH_AS(pipeline::micro_batch_cuts(eight, 2, -1), doctest::Contains("-1 micro-batches"), error);
}

TEST_CASE("pipeline: many sequences of mixed kinds as micro-batches, 2 and 3 stages, bit for bit; counters add up") {
    struct config {
        std::shared_ptr<const io::gguf_file> f;
        int n;
        std::vector<std::int64_t> counts;
        bool diffusion;
        std::int64_t micro;
    };
    const auto clover_file = load(bundled_pl);
    const auto qwen = qwen_file();
    for (const config& cf : std::vector<config>{{clover_file, 2, {}, true, 0},
                                                {clover_file, 3, {3, 2, 3}, true, 0},
                                                {clover_file, 2, {}, true, 7},
                                                {qwen, 3, {1, 2, 2}, false, 4}}) {
        CAPTURE(cf.n);
        CAPTURE(cf.micro);
        rt_model whole(cf.f, backend::cpu_options{.threads = 1});
        ranks rk(cf.n, cf.f, cf.counts);
        {
            rt_pipe pipe(cf.f, *rk.c0, {.layer_split = cf.counts, .timeout = patience, .micro_batches = cf.micro},
                         backend::cpu_options{.threads = 1});
            side_by_side p{whole, pipe};
            const auto before = pipe.gather_stats();
            REQUIRE(before.size() == std::size_t(cf.n));
            many(p, cf.diffusion, 100);
            const auto after = pipe.gather_stats();
            // Three passes of seven sequences, each cut into `per` micro-batches that every rank ran.
            const std::uint64_t per = cf.micro ? std::uint64_t(cf.micro) : std::uint64_t(cf.n);
            CHECK(pipe.passes() == 3);
            for (int r = 0; r < cf.n; ++r) {
                CAPTURE(r);
                CHECK(after[std::size_t(r)].micro_batches - before[std::size_t(r)].micro_batches == 3 * per);
                CHECK(after[std::size_t(r)].rows == after[0].rows);
                CHECK(after[std::size_t(r)].comm.bytes_sent > before[std::size_t(r)].comm.bytes_sent);
            }
            // The last rank sent at least every logits row of many()'s three passes (f32, n_vocab each).
            const std::int64_t logits_rows = 37 + (cf.diffusion ? 15 : 9) + 7;
            CHECK(after.back().comm.bytes_sent - before.back().comm.bytes_sent >= std::uint64_t(logits_rows * whole.n_vocab() * 4));
            CHECK(after[0].comm.bytes_received >= after.back().comm.bytes_sent - before.back().comm.bytes_sent);

            // Bad input in a later micro-batch fails before the first one leaves: nothing moved.
            const std::int64_t V = whole.n_vocab();
            std::vector<seq_pair> s;
            for (int i = 0; i < 5; ++i) s.push_back(p.open({.ctx = 8}));
            auto run_pipe = [&](std::vector<step> steps) {
                std::vector<pass_request> q;
                for (const step& x : steps) q.push_back({&x.s->pipe, x.kind, x.ids, x.logits, x.coreset});
                std::vector<float> out;
                pipe.run(q, out, true);
            };
            std::vector<step> bad;
            for (int i = 0; i < 5; ++i) bad.push_back({&s[std::size_t(i)], pass_kind::commit, pl_ids(2, V, 200 + std::uint64_t(i)), 1});
            bad[4].ids[1] = token(V);
            const std::string out_of_range = "token id " + std::to_string(V) + " at position 1 is out of range";
            CHECK_THROWS_WITH_AS(run_pipe(bad), doctest::Contains(out_of_range.c_str()), error);
            bad[4].ids = pl_ids(9, V, 210);
            CHECK_THROWS_WITH_AS(run_pipe(bad), doctest::Contains("context full: 0 + 9 tokens exceed the context size 8"), error);
            bad[4] = {&s[0], pass_kind::commit, pl_ids(1, V, 211), 1};
            CHECK_THROWS_WITH_AS(run_pipe(bad), doctest::Contains("has two segments in one pass"), error);
            CHECK(pipe.broken().empty());
            CHECK(s[0].pipe.n_past() == 0);
            bad[4] = {&s[4], pass_kind::commit, pl_ids(2, V, 212), 2};
            p.check(bad);  // every stage is where it was: the same bits as the whole model
        }
        rk.c0.reset();
        for (auto& t : rk.ts) t.join();
        rk.ts.clear();
        for (int r = 1; r < cf.n; ++r) CHECK(rk.result[std::size_t(r)] == "");
    }
}

TEST_CASE("pipeline: a rank that dies or fails in the middle of a pass's micro-batches ends in a stage_error, no hang") {
    const auto f = qwen_file();
    const std::vector<token> ids = {1, 2, 3};
    for (int n : {2, 3}) {
        for (bool kill : {true, false}) {
            CAPTURE(n);
            CAPTURE(kill);
            // Rank 1 fails (or its process is gone) in its second micro-batch of the first pass.
            auto group = std::make_shared<dist::local_group*>(nullptr);
            ranks rk(n, [f, kill, group](int r, dist::communicator& c) {
                struct dying : faulty {
                    using faulty::faulty;
                    dist::local_group* g = nullptr;
                    int self = 0;
                    void run_stage(std::span<const pass_request> reqs, const float* h, std::vector<float>& out, bool exact = false) {
                        if (g && bad_pass == 0) g->kill(self);
                        faulty::run_stage(reqs, h, out, exact);
                    }
                };
                dying m(f, pipeline::stage_of_rank(*f, c), backend::cpu_options{.threads = 1});
                if (r == 1) {
                    m.bad_pass = 1;
                    m.g = kill ? *group : nullptr;
                    m.self = r;
                }
                return pipeline::serve_stage(m, c, {patience});
            });
            *group = &rk.g;
            rt_pipe pipe(f, *rk.c0, {.timeout = patience, .micro_batches = 3}, backend::cpu_options{.threads = 1});
            std::vector<session> s;
            for (int i = 0; i < 6; ++i) s.push_back(pipe.new_session({.ctx = 32}));
            std::vector<pass_request> q;
            for (session& x : s) q.push_back({&x, pass_kind::commit, ids, 1});
            std::vector<float> out;
            const auto t0 = std::chrono::steady_clock::now();
            const std::string msg = testutil::error_of([&] { pipe.run(q, out, true); });
            CHECK(std::chrono::steady_clock::now() - t0 < 2s);  // the deadline is 20 s: it did not wait for it
            // Killed: rank 0 finds it gone itself, or the next rank says its rows did not come.
            if (kill) CHECK(msg.find("rank 1 is gone (killed)") != std::string::npos);
            else CHECK(msg == "pipeline: " + pipeline::stage_name(1, pipe.split()[1]) + " failed: injected pass failure");
            CHECK(pipe.broken() == msg);
            bool threw = false;
            try {
                pipe.run(q, out, true);
            } catch (const pipeline::stage_error& e) {
                threw = true;
                CHECK(e.stage() == 1);
            }
            CHECK(threw);
        }
    }
}
