#pragma once
// Conversations for the Qwen chat formats: messages, tool calls, and which format a model
// uses. Messages convert from and to the OpenAI chat JSON ({"role", "content",
// "reasoning_content", "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "clover/chat/json_text.hpp"
#include "clover/core/error.hpp"

namespace clover::chat {

// qwen3: Qwen3 / Qwen3-Next (JSON tool calls in <tool_call>, no think prefill).
// qwen35: Qwen3.5 / Qwen3.6 and Clover (XML <function=…><parameter=…> tool calls, tools
// first in the system turn, "<think>\n" generation prefill).
enum class format { qwen3, qwen35 };

inline std::string_view format_name(format f) { return f == format::qwen3 ? "qwen3" : "qwen35"; }

// Recognises the family from a chat template's text (GGUF tokenizer.chat_template or
// tokenizer_config.json); `fallback` when the text says neither.
inline format detect_format(std::string_view chat_template, format fallback = format::qwen35) {
    if (chat_template.find("<function=") != std::string_view::npos) return format::qwen35;
    if (chat_template.find("\"arguments\": ") != std::string_view::npos ||
        chat_template.find("<tool_call>\\n{") != std::string_view::npos)
        return format::qwen3;
    if (chat_template.find("<|im_start|>") != std::string_view::npos) return fallback;
    return fallback;
}

struct tool_call {
    std::string name;
    json arguments = json::object();  // an object; a JSON string is kept as given (Qwen3 prints it raw)
    std::string id;                   // OpenAI's call id, if any (not rendered)
};

struct message {
    std::string role;  // system | user | assistant | tool
    std::string content;
    std::optional<std::string> reasoning_content;  // assistant: the <think> text
    std::vector<tool_call> tool_calls;              // assistant
    std::string tool_call_id;                       // tool: the call answered (not rendered)
};

inline message system_msg(std::string c) { return {"system", std::move(c), std::nullopt, {}, {}}; }
inline message user_msg(std::string c) { return {"user", std::move(c), std::nullopt, {}, {}}; }
inline message assistant_msg(std::string c, std::optional<std::string> reasoning = std::nullopt, std::vector<tool_call> calls = {}) {
    return {"assistant", std::move(c), std::move(reasoning), std::move(calls), {}};
}
inline message tool_msg(std::string c, std::string call_id = {}) { return {"tool", std::move(c), std::nullopt, {}, std::move(call_id)}; }

inline message message_from_json(const json& j) {
    if (!j.is_object()) fail("chat: a message must be a JSON object");
    message m;
    if (!j.contains("role") || !j["role"].is_string()) fail("chat: a message has no \"role\"");
    m.role = j["role"].get<std::string>();
    if (j.contains("content")) {
        const json& c = j["content"];
        if (c.is_string()) m.content = c.get<std::string>();
        else if (c.is_array()) {  // OpenAI content parts: only text parts are supported
            for (const auto& part : c) {
                if (!part.is_object() || part.value("type", "text") != "text" || !part.contains("text"))
                    fail("chat: only text content parts are supported (role '", m.role, "')");
                m.content += part["text"].get<std::string>();
            }
        } else if (!c.is_null()) fail("chat: \"content\" must be a string (role '", m.role, "')");
    }
    if (j.contains("reasoning_content") && j["reasoning_content"].is_string())
        m.reasoning_content = j["reasoning_content"].get<std::string>();
    if (j.contains("tool_calls") && j["tool_calls"].is_array()) {
        for (const auto& tc : j["tool_calls"]) {
            const json& f = tc.contains("function") ? tc["function"] : tc;
            tool_call call;
            if (!f.contains("name") || !f["name"].is_string()) fail("chat: a tool call has no function name");
            call.name = f["name"].get<std::string>();
            if (f.contains("arguments")) call.arguments = f["arguments"];
            if (tc.contains("id") && tc["id"].is_string()) call.id = tc["id"].get<std::string>();
            m.tool_calls.push_back(std::move(call));
        }
    }
    if (j.contains("tool_call_id") && j["tool_call_id"].is_string()) m.tool_call_id = j["tool_call_id"].get<std::string>();
    return m;
}

inline std::vector<message> messages_from_json(const json& j) {
    if (!j.is_array()) fail("chat: \"messages\" must be an array");
    std::vector<message> out;
    for (const auto& m : j) out.push_back(message_from_json(m));
    return out;
}

// OpenAI form; arguments as a JSON string, as the OpenAI API returns them.
inline json to_json(const message& m) {
    json j = json::object();
    j["role"] = m.role;
    j["content"] = m.content;
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (!m.tool_calls.empty()) {
        json calls = json::array();
        for (std::size_t i = 0; i < m.tool_calls.size(); ++i) {
            const auto& c = m.tool_calls[i];
            json f = {{"name", c.name}, {"arguments", c.arguments.is_string() ? c.arguments.get<std::string>() : c.arguments.dump()}};
            calls.push_back({{"id", c.id.empty() ? "call_" + std::to_string(i) : c.id}, {"type", "function"}, {"function", f}});
        }
        j["tool_calls"] = calls;
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    return j;
}

}  // namespace clover::chat
