// Requests an attacker would send, each of which used to kill or wedge `clover serve`:
// invalid UTF-8 in paths and bodies, JSON nested 100,000 deep, a model that produces ids its
// tokenizer does not have, and clients that hang up on a non-streaming request. Every answer
// must be a JSON 4xx/5xx (valid UTF-8), and the server must serve the next request.
#include <doctest/doctest.h>

#include "server_test_util.hpp"

using namespace server_test;

namespace {

std::string nested(std::size_t depth, const std::string& open = "[", const std::string& close = "]") {
    std::string s;
    for (std::size_t i = 0; i < depth; ++i) s += open;
    s += "1";
    for (std::size_t i = 0; i < depth; ++i) s += close;
    return s;
}

bool healthy(int port) { return get(port, "/health").status == 200; }

}  // namespace

TEST_CASE("hostile: invalid UTF-8 in a path, a model name or a body gets a JSON 4xx, and the server lives") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.model_id = "tiny"; return o; }());
    const int port = srv.start();
    // The 404 handler used to dump() the path outside httplib's try block: std::terminate.
    for (const char* path : {"/x%FF", "/%C3%28", "/v1/%FF%FE/chat", "/x\xff"}) {
        CAPTURE(path);
        auto r = raw(port, http_request("GET", path));
        CHECK(r.is_error(404));
        REQUIRE(healthy(port));
    }
    CHECK(raw(port, http_request("POST", "/nothing%FF", "{}")).is_error(404));
    // A model name that is not UTF-8: 404 naming it (with U+FFFD), not a 500.
    auto m = raw(port, http_request("GET", "/v1/models/%FF"));
    CHECK(m.is_error(404));
    // Bodies: raw 0xFF inside a JSON string, a lone continuation byte, a truncated sequence.
    for (std::string bad : {"\xff", "\x80", "\xe2\x82", "ok \xc0\xaf"}) {
        CAPTURE(bad.size());
        const std::string body = R"({"messages": [{"role": "user", "content": ")" + bad + R"("}], "max_tokens": 2})";
        auto r = raw(port, http_request("POST", "/v1/chat/completions", body));
        CHECK(r.is_error(400));
        const std::string model = R"({"model": ")" + bad + R"(", "prompt": "x"})";
        CHECK(raw(port, http_request("POST", "/v1/completions", model)).is_error(400));
    }
    // Escaped lone surrogates are not UTF-8 either.
    CHECK(raw(port, http_request("POST", "/v1/completions", R"({"prompt": "\udc00", "max_tokens": 1})")).status / 100 == 4);
    // Header values with bad bytes are never echoed into invalid JSON.
    auto h = raw(port, http_request("POST", "/v1/chat/completions", "{", "X-Api-Key: \xff\xfe\r\nOrigin: http://\xff\r\n"));
    CHECK(h.status / 100 == 4);
    CHECK(h.body_json.is_object());
    REQUIRE(healthy(port));
}

TEST_CASE("hostile: JSON nested 100,000 deep is refused with a 400 naming the limit (no stack overflow)") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    const std::string deep = nested(100'000, "{\"a\":", "}");
    const std::string chat = "/v1/chat/completions";
    auto expect_limit = [&](const std::string& body) {
        auto r = raw(port, http_request("POST", chat, body), 30);
        CHECK(r.is_error(400));
        if (r.body_json.is_object()) CHECK(r.body_json["error"]["message"].get<std::string>().find("512") != std::string::npos);
        REQUIRE(healthy(port));
    };
    // tools[].function.parameters
    expect_limit(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": [{"type": "function", "function": {"name": "f", "parameters": )" +
                 deep + "}}]}");
    // tool_calls[].function.arguments, as a value and as a JSON string
    const std::string head = R"({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": )";
    const std::string tail = R"(}}]}, {"role": "tool", "tool_call_id": "c", "content": "ok"}]})";
    expect_limit(head + deep + tail);
    expect_limit(head + json(deep).dump() + tail);
    // anywhere else in the body, and in /v1/completions
    expect_limit(R"({"messages": [{"role": "user", "content": "hi"}], "extra": )" + nested(200'000) + "}");
    auto c = raw(port, http_request("POST", "/v1/completions", R"({"prompt": )" + nested(300'000) + "}"), 30);
    CHECK(c.is_error(400));
    // 500 levels of real nesting pass.
    json ok = user("hi");
    ok["max_tokens"] = 1;
    json v = 1;
    for (int i = 0; i < 500; ++i) v = json::array({v});
    ok["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}, {"x", v}}}}}}});
    CHECK(post(port, chat, ok).status == 200);
}

TEST_CASE("hostile: a model whose vocabulary is larger than its tokenizer's: checked at setup, clear errors while streaming") {
    auto& f = fx();
    // The same tiny model with 600 rows: ids 512..599 have no text.
    static const std::string big_path = [] {
        auto s = synth::preset("tiny");
        s.arch = "clover_moe";
        s.n_vocab = 600;
        return testutil::synth_file("server_big_vocab_" + server_test::test_tag() + ".gguf", s);
    }();
    rt_model big{load(big_path), backend::cpu_options{2}};
    const tokenizer big_tok = tokenizer::from_gguf(big_path);
    // A tokenizer with more tokens than the model has rows cannot work: refused at setup.
    try {
        server::server bad(f.m, big_tok, opts());
        FAIL("a 600-token tokenizer was accepted for a 512-row model");
    } catch (const clover::error& e) {
        const std::string w = e.what();
        CHECK(w.find("600") != std::string::npos);
        CHECK(w.find("512") != std::string::npos);
    }
    // More rows than tokens is how checkpoints pad their vocabulary: accepted; an id past the
    // tokenizer ends the answer with a clear error instead of an exception in the stream.
    scripted_model sm(big);
    sm.after = f.tok.eog_ids().front();
    sm.script = f.tok.encode("fine so far");
    sm.script.push_back(555);
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    json req = {{"prompt", "x"}, {"max_tokens", 20}};
    auto s = stream(port, "/v1/completions", req);
    CHECK(s.status == 200);
    CHECK(s.done);
    CHECK(s.text == "fine so far");
    bool saw_error = false;
    for (const auto& c : s.chunks)
        if (c.contains("error")) saw_error = c["error"]["message"].get<std::string>().find("555") != std::string::npos;
    CHECK(saw_error);
    auto r = post(port, "/v1/completions", req);
    CHECK(is_error(r, 500));
    if (r.body.is_object()) CHECK(r.body["error"]["message"].get<std::string>().find("555") != std::string::npos);
    json chat = user("hi");
    chat["stream"] = true;
    auto sc = stream(port, "/v1/chat/completions", chat);
    CHECK(sc.done);
    // The server is fine afterwards.
    sm.script = f.tok.encode("ok");
    auto after = post(port, "/v1/completions", req);
    CHECK(after.status == 200);
    CHECK(after.body["choices"][0]["text"] == "ok");
}

TEST_CASE("hostile: a non-streaming client that hangs up cancels its generation (running or queued)") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    sm.script.assign(3000, f.tok.encode("a").front());
    sm.delay = std::chrono::microseconds(2000);  // 3000 tokens: more than 6 s
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    const std::string body = json{{"prompt", "x"}, {"max_tokens", 3000}}.dump();
    {
        raw_conn c(port);
        REQUIRE(c.send(http_request("POST", "/v1/completions", body)));
        CHECK(eventually([&] { return srv.stats().busy; }, 5));
        c.close();  // the client gives up while its answer is being generated
    }
    const double t = seconds_of([&] { CHECK(eventually([&] { auto c = srv.stats(); return c.cancelled == 1 && !c.busy; }, 3)); });
    CHECK(t < 3);
    // One running, one queued behind it; both hang up.
    {
        raw_conn a(port), b(port);
        REQUIRE(a.send(http_request("POST", "/v1/completions", body)));
        CHECK(eventually([&] { return srv.stats().busy; }, 5));
        REQUIRE(b.send(http_request("POST", "/v1/completions", body)));
        CHECK(eventually([&] { return srv.stats().queued == 1; }, 5));
        b.close();
        a.close();
    }
    CHECK(eventually([&] { auto c = srv.stats(); return c.cancelled == 3 && !c.busy && c.queued == 0; }, 3));
    sm.delay = std::chrono::microseconds(0);
    sm.script = f.tok.encode("fine");
    auto r = post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 8}});
    CHECK(r.status == 200);
    CHECK(r.body["choices"][0]["text"] == "fine");
}
