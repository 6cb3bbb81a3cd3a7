#pragma once
// The parts of an answer besides its text: usage, timings, and log-probabilities in OpenAI's
// shapes (a request's `logprobs`): each token the client received,
// with the log-probability the model gave it at the pass that decided it (AR: its decode row;
// speculative: the verify row; diffusion: the preview pass that committed it) and the likeliest
// alternatives there. Chat: choice.logprobs.content = [{token, logprob, bytes, top_logprobs}];
// completions: choice.logprobs = {tokens, token_logprobs, top_logprobs, text_offset}.
#include <cstdint>
#include <span>
#include <string>

#include "clover/decode/sampler.hpp"
#include "clover/server/protocol.hpp"
#include "clover/server/response.hpp"

namespace clover::server {

inline std::string finish_reason(const response_builder& rb, const decode::generate_stats& st) {
    if (rb.has_tool_calls()) return "tool_calls";
    if (!rb.stopped_by_string() && (st.stop_reason == "length" || st.stop_reason == "context")) return "length";
    return "stop";
}

inline json usage_json(const request& r, const decode::generate_stats& st) {
    const std::int64_t p = std::int64_t(r.prompt.size());
    return {{"prompt_tokens", p}, {"completion_tokens", st.tokens}, {"total_tokens", p + st.tokens},
            {"prompt_tokens_details", {{"cached_tokens", st.cached_tokens}}}};
}

// Ours, then llama-server's names: prompt_n counts the prompt tokens computed, cache_n those
// taken from the prefix cache. block_cuts: times the progress rule halved the block.
inline json timings_json(const request& r, const decode::generate_stats& st) {
    const std::int64_t computed = std::int64_t(r.prompt.size()) - st.cached_tokens;
    const double pms = st.prompt_seconds * 1e3, gms = st.seconds * 1e3;
    return {{"decoder", decoder_name(r.dec)}, {"passes", st.passes()}, {"tokens_per_pass", st.tokens_per_pass()},
            {"block_cuts", st.block_cuts}, {"prompt_seconds", st.prompt_seconds}, {"seconds", st.seconds},
            {"tokens_per_second", st.seconds > 0 ? double(st.tokens) / st.seconds : 0.0}, {"stop_reason", st.stop_reason},
            {"cache_n", st.cached_tokens}, {"prompt_n", computed}, {"prompt_ms", pms},
            {"prompt_per_token_ms", computed > 0 ? pms / double(computed) : 0.0},
            {"prompt_per_second", pms > 0 ? double(computed) * 1e3 / pms : 0.0}, {"predicted_n", st.tokens},
            {"predicted_ms", gms}, {"predicted_per_token_ms", st.tokens > 0 ? gms / double(st.tokens) : 0.0},
            {"predicted_per_second", gms > 0 ? double(st.tokens) * 1e3 / gms : 0.0}};
}

namespace logprobs_detail {
inline std::string text_of(const tokenizer& tok, std::int32_t id) {
    return id >= 0 && std::size_t(id) < tok.n_vocab() ? std::string(tok.token_bytes(id)) : std::string();
}
inline json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}
}  // namespace logprobs_detail

// {"content": [...]} for the chat API.
inline json chat_logprobs(const tokenizer& tok, std::span<const decode::token_logprob> lps) {
    using namespace logprobs_detail;
    json content = json::array();
    for (const auto& lp : lps) {
        const std::string t = text_of(tok, lp.id);
        json top = json::array();
        for (const auto& [id, l] : lp.top) {
            const std::string s = text_of(tok, id);
            top.push_back({{"token", s}, {"logprob", l}, {"bytes", bytes_of(s)}});
        }
        content.push_back({{"token", t}, {"logprob", lp.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
}

// The legacy completions form; `offset`: the generated text's bytes before these tokens (a
// stream's chunks continue it).
inline json completion_logprobs(const tokenizer& tok, std::span<const decode::token_logprob> lps, std::size_t& offset) {
    using namespace logprobs_detail;
    json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
    for (const auto& lp : lps) {
        const std::string t = text_of(tok, lp.id);
        tokens.push_back(t);
        logprobs.push_back(lp.logprob);
        json top = json::object();
        for (const auto& [id, l] : lp.top) top[text_of(tok, id)] = l;
        tops.push_back(std::move(top));
        offsets.push_back(offset);
        offset += t.size();
    }
    return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(logprobs)}, {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
}

// A choice's `logprobs`: null when the request asked for none.
inline json answer_logprobs(const tokenizer& tok, const request& r, std::span<const decode::token_logprob> lps, std::size_t& offset) {
    if (r.gen.logprobs < 0) return nullptr;
    return r.chat ? chat_logprobs(tok, lps) : completion_logprobs(tok, lps, offset);
}

}  // namespace clover::server
