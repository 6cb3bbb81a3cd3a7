// The server's request parser (server/protocol.hpp), without HTTP: the input is a request body,
// handled as `clover serve` handles one (server.hpp completion()): JSON parse (an error is a
// 400), parse_request for /v1/chat/completions in both chat formats and for /v1/completions,
// the error reply built and serialised; an accepted request then runs its response path
// (stop strings, tool typing, the final message) over a fixed model output. The tokenizer is the
// bundled model's (models/clover-small.gguf).
// A finding, beyond a crash: an exception other than http_error from parse_request (the server
// would answer "bad request: <library message>", not a message naming the field), a 4xx status
// outside 400..499, an accepted request that breaks the limits it was checked against.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <clover/server/protocol.hpp>
#include <clover/server/response.hpp>
#include <clover/tokenizer/tokenizer.hpp>

#include "fuzz_util.hpp"

namespace {

using clover::server::json;

const clover::tokenizer& tok() {
    static const clover::tokenizer t = clover::tokenizer::from_gguf(fuzz::source_dir() / "models/clover-small.gguf");
    return t;
}

// What the model "answers": reasoning, text and an XML tool call, as tokens.
const std::vector<clover::token>& answer() {
    static const std::vector<clover::token> ids = tok().encode(
        "<think>\nThe user wants the weather.\n</think>\n\nLet me check. STOP here\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
    return ids;
}

void check_accepted(const clover::server::request& r, const clover::server::options& o) {
    if (r.prompt.empty()) fuzz::die("accepted a request with an empty prompt");
    for (auto id : r.prompt)
        if (id < 0 || std::size_t(id) >= tok().n_vocab()) fuzz::die("prompt id " + std::to_string(id) + " outside the vocabulary");
    const auto n = std::int64_t(r.prompt.size());
    if (n >= o.ctx) fuzz::die("accepted a prompt of " + std::to_string(n) + " tokens for a context of " + std::to_string(o.ctx));
    if (r.gen.max_tokens < 1 || r.gen.max_tokens > o.max_tokens_limit || n + r.gen.max_tokens > o.ctx)
        fuzz::die("max_tokens " + std::to_string(r.gen.max_tokens) + " breaks the limits");
    if (r.ctx <= n || r.ctx > o.ctx) fuzz::die("session size " + std::to_string(r.ctx) + " for a prompt of " + std::to_string(n));

    clover::server::response_builder rb(tok(), r);
    for (auto t : answer()) (void)rb.push(t);
    (void)rb.finish();
    if (r.chat) (void)rb.message().dump(-1, ' ', false, json::error_handler_t::replace);
}

void handle(const json& body, bool chat_api, clover::chat::format fmt) {
    static const clover::server::options o;
    static const clover::server::model_info mi{.n_expert = 8, .diffusion_unavailable = ""};
    try {
        const clover::server::request r = clover::server::parse_request(body, chat_api, tok(), mi, o, fmt);
        check_accepted(r, o);
    } catch (const clover::server::http_error& e) {
        if (e.status < 400 || e.status > 499) fuzz::die("status " + std::to_string(e.status) + " for a bad request: " + e.what());
        (void)clover::server::error_body(e.status, e.what(), e.type, e.param).dump();
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    (void)answer();  // loads the tokenizer once, before the first input is timed
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    json body;
    try {
        body = json::parse(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
    } catch (const json::exception&) {
        // parse_error: the server answers 400 "not valid JSON"; out_of_range (a number too large
        // for a double) reaches its catch-all: 400 "bad request: <library message>".
        return 0;
    }
    handle(body, true, clover::chat::format::qwen35);
    handle(body, true, clover::chat::format::qwen3);
    handle(body, false, clover::chat::format::qwen35);
    return 0;
}
