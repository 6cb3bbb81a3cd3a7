#pragma once
// Server-sent events as the OpenAI streaming API sends them: one `data: <json>` line per
// chunk, a blank line after each, and `data: [DONE]` at the end. Comment lines (": ...") are
// keep-alives that clients ignore; the server writes them while a request waits in the queue,
// which is also how it notices a client that went away.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace clover::server {

template <class Json>
inline std::string sse_data(const Json& j) {
    return "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}
inline std::string sse_done() { return "data: [DONE]\n\n"; }
inline std::string sse_comment(std::string_view text) { return ": " + std::string(text) + "\n\n"; }

// Splits an SSE byte stream into the payloads of its `data:` lines (a client-side helper for
// tests and the benchmark). Feed bytes as they arrive; complete events come out.
class sse_reader {
public:
    template <class F>
    void feed(std::string_view bytes, F&& on_data) {
        buf_ += bytes;
        for (;;) {
            auto end = buf_.find("\n\n");
            if (end == std::string::npos) return;
            std::string_view ev(buf_.data(), end);
            std::string data;
            bool any = false;
            while (!ev.empty()) {
                auto nl = ev.find('\n');
                std::string_view line = ev.substr(0, nl);
                if (line.starts_with("data:")) {
                    line.remove_prefix(5);
                    if (line.starts_with(" ")) line.remove_prefix(1);
                    if (any) data += '\n';
                    data += line;
                    any = true;
                }
                if (nl == std::string_view::npos) break;
                ev.remove_prefix(nl + 1);
            }
            buf_.erase(0, end + 2);
            if (any) on_data(data);
        }
    }

private:
    std::string buf_;
};

}  // namespace clover::server
