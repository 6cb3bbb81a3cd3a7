#pragma once
// What a JSON text would cost as a tree, measured before the tree is built: a SAX pass over the
// text (nlohmann's sax_parse, which builds nothing and keeps no stack of values) counts the
// values and estimates the bytes the tree (nlohmann::ordered_json) would allocate, and stops at
// the first value past the budget.
//
// Why: request bodies are bounded in bytes (--max-body, 4 MiB), but not their trees. The 4 MiB
// body `[{},{},...]` holds 1.4 million empty objects, ~75 MB as a tree; 24 of them at once took
// the server from 32 MiB to 1.6 GiB (issue 38). Refused here, such a body costs its text only.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace clover::server {

struct json_budget {
    // Values of any kind (a 262,144-id prompt is more than any context this server runs).
    std::size_t max_values = std::size_t(1) << 18;
    // Bytes the tree may allocate (its strings included), as estimated below.
    std::size_t max_bytes = std::size_t(16) << 20;
};

namespace json_budget_detail {

// The estimate, for ordered_json on a 64-bit glibc: a value is 16 bytes in its parent's
// vector, counted twice for the vector's growth; an object member adds its key (a 32-byte
// std::string, doubled likewise); objects, arrays and strings are allocated on their own
// (a vector or std::string header plus malloc's overhead); a string or key longer than the
// short-string buffer (15 bytes) adds its characters and another allocation.
inline constexpr std::size_t slot = 32, member = 64, container = 48, string_value = 48;
inline std::size_t heap(std::size_t chars) { return chars > 15 ? chars + 1 + 16 : 0; }

class counter {
public:
    using json = nlohmann::ordered_json;
    explicit counter(const json_budget& b) : b_(b) {}

    bool null() { return value(0); }
    bool boolean(bool) { return value(0); }
    bool number_integer(json::number_integer_t) { return value(0); }
    bool number_unsigned(json::number_unsigned_t) { return value(0); }
    bool number_float(json::number_float_t, const json::string_t&) { return value(0); }
    bool string(json::string_t& s) { return value(string_value + heap(s.size())); }
    bool binary(json::binary_t& b) { return value(string_value + heap(b.size())); }
    bool start_object(std::size_t) { return value(container); }
    bool key(json::string_t& k) { return add(member + heap(k.size())); }
    bool end_object() { return true; }
    bool start_array(std::size_t) { return value(container); }
    bool end_array() { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
        syntax_ = e.what();
        return false;
    }

    // After the pass: what is wrong (empty: within the budget and valid JSON).
    const std::string& over() const { return over_; }
    const std::string& syntax() const { return syntax_; }

private:
    bool value(std::size_t own) {
        if (++values_ > b_.max_values) {
            over_ = "the request body has more than " + std::to_string(b_.max_values) + " JSON values (the limit)";
            return false;
        }
        return add(slot + own);
    }
    bool add(std::size_t n) {
        bytes_ += n;
        if (bytes_ > b_.max_bytes) {
            over_ = "the request body would take more than " + std::to_string(b_.max_bytes >> 20) +
                    " MiB as a JSON tree (the limit); send fewer or shorter values";
            return false;
        }
        return true;
    }

    json_budget b_;
    std::size_t values_ = 0, bytes_ = 0;
    std::string over_, syntax_;
};

}  // namespace json_budget_detail

// Checks `text` against `b` without building anything: `over` names the limit passed, `syntax`
// is nlohmann's parse_error message when the text is not JSON (the first problem met wins).
struct json_check {
    std::string over, syntax;
    bool ok() const { return over.empty() && syntax.empty(); }
};
inline json_check check_json_budget(std::string_view text, const json_budget& b = {}) {
    json_budget_detail::counter c(b);
    (void)nlohmann::ordered_json::sax_parse(text, &c);
    return {c.over(), c.syntax()};
}

}  // namespace clover::server
