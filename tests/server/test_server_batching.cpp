// Continuous batching (decode/runner.hpp behind server.hpp): requests that generate together —
// AR, diffusion and speculative ones in the same steps, prompts chunked under a small token
// budget, a client leaving in the middle — each get exactly the answer they get alone; a
// costly request (a 64-row block deciding one token a pass) gets its fair share of the rows, not
// every step, and the progress rule cuts its block back.
#include <doctest/doctest.h>

#include <algorithm>
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

namespace {

// The tiny model whose passes cost time in proportion to their rows, as a CPU's do once a model
// is large enough to be compute-bound (the bundled model: a 1,024-row preview 1.2 s, a decode
// row 1.25 ms). On the tiny model itself a pass costs about the same whatever its rows, which
// would hide what a large block does to the requests beside it.
struct row_cost_model : rt_model {
    using rt_model::rt_model;
    std::chrono::microseconds per_row{150};
    void run(std::span<const pass_request> reqs, std::vector<float>& logits, bool exact = false) {
        std::int64_t rows = 0;
        for (const auto& r : reqs) rows += std::int64_t(r.ids.size());
        std::this_thread::sleep_for(per_row * rows);
        rt_model::run(reqs, logits, exact);
    }
};
row_cost_model& costly() {
    static row_cost_model m{load(model_path()), backend::cpu_options{2}};
    return m;
}

json ar_request(int max_tokens) {
    json r = {{"prompt", "A fair share: "}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
    return r;
}
// The audit's hostile request, within the caps: every pass a whole 64-row block deciding one token.
json hostile_request(int max_tokens) {
    return {{"prompt", "Stall the batch: "}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
            {"decoder", "diffusion"}, {"block", 64}, {"threshold", 1.0}};
}
double per_token_ms(const json& body) { return body["timings"]["predicted_per_token_ms"].get<double>(); }
std::int64_t metric(const std::string& text, const std::string& name) {
    const auto at = text.find("\nclover_" + name + " ");
    return at == std::string::npos ? -1 : std::stoll(text.substr(at + name.size() + 9));
}

}  // namespace

TEST_CASE("batching: a threshold-1.0 64-row diffusion request leaves an AR request beside it within 2x of its time alone") {
    auto& f = fx();
    auto o = opts();
    o.max_rows_per_token = 0;  // the progress rule off: every pass of the hostile request stays a 64-row block
    server::basic_server<row_cost_model> srv(costly(), f.tok, o);
    const int port = srv.start();
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    std::vector<double> alone, beside;
    for (int k = 0; k < 3; ++k) {
        const auto r = post(port, "/v1/completions", ar_request(192));
        REQUIRE(r.status == 200);
        alone.push_back(per_token_ms(r.body));
    }
    // The hostile client streams (~20 s of passes alone) until it hangs up.
    json h = hostile_request(2000);
    h["stream"] = true;
    raw_conn hostile(port);
    REQUIRE(hostile.send(http_request("POST", "/v1/completions", h.dump())));
    REQUIRE(eventually([&] { return srv.stats().running == 1; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its prompt done: every pass is now a 64-row block
    for (int k = 0; k < 3; ++k) {
        const auto r = post(port, "/v1/completions", ar_request(192));
        REQUIRE(r.status == 200);
        CHECK(r.body["usage"]["completion_tokens"] == 192);
        beside.push_back(per_token_ms(r.body));
    }
    CHECK(srv.stats().running == 1);  // the hostile request was there all along
    const auto text = get(port, "/metrics").raw;
    hostile.close();
    CHECK(eventually([&] { return srv.stats().cancelled == 1 && srv.stats().running == 0; }));
    MESSAGE("AR ms per token alone ", median(alone), ", beside the 64-row diffusion request ", median(beside));
    // The fair share gives the block one step in 64 beside a 1-row AR request (3 of the 192 here):
    // ~1.3x. Before it, the block ran in every step: ~25x (65 rows a step instead of 1).
    CHECK(median(beside) < 2.0 * median(alone));
    CHECK(metric(text, "block_limit") == 64);
    CHECK(metric(text, "draft_limit") == 32);
    CHECK(metric(text, "step_rows_limit") == 512);
    CHECK(metric(text, "progress_rows_per_token_limit") == 0);
    CHECK(metric(text, "step_rows_max") >= 65);  // the block and an AR row, in the steps the block had
    CHECK(metric(text, "step_rows_max") <= 512);
    CHECK(metric(text, "segments_deferred_total") > 0);
    CHECK(metric(text, "steps_total") > 3 * 192);
    CHECK(metric(text, "step_rows_total") > metric(text, "steps_total"));
}

TEST_CASE("batching: the progress rule halves a block that decides too little per row, alone or batched alike") {
    auto& f = fx();
    server::basic_server<row_cost_model> srv(costly(), f.tok, opts());
    const int port = srv.start();
    // 64 passes of 64 rows for 64 tokens (65 rows a token with the commit) halve the block to 32;
    // 33 rows a token halve it to 16; 17 are within the default 32.
    auto alone = stream(port, "/v1/completions", hostile_request(160));
    REQUIRE(alone.done);
    CHECK(alone.chunks.back()["timings"]["block_cuts"] == 2);
    CHECK(alone.chunks.back()["usage"]["completion_tokens"] == 160);
    streamed batched;
    std::thread th([&] { batched = stream(port, "/v1/completions", hostile_request(160)); });
    REQUIRE(eventually([&] { return srv.stats().running == 1; }));
    CHECK(post(port, "/v1/completions", ar_request(100)).status == 200);
    th.join();
    REQUIRE(batched.done);
    CHECK(batched.text == alone.text);
    CHECK(batched.chunks.back()["timings"]["block_cuts"] == 2);
    const auto text = get(port, "/metrics").raw;
    CHECK(metric(text, "requests_cut_back_total") == 2);
    CHECK(metric(text, "progress_rows_per_token_limit") == 32);
}

TEST_CASE("batching: --batch-tokens bounds every step's rows, diffusion and speculative blocks included") {
    auto& f = fx();
    auto& m = costly();  // slow enough that the four surely generate together
    auto request = [](int k) {
        return json{{"prompt", json::array({7 + k})}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true},
                    {"decoder", k % 2 ? "speculative" : "diffusion"}, {"block", 8}};
    };
    auto text_of = [](const reply& r) { return r.status == 200 ? r.body["choices"][0]["text"].get<std::string>() : "<failed>"; };
    std::vector<std::string> ref;
    {
        server::basic_server<row_cost_model> one(m, f.tok, serial_opts());
        const int p1 = one.start();
        for (int k = 0; k < 4; ++k) ref.push_back(text_of(post(p1, "/v1/completions", request(k))));
    }
    auto o = opts();
    o.parallel = 4;
    o.batch_tokens = 16;  // two 8-row blocks a step: four requests' blocks take turns
    server::basic_server<row_cost_model> srv(m, f.tok, o);
    const int port = srv.start();
    std::vector<std::string> got(4);
    std::vector<std::thread> th;
    for (int k = 0; k < 4; ++k) th.emplace_back([&, k] { got[std::size_t(k)] = text_of(post(port, "/v1/completions", request(k))); });
    for (auto& t : th) t.join();
    for (int k = 0; k < 4; ++k) CHECK(got[std::size_t(k)] == ref[std::size_t(k)]);
    CHECK(srv.stats().peak_running >= 3);
    const auto c = srv.stats().steps;
    CHECK(c.max_rows <= 16);  // before: every running block in every step, up to 32 rows
    CHECK(c.max_rows >= 8);
    CHECK(c.deferred > 0);
    // The caps in force follow the budget: a 32-row block cannot fit a 16-row step.
    json big = request(0);
    big["block"] = 32;
    const auto r = post(port, "/v1/completions", big);
    CHECK(is_error(r, 400));
    CHECK(r.body["error"]["param"] == "block");
    CHECK(r.body["error"]["message"].get<std::string>().find("at most 16") != std::string::npos);
}
