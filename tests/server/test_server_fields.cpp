// OpenAI request fields that change the answer are honoured or refused, never accepted and
// ignored: logit_bias (every decoder), logprobs / top_logprobs (chat) and logprobs (completions),
// with each token's log-probability from the pass that decided it, and n (only 1).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "server_test_util.hpp"

using namespace server_test;

namespace {

const char* decoders[] = {"ar", "diffusion", "speculative"};

json completion(const std::string& prompt, int max_tokens, const char* decoder = "ar") {
    return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"decoder", decoder}, {"block", 4}};
}

// The model's own log-softmax after `prompt` (one pass on a fresh session).
std::vector<double> first_logprobs(const std::vector<token>& prompt) {
    auto& f = fx();
    session s = f.m.new_session({.ctx = 256});
    std::vector<float> lg;
    f.m.commit(s, prompt, logits_rows::last, lg, true);
    double mx = -INFINITY, z = 0;
    for (float x : lg) mx = std::max(mx, double(x));
    for (float x : lg) z += std::exp(double(x) - mx);
    std::vector<double> out;
    for (float x : lg) out.push_back(double(x) - mx - std::log(z));
    return out;
}

}  // namespace

TEST_CASE("fields: logit_bias -100 on every id but one makes every decoder produce only that one") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    const token a = f.tok.encode("a").front();
    json bias = json::object();
    for (std::size_t i = 0; i < f.tok.n_vocab(); ++i)
        if (token(i) != a) bias[std::to_string(i)] = -100;
    for (const char* dec : decoders) {
        CAPTURE(dec);
        json r = completion("Say anything: ", 8, dec);
        const auto plain = post(port, "/v1/completions", r);
        REQUIRE(plain.status == 200);
        CHECK(plain.body["choices"][0]["text"] != "aaaaaaaa");  // the bias is what makes it
        r["logit_bias"] = bias;
        const auto biased = post(port, "/v1/completions", r);
        REQUIRE(biased.status == 200);
        CHECK(biased.body["choices"][0]["text"] == "aaaaaaaa");
        r["temperature"] = 1.0;  // sampled, too
        CHECK(post(port, "/v1/completions", r).body["choices"][0]["text"] == "aaaaaaaa");
    }
    // +100 on one id: chosen whatever the logits.
    json one = completion("Say anything: ", 4);
    one["logit_bias"] = {{std::to_string(a), 100}};
    CHECK(post(port, "/v1/completions", one).body["choices"][0]["text"] == "aaaa");
    for (json bad : {json::array({json::array({1, 2})}), json{{"abc", 1}}, json{{"-1", 1}}, json{{"99999", 1}}, json{{"5", 101}},
                     json{{"5", "x"}}, json(3)}) {
        CAPTURE(bad.dump());
        json r = completion("x", 1);
        r["logit_bias"] = bad;
        const auto res = post(port, "/v1/completions", r);
        CHECK(is_error(res, 400));
        CHECK(res.body["error"]["param"] == "logit_bias");
    }
}

TEST_CASE("fields: chat logprobs / top_logprobs give each token's log-probability and the likeliest, for every decoder") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    for (const char* dec : decoders) {
        CAPTURE(dec);
        json r = user("Tell me something.");
        r["max_tokens"] = 6;
        r["temperature"] = 0;
        r["ignore_eos"] = true;
        r["decoder"] = dec;
        r["block"] = 4;
        r["logprobs"] = true;
        r["top_logprobs"] = 3;
        const auto res = post(port, "/v1/chat/completions", r);
        REQUIRE(res.status == 200);
        const json& content = res.body["choices"][0]["logprobs"]["content"];
        REQUIRE(content.is_array());
        CHECK(content.size() == 6);
        for (const auto& e : content) {
            CHECK(e["logprob"].get<double>() <= 0.0);
            REQUIRE(e["top_logprobs"].size() == 3);
            // Greedy: the chosen token is the likeliest at the pass that decided it (diffusion:
            // the preview pass that committed it; speculative: the verify pass).
            CHECK(e["top_logprobs"][0]["token"] == e["token"]);
            CHECK(e["top_logprobs"][0]["logprob"].get<double>() == doctest::Approx(e["logprob"].get<double>()));
            CHECK(e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]);
            CHECK(e["top_logprobs"][1]["logprob"] >= e["top_logprobs"][2]["logprob"]);
            // bytes: the token's own bytes (its text is not always UTF-8: then "token" has U+FFFD).
            std::string raw;
            for (int b : e["bytes"]) raw += char(b);
            const std::string t = e["token"];
            CHECK((raw == t || t.find("\xEF\xBF\xBD") != std::string::npos));
        }
        // Streamed: the same entries, spread over the chunks.
        auto s = stream(port, "/v1/chat/completions", r);
        REQUIRE(s.done);
        json all = json::array();
        for (const auto& c : s.chunks)
            if (!c["choices"].empty() && c["choices"][0]["logprobs"].is_object())
                for (const auto& e : c["choices"][0]["logprobs"]["content"]) all.push_back(e);
        CHECK(all == content);
        // Without logprobs: null, as OpenAI's.
        r.erase("logprobs");
        r.erase("top_logprobs");
        CHECK(post(port, "/v1/chat/completions", r).body["choices"][0]["logprobs"].is_null());
    }
    for (auto [key, v] : std::vector<std::pair<const char*, json>>{{"logprobs", "yes"}, {"top_logprobs", 21}, {"top_logprobs", -1}}) {
        CAPTURE(key);
        json r = user("hi");
        r["logprobs"] = true;
        r[key] = v;
        const auto res = post(port, "/v1/chat/completions", r);
        CHECK(is_error(res, 400));
        CHECK(res.body["error"]["param"] == key);
    }
    json r = user("hi");
    r["top_logprobs"] = 2;  // without logprobs: true
    CHECK(post(port, "/v1/chat/completions", r).body["error"]["param"] == "top_logprobs");
}

TEST_CASE("fields: completions logprobs N: tokens, their log-probabilities (the model's), N likeliest, text offsets") {
    auto& f = fx();
    const std::string prompt = "Numbers: one two";
    const auto ids = f.tok.encode(prompt, {.parse_special = false});
    const auto expect = first_logprobs(ids);  // before the server shares the model
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    json r = completion(prompt, 5);
    r["logprobs"] = 2;
    // Printable ASCII only (a random model's bytes are often not UTF-8, which JSON text cannot
    // carry as it is): the bias changes the choice, not the log-probabilities, which are the model's.
    std::vector<bool> ascii(f.tok.n_vocab());
    for (std::size_t i = 0; i < f.tok.n_vocab(); ++i) {
        const std::string b(f.tok.token_bytes(token(i)));
        ascii[i] = !b.empty() && std::all_of(b.begin(), b.end(), [](char c) { return c >= 32 && c < 127; });
        if (!ascii[i]) r["logit_bias"][std::to_string(i)] = -100;
    }
    const auto res = post(port, "/v1/completions", r);
    REQUIRE(res.status == 200);
    const json& lp = res.body["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"].size() == 5);
    REQUIRE(lp["token_logprobs"].size() == 5);
    REQUIRE(lp["top_logprobs"].size() == 5);
    std::string joined;
    for (std::size_t i = 0; i < 5; ++i) {
        CHECK(lp["text_offset"][i] == joined.size());
        joined += lp["tokens"][i].get<std::string>();
        CHECK(lp["top_logprobs"][i].size() >= 1);
        CHECK(lp["top_logprobs"][i].size() <= 2);
    }
    CHECK(joined == res.body["choices"][0]["text"]);
    // Greedy: the first token is the model's likeliest after the prompt, with its log-softmax.
    std::size_t first = 0;
    for (std::size_t i = 0; i < f.tok.n_vocab(); ++i)
        if (ascii[i] && (!ascii[first] || expect[i] > expect[first])) first = i;
    CHECK(lp["tokens"][0] == std::string(f.tok.token_bytes(token(first))));
    CHECK(lp["token_logprobs"][0].get<double>() == doctest::Approx(expect[first]).epsilon(1e-4));
    // Streamed: the same, chunk by chunk, offsets continuing.
    auto s = stream(port, "/v1/completions", r);
    REQUIRE(s.done);
    json tokens = json::array(), offsets = json::array();
    for (const auto& c : s.chunks)
        if (!c["choices"].empty() && c["choices"][0]["logprobs"].is_object())
            for (std::size_t i = 0; i < c["choices"][0]["logprobs"]["tokens"].size(); ++i) {
                tokens.push_back(c["choices"][0]["logprobs"]["tokens"][i]);
                offsets.push_back(c["choices"][0]["logprobs"]["text_offset"][i]);
            }
    CHECK(tokens == lp["tokens"]);
    CHECK(offsets == lp["text_offset"]);
    for (auto [key, v] : std::vector<std::pair<const char*, json>>{{"logprobs", 21}, {"logprobs", true}, {"top_logprobs", 2}}) {
        CAPTURE(key);
        json bad = completion("x", 1);
        bad[key] = v;
        const auto e = post(port, "/v1/completions", bad);
        CHECK(is_error(e, 400));
        CHECK(e.body["error"]["param"] == key);
    }
}

TEST_CASE("fields: n other than 1 is refused with a 400 naming 'n'") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    for (json n : {json(2), json(0), json("2"), json(1.5)}) {
        CAPTURE(n.dump());
        json r = user("hi");
        r["n"] = n;
        const auto res = post(port, "/v1/chat/completions", r);
        CHECK(is_error(res, 400));
        CHECK(res.body["error"]["param"] == "n");
        CHECK(res.body["error"]["message"].get<std::string>().find("'n'") != std::string::npos);
    }
    json r = user("hi");
    r["max_tokens"] = 1;
    r["n"] = 1;
    CHECK(post(port, "/v1/chat/completions", r).status == 200);
    json c = completion("x", 1);
    c["n"] = 3;
    CHECK(post(port, "/v1/completions", c).body["error"]["param"] == "n");
}
