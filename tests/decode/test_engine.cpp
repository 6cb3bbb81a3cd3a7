// decode::engine driven directly (decode/engine.hpp): a request abandoned half way through its
// prompt leaves, and the one beside it gets the tokens it gets alone; a prompt that begins with a
// cached prefix resumes from it and answers as if computed whole; a full queue and a shut-down
// engine refuse at submit; a request the file cannot run fails at admission through its sink; a
// model thread's serve() loop ends the running request at shutdown and serves again after reopen.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <clover/clover.hpp>
#include <clover/decode/engine.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
using eng_t = decode::engine<rt_model>;

struct outcome {
    std::vector<token> tokens;
    decode::engine_result end;
    int ends = 0;
};

decode::engine_request<> request_for(std::vector<token> prompt, std::int64_t n, decode::builtin_decoder dec, outcome& out) {
    decode::engine_request<> r;
    r.prompt = std::move(prompt);
    r.gen.max_tokens = n;
    r.gen.ignore_eos = true;
    r.dec = dec;
    r.sink.on_token = [&out](token t) {
        out.tokens.push_back(t);
        return true;
    };
    r.sink.on_end = [&out](const decode::engine_result& e) {
        out.end = e;
        ++out.ends;
    };
    return r;
}

rt_model& tiny() {
    static std::unique_ptr<rt_model> m = [] {
        auto spec = synth::preset("tiny");
        spec.arch = "clover_moe";
        spec.rope_theta = 100.f;
        return std::make_unique<rt_model>(load(testutil::synth_file("engine_tiny.gguf", spec)), backend::cpu::options{2});
    }();
    return *m;
}

}  // namespace

TEST_CASE("engine: a request abandoned mid-prefill leaves; the other gets exactly its tokens alone") {
    rt_model& m = tiny();
    // 1,200 tokens: three prompt chunks of a session's 512-row batch, so one step leaves it half done.
    const auto long_prompt = testutil::random_ids(1200, 500, 11);
    const auto short_prompt = testutil::random_ids(37, 500, 12);
    for (decode::builtin_decoder dec : {decode::builtin_decoder(decode::ar{}), decode::builtin_decoder(decode::self_speculative{6, 1, 0.95f, -1})}) {
        CAPTURE(dec.index());
        outcome alone;
        {
            eng_t e(m, {.parallel = 2, .exact = true});
            e.submit(request_for(short_prompt, 14, dec, alone));
            e.run_until_idle();
        }
        REQUIRE(alone.ends == 1);
        REQUIRE(alone.tokens.size() == 14);

        outcome a, b;
        eng_t e(m, {.parallel = 2, .exact = true});
        auto ha = e.submit(request_for(long_prompt, 20, decode::ar{}, a));
        auto hb = e.submit(request_for(short_prompt, 14, dec, b));
        REQUIRE(e.step());  // both admitted; the long prompt's first chunk computed
        CHECK(e.stats().running == 2);
        CHECK(a.tokens.empty());
        ha->abandon();
        e.run_until_idle();
        CHECK(a.ends == 1);
        CHECK(a.tokens.empty());
        CHECK(a.end.abandoned);
        CHECK(a.end.error.empty());
        CHECK(a.end.stats.stop_reason == "cancelled");
        CHECK(a.end.stats.prompt_tokens == 0);  // its prompt never finished
        CHECK(b.ends == 1);
        CHECK_FALSE(b.end.abandoned);
        CHECK(b.tokens == alone.tokens);
        const auto st = e.stats();
        CHECK(st.requests == 2);
        CHECK(st.cancelled == 1);
        CHECK(st.completed == 1);
        CHECK(st.running == 0);
        CHECK(st.peak_running == 2);
        CHECK(st.generated_tokens == 14);
        (void)hb;
    }
}

TEST_CASE("engine: a prompt that begins with a cached prefix resumes at a cut and answers as if computed whole") {
    rt_model& m = tiny();
    constexpr token boundary = 7;  // stands for <|im_start|>
    auto turn1 = testutil::random_ids(90, 500, 21);
    for (auto& t : turn1)
        if (t == boundary) t = boundary + 1;
    turn1[70] = boundary;  // a message starts after 71 tokens: a cut at 71
    auto turn2 = turn1;
    for (token t : testutil::random_ids(30, 500, 22)) turn2.push_back(t == boundary ? boundary + 1 : t);

    outcome fresh;
    {
        eng_t e(m, {.exact = true, .boundary = boundary, .boundary_gap = 16});
        e.submit(request_for(turn2, 10, decode::ar{}, fresh));
        e.run_until_idle();
    }
    eng_t e(m, {.exact = true, .cache_bytes = std::size_t(256) << 20, .boundary = boundary, .boundary_gap = 16});
    outcome first, second;
    e.submit(request_for(turn1, 4, decode::ar{}, first));
    e.run_until_idle();
    CHECK(first.end.stats.cached_tokens == 0);
    e.submit(request_for(turn2, 10, decode::ar{}, second));
    e.run_until_idle();
    CHECK(second.end.stats.cached_tokens == 71);
    CHECK(second.end.stats.prompt_tokens == std::int64_t(turn2.size()));
    CHECK(second.tokens == fresh.tokens);
    const auto st = e.stats();
    CHECK(st.cache.hits == 1);
    CHECK(st.cached_tokens == 71);
    // cache_prompt = false neither looks up nor keeps.
    outcome third;
    auto r = request_for(turn2, 10, decode::ar{}, third);
    r.cache_prompt = false;
    e.submit(std::move(r));
    e.run_until_idle();
    CHECK(third.end.stats.cached_tokens == 0);
    CHECK(third.tokens == fresh.tokens);
}

TEST_CASE("engine: a full queue and a shut-down engine refuse at submit; a bad request fails through its sink") {
    rt_model& m = tiny();
    eng_t e(m, {.max_queue = 1});
    outcome a, b, c;
    e.submit(request_for({1, 2, 3}, 2, decode::ar{}, a));
    try {
        e.submit(request_for({1, 2, 3}, 2, decode::ar{}, b));
        FAIL("a second request found room in a queue of one");
    } catch (const decode::engine_refused& r) {
        CHECK_FALSE(r.shutting_down);
        CHECK(r.queued == 1);
    }
    e.run_until_idle();
    CHECK(a.ends == 1);
    CHECK(a.tokens.size() == 2);
    CHECK(b.ends == 0);
    e.submit(request_for({}, 2, decode::ar{}, c));  // an empty prompt: refused at admission
    e.run_until_idle();
    CHECK(c.ends == 1);
    CHECK(c.end.error.find("prompt is empty") != std::string::npos);
    outcome q;
    e.submit(request_for({4, 5}, 2, decode::ar{}, q));
    e.shutdown("closing");
    CHECK(q.ends == 1);
    CHECK(q.end.error == "closing");
    CHECK_THROWS_AS(e.submit(request_for({1}, 1, decode::ar{}, b)), decode::engine_refused);
    e.reopen();
    e.submit(request_for({1, 2}, 3, decode::ar{}, b));
    e.run_until_idle();
    CHECK(b.tokens.size() == 3);
}

TEST_CASE("engine: serve() on a model thread; shutdown ends the running request with its reason; served again after reopen") {
    rt_model& m = tiny();
    eng_t e(m, {.parallel = 2});
    std::atomic<int> seen{0};
    outcome a, b;
    auto ra = request_for(testutil::random_ids(20, 500, 31), 100000, decode::ar{}, a);
    ra.ctx = 4096;
    ra.sink.on_token = [&](token t) {
        a.tokens.push_back(t);
        ++seen;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow consumer: the shutdown comes mid-answer
        return true;
    };
    std::thread worker([&] { e.serve(); });
    e.submit(std::move(ra));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (seen.load() < 3 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(seen.load() >= 3);
    e.shutdown("going away");
    worker.join();
    CHECK(a.ends == 1);
    CHECK(a.end.error == "going away");
    CHECK(e.stats().running == 0);
    // The runner let go of the request it held: a second life serves a new one.
    e.reopen();
    std::thread again([&] { e.serve(); });
    e.submit(request_for({1, 2, 3}, 4, decode::ar{}, b));
    const auto until2 = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (e.stats().completed < 2 && std::chrono::steady_clock::now() < until2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    e.shutdown("done");
    again.join();
    CHECK(b.ends == 1);
    CHECK(b.end.error.empty());
    CHECK(b.tokens.size() == 4);
}
