// Chat formats: rendering equals what the Jinja templates render (fixtures made with
// @huggingface/jinja by tools/tokenizer/render_chat.mjs from the official Qwen3 template and
// our Qwen3.5-style template), parsing inverts rendering, and streaming parsing equals
// parsing the whole text at once.
#include <doctest/doctest.h>

#include <fstream>
#include <random>

#include "clover/chat/parse.hpp"
#include "clover/chat/render.hpp"

using namespace clover;
using namespace clover::chat;

namespace {

json load(const std::string& name) {
    std::ifstream f(std::string(CLOVER_TEST_DATA) + "/chat/" + name, std::ios::binary);
    REQUIRE_MESSAGE(f, "missing fixture tests/data/chat/", name);
    return json::parse(f);
}
std::string slurp(const std::string& name) {
    std::ifstream f(std::string(CLOVER_TEST_DATA) + "/chat/" + name, std::ios::binary);
    REQUIRE(f);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

render_options options_of(const json& c) {
    render_options o;
    o.add_generation_prompt = c.value("add_generation_prompt", true);
    o.enable_thinking = c.value("enable_thinking", true);
    if (c.contains("tools")) o.tools = c["tools"];
    return o;
}

bool in_format(const json& c, format f) {
    if (!c.contains("formats")) return true;
    for (const auto& x : c["formats"])
        if (x.get<std::string>() == format_name(f)) return true;
    return false;
}

// Where the texts first differ, for a readable failure.
std::string first_difference(const std::string& a, const std::string& b) {
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    auto from = i < 40 ? 0 : i - 40;
    return "at byte " + std::to_string(i) + "\n  ours:     " + json(a.substr(from, 120)).dump() + "\n  template: " +
           json(b.substr(from, 120)).dump();
}

}  // namespace

TEST_CASE("rendering equals the chat templates (fixtures rendered by a real Jinja engine)") {
    json cases = load("conversations.json");
    for (format f : {format::qwen3, format::qwen35}) {
        json expected = load("expected_" + std::string(format_name(f)) + ".json");
        std::size_t n = 0;
        for (const auto& c : cases) {
            if (!in_format(c, f)) continue;
            std::string name = c["name"].get<std::string>();
            REQUIRE_MESSAGE(expected.contains(name), "fixture lacks ", name);
            std::string ours = render(f, messages_from_json(c["messages"]), options_of(c));
            std::string want = expected[name].get<std::string>();
            CHECK_MESSAGE(ours == want, format_name(f), " / ", name, ": ", first_difference(ours, want));
            ++n;
        }
        CHECK(n == expected.size());
        MESSAGE(format_name(f), ": ", n, " conversations render as the template does");
    }
}

TEST_CASE("the format is recognised from the template text") {
    CHECK(detect_format(slurp("qwen3_chat_template.jinja")) == format::qwen3);
    CHECK(detect_format(slurp("qwen35_chat_template.jinja")) == format::qwen35);
    CHECK(detect_format("") == format::qwen35);
    CHECK(detect_format("", format::qwen3) == format::qwen3);
}

TEST_CASE("generation prompts: thinking on and off") {
    std::vector<message> m = {user_msg("Hi")};
    CHECK(render(format::qwen35, m).ends_with("<|im_start|>assistant\n<think>\n"));
    CHECK(render(format::qwen35, m, {.enable_thinking = false}).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    CHECK(render(format::qwen3, m).ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    CHECK(render(format::qwen3, m, {.enable_thinking = false}).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    CHECK(prompt_opens_think(render(format::qwen35, m)));
    CHECK_FALSE(prompt_opens_think(render(format::qwen35, m, {.enable_thinking = false})));
    CHECK_FALSE(prompt_opens_think(render(format::qwen3, m)));
}

TEST_CASE("tojson and Python str as the templates print them") {
    CHECK(tojson(json::parse(R"({"b": [1, 2.5, true, null], "a": "x\"y\n\u0001é"})")) ==
          R"({"b": [1, 2.5, true, null], "a": "x\"y\n\u0001é"})");
    CHECK(tojson(json(1.0)) == "1.0");
    CHECK(tojson(json(0.1)) == "0.1");
    CHECK(tojson(json(1e-05)) == "1e-05");
    CHECK(tojson(json(1e20)) == "1e+20");
    CHECK(tojson(json(-3)) == "-3");
    CHECK(python_str(json(true)) == "True");
    CHECK(python_str(json(nullptr)) == "None");
    CHECK(python_str(json("text")) == "text");
    // A boolean argument in the XML form is printed the Python way.
    std::vector<message> m = {user_msg("x"), assistant_msg("", std::nullopt, {{"f", json{{"flag", true}, {"n", 3}}, ""}})};
    CHECK(render(format::qwen35, m, {.add_generation_prompt = false}).find("<parameter=flag>\nTrue\n</parameter>") !=
          std::string::npos);
}

TEST_CASE("rendering errors are one clover::error") {
    CHECK_THROWS_WITH_AS(render(format::qwen35, std::vector<message>{}), "chat: no messages", clover::error);
    CHECK_THROWS_WITH_AS(render(format::qwen35, std::vector<message>{system_msg("s")}), "chat: no user query in the messages",
                         clover::error);
    CHECK_THROWS_WITH_AS(render(format::qwen35, std::vector<message>{user_msg("a"), system_msg("s")}),
                         "chat: a system message must come first", clover::error);
    CHECK_THROWS_AS(render(format::qwen3, std::vector<message>{{"robot", "x", {}, {}, {}}}), clover::error);
    CHECK_THROWS_AS(messages_from_json(json::parse(R"([{"content": "no role"}])")), clover::error);
    std::vector<message> bad = {user_msg("x"), assistant_msg("", std::nullopt, {{"f", json("not json"), ""}})};
    CHECK_THROWS_AS(render(format::qwen35, bad), clover::error);
}

TEST_CASE("parsing: reasoning, content and several tool calls in both forms") {
    json tools = load("conversations.json")[10]["tools"];
    parse_options thinking{.in_reasoning = true, .tools = &tools};
    auto r = parse(format::qwen35,
                   "Need two lookups.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                   "Paris\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\n"
                   "a\nb\n</parameter>\n<parameter=max_results>\n3\n</parameter>\n<parameter=filters>\n{\"lang\": [\"en\"]}\n"
                   "</parameter>\n</function>\n</tool_call>",
                   thinking);
    CHECK(r.reasoning == "Need two lookups.");
    CHECK(r.content == "Let me check.");
    REQUIRE(r.tool_calls.size() == 2);
    CHECK(r.tool_calls[0].name == "get_weather");
    CHECK(r.tool_calls[0].arguments == json{{"city", "Paris"}});
    CHECK(r.tool_calls[1].arguments == json::parse(R"({"query": "a\nb", "max_results": 3, "filters": {"lang": ["en"]}})"));
    CHECK(r.errors.empty());

    auto q = parse(format::qwen3,
                   "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                   "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"x\\\"}\"}\n</tool_call>");
    CHECK(q.reasoning == "hmm");
    CHECK(q.content.empty());
    REQUIRE(q.tool_calls.size() == 2);
    CHECK(q.tool_calls[1].arguments == json{{"query", "x"}});  // string arguments are read as JSON

    // No schema: JSON literals become JSON, other text stays text; schema types win.
    auto s = parse(format::qwen35, "<tool_call>\n<function=f>\n<parameter=a>\n42\n</parameter>\n<parameter=b>\nTrue\n"
                                   "</parameter>\n<parameter=c>\nhello\n</parameter>\n</function>\n</tool_call>");
    CHECK(s.tool_calls.at(0).arguments == json::parse(R"({"a": 42, "b": "True", "c": "hello"})"));
    json schema = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}}}}])");
    auto t = parse(format::qwen35, "<tool_call>\n<function=f>\n<parameter=a>\n42\n</parameter>\n<parameter=b>\nTrue\n"
                                   "</parameter>\n</function>\n</tool_call>", {.tools = &schema});
    CHECK(t.tool_calls.at(0).arguments == json::parse(R"({"a": "42", "b": true})"));

    // An unreadable call stays in the content and is reported.
    auto e = parse(format::qwen3, "Answer.\n<tool_call>\n{not json}\n</tool_call>");
    CHECK(e.tool_calls.empty());
    CHECK(e.content == "Answer.\n<tool_call>\n{not json}\n</tool_call>");
    CHECK(e.errors.size() == 1);
    // Output that stops inside the reasoning.
    auto u = parse(format::qwen35, "still thinking\n", {.in_reasoning = true});
    CHECK(u.reasoning == "still thinking");
    CHECK(u.reasoning_unclosed);
    // Plain answers, with and without a think block.
    CHECK(parse(format::qwen3, "Hello!").content == "Hello!");
    CHECK(parse(format::qwen3, "<thinking is not a tag").content == "<thinking is not a tag");
    CHECK(parse(format::qwen3, "<thi").content == "<thi");
}

namespace {

// Feeds text in the given chunk sizes; the events must add up to the one-shot parse.
void check_streaming(format f, const std::string& text, const parse_options& o, std::mt19937& rng) {
    parse_result whole = parse(f, text, o);
    for (int trial = 0; trial < 12; ++trial) {
        stream_parser p(f, o);
        std::string reasoning, content;
        std::vector<tool_call> calls;
        std::vector<std::string> begun;
        auto take = [&](const std::vector<stream_event>& evs) {
            for (const auto& e : evs) {
                switch (e.type) {
                case stream_event::kind::reasoning: reasoning += e.text; break;
                case stream_event::kind::content: content += e.text; break;
                case stream_event::kind::tool_call_begin: begun.push_back(e.text); break;
                case stream_event::kind::tool_call:
                    REQUIRE(begun.size() == calls.size() + 1);  // announced before it completes
                    CHECK(begun.back() == e.call.name);
                    calls.push_back(e.call);
                    break;
                }
            }
        };
        for (std::size_t i = 0; i < text.size();) {
            std::size_t n = trial == 0 ? 1 : 1 + rng() % 9;
            take(p.feed(std::string_view(text).substr(i, n)));
            i += n;
        }
        take(p.finish());
        REQUIRE(reasoning == whole.reasoning);
        REQUIRE(content == whole.content);
        REQUIRE(calls.size() == whole.tool_calls.size());
        for (std::size_t k = 0; k < calls.size(); ++k) {
            CHECK(calls[k].name == whole.tool_calls[k].name);
            CHECK(calls[k].arguments == whole.tool_calls[k].arguments);
        }
        CHECK(p.result().content == whole.content);
    }
}

}  // namespace

TEST_CASE("parsing inverts rendering, and streaming equals parsing at once") {
    json cases = load("conversations.json");
    std::mt19937 rng(5);
    std::size_t inverted = 0;
    for (format f : {format::qwen3, format::qwen35}) {
        for (const auto& c : cases) {
            if (!in_format(c, f)) continue;
            auto msgs = messages_from_json(c["messages"]);
            auto o = options_of(c);
            if (o.add_generation_prompt || msgs.back().role != "assistant") continue;
            // The prompt a model would have seen, and the text it would have generated.
            std::vector<message> before(msgs.begin(), msgs.end() - 1);
            render_options po = o;
            po.add_generation_prompt = true;
            std::string prompt = render(f, before, po), full = render(f, msgs, o);
            std::string name = c["name"].get<std::string>();
            // Qwen3 renders an earlier-than-last assistant turn without its think block, so
            // only the last turn is the model's output here.
            REQUIRE_MESSAGE(full.starts_with(prompt), name);
            std::string output = full.substr(prompt.size());
            REQUIRE(output.ends_with("<|im_end|>\n"));
            output.resize(output.size() - 11);
            parse_options popt{.in_reasoning = prompt_opens_think(prompt), .tools = &o.tools};
            parse_result r = parse(f, output, popt);
            CHECK_MESSAGE(r.errors.empty(), name);
            std::vector<message> again = before;
            again.push_back(r.to_message());
            CHECK_MESSAGE(render(f, again, o) == full, format_name(f), " / ", name, ": ", first_difference(render(f, again, o), full));
            check_streaming(f, output, popt, rng);
            ++inverted;
        }
    }
    MESSAGE(inverted, " rendered assistant turns parsed back to the same rendering");
    CHECK(inverted >= 14);
}
