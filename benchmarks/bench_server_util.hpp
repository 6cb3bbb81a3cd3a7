#pragma once
// Helpers of bench_server: percentiles, one streaming chat request timed from the client's side,
// fixed filler text sized in tokens, prompt ids as the server computes them, and the JSON lines
// that go to stdout and, with --json-out, to a file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <clover/server/server.hpp>

namespace bench {

using json = clover::server::json;
using clk = std::chrono::steady_clock;

inline double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double k = p / 100.0 * double(v.size() - 1);
    const auto lo = std::size_t(k);
    const auto hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (k - double(lo));
}

inline double seconds(clk::duration d) { return std::chrono::duration<double>(d).count(); }

// One streamed chat completion as the client saw it.
struct reply {
    bool ok = false;
    std::string why;                  // a failed request: its status or the client's error
    double ttft = 0, total = 0, tpot = -1;  // seconds; tpot: per output token after the first
    std::vector<double> gaps;         // between text chunks
    long tokens = 0;                  // usage.completion_tokens
    std::string content, reasoning;   // the answer as an OpenAI client assembles it from deltas
    json usage = json::object(), timings = json::object();  // from the final chunk
};

// Sends `body` (a chat request with "stream": true) and reads the SSE answer. TTFT is the time
// to the first chunk with text (content, reasoning or a tool call), not the role-only chunk.
inline reply stream_chat(httplib::Client& cli, const json& body) {
    reply s;
    clover::server::sse_reader rd;
    clk::time_point start = clk::now(), first{}, last{};
    bool got_first = false;
    std::string stream_error, head;  // head: the first bytes, which are the error body of a non-200 answer
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, std::size_t n, std::uint64_t, std::uint64_t) {
        if (head.size() < 300) head.append(d, std::min(n, 300 - head.size()));
        rd.feed(std::string_view(d, n), [&](const std::string& data) {
            if (data == "[DONE]") return;
            json j = json::parse(data);
            if (j.contains("error")) stream_error = j["error"].value("message", "error event");
            if (j.contains("usage")) {
                s.usage = j["usage"];
                s.tokens = s.usage.value("completion_tokens", 0L);
            }
            if (j.contains("timings")) s.timings = j["timings"];
            if (!j.contains("choices") || j["choices"].empty()) return;
            const json& delta = j["choices"][0]["delta"];
            auto text_of = [&](const char* key) {
                return delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>() : std::string();
            };
            const std::string content = text_of("content"), reasoning = text_of("reasoning_content");
            s.content += content;
            s.reasoning += reasoning;
            if (content.empty() && reasoning.empty() && !delta.contains("tool_calls")) return;
            const auto now = clk::now();
            if (!got_first) { first = now; got_first = true; }
            else s.gaps.push_back(seconds(now - last));
            last = now;
        });
        return true;
    };
    auto res = cli.send(req);
    const auto end = clk::now();
    s.ok = res && res->status == 200 && stream_error.empty();
    if (!s.ok)
        s.why = !res                 ? httplib::to_string(res.error())
                : res->status != 200 ? "status " + std::to_string(res->status) + " " + head
                                     : "error event: " + stream_error;
    s.total = seconds(end - start);
    s.ttft = got_first ? seconds(first - start) : s.total;
    if (got_first && s.tokens > 1) s.tpot = seconds(last - first) / double(s.tokens - 1);
    return s;
}

// usage.prompt_tokens_details.cached_tokens; -1 when the server does not report it.
inline long cached_tokens(const json& usage) {
    auto d = usage.find("prompt_tokens_details");
    return d != usage.end() && d->is_object() ? d->value("cached_tokens", -1L) : -1L;
}

// Line `i` of a fixed, tool-output-like text (a listing, compiler warnings, test results, notes);
// `salt` shifts the numbers so that two texts with different salts differ from their first line.
inline std::string filler_line(long i, long salt) {
    const long a = i * 37 + salt * 101, b = (i * 13 + salt * 7) % 97;
    switch (i % 5) {
    case 0: return "drwxr-xr-x  2 agent staff  " + std::to_string(1024 + a % 9000) + " Dec  4 09:" + std::to_string(10 + b % 50) +
                   " src/module_" + std::to_string(a % 211) + "/\n";
    case 1: return "src/module_" + std::to_string(a % 211) + "/file_" + std::to_string(b) + ".cpp:" + std::to_string(10 + a % 900) +
                   ": warning: unused variable 'tmp_" + std::to_string(b) + "' [-Wunused-variable]\n";
    case 2: return "test_case_" + std::to_string(a % 503) + " ... ok (" + std::to_string(b + 3) + " ms)\n";
    case 3: return "The configuration key option_" + std::to_string(a % 307) + " defaults to " + std::to_string(b) +
                   "; it sets how many workers the scheduler starts for queue " + std::to_string(a % 17) + ".\n";
    default: return "commit " + std::to_string(100000 + a % 899999) + ": fix the parser of record " + std::to_string(b) +
                    " when its length field is " + std::to_string(a % 4096) + " bytes\n";
    }
}

// Fixed filler text of about `n` tokens: whole lines while they fit, the last one cut at a token
// (the text is ASCII, so any token prefix decodes to whole characters).
inline std::string filler(const clover::tokenizer& tok, long n, long salt) {
    std::string out;
    if (n <= 0) return out;
    for (long i = 0; long(tok.encode(out).size()) < n; ++i) out += filler_line(i, salt);
    const auto ids = tok.encode(out);
    return tok.decode(std::span<const std::int32_t>(ids.data(), std::size_t(n)));
}

// The prompt ids the server computes for a chat request body (the same library calls).
struct prompt_counter {
    const clover::tokenizer& tok;
    clover::server::options o;
    clover::chat::format fmt = clover::chat::detect_format(tok.chat_template());
    std::vector<clover::token> ids(const json& body) const {
        return clover::server::parse_request(body, true, tok, clover::server::model_info{}, o, fmt).prompt;
    }
    long count(const json& body) const { return long(ids(body).size()); }
};

inline std::size_t common_prefix(const std::vector<clover::token>& a, const std::vector<clover::token>& b) {
    std::size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return k;
}

// A result line: printed, and appended to the --json-out file when there is one.
class json_lines {
public:
    explicit json_lines(std::string path) : path_(std::move(path)) {
        if (path_.empty()) return;
        f_ = std::fopen(path_.c_str(), "a");
        if (!f_) throw std::runtime_error("--json-out: cannot open " + path_ + " for appending");
    }
    json_lines(const json_lines&) = delete;
    ~json_lines() {
        if (f_) std::fclose(f_);
    }
    void emit(const json& j) {
        const std::string line = j.dump();
        std::printf("%s\n", line.c_str());
        if (f_ && (std::fprintf(f_, "%s\n", line.c_str()) < 0 || std::fflush(f_) != 0))
            throw std::runtime_error("--json-out: cannot write to " + path_);
    }

private:
    std::string path_;
    std::FILE* f_ = nullptr;
};

}  // namespace bench
