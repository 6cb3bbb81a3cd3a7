// The server's prefix cache (decode/prefix_cache.hpp): the next turn of a chat — the template
// has dropped the previous answer's reasoning — resumes at the start of that answer and gives
// exactly the answer of a server without a cache; a small budget evicts; usage, timings and
// /metrics say what was cached.
#include <doctest/doctest.h>

#include "server_test_util.hpp"

using namespace server_test;

namespace {

std::string words(int k, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {  // appended piece by piece: GCC 12's -Wrestrict misreads "w" + std::string&&
        s += 'w';
        s += std::to_string((k * 131 + i * 7) % 97);
        s += ' ';
    }
    return s;
}

struct turn {
    reply r;
    std::string content, reasoning;
};

// A conversation of `turns` turns on a fresh server; each turn sends back the previous answers'
// content (not their reasoning, as OpenAI clients do).
std::vector<turn> converse(std::int64_t cache_mib, bool thinking, int turns, bool streamed_last = false) {
    auto& f = fx();
    auto o = opts();
    o.cache_ram_mib = cache_mib;
    server::server srv(f.m, f.tok, o);
    const int port = srv.start();
    json msgs = json::array({{{"role", "system"}, {"content", "You are a tool-using agent. " + words(1, 60)}},
                             {{"role", "user"}, {"content", "Task: " + words(2, 80)}}});
    std::vector<turn> out;
    for (int t = 0; t < turns; ++t) {
        json body = {{"messages", msgs}, {"max_tokens", 12}, {"temperature", 0},
                     {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
        turn tr;
        if (streamed_last && t + 1 == turns) {
            body["stream_options"] = {{"include_usage", true}};
            auto s = stream(port, "/v1/chat/completions", body);
            REQUIRE(s.done);
            tr.content = s.content;
            tr.reasoning = s.reasoning;
            tr.r.status = 200;
            tr.r.body = {{"usage", s.usage}};
        } else {
            tr.r = post(port, "/v1/chat/completions", body);
            REQUIRE(tr.r.status == 200);
            const json& m = tr.r.body["choices"][0]["message"];
            tr.content = m["content"].is_string() ? m["content"].get<std::string>() : "";
            tr.reasoning = m.value("reasoning_content", std::string());
        }
        msgs.push_back({{"role", "assistant"}, {"content", tr.content}});
        msgs.push_back({{"role", "user"}, {"content", "Tool output " + std::to_string(t) + ": " + words(10 + t, 70)}});
        out.push_back(std::move(tr));
    }
    return out;
}

std::int64_t cached_of(const reply& r) { return r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<std::int64_t>(); }
std::int64_t prompt_of(const reply& r) { return r.body["usage"]["prompt_tokens"].get<std::int64_t>(); }

}  // namespace

TEST_CASE("prefix cache: each chat turn resumes at the previous answer and answers as without a cache (thinking on and off)") {
    for (bool thinking : {true, false}) {
        CAPTURE(thinking);
        const auto off = converse(0, thinking, 4);
        const auto on = converse(4096, thinking, 4, true);
        for (std::size_t t = 0; t < on.size(); ++t) {
            CAPTURE(t);
            CHECK(on[t].content == off[t].content);
            CHECK(on[t].reasoning == off[t].reasoning);
            CHECK(prompt_of(on[t].r) == prompt_of(off[t].r));
            CHECK(cached_of(off[t].r) == 0);
            if (t == 0) {
                CHECK(cached_of(on[t].r) == 0);
                continue;
            }
            // Everything up to the previous turn's generation prompt (<|im_start|>assistant...)
            // comes from the cache: what is computed is the answer without its reasoning, the
            // new message and the generation prompt.
            const std::int64_t prev = prompt_of(on[t - 1].r);
            const auto gen = fx().tok.encode(thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
            CHECK(cached_of(on[t].r) == prev - std::int64_t(gen.size()) + 1);  // up to just after its <|im_start|>
            if (t + 1 < on.size()) {  // the streamed last turn's usage chunk has no timings
                const json& tm = on[t].r.body["timings"];
                CHECK(tm["cache_n"] == cached_of(on[t].r));
                CHECK(tm["prompt_n"] == prompt_of(on[t].r) - cached_of(on[t].r));
                CHECK(tm["predicted_n"] == on[t].r.body["usage"]["completion_tokens"]);
            }
        }
    }
}

TEST_CASE("prefix cache: a small budget evicts the oldest conversations and never holds more than it may") {
    auto& f = fx();
    auto o = opts();
    o.cache_ram_mib = 1;
    server::server srv(f.m, f.tok, o);
    const int port = srv.start();
    const std::size_t per = f.m.checkpoint_bytes() + f.m.page_bytes(1);
    const int n = int((std::size_t(1) << 20) / per) + 4;  // more resume points than 1 MiB holds
    REQUIRE(n < 400);
    auto ask = [&](int k) {
        json b = user("Question " + std::to_string(k) + ": " + words(k, 90));
        b["max_tokens"] = 1;
        b["temperature"] = 0;
        return post(port, "/v1/chat/completions", b);
    };
    for (int k = 0; k < n; ++k) REQUIRE(ask(k).status == 200);
    // The model thread keeps a request's prefix (and evicts) just after answering it.
    CHECK(eventually([&] {
        const auto c = srv.stats();
        return c.cache.evicted > 0 && c.cache.bytes <= c.cache.budget;
    }));
    CHECK(srv.stats().cache.budget == std::size_t(1) << 20);
    // The newest is still there, the first one is not.
    CHECK(cached_of(ask(n - 1)) > 0);
    CHECK(cached_of(ask(0)) == 0);
    CHECK(eventually([&] {
        const auto metrics = get(port, "/metrics");
        return metrics.raw.find("clover_prefix_cache_evicted_total " + std::to_string(srv.stats().cache.evicted) + "\n") != std::string::npos;
    }));
    const auto metrics = get(port, "/metrics");
    CHECK(metrics.raw.find("clover_prefix_cache_hits_total 1\n") != std::string::npos);
    CHECK(metrics.raw.find("# TYPE clover_kv_pages_used gauge") != std::string::npos);
}

TEST_CASE("prefix cache: cache_prompt false neither reuses nor keeps a prefix, and gives the same answer") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    json b = user("A long question: " + words(3, 120));
    b["max_tokens"] = 6;
    b["temperature"] = 0;
    json nc = b;
    nc["cache_prompt"] = false;
    const auto first = post(port, "/v1/chat/completions", nc);  // not kept
    REQUIRE(first.status == 200);
    CHECK(srv.stats().cache.entries == 0);
    const auto second = post(port, "/v1/chat/completions", b);  // computed whole, kept
    CHECK(cached_of(second) == 0);
    CHECK(eventually([&] { return srv.stats().cache.entries > 0; }));
    const auto third = post(port, "/v1/chat/completions", nc);  // the cached prefix is there, not used
    CHECK(cached_of(third) == 0);
    const auto fourth = post(port, "/v1/chat/completions", b);
    CHECK(cached_of(fourth) > 0);
    for (const auto* r : {&first, &second, &third, &fourth})
        CHECK((*r).body["choices"][0]["message"]["content"] == first.body["choices"][0]["message"]["content"]);
    nc["cache_prompt"] = "no";
    CHECK(is_error(post(port, "/v1/chat/completions", nc), 400));
}

TEST_CASE("prefix cache: cache_salt scopes cached prefixes: another salt, or none, sees nothing of a salted prompt") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    json b = user("A question from one tenant: " + words(5, 120));
    b["max_tokens"] = 2;
    b["temperature"] = 0;
    auto salted = [&](const char* salt) {
        json x = b;
        if (salt) x["cache_salt"] = salt;
        // Kept by the model thread just after answering, before it takes the next request.
        auto r = post(port, "/v1/chat/completions", x);
        REQUIRE(r.status == 200);
        return r;
    };
    CHECK(cached_of(salted("tenant-a")) == 0);
    CHECK(cached_of(salted("tenant-b")) == 0);  // the same prompt under another salt: nothing to learn
    CHECK(cached_of(salted(nullptr)) == 0);     // nor without one
    const auto again = salted("tenant-a");
    CHECK(cached_of(again) > 0);                 // the same salt reuses it
    CHECK(cached_of(salted("tenant-b")) > 0);
    CHECK(cached_of(salted(nullptr)) > 0);
    CHECK(again.body["choices"][0]["message"] == salted(nullptr).body["choices"][0]["message"]);
    for (json bad : {json(""), json(5), json::array({"a"}), json(std::string(1025, 's'))}) {
        json x = b;
        x["cache_salt"] = bad;
        auto r = post(port, "/v1/chat/completions", x);
        CHECK(is_error(r, 400));
        CHECK(r.body["error"]["param"] == "cache_salt");
    }
}

TEST_CASE("prefix cache: each API key is its own scope (--cache-scope key, the default with keys); global shares") {
    auto& f = fx();
    for (const char* scope : {"auto", "key", "global"}) {
        CAPTURE(scope);
        auto o = opts();
        o.api_key = "alice-key";
        o.api_keys = {"bob-key"};
        o.cache_scope = scope;
        server::server srv(f.m, f.tok, o);
        const int port = srv.start();
        json b = user("Shared system prompt and question: " + words(6, 120));
        b["max_tokens"] = 2;
        b["temperature"] = 0;
        auto as = [&](const char* key) {
            auto r = post(port, "/v1/chat/completions", b, {{"Authorization", std::string("Bearer ") + key}});
            REQUIRE(r.status == 200);
            return cached_of(r);
        };
        CHECK(is_error(post(port, "/v1/chat/completions", b, {{"Authorization", "Bearer eve-key"}}), 401));
        CHECK(as("alice-key") == 0);
        const bool shared = std::string(scope) == "global";
        CHECK((as("bob-key") > 0) == shared);  // bob's first request: alice's prefix only if global
        CHECK(as("alice-key") > 0);
        CHECK(as("bob-key") > 0);
        CHECK(post(port, "/v1/chat/completions", b, {{"X-Api-Key", "bob-key"}}).status == 200);
    }
}
