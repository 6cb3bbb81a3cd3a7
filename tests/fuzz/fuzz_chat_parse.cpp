// The chat output parser (chat/parse.hpp) on arbitrary model output: thinking, content and tool
// calls in both formats. The first input byte picks the format, whether the prompt left <think>
// open, whether tools with a schema type the XML parameters, and how the text is cut into stream
// pieces; the rest is the output.
// Checked, beyond "no crash": the output streamed in pieces parses exactly as in one go (the
// server streams, tests mostly parse whole); the parsed message converts to OpenAI JSON and
// renders back into a prompt (the next turn of a conversation) with no error but clover::error.
// The server hands the parser valid UTF-8 (streaming_decoder sanitizes), so the checks run on
// sanitize(output); the raw bytes only have to parse without a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <clover/chat/message.hpp>
#include <clover/chat/parse.hpp>
#include <clover/chat/render.hpp>
#include <clover/core/error.hpp>
#include <clover/tokenizer/utf8.hpp>

#include "fuzz_util.hpp"

namespace {

using clover::chat::json;

const json& tools() {
    static const json t = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {
          "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
          "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
          "note": {"type": ["null", "string"]}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "noop"}}])");
    return t;
}

std::string text_of(const clover::chat::parse_result& r) {
    std::string s = "R[" + r.reasoning + "]C[" + r.content + "]U" + std::to_string(r.reasoning_unclosed);
    for (const auto& c : r.tool_calls) s += "T[" + c.name + "|" + c.arguments.dump(-1, ' ', false, json::error_handler_t::replace) + "]";
    for (const auto& e : r.errors) s += "E[" + e + "]";
    return s;
}

// The output fed in pieces of 1..16 bytes, their lengths drawn from `seed`.
clover::chat::parse_result streamed(clover::chat::format f, const std::string& text, const clover::chat::parse_options& o,
                                    unsigned seed) {
    clover::chat::stream_parser p(f, o);
    std::string reasoning, content;
    std::size_t calls = 0;
    auto take = [&](const std::vector<clover::chat::stream_event>& evs) {
        for (const auto& ev : evs) {
            if (ev.type == clover::chat::stream_event::kind::reasoning) reasoning += ev.text;
            else if (ev.type == clover::chat::stream_event::kind::content) content += ev.text;
            else if (ev.type == clover::chat::stream_event::kind::tool_call) ++calls;
        }
    };
    std::uint32_t state = seed * 2654435761u + 1;
    for (std::size_t i = 0; i < text.size();) {
        state = state * 1664525u + 1013904223u;
        const std::size_t n = std::min<std::size_t>(text.size() - i, 1 + (state >> 28));
        take(p.feed(std::string_view(text).substr(i, n)));
        i += n;
    }
    take(p.finish());
    const auto& r = p.result();
    if (reasoning != r.reasoning || content != r.content || calls != r.tool_calls.size())
        fuzz::die("the stream events do not add up to the parse result");
    return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto in = fuzz::split_flags(data, size);
    const auto fmt = in.bit(0) ? clover::chat::format::qwen3 : clover::chat::format::qwen35;
    const clover::chat::parse_options opt{.in_reasoning = in.bit(1), .tools = in.bit(2) ? &tools() : nullptr};

    (void)clover::chat::parse(fmt, in.rest, opt);  // raw bytes: no crash, no exception

    const std::string text = clover::tok::utf8::sanitize(in.rest);
    const clover::chat::parse_result whole = clover::chat::parse(fmt, text, opt);
    const clover::chat::parse_result pieces = streamed(fmt, text, opt, in.flags >> 3);
    if (text_of(whole) != text_of(pieces)) fuzz::die("streamed parse differs:\n  whole:  " + text_of(whole) + "\n  pieces: " + text_of(pieces));

    const clover::chat::message m = whole.to_message();
    const std::string reply = clover::chat::to_json(m).dump();  // valid UTF-8 in, valid UTF-8 out
    try {
        clover::chat::render_options ro;
        if (opt.tools) ro.tools = *opt.tools;
        const std::vector<clover::chat::message> conv{clover::chat::user_msg("hi"), m, clover::chat::user_msg("and now?")};
        (void)clover::chat::render(fmt, conv, ro);
        (void)clover::chat::render(fmt, clover::chat::messages_from_json(json::array({json::parse(reply)})), ro);
    } catch (const clover::error&) {
    }
    return 0;
}
