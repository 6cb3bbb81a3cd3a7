#pragma once
// JSON text the way chat templates print it: Jinja's `tojson` as Hugging Face runs it
// (Python json.dumps with ensure_ascii=False and the default ", " / ": " separators, keys in
// insertion order), and Python's str() of a scalar (what `| string` gives a tool argument).
//
// Python and the JavaScript Jinja engine agree on strings, integers, non-integral floats,
// booleans and null inside JSON. They differ on integral floats (Python 1.0, JS 1) and on
// `| string` of booleans and null (Python True/None, JS true/error); we follow Python, the
// engine the models were trained with.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "clover/core/error.hpp"

namespace clover::chat {

using json = nlohmann::ordered_json;

// How deep JSON from outside (request bodies, tool arguments, model output) may nest. nlohmann's
// parser keeps its own stack, but copying, comparing and printing a value recurse once per
// level: a 4 MiB body can nest two million levels, far past any thread's stack. So text is
// measured before a value is built from it, and nothing deeper than this is ever built.
inline constexpr std::size_t max_json_depth = 512;

// The deepest nesting of arrays and objects in JSON text (string contents skipped), one pass
// without recursion; counting stops once it passes `limit`. Exact for valid JSON; for invalid
// text the parser that follows reports the error.
inline std::size_t json_nesting(std::string_view text, std::size_t limit = max_json_depth) {
    std::size_t depth = 0, deepest = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest && (deepest = depth) > limit) return deepest;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

// json::parse for text from outside: clover::error when it nests deeper than max_depth
// (nlohmann's parse_error for malformed text, as json::parse).
inline json parse_json(std::string_view text, std::size_t max_depth = max_json_depth) {
    if (json_nesting(text, max_depth) > max_depth) fail("JSON nested deeper than ", max_depth, " levels");
    return json::parse(text);
}

namespace json_detail {

inline void quote(const std::string& s, std::string& out) {
    static const char* hex = "0123456789abcdef";
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                out += "\\u00";
                out += hex[c >> 4];
                out += hex[c & 15];
            } else {
                out += char(c);
            }
        }
    }
    out += '"';
}

// Python's repr of a float: the shortest text that reads back the same, with ".0" on integers.
inline std::string float_text(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    char buf[40];
    for (int prec = 1; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (std::strtod(buf, nullptr) == d) break;
    }
    std::string s = buf;
    auto e = s.find('e');
    if (e != std::string::npos) {  // Python writes 1e-05 / 1e+20, as %g does
        std::string mant = s.substr(0, e), ex = s.substr(e + 1);
        char sign = ex[0] == '-' ? '-' : '+';
        if (ex[0] == '-' || ex[0] == '+') ex = ex.substr(1);
        while (ex.size() > 2 && ex[0] == '0') ex = ex.substr(1);
        if (ex.size() < 2) ex = "0" + ex;
        return mant + "e" + sign + ex;
    }
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
}

inline void dump(const json& j, std::string& out, std::size_t depth = 0) {
    if (depth > max_json_depth) fail("chat: JSON nested deeper than ", max_json_depth, " levels");
    switch (j.type()) {
    case json::value_t::null: out += "null"; break;
    case json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; break;
    case json::value_t::number_integer: out += std::to_string(j.get<std::int64_t>()); break;
    case json::value_t::number_unsigned: out += std::to_string(j.get<std::uint64_t>()); break;
    case json::value_t::number_float: out += float_text(j.get<double>()); break;
    case json::value_t::string: quote(j.get_ref<const std::string&>(), out); break;
    case json::value_t::array: {
        out += '[';
        bool first = true;
        for (const auto& x : j) {
            if (!first) out += ", ";
            first = false;
            dump(x, out, depth + 1);
        }
        out += ']';
        break;
    }
    case json::value_t::object: {
        out += '{';
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            quote(it.key(), out);
            out += ": ";
            dump(it.value(), out, depth + 1);
        }
        out += '}';
        break;
    }
    default: out += "null"; break;  // binary / discarded: not produced by the parsers we use
    }
}

}  // namespace json_detail

// Jinja's `x | tojson`.
inline std::string tojson(const json& j) {
    std::string out;
    json_detail::dump(j, out);
    return out;
}

// Python's str(x) for a scalar; containers as tojson.
inline std::string python_str(const json& j) {
    switch (j.type()) {
    case json::value_t::string: return j.get<std::string>();
    case json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case json::value_t::null: return "None";
    default: return tojson(j);
    }
}

}  // namespace clover::chat
