#pragma once
// What the server tests share: the tiny random-weight model, a scripted model that runs the
// same passes but puts all the probability on a chosen continuation, and loopback HTTP helpers
// (httplib::Client for well-formed requests, raw sockets for everything a client should not do).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <clover/model/synth.hpp>
#include <clover/server/server.hpp>

#include "../common/test_util.hpp"

#include <cstdlib>

namespace server_test {

using namespace clover;
using json = server::json;


using rt_model = model<variants::from_file, backend::cpu>;

// The server suites run at once as several processes of one executable (tests/server/CMakeLists.txt):
// each writes its own model files, named by the tag its ctest entry sets.
inline std::string test_tag() {
    const char* t = std::getenv("CLOVER_SERVER_TEST_TAG");
    return t && *t ? t : "main";
}

inline const std::string& model_path() {
    static const std::string p = [] {
        auto s = synth::preset("tiny");
        s.arch = "clover_moe";
        s.rope_theta = 100.f;
        return testutil::synth_file("server_tiny_" + test_tag() + ".gguf", s);
    }();
    return p;
}

struct fixture_model {
    rt_model m{load(model_path()), backend::cpu_options{2}};
    tokenizer tok = tokenizer::from_gguf(model_path());
};
inline fixture_model& fx() {
    static fixture_model f;
    return f;
}

// The real model's passes with scripted logits: position prompt_len + i gets script[i], then
// `after` (the end-of-generation token) forever.
struct scripted_model {
    explicit scripted_model(rt_model& b) : base(b) {}
    rt_model& base;
    std::vector<token> script;
    token after = 0;
    std::int64_t prompt_len = 0;
    bool prompt_open = false;
    std::chrono::microseconds delay{0};  // per pass, to make generations slow on purpose
    std::mutex prompt_mu;
    std::vector<token> last_prompt;  // the ids of the latest prompt (all its chunks)
    std::vector<token> prompt() {
        std::lock_guard lk(prompt_mu);
        return last_prompt;
    }

    const hparams& hp() const { return base.hp(); }
    std::int64_t n_vocab() const { return base.n_vocab(); }
    session new_session(session_options o) const { return base.new_session(o); }
    std::string diffusion_unavailable() const { return base.diffusion_unavailable(); }
    void require_diffusion() const { base.require_diffusion(); }
    token at(std::int64_t pos) const {
        const std::int64_t i = pos - prompt_len;
        return i >= 0 && i < std::int64_t(script.size()) ? script[std::size_t(i)] : after;
    }
    void onehot(float* row, token t) const {
        std::fill(row, row + n_vocab(), 0.f);
        row[t] = 40.f;
    }
    void commit(session& s, std::span<const token> ids, logits_rows rows, std::vector<float>& logits) {
        if (delay.count()) std::this_thread::sleep_for(delay);
        if (s.n_past() == 0) {
            prompt_len = std::int64_t(ids.size());
            std::lock_guard lk(prompt_mu);
            last_prompt.assign(ids.begin(), ids.end());
        }
        const std::int64_t p0 = s.n_past(), V = n_vocab();
        base.commit(s, ids, rows, logits);
        if (rows == logits_rows::last) onehot(logits.data(), at(p0 + std::int64_t(ids.size())));
        if (rows == logits_rows::all)
            for (std::size_t i = 0; i < ids.size(); ++i) onehot(logits.data() + i * V, at(p0 + std::int64_t(i) + 1));
    }
    void preview(const session& s, std::span<const token> block, std::int64_t coreset, std::vector<float>& logits) {
        if (delay.count()) std::this_thread::sleep_for(delay);
        base.preview(s, block, coreset, logits);
        for (std::size_t i = 0; i < block.size(); ++i) onehot(logits.data() + i * n_vocab(), at(s.n_past() + std::int64_t(i)));
    }
    void verify(session& s, std::span<const token> ids, std::vector<float>& logits) {
        if (delay.count()) std::this_thread::sleep_for(delay);
        const std::int64_t p0 = s.n_past();
        base.verify(s, ids, logits);
        for (std::size_t i = 0; i < ids.size(); ++i) onehot(logits.data() + i * n_vocab(), at(p0 + std::int64_t(i) + 1));
    }
    void rollback(session& s, std::int64_t keep) { base.rollback(s, keep); }
    // The prefix cache's part of the model (the scripted tests run with the cache off: the
    // script is keyed by the length of a prompt computed from its first token).
    using saved_state = rt_model::saved_state;
    std::int64_t page_size() const { return base.page_size(); }
    std::size_t page_bytes(int pool) const { return base.page_bytes(pool); }
    std::size_t checkpoint_bytes() const { return base.checkpoint_bytes(); }
    std::int64_t kv_pages_used(int pool) const { return base.kv_pages_used(pool); }
    void checkpoint(session& s) const { base.checkpoint(s); }
    std::vector<std::int64_t> checkpoints(const session& s) const { return base.checkpoints(s); }
    std::vector<std::int32_t> hold_pages(const session& s, std::int64_t first, std::int64_t count) const {
        return base.hold_pages(s, first, count);
    }
    void drop_pages(int pool, std::span<const std::int32_t> pages) const { base.drop_pages(pool, pages); }
    saved_state save_state(const session& s, std::int64_t pos) const { return base.save_state(s, pos); }
    saved_state take_state(session& s, std::int64_t pos) const { return base.take_state(s, pos); }
    session new_session_from(session_options o, std::span<const std::int32_t> pages, std::span<const token> tokens,
                             const saved_state& st) const {
        return base.new_session_from(o, pages, tokens, st);
    }
    // The batched pass the decoders drive (model::run): the real pass, then each logits row
    // replaced by the script's token for the position it predicts.
    void run(std::span<const pass_request> reqs, std::vector<float>& logits, bool exact = false) {
        if (delay.count()) std::this_thread::sleep_for(delay);
        std::vector<std::int64_t> p0;
        for (const pass_request& r : reqs) {
            p0.push_back(r.s->n_past());
            // The prompt may come in chunks (rows up to the session's batch): it ends with the
            // chunk that asks for logits.
            if (r.kind == pass_kind::commit && (r.s->n_past() == 0 || prompt_open)) {
                prompt_len = r.s->n_past() + std::int64_t(r.ids.size());
                prompt_open = r.logits == 0;
                std::lock_guard lk(prompt_mu);
                if (r.s->n_past() == 0) last_prompt.clear();
                last_prompt.insert(last_prompt.end(), r.ids.begin(), r.ids.end());
            }
        }
        base.run(reqs, logits, exact);
        const std::int64_t V = n_vocab();
        std::int64_t row = 0;
        for (std::size_t k = 0; k < reqs.size(); ++k) {
            const std::int64_t n = std::int64_t(reqs[k].ids.size());
            const std::int64_t shift = reqs[k].kind == pass_kind::preview ? 0 : 1;  // preview rows: no shift
            for (std::int64_t i = n - reqs[k].logits; i < n; ++i) onehot(logits.data() + (row++) * V, at(p0[k] + i + shift));
        }
    }
};

struct reply {
    int status = 0;
    json body;
    std::string raw;
};

inline reply post(int port, const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60);
    auto r = cli.Post(path.c_str(), h, body, "application/json");
    reply out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    try {
        out.body = json::parse(r->body);
    } catch (...) {
        out.body = nullptr;
    }
    return out;
}
inline reply post(int port, const std::string& path, const json& body, const httplib::Headers& h = {}) { return post(port, path, body.dump(), h); }
inline reply get(int port, const std::string& path, const httplib::Headers& h = {}) {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Get(path.c_str(), h);
    reply out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    try {
        out.body = json::parse(r->body);
    } catch (...) {
        out.body = nullptr;
    }
    return out;
}

struct streamed {
    int status = 0;
    std::vector<json> chunks;
    bool done = false;  // saw data: [DONE]
    std::string content, reasoning, text, finish;
    json tool_calls = json::array();  // assembled from the deltas
    json usage;
};

// Streams a request; `stop_after` > 0 makes the client hang up after that many chunks.
inline streamed stream(int port, const std::string& path, json body, int stop_after = 0) {
    body["stream"] = true;
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60);
    streamed out;
    server::sse_reader rd;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, std::size_t n, std::uint64_t, std::uint64_t) {
        rd.feed(std::string_view(d, n), [&](const std::string& data) {
            if (data == "[DONE]") { out.done = true; return; }
            out.chunks.push_back(json::parse(data));
        });
        return stop_after <= 0 || int(out.chunks.size()) < stop_after;
    };
    auto r = cli.send(req);
    if (r) out.status = r->status;
    for (const auto& c : out.chunks) {
        if (c.contains("usage")) out.usage = c["usage"];
        if (!c.contains("choices") || c["choices"].empty()) continue;
        const json& ch = c["choices"][0];
        if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) out.finish = ch["finish_reason"];
        if (ch.contains("text")) out.text += ch["text"].get<std::string>();
        if (!ch.contains("delta")) continue;
        const json& d = ch["delta"];
        if (d.contains("content") && d["content"].is_string()) out.content += d["content"].get<std::string>();
        if (d.contains("reasoning_content")) out.reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("tool_calls"))
            for (const auto& tc : d["tool_calls"]) {
                const std::size_t i = tc["index"];
                while (out.tool_calls.size() <= i) out.tool_calls.push_back({{"function", {{"name", ""}, {"arguments", ""}}}});
                json& t = out.tool_calls[i];
                if (tc.contains("id")) t["id"] = tc["id"];
                if (tc.contains("function")) {
                    if (tc["function"].contains("name")) t["function"]["name"] = tc["function"]["name"];
                    if (tc["function"].contains("arguments"))
                        t["function"]["arguments"] = t["function"]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
                }
            }
    }
    return out;
}

inline server::options opts(int port = 0) {
    server::options o;
    o.port = port;
    return o;
}
// One request generating at a time, no prefix cache: what a scripted_model needs (its script is
// keyed by the length of the one prompt it has seen), and what the queueing tests count on.
inline server::options serial_opts(int port = 0) {
    server::options o = opts(port);
    o.parallel = 1;
    o.cache_ram_mib = 0;
    return o;
}

inline json user(const std::string& text) { return json{{"messages", json::array({{{"role", "user"}, {"content", text}}})}}; }

inline bool is_error(const reply& r, int status) {
    return r.status == status && r.body.is_object() && r.body.contains("error") && r.body["error"]["message"].is_string() &&
           !r.body["error"]["message"].get<std::string>().empty();
}

template <class F>
inline bool eventually(F&& f, double seconds = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        if (f()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return f();
}


// A raw loopback connection, for what httplib::Client would not send: bad bytes, slow or half
// requests, chunked or compressed bodies, clients that go away.
class raw_conn {
public:
    explicit raw_conn(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(std::uint16_t(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close();
    }
    raw_conn(const raw_conn&) = delete;
    ~raw_conn() { close(); }
    bool ok() const { return fd_ >= 0; }
    int fd() const { return fd_; }
    bool send(std::string_view s) {
        while (!s.empty()) {
            const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
            if (n <= 0) return false;
            s.remove_prefix(std::size_t(n));
        }
        return true;
    }
    // Everything the server sends until it closes the connection or `seconds` pass.
    std::string read_all(double seconds = 10) {
        std::string out;
        closed_ = false;
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        char buf[8192];
        while (fd_ >= 0) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
            if (left <= 0) break;
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, int(left)) <= 0) continue;
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) { closed_ = true; break; }
            out.append(buf, std::size_t(n));
        }
        return out;
    }
    bool closed() const { return closed_; }  // read_all ended because the server closed
    void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
    bool closed_ = false;
};

struct raw_reply {
    int status = 0;           // 0: no response
    std::string head, body;   // body de-chunked
    json body_json;           // null unless the body is valid JSON (and valid UTF-8)
    bool closed = false;      // the server closed the connection
    std::string header(const std::string& name) const {
        std::string lower_head = head, key = "\r\n" + name + ":";
        for (auto& c : lower_head) c = char(std::tolower(static_cast<unsigned char>(c)));
        for (auto& c : key) c = char(std::tolower(static_cast<unsigned char>(c)));
        auto at = lower_head.find(key);
        if (at == std::string::npos) return {};
        at += key.size();
        auto end = head.find("\r\n", at);
        std::string v = head.substr(at, end - at);
        while (!v.empty() && v.front() == ' ') v.erase(0, 1);
        return v;
    }
    bool is_error(int st) const {
        return status == st && body_json.is_object() && body_json.contains("error") && body_json["error"]["message"].is_string() &&
               !body_json["error"]["message"].get<std::string>().empty();
    }
};

inline raw_reply parse_http(const std::string& bytes) {
    raw_reply r;
    const auto end = bytes.find("\r\n\r\n");
    if (!bytes.starts_with("HTTP/1.") || end == std::string::npos) return r;
    r.head = bytes.substr(0, end + 2);
    r.status = std::atoi(bytes.c_str() + 9);
    std::string body = bytes.substr(end + 4);
    if (r.header("Transfer-Encoding").find("chunked") != std::string::npos) {
        std::string plain;
        std::size_t at = 0;
        while (at < body.size()) {
            const auto nl = body.find("\r\n", at);
            if (nl == std::string::npos) break;
            const std::size_t n = std::strtoul(body.c_str() + at, nullptr, 16);
            if (n == 0 || nl + 2 + n > body.size()) break;
            plain += body.substr(nl + 2, n);
            at = nl + 2 + n + 2;
        }
        body = plain;
    }
    r.body = body;
    try {
        r.body_json = json::parse(body);
    } catch (...) {
        r.body_json = nullptr;
    }
    return r;
}

// Sends `request` on a fresh connection; the response (the server closes after it: every
// request here says Connection: close).
inline raw_reply raw(int port, const std::string& request, double seconds = 10) {
    raw_conn c(port);
    REQUIRE(c.ok());
    c.send(request);
    raw_reply r = parse_http(c.read_all(seconds));
    r.closed = c.closed();
    return r;
}

inline std::string http_request(const std::string& method, const std::string& path, const std::string& body = {},
                                const std::string& extra_headers = {}, bool with_length = true) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (!body.empty() || method == "POST") r += "Content-Type: application/json\r\n";
    if (with_length && (!body.empty() || method == "POST")) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    return r + extra_headers + "\r\n" + body;
}

// Wall-clock seconds of f().
template <class F>
inline double seconds_of(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace server_test
