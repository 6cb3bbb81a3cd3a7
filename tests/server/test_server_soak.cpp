// Soak: 1,000 requests from 16 clients at once against the bundled model
// (models/clover-small.gguf), good ones mixed with everything test_server_hostile sends one at
// a time (bad JSON and bytes, deep nesting, oversized, compressed and chunked bodies, foreign
// origins, unknown paths) and clients that hang up before, during and after their request.
// Every good request must get exactly the answer it gets when run alone (greedy), the server
// must not crash or hang, and its memory must come back: RSS within 10 % of where it started.
//
// Sanitizer builds run 500 requests (ASan makes each one ~7 times slower; 1,000 take 30 s and
// 450 MB there) and skip the RSS bound (ASan's quarantine holds freed memory on purpose).
#include <doctest/doctest.h>

#include <malloc.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "server_test_util.hpp"

using namespace server_test;

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_SANITIZED 1
#endif
#endif
#ifndef SOAK_SANITIZED
#define SOAK_SANITIZED 0
#endif

namespace {

constexpr int n_requests = SOAK_SANITIZED ? 500 : 1000;
constexpr int n_clients = 16;

std::size_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    std::size_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * std::size_t(::sysconf(_SC_PAGESIZE));
}

// The good requests: chat and text completions, streamed or not, greedy and short.
struct good_request {
    std::string path;
    json body;
    bool stream;
};
std::vector<good_request> good_requests() {
    std::vector<good_request> g;
    const char* prompts[] = {"Hello there", "What is a clover?", "def add(a, b):", "Once upon a time", "1, 2, 3,", "The capital of France"};
    for (int i = 0; i < 6; ++i) {
        json chat = {{"messages", json::array({{{"role", "user"}, {"content", prompts[i]}}})}, {"max_tokens", 3 + i % 3},
                     {"temperature", 0}, {"chat_template_kwargs", {{"enable_thinking", i % 2 == 0}}}};
        json text = {{"prompt", prompts[i]}, {"max_tokens", 4}, {"temperature", 0}};
        g.push_back({"/v1/chat/completions", chat, i % 2 == 1});
        g.push_back({"/v1/completions", text, i % 2 == 0});
    }
    return g;
}

// What a good request answered: the text (chat: reasoning + content), or empty with ok false.
struct answer {
    bool ok = false;
    std::string text;
    std::string why;
};
answer run_good(int port, const good_request& g) {
    answer a;
    if (g.stream) {
        auto s = stream(port, g.path, g.body);
        a.ok = s.status == 200 && s.done;
        a.text = g.path == "/v1/completions" ? s.text : s.reasoning + "|" + s.content;
        if (!a.ok) a.why = "stream status " + std::to_string(s.status) + (s.done ? "" : " without [DONE]");
    } else {
        auto r = post(port, g.path, g.body);
        a.ok = r.status == 200 && r.body.is_object();
        if (a.ok) {
            const json& c = r.body["choices"][0];
            if (g.path == "/v1/completions") a.text = c["text"].get<std::string>();
            else {
                const json& m = c["message"];
                a.text = m.value("reasoning_content", std::string()) + "|" + (m["content"].is_string() ? m["content"].get<std::string>() : "");
            }
        } else {
            a.why = "status " + std::to_string(r.status) + " " + r.raw.substr(0, 200);
        }
    }
    return a;
}

std::string chunked_body(std::size_t size) {
    std::string piece(16384, ' ');
    std::string out;
    char len[32];
    std::snprintf(len, sizeof len, "%zx\r\n", piece.size());
    out += "4\r\n{\"a\"\r\n";
    for (std::size_t n = 0; n < size; n += piece.size()) out += len + piece + "\r\n";
    return out + "0\r\n\r\n";
}

// One bad or rude request of kind k; an error message when the server answered wrongly.
std::string run_bad(int port, int k, std::mt19937& rng) {
    const std::string ok_body = json{{"prompt", "x"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
    auto expect = [](const raw_reply& r, int status, const char* what) -> std::string {
        if (r.is_error(status)) return {};
        return std::string(what) + ": expected a JSON " + std::to_string(status) + ", got " + std::to_string(r.status) + " " + r.body.substr(0, 120);
    };
    switch (k) {
    case 0: return expect(raw(port, http_request("POST", "/v1/chat/completions", "{\"messages\": [")), 400, "malformed JSON");
    case 1: return expect(raw(port, http_request("POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}")), 400, "invalid UTF-8");
    case 2: {
        std::string deep = "{\"prompt\": \"x\", \"deep\": " + std::string(20000, '[') + std::string(20000, ']') + "}";
        return expect(raw(port, http_request("POST", "/v1/completions", deep)), 400, "deep nesting");
    }
    case 3: return expect(raw(port, http_request("POST", "/v1/completions", R"({"prompt": "x", "temperature": "hot"})")), 400, "bad field");
    case 4: return expect(raw(port, http_request("GET", "/x%FF")), 404, "unknown path");
    case 5: return expect(raw(port, http_request("POST", "/v1/completions", ok_body, "Origin: http://evil.example\r\n")), 403, "foreign origin");
    case 6: return expect(raw(port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999\r\nConnection: close\r\n\r\n"),
                          413, "declared length");
    case 7: return expect(raw(port, http_request("POST", "/v1/completions", ok_body, "Content-Encoding: gzip\r\n")), 415, "compressed");
    case 8: {  // a chunked body past the limit: 413, or the connection ends; never a 200
        auto r = raw(port, http_request("POST", "/v1/completions", "", "Transfer-Encoding: chunked\r\n", false) + chunked_body(600 * 1024));
        if (r.status == 200 || (r.status != 0 && !r.is_error(413))) return "chunked past the limit: got " + std::to_string(r.status);
        return {};
    }
    case 9: {  // half the headers, then gone
        raw_conn c(port);
        c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le");
        return {};
    }
    case 10: {  // a whole request, then gone before the answer (running or queued: cancelled)
        raw_conn c(port);
        c.send(http_request("POST", "/v1/completions", json{{"prompt", "a long story"}, {"max_tokens", 64}}.dump()));
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 20));
        return {};
    }
    case 11: {  // a stream, dropped after the first chunk
        json b = {{"messages", json::array({{{"role", "user"}, {"content", "tell me a story"}}})}, {"max_tokens", 64}};
        (void)stream(port, "/v1/chat/completions", b, 1);
        return {};
    }
    case 12: {  // a body promised but never finished: the read timeout ends it
        raw_conn c(port);
        c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"prompt\"");
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
        return {};
    }
    default: {
        auto h = get(port, "/health");
        return h.status == 200 ? std::string() : "health: " + std::to_string(h.status);
    }
    }
}
constexpr int n_bad_kinds = 14;

}  // namespace

TEST_CASE("soak: 1,000 mixed requests from 16 clients: right answers, no crash or hang, memory comes back") {
    const std::string path = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";
    REQUIRE_MESSAGE(std::filesystem::exists(path), "the bundled model ", path, " is missing");
    rt_model m{load(path), backend::cpu_options{2}};
    const tokenizer tok = tokenizer::from_gguf(path);
    server::options o = opts();
    o.max_body_bytes = 256 * 1024;
    o.read_timeout_s = 2;  // requests that never finish are dropped within the run
    server::server srv(m, tok, o);
    const int port = srv.start();
    REQUIRE(port > 0);

    // The answers each good request gets when it runs alone.
    const auto goods = good_requests();
    std::vector<std::string> expected;
    for (const auto& g : goods) {
        auto a = run_good(port, g);
        REQUIRE_MESSAGE(a.ok, a.why);
        expected.push_back(a.text);
    }

    std::mutex mu;
    std::vector<std::string> errors;
    int good_done = 0;
    auto round = [&](int count, std::uint32_t seed) {
        std::atomic<int> next{0};
        std::vector<std::thread> clients;
        for (int c = 0; c < n_clients; ++c)
            clients.emplace_back([&, c] {
                std::mt19937 rng(seed * 7919u + std::uint32_t(c));
                for (int i; (i = next++) < count;) {
                    std::mt19937 pick(seed + std::uint32_t(i));
                    std::string err;
                    bool good = false;
                    if (pick() % 100 < 45) {
                        const std::size_t g = pick() % goods.size();
                        auto a = run_good(port, goods[g]);
                        good = true;
                        if (!a.ok) err = "good request " + std::to_string(g) + ": " + a.why;
                        else if (a.text != expected[g]) err = "good request " + std::to_string(g) + ": '" + a.text + "' instead of '" + expected[g] + "'";
                    } else {
                        err = run_bad(port, int(pick() % n_bad_kinds), rng);
                    }
                    std::lock_guard lk(mu);
                    good_done += good;
                    if (!err.empty() && errors.size() < 20) errors.push_back(err);
                }
            });
        for (auto& t : clients) t.join();
    };
    auto settle = [&] {
        // Everything cancelled or finished, every connection closed or timed out.
        return eventually([&] { auto c = srv.stats(); return !c.busy && c.queued == 0; }, 30);
    };

    // Warm-up with the same mix: the allocator's per-thread arenas and the pool's threads reach
    // their working size (RSS grows ~10 % over the first few hundred requests, then stays flat).
    round(SOAK_SANITIZED ? 64 : 300, 1);
    REQUIRE(settle());
    std::this_thread::sleep_for(std::chrono::seconds(3));  // past the read timeout: half requests are gone
    ::malloc_trim(0);  // measure what is held, not what the allocator keeps for later
    const std::size_t rss0 = rss_bytes();
    errors.clear();
    good_done = 0;

    const double seconds = seconds_of([&] { round(n_requests, 2); });
    CHECK(settle());
    for (const auto& e : errors) MESSAGE(e);
    CHECK(errors.empty());
    CHECK(good_done > n_requests / 3);
    MESSAGE(n_requests, " requests (", good_done, " good) in ", seconds, " s");

    std::this_thread::sleep_for(std::chrono::seconds(3));
    ::malloc_trim(0);
    const std::size_t rss1 = rss_bytes();
    MESSAGE("RSS ", rss0 >> 20, " MiB before, ", rss1 >> 20, " MiB after");
    if (!SOAK_SANITIZED) CHECK(double(rss1) <= 1.10 * double(rss0));

    // Still serving, and still right.
    for (std::size_t g = 0; g < goods.size(); ++g) {
        auto a = run_good(port, goods[g]);
        CHECK(a.ok);
        CHECK(a.text == expected[g]);
    }
    const auto c = srv.stats();
    CHECK(c.cancelled > 0);  // the clients that hung up were noticed
    srv.stop();
}
