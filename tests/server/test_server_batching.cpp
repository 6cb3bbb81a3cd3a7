// Continuous batching (decode/runner.hpp behind server.hpp): requests that generate together —
// AR, diffusion and speculative ones in the same steps, prompts chunked under a small token
// budget, a client leaving in the middle — each get exactly the answer they get alone.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "server_test_util.hpp"

using namespace server_test;

namespace {

json request_for(int k, int max_tokens = 20) {
    json r = user("request " + std::to_string(k) + ": " + std::string(std::size_t(3 + 7 * k), 'x'));
    r["max_tokens"] = max_tokens;
    r["temperature"] = 0;
    r["decoder"] = k % 3 == 0 ? "ar" : k % 3 == 1 ? "diffusion" : "speculative";
    r["block"] = 4 + k % 3;
    r["chat_template_kwargs"] = {{"enable_thinking", k % 2 == 0}};
    return r;
}

std::string answer_of(const reply& r) {
    if (r.status != 200) return "<status " + std::to_string(r.status) + ">";
    const json& m = r.body["choices"][0]["message"];
    return (m["content"].is_string() ? m["content"].get<std::string>() : std::string()) + "|" + m.value("reasoning_content", std::string());
}

std::string answer_of(const streamed& s) { return s.done ? s.content + "|" + s.reasoning : "<stream failed>"; }

// Each request alone, on a server that runs one generation at a time.
std::vector<std::string> alone(int n, int max_tokens = 20) {
    auto& f = fx();
    server::server srv(f.m, f.tok, serial_opts());
    const int port = srv.start();
    std::vector<std::string> out;
    for (int k = 0; k < n; ++k) out.push_back(answer_of(post(port, "/v1/chat/completions", request_for(k, max_tokens))));
    return out;
}

}  // namespace

TEST_CASE("batching: 8 requests with mixed decoders generate together and each equals itself alone") {
    auto& f = fx();
    const auto ref = alone(8);
    for (std::int64_t budget : {512, 9}) {  // 9: prompts wait and go one chunk per step
        CAPTURE(budget);
        auto o = opts();
        o.parallel = 8;
        o.batch_tokens = budget;
        server::server srv(f.m, f.tok, o);
        const int port = srv.start();
        std::vector<std::string> got(8);
        std::vector<std::thread> th;
        for (int k = 0; k < 8; ++k)
            th.emplace_back([&, k] {
                if (k % 2) {
                    auto s = stream(port, "/v1/chat/completions", request_for(k));
                    got[std::size_t(k)] = answer_of(s);
                } else {
                    got[std::size_t(k)] = answer_of(post(port, "/v1/chat/completions", request_for(k)));
                }
            });
        for (auto& t : th) t.join();
        for (int k = 0; k < 8; ++k) {
            CAPTURE(k);
            CHECK(got[std::size_t(k)] == ref[std::size_t(k)]);
        }
        const auto c = srv.stats();
        CHECK(c.completed == 8);
        CHECK(c.peak_running >= 2);  // they really shared steps
        CHECK(c.running == 0);
        // The same counters for Prometheus.
        const auto metrics = get(port, "/metrics");
        CHECK(metrics.status == 200);
        CHECK(metrics.raw.find("# TYPE clover_requests_completed_total counter\nclover_requests_completed_total 8\n") != std::string::npos);
        CHECK(metrics.raw.find("clover_requests_running 0\n") != std::string::npos);
        CHECK(metrics.raw.find("clover_requests_running_peak " + std::to_string(c.peak_running) + "\n") != std::string::npos);
        CHECK(metrics.raw.find("clover_generated_tokens_total " + std::to_string(c.generated_tokens) + "\n") != std::string::npos);
        CHECK(c.generated_tokens > 0);
        CHECK(c.prompt_tokens > 0);
    }
}

TEST_CASE("batching: /metrics needs the API key when the server has one") {
    auto& f = fx();
    auto o = opts();
    o.api_key = "k3y";
    server::server srv(f.m, f.tok, o);
    const int port = srv.start();
    CHECK(get(port, "/metrics").status == 401);
    const auto ok = get(port, "/metrics", {{"Authorization", "Bearer k3y"}});
    CHECK(ok.status == 200);
    CHECK(ok.raw.find("clover_requests_total 0\n") != std::string::npos);
}

TEST_CASE("batching: a client that leaves mid-batch frees its sequence; the others' answers are unchanged") {
    auto& f = fx();
    auto o = opts();
    o.parallel = 4;
    server::server srv(f.m, f.tok, o);
    const int port = srv.start();
    std::vector<std::string> got(4);
    std::vector<std::thread> th;
    for (int k = 0; k < 4; ++k)
        th.emplace_back([&, k] {
            json r = request_for(k, 60);
            r["decoder"] = "ar";  // one token per step: the leaver is surely mid-generation
            r["chat_template_kwargs"] = {{"enable_thinking", false}};
            if (k == 1) {
                auto s = stream(port, "/v1/chat/completions", r, 3);  // hangs up after 3 chunks
                got[1] = s.done ? "<finished>" : "<left>";
            } else {
                auto s = stream(port, "/v1/chat/completions", r);
                got[std::size_t(k)] = answer_of(s);
            }
        });
    for (auto& t : th) t.join();
    CHECK(got[1] == "<left>");
    CHECK(eventually([&] { auto c = srv.stats(); return c.cancelled == 1 && c.completed == 3 && c.running == 0; }));
    // References with the same settings, alone.
    server::server one(f.m, f.tok, serial_opts());
    const int p1 = one.start();
    for (int k : {0, 2, 3}) {
        CAPTURE(k);
        json r = request_for(k, 60);
        r["decoder"] = "ar";
        r["chat_template_kwargs"] = {{"enable_thinking", false}};
        auto s = stream(p1, "/v1/chat/completions", r);
        REQUIRE(s.done);
        CHECK(got[std::size_t(k)] == answer_of(s));
    }
}

TEST_CASE("batching: --parallel and --batch-tokens below 1 are refused at construction") {
    auto& f = fx();
    auto o = opts();
    o.parallel = 0;
    CHECK_THROWS_WITH_AS(server::server(f.m, f.tok, o), doctest::Contains("--parallel must be at least 1"), error);
    o = opts();
    o.batch_tokens = 0;
    CHECK_THROWS_WITH_AS(server::server(f.m, f.tok, o), doctest::Contains("--batch-tokens must be at least 1"), error);
}
