#pragma once
// Generated tokens → the OpenAI response: bytes through a streaming UTF-8 decoder, stop strings
// cut out (text that could still become a stop string is held back), then for chat the output
// parser splits reasoning_content, content and tool_calls, also as streamed deltas.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "clover/chat/parse.hpp"
#include "clover/server/protocol.hpp"
#include "clover/tokenizer/streaming_decoder.hpp"

namespace clover::server {

// Holds back text that may be the start of a stop string; cuts at the first stop string.
class stop_filter {
public:
    explicit stop_filter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
    std::string feed(std::string_view text) {
        if (stopped_) return {};
        buf_ += text;
        std::size_t cut = std::string::npos;
        for (const auto& s : stops_)
            if (auto p = buf_.find(s); p != std::string::npos) cut = std::min(cut, p);
        if (cut != std::string::npos) {
            stopped_ = true;
            std::string out = buf_.substr(0, cut);
            buf_.clear();
            return out;
        }
        std::size_t keep = 0;
        for (const auto& s : stops_)
            for (std::size_t n = std::min(s.size() - 1, buf_.size()); n > keep; --n)
                if (buf_.compare(buf_.size() - n, n, s, 0, n) == 0) { keep = n; break; }
        std::string out = buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return out;
    }
    std::string finish() {
        std::string out = stopped_ ? std::string() : buf_;
        buf_.clear();
        return out;
    }
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    std::string buf_;
    bool stopped_ = false;
};

// One response in the making. push() takes generated tokens and returns the delta objects
// to stream (chat: {"content"} / {"reasoning_content"} / {"tool_calls"}; completions:
// {"text"}); finish() flushes. The accumulated message is there at the end.
class response_builder {
public:
    response_builder(const tokenizer& tok, const request& r)
        : chat_(r.chat), dec_(tok), stop_(r.gen.stop), tools_(r.tools), parser_(r.fmt, chat::parse_options{r.in_reasoning, &tools_}) {}
    response_builder(const response_builder&) = delete;

    std::vector<json> push(token t) {
        ++tokens_;
        return text(stop_.feed(dec_.push(t)));
    }
    std::vector<json> finish() {
        std::vector<json> out = text(stop_.feed(dec_.finish()));
        auto rest = text(stop_.finish());
        out.insert(out.end(), rest.begin(), rest.end());
        if (chat_) {
            for (auto& ev : parser_.finish()) add_event(ev, out);
        }
        return out;
    }
    bool stopped_by_string() const { return stop_.stopped(); }
    std::int64_t tokens() const { return tokens_; }

    // After finish(): the whole answer.
    const std::string& text_so_far() const { return text_; }
    const chat::parse_result& parsed() const { return parser_.result(); }
    bool has_tool_calls() const { return !parser_.result().tool_calls.empty(); }

    // Chat: the final assistant message in OpenAI form.
    json message() const {
        const auto& p = parser_.result();
        json m = json::object();
        m["role"] = "assistant";
        m["content"] = p.content.empty() && !p.tool_calls.empty() ? json(nullptr) : json(p.content);
        if (!p.reasoning.empty() || p.reasoning_unclosed) m["reasoning_content"] = p.reasoning;
        if (!p.tool_calls.empty()) {
            json calls = json::array();
            for (std::size_t i = 0; i < p.tool_calls.size(); ++i) calls.push_back(call_json(p.tool_calls[i], i, true));
            m["tool_calls"] = calls;
        }
        return m;
    }

private:
    json call_json(const chat::tool_call& c, std::size_t i, bool full) const {
        json f = json::object();
        if (full) f["name"] = c.name;
        f["arguments"] = c.arguments.is_string() ? c.arguments.get<std::string>() : c.arguments.dump();
        json j = json::object();
        if (!full) j["index"] = i;
        j["id"] = call_id(i);
        j["type"] = "function";
        j["function"] = f;
        return j;
    }
    std::string call_id(std::size_t i) const { return "call_" + std::to_string(i); }

    std::vector<json> text(const std::string& s) {
        std::vector<json> out;
        if (s.empty()) return out;
        text_ += s;
        if (!chat_) {
            out.push_back(json{{"text", s}});
            return out;
        }
        for (auto& ev : parser_.feed(s)) add_event(ev, out);
        return out;
    }
    void add_event(const chat::stream_event& ev, std::vector<json>& out) {
        using k = chat::stream_event::kind;
        switch (ev.type) {
        case k::reasoning: out.push_back(json{{"reasoning_content", ev.text}}); break;
        case k::content: out.push_back(json{{"content", ev.text}}); break;
        case k::tool_call_begin: {
            json f = {{"name", ev.text}, {"arguments", ""}};
            json d = {{"index", calls_}, {"id", call_id(calls_)}, {"type", "function"}, {"function", f}};
            out.push_back(json{{"tool_calls", json::array({d})}});
            begun_ = true;
            break;
        }
        case k::tool_call: {
            const auto& c = ev.call;
            json f = json::object();
            if (!begun_) f["name"] = c.name;
            f["arguments"] = c.arguments.is_string() ? c.arguments.get<std::string>() : c.arguments.dump();
            json d = {{"index", calls_}};
            if (!begun_) { d["id"] = call_id(calls_); d["type"] = "function"; }
            d["function"] = f;
            out.push_back(json{{"tool_calls", json::array({d})}});
            ++calls_;
            begun_ = false;
            break;
        }
        }
    }

    bool chat_;
    streaming_decoder dec_;
    stop_filter stop_;
    json tools_;  // before parser_, which keeps a pointer to it
    chat::stream_parser parser_;
    std::string text_;
    std::int64_t tokens_ = 0;
    std::size_t calls_ = 0;
    bool begun_ = false;
};

}  // namespace clover::server
