// `clover serve` over loopback with a real HTTP client (httplib::Client): chat and text
// completions, streaming and not, tool calls, thinking, decoders, bad input, many clients at
// once, a client that disconnects mid-stream. Every server binds 127.0.0.1 on an ephemeral port.
//
// Two models: the tiny random-weight Clover file (real passes, random text), and a scripted
// wrapper around it that runs the same passes but puts all the probability on a chosen
// continuation, so tool calls and thinking come out exactly as a trained model would write them.
#include <doctest/doctest.h>

#include <cctype>

#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "server_test_util.hpp"
#ifdef CLOVER_CLI
#include "../cli/cli_run.hpp"
#endif

using namespace server_test;

TEST_CASE("server: health, models, and chat completions on the real model (non-streaming and streaming agree)") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.model_id = "tiny"; return o; }());
    const int port = srv.start();
    REQUIRE(port > 0);

    auto h = get(port, "/health");
    CHECK(h.status == 200);
    CHECK(h.body["status"] == "ok");
    auto ms = get(port, "/v1/models");
    CHECK(ms.status == 200);
    CHECK(ms.body["object"] == "list");
    CHECK(ms.body["data"][0]["id"] == "tiny");
    CHECK(get(port, "/v1/models/tiny").status == 200);
    CHECK(is_error(get(port, "/v1/models/other"), 404));

    json req = user("Hello there");
    req["max_tokens"] = 12;
    req["temperature"] = 0;
    req["model"] = "tiny";
    auto r = post(port, "/v1/chat/completions", req);
    REQUIRE(r.status == 200);
    CHECK(r.body["object"] == "chat.completion");
    const json& msg = r.body["choices"][0]["message"];
    CHECK(msg["role"] == "assistant");
    const std::string fr = r.body["choices"][0]["finish_reason"];
    CHECK((fr == "stop" || fr == "length" || fr == "tool_calls"));
    CHECK(r.body["usage"]["prompt_tokens"].get<int>() > 0);
    CHECK(r.body["usage"]["completion_tokens"].get<int>() >= 1);
    CHECK(r.body["usage"]["completion_tokens"].get<int>() <= 12);
    CHECK(r.body["usage"]["total_tokens"] == r.body["usage"]["prompt_tokens"].get<int>() + r.body["usage"]["completion_tokens"].get<int>());

    auto s = stream(port, "/v1/chat/completions", req);
    CHECK(s.status == 200);
    CHECK(s.done);
    REQUIRE(s.chunks.size() >= 2);
    CHECK(s.chunks[0]["object"] == "chat.completion.chunk");
    CHECK(s.chunks[0]["choices"][0]["delta"]["role"] == "assistant");
    CHECK(s.finish == fr);
    CHECK(s.content == (msg["content"].is_string() ? msg["content"].get<std::string>() : std::string()));
    CHECK(s.reasoning == msg.value("reasoning_content", std::string()));
    CHECK(s.usage == r.body["usage"]);

    // stream_options.include_usage: a last chunk with no choices and the usage.
    req["stream_options"] = {{"include_usage", true}};
    auto su = stream(port, "/v1/chat/completions", req);
    REQUIRE(su.chunks.size() >= 2);
    CHECK(su.chunks.back()["choices"].empty());
    CHECK(su.chunks.back()["usage"] == r.body["usage"]);

    // Text completions, both ways; greedy output is the same.
    json tc = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}};
    auto t = post(port, "/v1/completions", tc);
    REQUIRE(t.status == 200);
    CHECK(t.body["object"] == "text_completion");
    CHECK(t.body["choices"][0]["text"].is_string());
    auto ts = stream(port, "/v1/completions", tc);
    CHECK(ts.done);
    CHECK(ts.text == t.body["choices"][0]["text"].get<std::string>());
    srv.stop();
}

TEST_CASE("server: stop strings end the answer and are cut out") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    sm.script = f.tok.encode("alpha beta STOP gamma delta");
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    json req = {{"prompt", "x"}, {"max_tokens", 40}, {"stop", "STOP"}};
    auto r = post(port, "/v1/completions", req);
    REQUIRE(r.status == 200);
    CHECK(r.body["choices"][0]["text"] == "alpha beta ");
    CHECK(r.body["choices"][0]["finish_reason"] == "stop");
    auto s = stream(port, "/v1/completions", req);
    CHECK(s.text == "alpha beta ");
    req["stop"] = json::array({"nothing", "delta"});
    CHECK(post(port, "/v1/completions", req).body["choices"][0]["text"] == "alpha beta STOP gamma ");
    req.erase("stop");
    req["max_tokens"] = 2;
    auto l = post(port, "/v1/completions", req);
    CHECK(l.body["choices"][0]["finish_reason"] == "length");
    CHECK(l.body["usage"]["completion_tokens"] == 2);
}

TEST_CASE("server: thinking on and off (reasoning_content apart from content)") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();

    // Thinking on (the default): the prompt opens <think>, the model closes it.
    sm.script = f.tok.encode("Let me think about it.\n</think>\n\nHello there!");
    json req = user("Hi");
    auto on = post(port, "/v1/chat/completions", req);
    REQUIRE(on.status == 200);
    CHECK(on.body["choices"][0]["message"]["reasoning_content"] == "Let me think about it.");
    CHECK(on.body["choices"][0]["message"]["content"] == "Hello there!");
    CHECK(on.body["choices"][0]["finish_reason"] == "stop");
    auto son = stream(port, "/v1/chat/completions", req);
    CHECK(son.reasoning == "Let me think about it.");
    CHECK(son.content == "Hello there!");

    // Thinking off: an empty think block in the prompt, no reasoning in the answer.
    sm.script = f.tok.encode("Hello there!");
    req["chat_template_kwargs"] = {{"enable_thinking", false}};
    auto off = post(port, "/v1/chat/completions", req);
    REQUIRE(off.status == 200);
    CHECK_FALSE(off.body["choices"][0]["message"].contains("reasoning_content"));
    CHECK(off.body["choices"][0]["message"]["content"] == "Hello there!");
    CHECK(off.body["usage"]["prompt_tokens"].get<int>() > on.body["usage"]["prompt_tokens"].get<int>());
    auto soff = stream(port, "/v1/chat/completions", req);
    CHECK(soff.reasoning.empty());
    CHECK(soff.content == "Hello there!");
}

TEST_CASE("server: a tool-call round trip (two calls in one turn, streamed as deltas)") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
    ])");
    sm.script = f.tok.encode(
        "I will look both up.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>");
    json req = user("Weather and time in Paris?");
    req["tools"] = tools;
    req["chat_template_kwargs"] = {{"enable_thinking", false}};
    auto r = post(port, "/v1/chat/completions", req);
    REQUIRE(r.status == 200);
    const json& msg = r.body["choices"][0]["message"];
    CHECK(r.body["choices"][0]["finish_reason"] == "tool_calls");
    CHECK(msg["content"] == "I will look both up.");
    REQUIRE(msg["tool_calls"].size() == 2);
    CHECK(msg["tool_calls"][0]["type"] == "function");
    CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
    CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}, {"days", 3}});
    CHECK(msg["tool_calls"][1]["function"]["name"] == "get_time");
    CHECK(json::parse(msg["tool_calls"][1]["function"]["arguments"].get<std::string>()) == json{{"tz", "CET"}});
    CHECK(msg["tool_calls"][0]["id"] != msg["tool_calls"][1]["id"]);

    auto s = stream(port, "/v1/chat/completions", req);
    CHECK(s.done);
    CHECK(s.finish == "tool_calls");
    CHECK(s.content == "I will look both up.");
    REQUIRE(s.tool_calls.size() == 2);
    for (int i = 0; i < 2; ++i) {
        CHECK(s.tool_calls[i]["id"] == msg["tool_calls"][i]["id"]);
        CHECK(s.tool_calls[i]["function"]["name"] == msg["tool_calls"][i]["function"]["name"]);
        CHECK(json::parse(s.tool_calls[i]["function"]["arguments"].get<std::string>()) ==
              json::parse(msg["tool_calls"][i]["function"]["arguments"].get<std::string>()));
    }

    // The client runs the tools and sends the results back; the model answers.
    json follow = req;
    follow["messages"].push_back(msg);
    follow["messages"].push_back({{"role", "tool"}, {"tool_call_id", msg["tool_calls"][0]["id"]}, {"content", "sunny, 21 C"}});
    follow["messages"].push_back({{"role", "tool"}, {"tool_call_id", msg["tool_calls"][1]["id"]}, {"content", "14:05"}});
    sm.script = f.tok.encode("It is sunny and 21 C in Paris; the time there is 14:05.");
    auto r2 = post(port, "/v1/chat/completions", follow);
    REQUIRE(r2.status == 200);
    CHECK(r2.body["choices"][0]["finish_reason"] == "stop");
    CHECK(r2.body["choices"][0]["message"]["content"] == "It is sunny and 21 C in Paris; the time there is 14:05.");
    CHECK(r2.body["usage"]["prompt_tokens"].get<int>() > r.body["usage"]["prompt_tokens"].get<int>());

    // tool_choice "none" leaves the tools out of the prompt; content parts are accepted.
    json none = user("Hi");
    none["messages"][0]["content"] = json::array({{{"type", "text"}, {"text", "Weather "}}, {{"type", "text"}, {"text", "in Paris?"}}});
    none["tools"] = tools;
    none["tool_choice"] = "none";
    auto rn = post(port, "/v1/chat/completions", none);
    REQUIRE(rn.status == 200);
    CHECK(rn.body["usage"]["prompt_tokens"].get<int>() < r.body["usage"]["prompt_tokens"].get<int>());
}

TEST_CASE("server: decoder options (ar, diffusion, speculative give the same scripted answer)") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    sm.script = f.tok.encode("The quick brown fox jumps over the lazy dog.");
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    json req = {{"prompt", "x"}, {"max_tokens", 64}};
    for (const char* d : {"ar", "diffusion", "speculative"}) {
        CAPTURE(d);
        req["decoder"] = d;
        req["block"] = 8;
        req["threshold"] = 0.9;
        req["coreset"] = 4;
        auto r = post(port, "/v1/completions", req);
        REQUIRE(r.status == 200);
        CHECK(r.body["choices"][0]["text"] == "The quick brown fox jumps over the lazy dog.");
        CHECK(r.body["timings"]["decoder"] == d);
        if (std::string(d) != "ar") CHECK(r.body["timings"]["tokens_per_pass"].get<double>() > 1.0);
        auto s = stream(port, "/v1/completions", req);
        CHECK(s.text == "The quick brown fox jumps over the lazy dog.");
    }
    // The real model too (random text, but it must run).
    server::server real(f.m, f.tok, opts());
    const int p2 = real.start();
    json rq = user("hello");
    rq["decoder"] = "diffusion";
    rq["max_tokens"] = 16;
    rq["block"] = 8;
    CHECK(post(p2, "/v1/chat/completions", rq).status == 200);
    rq["decoder"] = "speculative";
    CHECK(post(p2, "/v1/chat/completions", rq).status == 200);
}

TEST_CASE("server: bad requests get a 4xx JSON error and the server stays up") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.model_id = "tiny"; o.max_tokens_limit = 256; o.max_body_bytes = 64 * 1024; return o; }());
    const int port = srv.start();
    const std::string chat = "/v1/chat/completions";
    CHECK(is_error(post(port, chat, std::string("{not json")), 400));
    CHECK(is_error(post(port, chat, std::string("")), 400));
    CHECK(is_error(post(port, chat, std::string("[1, 2]")), 400));
    CHECK(is_error(post(port, chat, json::object()), 400));
    CHECK(is_error(post(port, chat, json{{"messages", "hi"}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array()}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array({"hi"})}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array({{{"role", 3}, {"content", "x"}}})}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array({{{"role", "user"}, {"content", 42}}})}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}}), 400));
    CHECK(is_error(post(port, chat, json{{"messages", json::array({{{"role", "system"}, {"content", "only a system prompt"}}})}}), 400));
    auto with = [](const char* key, json v) {
        json r = user("hi");
        r[key] = std::move(v);
        return r;
    };
    auto nested = [&](const char* key, json v) {
        json r = user("hi");
        r["chat_template_kwargs"][key] = std::move(v);
        return r;
    };
    for (auto [key, v] : std::vector<std::pair<const char*, json>>{
             {"temperature", "hot"}, {"temperature", -1}, {"temperature", 9}, {"top_p", 2}, {"top_p", 0}, {"top_k", -3}, {"top_k", 1.5},
             {"min_p", "x"}, {"seed", "x"}, {"stop", 5}, {"stop", json::array({1})}, {"stop", ""}, {"presence_penalty", 5},
             {"frequency_penalty", "x"}, {"repetition_penalty", 0}, {"max_tokens", -5}, {"max_tokens", 0}, {"max_tokens", "10"},
             {"max_tokens", 1e30}, {"max_tokens", 1000000000}, {"max_completion_tokens", 100000}, {"stream", "yes"}, {"n", 2},
             {"tools", json::object()}, {"tools", json::array({1})}, {"tool_choice", 3}, {"tool_choice", "sometimes"},
             {"decoder", "beam"}, {"decoder", 1}, {"block", 0}, {"block", 100000}, {"threshold", 2}, {"coreset", -2},
             {"coreset", 100000}, {"chat_template_kwargs", 1}, {"stream_options", 1}}) {
        CAPTURE(key);
        CAPTURE(v.dump());
        auto r = post(port, chat, with(key, v));
        CHECK(is_error(r, 400));
        if (r.body.is_object() && r.body.contains("error")) CHECK(r.body["error"]["param"] == key);
    }
    CHECK(is_error(post(port, chat, nested("enable_thinking", "no")), 400));
    json spec1 = with("decoder", "speculative");
    spec1["block"] = 1;
    CHECK(is_error(post(port, chat, spec1), 400));
    CHECK(is_error(post(port, chat, with("model", "gpt-4")), 404));
    CHECK(is_error(post(port, chat, with("model", 4)), 400));
    std::string longer;
    while (f.tok.encode(longer).size() <= 4200) longer += "w" + std::to_string(longer.size() % 97) + " ;";
    CHECK(is_error(post(port, chat, user(longer)), 400));  // more tokens than the context
    CHECK(is_error(post(port, chat, user(std::string(100 * 1024, 'a'))), 413));  // larger than the body limit
    CHECK(is_error(post(port, "/v1/completions", json{{"prompt", 5}}), 400));
    CHECK(is_error(post(port, "/v1/completions", json{{"prompt", ""}}), 400));
    CHECK(is_error(post(port, "/v1/completions", json::object()), 400));
    CHECK(is_error(post(port, "/v1/nothing", json::object()), 404));
    CHECK(is_error(get(port, "/v1/chat/completions"), 404));
    // A bad request in the middle of a stream request's fields: 4xx, not an event stream.
    json bad = with("temperature", "x");
    bad["stream"] = true;
    CHECK(is_error(post(port, chat, bad), 400));
    // Valid edge cases pass: float integers, max_tokens at the limit, null fields.
    json ok = with("max_tokens", 4.0);
    ok["temperature"] = nullptr;
    ok["tools"] = nullptr;
    CHECK(post(port, chat, ok).status == 200);
    CHECK(post(port, chat, with("max_completion_tokens", 3)).body["usage"]["completion_tokens"].get<int>() <= 3);
    CHECK(get(port, "/health").status == 200);
    CHECK(srv.stats().rejected >= 40);
}

TEST_CASE("server: an API key guards /v1 (401 without it), /health stays open") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.api_key = "s3cret"; return o; }());
    const int port = srv.start();
    json req = user("hi");
    req["max_tokens"] = 2;
    CHECK(is_error(post(port, "/v1/chat/completions", req), 401));
    CHECK(is_error(post(port, "/v1/chat/completions", req, {{"Authorization", "Bearer wrong"}}), 401));
    CHECK(is_error(get(port, "/v1/models"), 401));
    CHECK(post(port, "/v1/chat/completions", req, {{"Authorization", "Bearer s3cret"}}).status == 200);
    CHECK(get(port, "/v1/models", {{"Authorization", "Bearer s3cret"}}).status == 200);
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("server: 16 concurrent clients get their own answers (outputs never mix)") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    auto request_for = [](int k) {
        json r = user("client number " + std::to_string(k % 8) + " says hello");
        r["max_tokens"] = 16;
        r["temperature"] = 0;
        r["chat_template_kwargs"] = {{"enable_thinking", k % 2 == 0}};
        return r;
    };
    // Serial references, then everyone at once (half streaming).
    std::vector<json> ref(8);
    for (int k = 0; k < 8; ++k) {
        auto r = post(port, "/v1/chat/completions", request_for(k));
        REQUIRE(r.status == 200);
        ref[k] = r.body["choices"][0]["message"];
    }
    std::vector<json> got(16);
    std::vector<int> status(16, 0);
    std::vector<std::thread> th;
    for (int k = 0; k < 16; ++k)
        th.emplace_back([&, k] {
            if (k % 2) {
                auto s = stream(port, "/v1/chat/completions", request_for(k));
                status[k] = s.done ? s.status : -1;
                got[k] = {{"content", s.content}, {"reasoning", s.reasoning}};
            } else {
                auto r = post(port, "/v1/chat/completions", request_for(k));
                status[k] = r.status;
                if (r.status == 200) {
                    const json& m = r.body["choices"][0]["message"];
                    got[k] = {{"content", m["content"].is_string() ? m["content"].get<std::string>() : ""},
                              {"reasoning", m.value("reasoning_content", std::string())}};
                }
            }
        });
    for (auto& t : th) t.join();
    for (int k = 0; k < 16; ++k) {
        CAPTURE(k);
        CHECK(status[k] == 200);
        const json& m = ref[k % 8];
        CHECK(got[k]["content"] == (m["content"].is_string() ? m["content"].get<std::string>() : std::string()));
        CHECK(got[k]["reasoning"] == m.value("reasoning_content", std::string()));
    }
    const auto c = srv.stats();
    CHECK(c.completed == 24);
    CHECK(c.queued == 0);
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("server: a client that disconnects mid-stream cancels its generation and frees the model") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    sm.script.assign(3000, f.tok.encode("a").front());
    sm.delay = std::chrono::microseconds(2000);  // 3000 tokens would take more than 6 s
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    json req = {{"prompt", "x"}, {"max_tokens", 3000}};
    const auto t0 = std::chrono::steady_clock::now();
    auto s = stream(port, "/v1/completions", req, 5);
    CHECK(s.chunks.size() == 5);
    CHECK_FALSE(s.done);
    CHECK(eventually([&] { auto c = srv.stats(); return c.cancelled == 1 && !c.busy; }));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    // A client that goes away while it waits in the queue is dropped too.
    std::thread slow([&] { stream(port, "/v1/completions", req, 30); });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto q = stream(port, "/v1/completions", req, 1);  // hangs up after the role chunk, still queued
    slow.join();
    CHECK(eventually([&] { auto c = srv.stats(); return c.cancelled == 3 && !c.busy && c.queued == 0; }));
    // The server is healthy and serves the next request.
    sm.delay = std::chrono::microseconds(0);
    sm.script = f.tok.encode("fine");
    auto h = get(port, "/health");
    CHECK(h.status == 200);
    CHECK(h.body["cancelled"] == 3);
    auto r = post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 8}});
    CHECK(r.status == 200);
    CHECK(r.body["choices"][0]["text"] == "fine");
}

TEST_CASE("server: stop() ends queued and running requests; a second server can take the port") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    sm.script.assign(2000, f.tok.encode("a").front());
    sm.delay = std::chrono::microseconds(2000);
    auto srv = std::make_unique<server::basic_server<scripted_model>>(sm, f.tok, serial_opts());
    const int port = srv->start();
    std::vector<std::thread> th;
    std::atomic<int> answered{0};
    for (int k = 0; k < 3; ++k)
        th.emplace_back([&] {
            auto r = post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2000}});
            if (r.status != 0) ++answered;
        });
    CHECK(eventually([&] { auto c = srv->stats(); return c.busy && c.queued == 2; }));
    const auto t0 = std::chrono::steady_clock::now();
    srv->stop();
    for (auto& t : th) t.join();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    srv.reset();
    server::basic_server<scripted_model> again(sm, f.tok, serial_opts(port));
    CHECK(again.start() == port);
}

#ifdef CLOVER_CLI
namespace {
clitest::result sh(const std::string& args, const std::string& input = {}) {
    return clitest::run(args, 60, "server_cli_err.txt", input);
}
}  // namespace

TEST_CASE("clover run: streams, prints the summary line, says clearly when the bundled model is missing") {
    const auto& path = model_path();
    auto r = sh("run -m " + path + " -p hello -n 6 --greedy");
    CHECK(r.status == 0);
    CHECK(r.out.starts_with("<think>\n"));
    CHECK(r.err.find("6 tokens, 6 passes, TPF 1.00") != std::string::npos);
    auto nt = sh("run -m " + path + " -p hello -n 4 --no-think --decoder diffusion --block 4 -q");
    CHECK(nt.status == 0);
    CHECK_FALSE(nt.out.starts_with("<think>"));
    CHECK(nt.err.find("diffusion") != std::string::npos);
    auto bad = sh("run -m " + path + " -n 4");
    CHECK(bad.status != 0);
    CHECK(bad.err.find("prompt") != std::string::npos);
    if (!std::filesystem::exists(std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf")) {
        auto none = sh("run -p hello -n 2");
        CHECK(none.status != 0);
        CHECK(none.err.find("models/clover-small.gguf") != std::string::npos);
        CHECK(none.err.find("-m") != std::string::npos);
    } else {  // the bundled model runs without -m (found from the working directory here)
        const auto cwd = std::filesystem::current_path();
        std::filesystem::current_path(CLOVER_SOURCE_DIR);
        auto bundled = sh("run -p hello -n 3 --greedy -q");
        std::filesystem::current_path(cwd);
        CHECK(bundled.status == 0);
        CHECK(bundled.err.find("3 tokens") != std::string::npos);
    }
}

// The "prompt N tokens (M cached)" counts of a run's summary lines, in order: {N, M} each.
std::vector<std::pair<long, long>> prompt_counts(const std::string& err) {
    std::vector<std::pair<long, long>> v;
    for (std::size_t at = err.find("| prompt "); at != std::string::npos; at = err.find("| prompt ", at + 1)) {
        long n = -1, c = -1;
        if (std::sscanf(err.c_str() + at, "| prompt %ld tokens (%ld cached)", &n, &c) == 2) v.emplace_back(n, c);
    }
    return v;
}

// `run --chat` drives the engine a server runs (decode/engine.hpp) with its prefix cache: turn 2
// resumes from what turn 1 computed — everything but the assistant header after the last message
// start (the Qwen template re-renders the answer without its reasoning) — and says so the way a
// server's usage does (cached tokens); the answers equal those computed from scratch.
TEST_CASE("clover run --chat: later turns resume from the conversation's state and answer as if recomputed") {
    const auto& path = model_path();
    const std::string input = "hello there\nand what comes next?\nthird turn, short\n";
    for (const char* think : {" --no-think", ""}) {
        CAPTURE(think);
        auto cached = sh("run --chat -m " + path + " -n 8 --greedy -q" + think, input);
        auto fresh = sh("run --chat -m " + path + " -n 8 --greedy -q --no-cache" + think, input);
        REQUIRE(cached.status == 0);
        REQUIRE(fresh.status == 0);
        CHECK(cached.out == fresh.out);
        const auto pc = prompt_counts(cached.err), pf = prompt_counts(fresh.err);
        REQUIRE(pc.size() == 3);
        REQUIRE(pf.size() == 3);
        CHECK(pc[0].second == 0);
        // Each turn resumes right after the previous prompt's last message start: what it
        // recomputes of the previous prompt is that prompt's assistant header (the same tokens
        // every turn), never more.
        CHECK(pc[1].second > 0);
        CHECK(pc[1].second < pc[0].first);
        CHECK(pc[2].second > pc[1].second);
        CHECK(pc[0].first - pc[1].second == pc[1].first - pc[2].second);
        CHECK(pc[0].first - pc[1].second < 20);
        for (int t = 0; t < 3; ++t) {
            CHECK(pf[std::size_t(t)].second == 0);
            CHECK(pf[std::size_t(t)].first == pc[std::size_t(t)].first);
        }
    }
}

TEST_CASE("clover serve: binds 127.0.0.1, answers, stops on SIGTERM") {
    const std::string err_path = testutil::tmp("serve_cli_err.txt");
    const std::string pid_path = testutil::tmp("serve_cli_pid.txt");
    std::remove(err_path.c_str());
    const std::string cmd = "timeout 60 " + std::string(CLOVER_CLI) + " serve -q --port 0 -m " + model_path() + " 2>" + err_path +
                            " </dev/null >/dev/null & echo $! > " + pid_path;
    REQUIRE(std::system(cmd.c_str()) == 0);
    int port = 0;
    CHECK(eventually([&] {
        std::ifstream e(err_path);
        std::stringstream ss;
        ss << e.rdbuf();
        const std::string s = ss.str();
        const auto at = s.find("http://127.0.0.1:");
        if (at == std::string::npos) return false;
        port = std::atoi(s.c_str() + at + 17);
        return port > 0;
    }));
    REQUIRE(port > 0);
    CHECK(get(port, "/health").status == 200);
    json req = user("hi");
    req["max_tokens"] = 3;
    CHECK(post(port, "/v1/chat/completions", req).status == 200);
    std::ifstream pf(pid_path);
    long pid = 0;
    pf >> pid;
    REQUIRE(pid > 0);
    ::kill(pid_t(pid), SIGTERM);  // the `timeout` wrapper passes it on
    CHECK(eventually([&] { return get(port, "/health").status == 0; }, 10));
}
#endif
