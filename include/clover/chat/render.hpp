#pragma once
// Renders a conversation into the prompt text of a Qwen chat format, exactly as the model's
// chat template does (tests/chat compares with a real Jinja engine running the templates).
//
// qwen3 follows the official Qwen3 template (tokenizer_config.json of Qwen3): reasoning is
// shown only on assistant turns after the last user query, and there only when it is the last
// message or has reasoning; tool calls are JSON inside <tool_call>.
// qwen35 follows the Qwen3.5/3.6 form (architecture.md §5.5): tools first in the system turn,
// every assistant turn after the last user query carries a <think> block (empty if there is
// no reasoning), contents are trimmed, tool calls are XML, and the generation prompt pre-fills
// "<think>\n" (or an empty think block when enable_thinking is false).
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "clover/chat/json_text.hpp"
#include "clover/chat/message.hpp"
#include "clover/core/error.hpp"
#include "clover/tokenizer/unicode.hpp"
#include "clover/tokenizer/utf8.hpp"

namespace clover::chat {

// A rendered prompt: the text, and where in it the template's own text lies (byte ranges
// [template_bounds[2k], template_bounds[2k+1]), sorted). Everything else came from the
// messages and tools, i.e. from whoever sent them.
struct rendered {
    std::string text;
    std::vector<std::size_t> template_bounds;
};

struct render_options {
    bool add_generation_prompt = true;
    bool enable_thinking = true;
    json tools = json::array();  // OpenAI tool definitions, printed one per line with tojson
};

namespace render_detail {

// Python's str.strip/lstrip/rstrip with a character set ('\n') or, for `| trim`, white space
// (the ECMAScript set, which the JS Jinja engine uses; see pretokenizer.hpp).
inline bool is_space_cp(char32_t cp) { return cp != tok::utf8::invalid && (tok::unicode::flags(cp) & tok::unicode::space); }
inline std::string_view lstrip_nl(std::string_view s) {
    while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
    return s;
}
inline std::string_view rstrip_nl(std::string_view s) {
    while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
    return s;
}
inline std::string_view strip_nl(std::string_view s) { return rstrip_nl(lstrip_nl(s)); }
inline std::string_view trim(std::string_view s) {
    std::size_t i = 0, keep_end = 0, first = std::string_view::npos;
    while (i < s.size()) {
        char32_t cp;
        auto len = std::size_t(tok::utf8::decode(s, i, cp));
        if (!is_space_cp(cp)) {
            if (first == std::string_view::npos) first = i;
            keep_end = i + len;
        }
        i += len;
    }
    return first == std::string_view::npos ? std::string_view() : s.substr(first, keep_end - first);
}
inline bool is_tool_response(std::string_view c) {
    return c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
}

// The templates' split of "<think>R</think>C" content: (reasoning, content).
inline std::pair<std::string, std::string> split_think(std::string_view content) {
    auto first_close = content.find("</think>");
    auto last_close = content.rfind("</think>");
    std::string_view after = lstrip_nl(content.substr(last_close + 8));
    std::string_view before = rstrip_nl(content.substr(0, first_close));
    auto open = before.rfind("<think>");
    if (open != std::string_view::npos) before = before.substr(open + 7);
    return {std::string(lstrip_nl(before)), std::string(after)};
}

inline std::size_t last_query_index(std::span<const message> msgs, bool trimmed, bool& found) {
    found = false;
    for (std::size_t k = msgs.size(); k-- > 0;) {
        if (msgs[k].role != "user") continue;
        std::string_view c = trimmed ? trim(msgs[k].content) : std::string_view(msgs[k].content);
        if (!is_tool_response(c)) { found = true; return k; }
    }
    return msgs.size() - 1;
}

inline const json& tool_arguments_object(const tool_call& c, json& parsed) {
    if (!c.arguments.is_string()) return c.arguments;
    try {
        parsed = parse_json(c.arguments.get<std::string>());
    } catch (const clover::error& e) {
        fail("chat: the arguments of tool call '", c.name, "': ", e.what());
    } catch (const std::exception&) {
        fail("chat: the arguments of tool call '", c.name, "' are a string that is not JSON");
    }
    return parsed;
}

inline void check_roles(std::span<const message> msgs) {
    for (const auto& m : msgs)
        if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
            fail("chat: unknown message role '", m.role, "' (system, user, assistant, tool)");
}

// The prompt in the making: t() appends the template's own text, c() text that came with the
// conversation (contents, reasoning, tool names, arguments and definitions). Only t() text
// may hold control tokens.
struct builder {
    rendered r;
    void t(std::string_view s) {
        if (s.empty()) return;
        if (!r.template_bounds.empty() && r.template_bounds.back() == r.text.size()) r.template_bounds.back() += s.size();
        else { r.template_bounds.push_back(r.text.size()); r.template_bounds.push_back(r.text.size() + s.size()); }
        r.text += s;
    }
    void c(std::string_view s) { r.text += s; }
};

inline rendered render_qwen3(std::span<const message> msgs, const render_options& o) {
    builder p;
    const bool has_tools = o.tools.is_array() && !o.tools.empty();
    if (has_tools) {
        p.t("<|im_start|>system\n");
        if (!msgs.empty() && msgs[0].role == "system") { p.c(msgs[0].content); p.t("\n\n"); }
        p.t("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (const auto& t : o.tools) { p.t("\n"); p.c(tojson(t)); }
        p.t("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (!msgs.empty() && msgs[0].role == "system") {
        p.t("<|im_start|>system\n");
        p.c(msgs[0].content);
        p.t("<|im_end|>\n");
    }
    bool found = false;
    const std::size_t last_query = msgs.empty() ? 0 : last_query_index(msgs, false, found);
    for (std::size_t i = 0; i < msgs.size(); ++i) {
        const message& m = msgs[i];
        const bool last = i + 1 == msgs.size();
        if (m.role == "user" || (m.role == "system" && i != 0)) {
            p.t("<|im_start|>" + m.role + "\n");
            p.c(m.content);
            p.t("<|im_end|>\n");
        } else if (m.role == "assistant") {
            std::string content = m.content, reasoning;
            if (m.reasoning_content) reasoning = *m.reasoning_content;
            else if (content.find("</think>") != std::string::npos) std::tie(reasoning, content) = split_think(m.content);
            if (i > last_query && (last || !reasoning.empty())) {
                p.t("<|im_start|>assistant\n<think>\n");
                p.c(strip_nl(reasoning));
                p.t("\n</think>\n\n");
                p.c(lstrip_nl(content));
            } else {
                p.t("<|im_start|>assistant\n");
                p.c(content);
            }
            for (std::size_t k = 0; k < m.tool_calls.size(); ++k) {
                const tool_call& c = m.tool_calls[k];
                if ((k == 0 && !content.empty()) || k > 0) p.t("\n");
                p.t("<tool_call>\n{\"name\": \"");
                p.c(c.name);
                p.t("\", \"arguments\": ");
                p.c(c.arguments.is_string() ? c.arguments.get<std::string>() : tojson(c.arguments));
                p.t("}\n</tool_call>");
            }
            p.t("<|im_end|>\n");
        } else if (m.role == "tool") {
            if (i == 0 || msgs[i - 1].role != "tool") p.t("<|im_start|>user");
            p.t("\n<tool_response>\n");
            p.c(m.content);
            p.t("\n</tool_response>");
            if (last || msgs[i + 1].role != "tool") p.t("<|im_end|>\n");
        }
    }
    if (o.add_generation_prompt) {
        p.t("<|im_start|>assistant\n");
        if (!o.enable_thinking) p.t("<think>\n\n</think>\n\n");
    }
    return std::move(p.r);
}

inline constexpr std::string_view qwen35_tool_instructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

inline rendered render_qwen35(std::span<const message> msgs, const render_options& o) {
    if (msgs.empty()) fail("chat: no messages");
    builder p;
    const bool has_tools = o.tools.is_array() && !o.tools.empty();
    if (has_tools) {
        p.t("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for (const auto& t : o.tools) { p.t("\n"); p.c(tojson(t)); }
        p.t("\n</tools>");
        p.t(qwen35_tool_instructions);
        if (msgs[0].role == "system")
            if (auto c = trim(msgs[0].content); !c.empty()) { p.t("\n\n"); p.c(c); }
        p.t("<|im_end|>\n");
    } else if (msgs[0].role == "system") {
        p.t("<|im_start|>system\n");
        p.c(trim(msgs[0].content));
        p.t("<|im_end|>\n");
    }
    bool found = false;
    const std::size_t last_query = last_query_index(msgs, true, found);
    if (!found) fail("chat: no user query in the messages");
    for (std::size_t i = 0; i < msgs.size(); ++i) {
        const message& m = msgs[i];
        const bool last = i + 1 == msgs.size();
        std::string content(trim(m.content));
        if (m.role == "system") {
            if (i != 0) fail("chat: a system message must come first");
        } else if (m.role == "user") {
            p.t("<|im_start|>user\n");
            p.c(content);
            p.t("<|im_end|>\n");
        } else if (m.role == "assistant") {
            std::string reasoning;
            if (m.reasoning_content) reasoning = *m.reasoning_content;
            else if (content.find("</think>") != std::string::npos) std::tie(reasoning, content) = split_think(std::string(content));
            reasoning = std::string(trim(reasoning));
            if (i > last_query) {
                p.t("<|im_start|>assistant\n<think>\n");
                p.c(reasoning);
                p.t("\n</think>\n\n");
                p.c(content);
            } else {
                p.t("<|im_start|>assistant\n");
                p.c(content);
            }
            for (std::size_t k = 0; k < m.tool_calls.size(); ++k) {
                const tool_call& c = m.tool_calls[k];
                if (k == 0) p.t(trim(content).empty() ? "<tool_call>\n<function=" : "\n\n<tool_call>\n<function=");
                else p.t("\n<tool_call>\n<function=");
                p.c(c.name);
                p.t(">\n");
                json parsed;
                const json& args = tool_arguments_object(c, parsed);
                if (!args.is_object() && !args.is_null())
                    fail("chat: the arguments of tool call '", c.name, "' must be an object");
                if (args.is_object())
                    for (auto it = args.begin(); it != args.end(); ++it) {
                        p.t("<parameter=");
                        p.c(it.key());
                        p.t(">\n");
                        p.c((it.value().is_object() || it.value().is_array()) ? tojson(it.value()) : python_str(it.value()));
                        p.t("\n</parameter>\n");
                    }
                p.t("</function>\n</tool_call>");
            }
            p.t("<|im_end|>\n");
        } else if (m.role == "tool") {
            if (i > 0 && msgs[i - 1].role != "tool") p.t("<|im_start|>user");
            p.t("\n<tool_response>\n");
            p.c(content);
            p.t("\n</tool_response>");
            if (last || msgs[i + 1].role != "tool") p.t("<|im_end|>\n");
        }
    }
    if (o.add_generation_prompt) {
        p.t("<|im_start|>assistant\n");
        p.t(o.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
    }
    return std::move(p.r);
}

}  // namespace render_detail

// The prompt text with the template's own text marked: tokenize it with
// tokenizer::encode_marked(r.text, r.template_bounds) so that control tokens are read only
// there, never in what the conversation brought in.
inline rendered render_marked(format f, std::span<const message> msgs, const render_options& o = {}) {
    render_detail::check_roles(msgs);
    if (!o.tools.is_array() && !o.tools.is_null()) fail("chat: \"tools\" must be an array");
    return f == format::qwen3 ? render_detail::render_qwen3(msgs, o) : render_detail::render_qwen35(msgs, o);
}
inline rendered render_marked(format f, const std::vector<message>& msgs, const render_options& o = {}) {
    return render_marked(f, std::span<const message>(msgs), o);
}
inline std::string render(format f, std::span<const message> msgs, const render_options& o = {}) {
    return render_marked(f, msgs, o).text;
}
inline std::string render(format f, const std::vector<message>& msgs, const render_options& o = {}) {
    return render(f, std::span<const message>(msgs), o);
}

// True when a rendered prompt leaves the assistant inside an open <think> block (the output
// then starts with reasoning): the qwen35 thinking prefill, or a prompt ending in "<think>\n".
inline bool prompt_opens_think(std::string_view prompt) {
    auto open = prompt.rfind("<think>");
    return open != std::string_view::npos && prompt.find("</think>", open) == std::string_view::npos &&
           prompt.find("<|im_start|>", open) == std::string_view::npos;
}

}  // namespace clover::chat
