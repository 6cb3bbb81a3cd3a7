#pragma once
// Parses what the model generated for an assistant turn back into reasoning, content and
// structured tool calls, in one go (parse) or while the text streams in (stream_parser).
// parse() is stream_parser fed the whole text, so both always agree.
//
//   [<think>\n] REASONING \n</think>\n\n CONTENT [\n\n<tool_call>…</tool_call>]* (then EOS)
//
// - Reasoning: when the prompt pre-filled "<think>\n" (qwen35 thinking; see
//   prompt_opens_think) the output starts inside it; otherwise an opening "<think>" is
//   recognised at the start. Newlines around it are dropped, as the templates strip them.
// - Tool calls: both bodies are understood in both formats — the XML form
//   (<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>) and the Qwen3 JSON
//   form ({"name": …, "arguments": {…}}). XML values are typed by the tool's JSON schema
//   when `tools` is given (integer, number, boolean — also Python's True/False —, object,
//   array, string); without a schema a value that is a JSON number/literal/object/array is
//   read as JSON, anything else stays text.
// - Content is what remains; white space before the first tool call (the template's
//   separator) is dropped. A tool call that cannot be read stays in the content, verbatim,
//   and is reported in `errors`.
// Text that may still turn into a tag ("</thi", "<tool_") is held back until it is decided.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "clover/chat/json_text.hpp"
#include "clover/chat/message.hpp"

namespace clover::chat {

struct parse_options {
    bool in_reasoning = false;   // the prompt left an open <think> (prompt_opens_think)
    const json* tools = nullptr; // OpenAI tool definitions, to type XML parameter values
};

struct parse_result {
    std::string reasoning;
    std::string content;
    std::vector<tool_call> tool_calls;
    bool reasoning_unclosed = false;  // the output ended inside <think>
    std::vector<std::string> errors;  // tool calls that could not be read (kept in content)

    message to_message() const {
        message m;
        m.role = "assistant";
        m.content = content;
        if (!reasoning.empty() || reasoning_unclosed) m.reasoning_content = reasoning;
        m.tool_calls = tool_calls;
        return m;
    }
};

struct stream_event {
    enum class kind { reasoning, content, tool_call_begin, tool_call };
    kind type;
    std::string text;  // reasoning / content delta; the function name for tool_call_begin
    tool_call call;    // tool_call
};

namespace parse_detail {

inline constexpr std::string_view think_open = "<think>", think_close = "</think>";
inline constexpr std::string_view call_open = "<tool_call>", call_close = "</tool_call>";

// Length of the longest suffix of s that is a proper prefix of tag.
inline std::size_t partial_tag(std::string_view s, std::string_view tag) {
    for (std::size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
    return 0;
}

inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
inline std::string_view trim_ws(std::string_view s) {
    while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
    return s;
}

inline const json* param_schema(const json* tools, const std::string& fn, const std::string& param) {
    if (!tools || !tools->is_array()) return nullptr;
    for (const auto& t : *tools) {
        const json& f = t.contains("function") ? t["function"] : t;
        if (!f.is_object() || f.value("name", "") != fn) continue;
        if (!f.contains("parameters") || !f["parameters"].contains("properties")) return nullptr;
        const json& props = f["parameters"]["properties"];
        return props.contains(param) ? &props[param] : nullptr;
    }
    return nullptr;
}

inline json typed_value(const std::string& raw, const json* schema) {
    auto as_json = [&]() -> std::optional<json> {
        try {
            return parse_json(raw);
        } catch (const std::exception&) {
            return std::nullopt;
        }
    };
    std::vector<std::string> types;
    if (schema && schema->contains("type")) {
        const json& t = (*schema)["type"];
        if (t.is_string()) types.push_back(t.get<std::string>());
        else if (t.is_array())
            for (const auto& x : t)
                if (x.is_string()) types.push_back(x.get<std::string>());
    }
    if (types.empty()) {  // no schema: JSON when it is JSON (but not a bare string), else text
        auto j = as_json();
        return (j && !j->is_string()) ? *j : json(raw);
    }
    for (const auto& t : types) {
        if (t == "string") return raw;
        if (t == "boolean") {
            if (raw == "true" || raw == "True") return true;
            if (raw == "false" || raw == "False") return false;
        } else if (t == "null") {
            if (raw == "null" || raw == "None") return nullptr;
        } else if (t == "integer" || t == "number" || t == "object" || t == "array") {
            auto j = as_json();
            if (j && ((t == "integer" && j->is_number_integer()) || (t == "number" && j->is_number()) ||
                      (t == "object" && j->is_object()) || (t == "array" && j->is_array())))
                return *j;
        }
    }
    return raw;
}

// The text inside <tool_call>…</tool_call>, either form. nullopt when it cannot be read.
inline std::optional<tool_call> read_call(std::string_view body, const json* tools) {
    std::string_view b = trim_ws(body);
    tool_call c;
    if (b.starts_with("{")) {
        json j;
        try {
            j = parse_json(b);
        } catch (const std::exception&) {
            return std::nullopt;
        }
        if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
        c.name = j["name"].get<std::string>();
        const char* key = j.contains("arguments") ? "arguments" : (j.contains("parameters") ? "parameters" : nullptr);
        if (key) {
            c.arguments = j[key];
            if (c.arguments.is_string()) {
                try {
                    json a = parse_json(c.arguments.get<std::string>());
                    if (a.is_object()) c.arguments = a;
                } catch (const std::exception&) {
                }
            }
        }
        return c;
    }
    if (!b.starts_with("<function=")) return std::nullopt;
    auto gt = b.find('>');
    if (gt == std::string_view::npos) return std::nullopt;
    c.name = std::string(trim_ws(b.substr(10, gt - 10)));
    if (c.name.empty()) return std::nullopt;
    std::string_view rest = b.substr(gt + 1);
    for (;;) {
        auto p = rest.find("<parameter=");
        auto f = rest.find("</function>");
        if (p == std::string_view::npos || (f != std::string_view::npos && f < p)) break;
        auto pg = rest.find('>', p);
        if (pg == std::string_view::npos) return std::nullopt;
        std::string key(trim_ws(rest.substr(p + 11, pg - p - 11)));
        auto end = rest.find("</parameter>", pg);
        if (end == std::string_view::npos) return std::nullopt;
        std::string_view v = rest.substr(pg + 1, end - pg - 1);
        if (v.starts_with("\n")) v.remove_prefix(1);  // the template puts the value on its own lines
        if (v.ends_with("\n")) v.remove_suffix(1);
        c.arguments[key] = typed_value(std::string(v), param_schema(tools, c.name, key));
        rest = rest.substr(end + 12);
    }
    return c;
}

// The function name, once the body has it complete (for tool_call_begin).
inline std::optional<std::string> early_name(std::string_view body) {
    std::string_view b = trim_ws(body);
    if (b.starts_with("<function=")) {
        auto gt = b.find('>');
        if (gt != std::string_view::npos) return std::string(trim_ws(b.substr(10, gt - 10)));
        return std::nullopt;
    }
    auto k = b.find("\"name\"");
    if (k == std::string_view::npos) return std::nullopt;
    auto q1 = b.find('"', b.find(':', k + 6));
    if (q1 == std::string_view::npos) return std::nullopt;
    auto q2 = b.find('"', q1 + 1);
    if (q2 == std::string_view::npos) return std::nullopt;
    return std::string(b.substr(q1 + 1, q2 - q1 - 1));
}

}  // namespace parse_detail

class stream_parser {
public:
    explicit stream_parser(format f, parse_options o = {}) : format_(f), opt_(o) {
        state_ = o.in_reasoning ? state::reasoning_start : state::start;
        res_.reasoning_unclosed = false;
    }

    std::vector<stream_event> feed(std::string_view text) {
        std::vector<stream_event> ev;
        buf_ += text;
        run(ev, false);
        return ev;
    }
    std::vector<stream_event> finish() {
        std::vector<stream_event> ev;
        run(ev, true);
        return ev;
    }
    const parse_result& result() const { return res_; }
    format get_format() const { return format_; }

private:
    enum class state { start, reasoning_start, reasoning, content_start, content, in_call };
    using kind = stream_event::kind;

    void emit(std::vector<stream_event>& ev, kind k, std::string_view text) {
        if (text.empty()) return;
        if (k == kind::reasoning) res_.reasoning += text;
        else res_.content += text;
        if (!ev.empty() && ev.back().type == k) ev.back().text += text;
        else ev.push_back({k, std::string(text), {}});
    }

    // Content text outside tool calls. Before the first call it streams, except for trailing
    // white space (the separator, if a call follows); after a call, only text that is more
    // than white space is kept.
    void content_text(std::vector<stream_event>& ev, std::string_view text, bool final_piece) {
        if (calls_seen_) {
            pending_ += text;
            if (final_piece) {
                auto t = parse_detail::trim_ws(pending_);
                if (!t.empty()) {
                    std::string piece(res_.content.empty() ? "" : "\n");  // (not "" + string: a GCC 12 -Wrestrict false alarm)
                    piece += t;
                    emit(ev, kind::content, std::move(piece));
                }
                pending_.clear();
            }
            return;
        }
        pending_ += text;
        std::size_t keep = 0;
        if (!final_piece)
            while (keep < pending_.size() && parse_detail::is_ws(pending_[pending_.size() - 1 - keep])) ++keep;
        emit(ev, kind::content, std::string_view(pending_).substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
    }

    void run(std::vector<stream_event>& ev, bool at_end) {
        using namespace parse_detail;
        for (bool progress = true; progress;) {
            progress = false;
            switch (state_) {
            case state::start: {
                std::string_view b = buf_;
                std::size_t ws = 0;
                while (ws < b.size() && is_ws(b[ws])) ++ws;
                std::string_view rest = b.substr(ws);
                if (rest.starts_with(think_open)) {
                    buf_.erase(0, ws + think_open.size());
                    state_ = state::reasoning_start;
                    progress = true;
                } else if (!at_end && think_open.starts_with(rest)) {
                    return;  // still could be "<think>"
                } else {
                    state_ = state::content_start;
                    progress = true;
                }
                break;
            }
            case state::reasoning_start: {
                std::size_t n = 0;
                while (n < buf_.size() && buf_[n] == '\n') ++n;
                buf_.erase(0, n);
                if (buf_.empty() && !at_end) return;
                state_ = state::reasoning;
                progress = true;
                break;
            }
            case state::reasoning: {
                auto close = buf_.find(think_close);
                if (close != std::string::npos) {
                    std::string_view r(buf_.data(), close);
                    while (!r.empty() && r.back() == '\n') r.remove_suffix(1);
                    emit(ev, kind::reasoning, r);
                    buf_.erase(0, close + think_close.size());
                    state_ = state::content_start;
                    progress = true;
                    break;
                }
                if (at_end) {  // stopped while thinking
                    std::string_view r(buf_);
                    while (!r.empty() && r.back() == '\n') r.remove_suffix(1);
                    emit(ev, kind::reasoning, r);
                    res_.reasoning_unclosed = true;
                    buf_.clear();
                    return;
                }
                // Hold a possible partial "</think>" and the newlines that may precede it.
                std::size_t keep = partial_tag(buf_, think_close);
                while (keep < buf_.size() && buf_[buf_.size() - 1 - keep] == '\n') ++keep;
                emit(ev, kind::reasoning, std::string_view(buf_).substr(0, buf_.size() - keep));
                buf_.erase(0, buf_.size() - keep);
                return;
            }
            case state::content_start: {
                std::size_t n = 0;
                while (n < buf_.size() && buf_[n] == '\n') ++n;
                buf_.erase(0, n);
                if (buf_.empty() && !at_end) return;
                state_ = state::content;
                progress = true;
                break;
            }
            case state::content: {
                auto open = buf_.find(call_open);
                if (open != std::string::npos) {
                    content_text(ev, std::string_view(buf_).substr(0, open), false);
                    if (calls_seen_) content_text(ev, {}, true);  // text between calls is complete
                    separator_ = pending_;                     // the white space before the call
                    pending_.clear();
                    buf_.erase(0, open + call_open.size());
                    state_ = state::in_call;
                    call_begun_ = false;
                    progress = true;
                    break;
                }
                std::size_t keep = at_end ? 0 : partial_tag(buf_, call_open);
                content_text(ev, std::string_view(buf_).substr(0, buf_.size() - keep), at_end);
                buf_.erase(0, buf_.size() - keep);
                return;
            }
            case state::in_call: {
                auto close = buf_.find(call_close);
                if (!call_begun_) {
                    if (auto name = early_name(std::string_view(buf_).substr(0, close == std::string::npos ? buf_.size() : close))) {
                        call_begun_ = true;
                        ev.push_back({kind::tool_call_begin, *name, {}});
                    }
                }
                if (close == std::string::npos && !at_end) return;
                std::string body = buf_.substr(0, close == std::string::npos ? buf_.size() : close);
                buf_.erase(0, close == std::string::npos ? buf_.size() : close + call_close.size());
                if (auto c = read_call(body, opt_.tools)) {
                    res_.tool_calls.push_back(*c);
                    ev.push_back({kind::tool_call, {}, *c});
                    calls_seen_ = true;
                } else {  // unreadable: it stays in the content, verbatim
                    std::string raw = std::string(call_open) + body + (close == std::string::npos ? "" : std::string(call_close));
                    res_.errors.push_back("tool call " + std::to_string(res_.tool_calls.size() + res_.errors.size()) +
                                          " could not be read: " + raw.substr(0, 200));
                    emit(ev, kind::content, separator_ + raw);
                }
                separator_.clear();
                state_ = state::content;
                progress = !buf_.empty() || at_end;
                if (buf_.empty() && at_end) { content_text(ev, {}, true); return; }
                break;
            }
            }
        }
    }

    format format_;
    parse_options opt_;
    state state_;
    std::string buf_, pending_, separator_;
    bool calls_seen_ = false, call_begun_ = false;
    parse_result res_;
};

inline parse_result parse(format f, std::string_view text, const parse_options& o = {}) {
    stream_parser p(f, o);
    p.feed(text);
    p.finish();
    return p.result();
}

}  // namespace clover::chat
