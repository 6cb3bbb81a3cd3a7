#pragma once
// The OpenAI request → what the engine runs: prompt ids (chat messages rendered in the model's
// chat format), generate_options (sampling, penalties, stop strings, token limit) and the
// decoder (the `decoder` / `block` / `threshold` / `coreset` extension). Every problem with a
// request is an http_error carrying a 4xx status and a message naming the field.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "clover/chat/message.hpp"
#include "clover/chat/parse.hpp"
#include "clover/chat/render.hpp"
#include "clover/decode/engine.hpp"
#include "clover/server/json_budget.hpp"
#include "clover/tokenizer/tokenizer.hpp"

namespace clover::server {

using json = chat::json;

struct http_error : std::runtime_error {
    int status;
    std::string type, param;
    http_error(int st, std::string msg, std::string par = {}, std::string ty = "invalid_request_error")
        : std::runtime_error(std::move(msg)), status(st), type(std::move(ty)), param(std::move(par)) {}
};

inline json error_body(int status, const std::string& message, const std::string& type = {}, const std::string& param = {}) {
    json e = json::object();
    e["message"] = message;
    e["type"] = !type.empty() ? type
                : status == 401 ? "authentication_error"
                : status == 404 ? "not_found_error"
                : status >= 500 ? "server_error"
                                : "invalid_request_error";
    e["param"] = param.empty() ? json(nullptr) : json(param);
    e["code"] = status;
    return json{{"error", e}};
}

struct options {
    std::string host = "127.0.0.1";
    int port = 8080;                       // 0: an ephemeral port (start() returns it)
    std::string api_key;                   // non-empty: every /v1 request needs "Authorization: Bearer KEY"
    std::vector<std::string> api_keys;     // more keys, each as good as api_key (which must then be set)
    std::vector<std::string> cors_origins; // browser origins allowed to call ("*": any); others get 403
    std::vector<std::string> allowed_hosts;// Host names accepted besides loopback ones (loopback servers)
    std::string model_id = "clover";       // the name /v1/models lists and requests may give
    std::int64_t ctx = 4096;               // tokens per request (prompt + output)
    bool kv_f16 = true;                    // KV cache in F16 (false: F32)
    std::int64_t parallel = 4;             // requests generating together (continuous batching)
    std::int64_t batch_tokens = 512;       // rows per batched step, every kind of segment (more wait)
    // Operator limits on a request's cost (README "Limits"): the largest diffusion block and
    // speculative block (its draft; both also at most batch_tokens), and the progress rule's
    // rows per decided token (decoders.hpp; 0: off).
    std::int64_t max_block = 64;
    std::int64_t max_draft = 32;
    std::int64_t max_rows_per_token = 32;
    // The prefix cache's memory (KV pages and GDN states of earlier prompts, decode/prefix_cache.hpp),
    // MiB; 0: no cache, every prompt computed from its first token.
    std::int64_t cache_ram_mib = 4096;
    // Who shares cached prefixes: "key" (each API key its own tree: a caller cannot learn from
    // cached_tokens or timing what another key's prompts were), "global", or "auto" (key when
    // the server has a key). A request's cache_salt narrows it further.
    std::string cache_scope = "auto";
    std::int64_t max_tokens_limit = 4096;  // a request asking for more gets a 400
    std::int64_t default_max_tokens = 512; // when the request gives none (clamped to the context)
    std::size_t max_body_bytes = 4u << 20;
    std::size_t max_queue = 64;            // waiting requests; more get a 503
    int http_threads = 32;                 // requests served at once; a quarter is kept for short ones
    int max_connections = 256;             // open connections (waiting, queued, served); more get a 503
    int read_timeout_s = 30;               // a request's headers and body must arrive within this
    int write_timeout_s = 30;              // one write to a client that does not read
    decode::sampler_options sampling{0.6f, 20, 0.95f, 0.f};  // defaults (Qwen's recommended)
    std::string decoder = "ar";            // default decoding mode: ar | diffusion | speculative
    std::int64_t block = 32;
    float threshold = 0.95f;
    std::int64_t coreset = -1;
    bool enable_thinking = true;           // default of chat_template_kwargs.enable_thinking
};

using decoder_choice = decode::builtin_decoder;

inline std::string decoder_name(const decoder_choice& d) {
    return std::visit([](const auto& x) { return std::string(std::decay_t<decltype(x)>::name); }, d);
}

// What the request parser needs to know about the model.
struct model_info {
    std::int64_t n_expert = 0;
    std::string diffusion_unavailable;  // "" when preview passes work
};

struct request {
    bool chat = true, stream = false, include_usage = false;
    std::string prompt_text;
    std::vector<token> prompt;
    chat::format fmt = chat::format::qwen35;
    bool in_reasoning = false;  // the prompt leaves an open <think>
    json tools = json::array(); // what the output parser types tool parameters with
    decode::generate_options gen;
    decoder_choice dec;
    std::int64_t ctx = 0;       // session size for this request
    bool cache_prompt = true;   // llama-server's field: false neither reuses nor keeps a cached prefix
    std::string cache_salt;     // vLLM's field: cached prefixes are shared only with the same salt
    std::string cache_scope;    // the prefix cache's tree for this request (the server sets it)
};

namespace protocol_detail {

inline const json* field(const json& b, const char* key) {
    auto it = b.find(key);
    return it == b.end() || it->is_null() ? nullptr : &*it;
}
inline double number(const json& b, const char* key, double lo, double hi, double def) {
    const json* v = field(b, key);
    if (!v) return def;
    if (!v->is_number()) throw http_error(400, std::string("'") + key + "' must be a number", key);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
        throw http_error(400, std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                                  " (got " + v->dump() + ")", key);
    return x;
}
inline std::int64_t integer(const json& b, const char* key, std::int64_t lo, std::int64_t hi, std::int64_t def) {
    const json* v = field(b, key);
    if (!v) return def;
    if (v->is_number_float()) {  // 16.0 is fine; 16.5 and 1e30 are not
        const double d = v->get<double>();
        if (!(std::fabs(d) < 9.0e15) || d != std::floor(d)) throw http_error(400, std::string("'") + key + "' must be an integer", key);
    } else if (!v->is_number_integer()) {
        throw http_error(400, std::string("'") + key + "' must be an integer", key);
    }
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > std::uint64_t(INT64_MAX))
        throw http_error(400, std::string("'") + key + "' is too large", key);
    const std::int64_t x = v->is_number_float() ? std::int64_t(v->get<double>()) : v->get<std::int64_t>();
    if (x < lo || x > hi)
        throw http_error(400, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                                  " (got " + std::to_string(x) + ")", key);
    return x;
}
inline bool boolean(const json& b, const char* key, bool def) {
    const json* v = field(b, key);
    if (!v) return def;
    if (!v->is_boolean()) throw http_error(400, std::string("'") + key + "' must be true or false", key);
    return v->get<bool>();
}

}  // namespace protocol_detail

// The request body as JSON: 400 when it is not JSON, nests deeper than chat::max_json_depth or
// would cost more than `budget` as a tree (all measured before anything is built, so that
// nothing recursive ever sees deeper input and a wide body costs its text only).
inline json parse_body(std::string_view body, const json_budget& budget = {}) {
    if (chat::json_nesting(body) > chat::max_json_depth)
        throw http_error(400, "the request body nests JSON deeper than " + std::to_string(chat::max_json_depth) + " levels (the limit)");
    const json_check c = check_json_budget(body, budget);
    if (!c.over.empty()) throw http_error(400, c.over);
    if (!c.syntax.empty()) throw http_error(400, "the request body is not valid JSON: " + c.syntax);
    try {
        return json::parse(body);
    } catch (const json::parse_error& e) {
        throw http_error(400, std::string("the request body is not valid JSON: ") + e.what());
    }
}

namespace protocol_detail {

// /v1/completions: a string is the client's text, tokenized with control tokens read as text
// (like chat message contents); control tokens go in as ids, alone or between strings:
// [151644, "user\nHi", 151645]. An array of strings is a batch, which n = 1 does not allow.
inline std::vector<token> completion_prompt(const json& p, const tokenizer& tok, std::string& text) {
    const encode_options plain{.parse_special = false};
    if (p.is_string()) {
        text = p.get<std::string>();
        if (text.empty()) throw http_error(400, "'prompt' must not be empty", "prompt");
        return tok.encode(text, plain);
    }
    if (!p.is_array()) throw http_error(400, "'prompt' must be a string, or an array of token ids and strings", "prompt");
    if (p.size() == 1 && p[0].is_string()) return completion_prompt(p[0], tok, text);
    if (p.empty()) throw http_error(400, "'prompt' must not be empty", "prompt");
    std::vector<token> ids;
    bool any_id = false;
    for (const auto& x : p) {
        if (x.is_string()) {
            const auto more = tok.encode(x.get_ref<const std::string&>(), plain);
            ids.insert(ids.end(), more.begin(), more.end());
            text += x.get_ref<const std::string&>();
        } else if (x.is_number_integer()) {
            const bool in_range = x.is_number_unsigned() ? x.get<std::uint64_t>() < tok.n_vocab()
                                                         : x.get<std::int64_t>() >= 0 && std::uint64_t(x.get<std::int64_t>()) < tok.n_vocab();
            if (!in_range)
                throw http_error(400, "'prompt': token id " + x.dump() + " is outside the vocabulary (" + std::to_string(tok.n_vocab()) + " tokens)",
                                 "prompt");
            ids.push_back(token(x.get<std::int64_t>()));
            text += tok.token_bytes(token(x.get<std::int64_t>()));
            any_id = true;
        } else {
            throw http_error(400, "'prompt' arrays hold token ids and strings", "prompt");
        }
    }
    if (!any_id) throw http_error(400, "'prompt' as an array of strings is a batch; this server takes one prompt (n = 1)", "prompt");
    return ids;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}.
inline std::vector<std::pair<std::int32_t, float>> logit_bias(const json& v, std::size_t n_vocab) {
    if (!v.is_object()) throw http_error(400, "'logit_bias' must be an object of token ids to biases, e.g. {\"15043\": -100}", "logit_bias");
    std::vector<std::pair<std::int32_t, float>> out;
    for (const auto& [key, b] : v.items()) {
        const bool digits = !key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || std::stoull(key) >= n_vocab)
            throw http_error(400, "'logit_bias': \"" + key + "\" is not a token id of this model (0 to " + std::to_string(n_vocab - 1) + ")",
                             "logit_bias");
        if (!b.is_number() || !(b.get<double>() >= -100.0 && b.get<double>() <= 100.0))
            throw http_error(400, "'logit_bias': the bias of token " + key + " must be a number from -100 to 100", "logit_bias");
        out.emplace_back(std::int32_t(std::stoul(key)), b.get<float>());
    }
    return out;
}

// Chat: logprobs (true/false) and top_logprobs (0 to 20, with logprobs); completions: logprobs
// (0 to 20, how many likeliest tokens). -1: none.
inline std::int32_t requested_logprobs(const json& body, bool chat_api) {
    if (!chat_api) {
        if (field(body, "top_logprobs"))
            throw http_error(400, "'top_logprobs' is a chat field; /v1/completions takes 'logprobs': N", "top_logprobs");
        return std::int32_t(integer(body, "logprobs", 0, 20, -1));
    }
    const bool on = boolean(body, "logprobs", false);
    const std::int64_t top = integer(body, "top_logprobs", 0, 20, 0);
    if (field(body, "top_logprobs") && !on) throw http_error(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    return on ? std::int32_t(top) : -1;
}

}  // namespace protocol_detail

// Parses an OpenAI request body (already valid JSON) for /v1/chat/completions (chat) or
// /v1/completions. Tokenizes the prompt and checks it against the context.
inline request parse_request(const json& body, bool chat_api, const tokenizer& tok, const model_info& mi, const options& o,
                             chat::format fmt) {
    using namespace protocol_detail;
    if (!body.is_object()) throw http_error(400, "the request body must be a JSON object");
    request r;
    r.chat = chat_api;
    r.fmt = fmt;
    if (const json* m = field(body, "model")) {
        if (!m->is_string()) throw http_error(400, "'model' must be a string", "model");
        const auto name = m->get<std::string>();
        if (!name.empty() && name != o.model_id)
            throw http_error(404, "the model '" + name + "' does not exist (this server serves '" + o.model_id + "')", "model",
                             "model_not_found");
    }
    r.stream = boolean(body, "stream", false);
    if (const json* so = field(body, "stream_options")) {
        if (!so->is_object()) throw http_error(400, "'stream_options' must be an object", "stream_options");
        r.include_usage = boolean(*so, "include_usage", false);
    }
    if (const json* n = field(body, "n"); n && *n != 1)
        throw http_error(400, "'n' must be 1: this server makes one choice per request (got " + n->dump() + ")", "n");

    // The prompt.
    if (chat_api) {
        const json* msgs = field(body, "messages");
        if (!msgs) throw http_error(400, "'messages' is required", "messages");
        if (!msgs->is_array()) throw http_error(400, "'messages' must be an array", "messages");
        if (msgs->empty()) throw http_error(400, "'messages' must not be empty", "messages");
        std::vector<chat::message> conv;
        for (std::size_t i = 0; i < msgs->size(); ++i) {
            const json& m = (*msgs)[i];
            const std::string par = "messages[" + std::to_string(i) + "]";
            if (!m.is_object()) throw http_error(400, par + " must be an object", par);
            if (!m.contains("role") || !m["role"].is_string()) throw http_error(400, par + ".role must be a string", par + ".role");
            if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() && !m["content"].is_array())
                throw http_error(400, par + ".content must be a string or an array of text parts", par + ".content");
            if (m.contains("content") && m["content"].is_array())
                for (const auto& part : m["content"])
                    if (!part.is_object() || !part.contains("text") || !part["text"].is_string() ||
                        (part.contains("type") && part["type"] != "text"))
                        throw http_error(400, par + ".content: only text parts ({\"type\": \"text\", \"text\": \"...\"}) are supported",
                                         par + ".content");
            try {
                conv.push_back(chat::message_from_json(m));
            } catch (const std::exception& e) {
                throw http_error(400, par + ": " + e.what(), par);
            }
        }
        chat::render_options ro;
        ro.enable_thinking = o.enable_thinking;
        if (const json* k = field(body, "chat_template_kwargs")) {
            if (!k->is_object()) throw http_error(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
            ro.enable_thinking = boolean(*k, "enable_thinking", ro.enable_thinking);
        }
        ro.enable_thinking = boolean(body, "enable_thinking", ro.enable_thinking);
        bool use_tools = true;
        if (const json* tc = field(body, "tool_choice")) {
            if (tc->is_string()) {
                const auto c = tc->get<std::string>();
                if (c == "none") use_tools = false;
                else if (c != "auto" && c != "required")
                    throw http_error(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or a function", "tool_choice");
            } else if (!tc->is_object()) {
                throw http_error(400, "'tool_choice' must be a string or an object", "tool_choice");
            }
        }
        if (const json* tools = field(body, "tools")) {
            if (!tools->is_array()) throw http_error(400, "'tools' must be an array", "tools");
            for (std::size_t i = 0; i < tools->size(); ++i) {
                const json& t = (*tools)[i];
                const json* f = t.is_object() ? field(t, "function") : nullptr;
                if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
                    throw http_error(400, "tools[" + std::to_string(i) + "] must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                                     "tools");
            }
            r.tools = *tools;
            if (const json* tc = field(body, "tool_choice"); tc && tc->is_object()) {  // one named function
                const json* f = field(*tc, "function");
                if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
                    throw http_error(400, "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                                     "tool_choice");
                json only = json::array();
                for (const auto& t : *tools)
                    if (t["function"]["name"] == (*f)["name"]) only.push_back(t);
                if (only.empty()) throw http_error(400, "'tool_choice' names a function that is not in 'tools'", "tool_choice");
                r.tools = only;
            }
            if (use_tools) ro.tools = r.tools;
        }
        chat::rendered prompt;
        try {
            prompt = chat::render_marked(fmt, conv, ro);
        } catch (const std::exception& e) {
            throw http_error(400, std::string("messages: ") + e.what(), "messages");
        }
        r.prompt_text = std::move(prompt.text);
        r.in_reasoning = chat::prompt_opens_think(r.prompt_text);
        // Control tokens only where the template wrote them: "<|im_end|>" typed in a message is text.
        r.prompt = tok.encode_marked(r.prompt_text, prompt.template_bounds);
    } else {
        const json* p = field(body, "prompt");
        if (!p) throw http_error(400, "'prompt' is required", "prompt");
        r.prompt = completion_prompt(*p, tok, r.prompt_text);
    }
    if (r.prompt.empty()) throw http_error(400, "the prompt is empty after tokenization", r.chat ? "messages" : "prompt");
    const std::int64_t n_prompt = std::int64_t(r.prompt.size());
    if (n_prompt >= o.ctx)
        throw http_error(400, "the prompt has " + std::to_string(n_prompt) + " tokens; the context holds " + std::to_string(o.ctx) +
                                  " (prompt and output together)", r.chat ? "messages" : "prompt", "context_length_exceeded");

    // Limits and sampling.
    auto& g = r.gen;
    std::int64_t max_tokens = integer(body, "max_tokens", 1, INT64_MAX, -1);
    const char* max_key = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    max_tokens = integer(body, "max_completion_tokens", 1, INT64_MAX, max_tokens);
    if (max_tokens > o.max_tokens_limit)
        throw http_error(400, std::string(max_key) + " is " + std::to_string(max_tokens) + "; this server allows at most " +
                                  std::to_string(o.max_tokens_limit), max_key);
    if (max_tokens < 0) max_tokens = o.default_max_tokens;
    g.max_tokens = std::max<std::int64_t>(1, std::min(max_tokens, o.ctx - n_prompt));
    g.ignore_eos = boolean(body, "ignore_eos", false);
    r.cache_prompt = boolean(body, "cache_prompt", true);
    g.eog = tok.eog_ids();
    auto& s = g.sampling;
    s = o.sampling;
    s.temperature = float(number(body, "temperature", 0.0, 2.0, s.temperature));
    s.top_p = float(number(body, "top_p", 0.0, 1.0, s.top_p));
    if (field(body, "top_p") && s.top_p <= 0.f) throw http_error(400, "'top_p' must be greater than 0", "top_p");
    s.top_k = std::int32_t(integer(body, "top_k", 0, 1 << 30, s.top_k));
    s.min_p = float(number(body, "min_p", 0.0, 1.0, s.min_p));
    s.presence_penalty = float(number(body, "presence_penalty", -2.0, 2.0, s.presence_penalty));
    s.frequency_penalty = float(number(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
    s.repetition_penalty = float(number(body, "repetition_penalty", 0.0, 10.0, s.repetition_penalty));
    if (s.repetition_penalty <= 0.f) throw http_error(400, "'repetition_penalty' must be greater than 0", "repetition_penalty");
    if (field(body, "seed")) {
        const json& v = body["seed"];
        if (!v.is_number_integer()) throw http_error(400, "'seed' must be an integer", "seed");
        s.seed = v.is_number_unsigned() ? v.get<std::uint64_t>() : std::uint64_t(v.get<std::int64_t>());
    } else {
        static thread_local std::mt19937_64 gen{std::random_device{}()};
        s.seed = gen();
    }
    if (auto t = tok.find_token("</think>")) s.think_end = *t;
    if (!g.eog.empty()) s.stop_token = g.eog.front();
    if (const json* st = field(body, "stop")) {
        if (st->is_string()) g.stop.push_back(st->get<std::string>());
        else if (st->is_array()) {
            for (const auto& x : *st) {
                if (!x.is_string()) throw http_error(400, "'stop' must be a string or an array of strings", "stop");
                g.stop.push_back(x.get<std::string>());
            }
        } else throw http_error(400, "'stop' must be a string or an array of strings", "stop");
        if (g.stop.size() > 16) throw http_error(400, "'stop' may hold at most 16 strings", "stop");
        for (const auto& x : g.stop)
            if (x.empty() || x.size() > 256) throw http_error(400, "'stop' strings must be 1 to 256 bytes long", "stop");
    }
    g.piece = [&tok](token t) { return t >= 0 && std::size_t(t) < tok.n_vocab() ? std::string(tok.token_bytes(t)) : std::string(); };
    if (const json* lb = field(body, "logit_bias")) s.logit_bias = logit_bias(*lb, tok.n_vocab());
    g.logprobs = requested_logprobs(body, chat_api);
    if (const json* salt = field(body, "cache_salt")) {
        if (!salt->is_string() || salt->get_ref<const std::string&>().empty() || salt->get_ref<const std::string&>().size() > 1024)
            throw http_error(400, "'cache_salt' must be a non-empty string of at most 1024 bytes", "cache_salt");
        r.cache_salt = salt->get<std::string>();
    }

    // The decoder (extension).
    std::string dec = o.decoder;
    if (const json* d = field(body, "decoder")) {
        if (!d->is_string()) throw http_error(400, "'decoder' must be \"ar\", \"diffusion\" or \"speculative\"", "decoder");
        dec = d->get<std::string>();
    }
    // A preview block is computed whole in every pass: the operator's cap bounds a pass's rows
    // (the step's rows are bounded by --batch-tokens, so the cap is never above it either).
    const bool spec = dec == "speculative";
    const std::int64_t cap = std::min(spec ? o.max_draft : o.max_block, o.batch_tokens), lo = spec ? 2 : 1;
    std::int64_t block = integer(body, "block", lo, INT64_MAX, std::max(lo, std::min(o.block, cap)));
    if (block > cap)
        throw http_error(400, "'block' is " + std::to_string(block) + "; this server allows at most " + std::to_string(cap) + " for the " +
                                  (dec == "ar" ? std::string("diffusion") : dec) + " decoder (" +
                                  (spec ? "--max-draft " + std::to_string(o.max_draft) : "--max-block " + std::to_string(o.max_block)) +
                                  ", --batch-tokens " + std::to_string(o.batch_tokens) + ")", "block");
    const float threshold = float(number(body, "threshold", 0.0, 1.0, o.threshold));
    std::int64_t coreset = o.coreset;
    if (field(body, "coreset")) coreset = integer(body, "coreset", 0, mi.n_expert, -1);
    if (dec == "ar") r.dec = decode::ar{};
    else if (dec == "diffusion") r.dec = decode::low_confidence{block, threshold, coreset, o.max_rows_per_token};
    else if (dec == "speculative") r.dec = decode::self_speculative{block, 1, threshold, coreset, o.max_rows_per_token};
    else throw http_error(400, "'decoder' must be \"ar\", \"diffusion\" or \"speculative\" (got \"" + dec + "\")", "decoder");
    if (dec != "ar" && !mi.diffusion_unavailable.empty())
        throw http_error(400, "decoder '" + dec + "' needs block diffusion, which this model cannot run: " + mi.diffusion_unavailable,
                         "decoder");
    r.ctx = std::min(o.ctx, n_prompt + g.max_tokens + (dec == "ar" ? 1 : block) + 1);
    return r;
}

}  // namespace clover::server
