// Limits that hold before a body reaches the handler: --max-body for chunked, length-less and
// compressed bodies, a declared length past the limit (answered without reading it), a bounded
// queue that answers 503 while /health stays fast, slow-loris clients that trickle their
// headers or body, and a bound on open connections.
#include <doctest/doctest.h>

#include <cstring>

#include "server_test_util.hpp"

using namespace server_test;

namespace {

std::string chunked(const std::string& body, std::size_t piece) {
    std::string out;
    char len[32];
    for (std::size_t at = 0; at < body.size(); at += piece) {
        const std::size_t n = std::min(piece, body.size() - at);
        std::snprintf(len, sizeof len, "%zx\r\n", n);
        out += len;
        out += body.substr(at, n);
        out += "\r\n";
    }
    return out + "0\r\n\r\n";
}

// gzip of `data` with stored (uncompressed) deflate blocks: what a client would send with
// Content-Encoding: gzip, without needing zlib here.
std::string gzip_stored(const std::string& data) {
    std::uint32_t table[256];
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    std::uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
    crc ^= 0xFFFFFFFFu;
    std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
    std::size_t at = 0;
    do {
        const std::size_t n = std::min<std::size_t>(65535, data.size() - at);
        const bool last = at + n == data.size();
        out += char(last ? 1 : 0);
        out += char(n & 0xFF);
        out += char(n >> 8);
        out += char(~n & 0xFF);
        out += char((~n >> 8) & 0xFF);
        out += data.substr(at, n);
        at += n;
    } while (at < data.size());
    for (int k = 0; k < 4; ++k) out += char((crc >> (8 * k)) & 0xFF);
    for (int k = 0; k < 4; ++k) out += char((data.size() >> (8 * k)) & 0xFF);
    return out;
}

// A valid completion request padded with spaces to about `size` bytes.
std::string padded_request(std::size_t size) {
    std::string b = R"({"prompt": "x", "max_tokens": 1)";
    if (b.size() + 1 < size) b += std::string(size - b.size() - 1, ' ');
    return b + "}";
}

}  // namespace

TEST_CASE("limits: --max-body holds for chunked, length-less and compressed bodies") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.max_body_bytes = 64 * 1024; return o; }());
    const int port = srv.start();
    const std::string path = "/v1/completions";
    // The same valid request, small: accepted in every framing we allow.
    CHECK(raw(port, http_request("POST", path, padded_request(1000))).status == 200);
    CHECK(raw(port, http_request("POST", path, "", "Transfer-Encoding: chunked\r\n", false) + chunked(padded_request(1000), 300)).status == 200);

    // 1 MiB chunked: refused (413), never parsed into a 200.
    auto big = raw(port, http_request("POST", path, "", "Transfer-Encoding: chunked\r\n", false) + chunked(padded_request(1 << 20), 16384));
    CHECK(big.status != 200);
    if (big.status) CHECK(big.is_error(413));
    // A declared length past the limit is answered at once, without waiting for the body.
    double t = seconds_of([&] {
        auto r = raw(port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000000000\r\n\r\n{", 5);
        CHECK(r.is_error(413));
    });
    CHECK(t < 2);
    // No length and not chunked: the body would run to the end of the connection; refused.
    {
        raw_conn c(port);
        c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" + padded_request(200 * 1024));
        c.shutdown_write();
        auto r = parse_http(c.read_all(5));
        CHECK(r.status != 200);
        if (r.status) CHECK(r.status / 100 == 4);
    }
    // Content-Encoding: refused (415), even when the body would be small: a 64 KiB gzip body can
    // unpack to gigabytes.
    auto gz = raw(port, http_request("POST", path, gzip_stored(padded_request(1000)), "Content-Encoding: gzip\r\n"));
    CHECK(gz.is_error(415));
    auto br = raw(port, http_request("POST", path, "xx", "Content-Encoding: br\r\n"));
    CHECK(br.is_error(415));
    // Methods that carry bodies we never read, and POSTs to paths that do not exist: refused
    // before their bodies are read.
    CHECK(raw(port, http_request("PUT", path, padded_request(100))).is_error(405));
    CHECK(raw(port, http_request("DELETE", path, "")).is_error(405));
    CHECK(raw(port, http_request("POST", "/v1/nothing", "", "Transfer-Encoding: chunked\r\n", false) + chunked(padded_request(1 << 20), 16384))
              .is_error(404));
    CHECK(raw(port, http_request("POST", path, "--x\r\n\r\n--x--", "Content-Type: multipart/form-data; boundary=x\r\n")).status / 100 == 4);
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("limits: 64 requests at once: the excess gets 503 at once and /health answers fast") {
    auto& f = fx();
    scripted_model sm(f.m);
    sm.after = f.tok.eog_ids().front();
    sm.script.assign(20, f.tok.encode("a").front());
    sm.delay = std::chrono::microseconds(5000);  // about 100 ms per request
    server::basic_server<scripted_model> srv(sm, f.tok, serial_opts());
    const int port = srv.start();
    std::vector<int> status(64, 0);
    std::vector<std::thread> th;
    for (int k = 0; k < 64; ++k)
        th.emplace_back([&, k] { status[k] = post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 20}}).status; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    double worst = 0;
    for (int i = 0; i < 5; ++i) {
        int st = 0;
        worst = std::max(worst, seconds_of([&] { st = get(port, "/health").status; }));
        CHECK(st == 200);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(worst < 1.0);
    for (auto& t : th) t.join();
    int ok = 0, busy = 0;
    for (int s : status) {
        ok += s == 200;
        busy += s == 503;
    }
    CHECK(ok + busy == 64);
    CHECK(busy > 0);
    CHECK(ok >= 8);
    CHECK(srv.stats().queued == 0);
}

TEST_CASE("limits: slow-loris clients (headers or body a byte at a time) neither starve /health nor stay forever") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.read_timeout_s = 2; return o; }());
    const int port = srv.start();
    std::vector<std::unique_ptr<raw_conn>> heads, bodies;
    for (int i = 0; i < 40; ++i) {
        heads.push_back(std::make_unique<raw_conn>(port));
        REQUIRE(heads.back()->send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
        bodies.push_back(std::make_unique<raw_conn>(port));
        REQUIRE(bodies.back()->send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"));
    }
    // They keep trickling while we check /health.
    std::atomic<bool> stop{false};
    std::thread trickle([&] {
        while (!stop) {
            for (auto& c : heads) c->send("X");
            for (auto& c : bodies) c->send(" ");
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    double worst = 0;
    for (int i = 0; i < 5; ++i) {
        int st = 0;
        worst = std::max(worst, seconds_of([&] { st = get(port, "/health").status; }));
        CHECK(st == 200);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK(worst < 1.0);
    // Past the read timeout (2 s for the whole request) they are answered 408 or dropped; bodies
    // past the completion slots were answered 503 at once.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    stop = true;
    trickle.join();
    int closed = 0;
    for (auto* group : {&heads, &bodies})
        for (auto& c : *group) {
            auto r = parse_http(c->read_all(2));
            closed += c->closed() && (r.status == 0 || r.status == 408 || (group == &bodies && r.status == 503));
            if (!c->closed() || (r.status != 0 && r.status != 408 && r.status != 503)) MESSAGE("status ", r.status, " closed ", c->closed());
        }
    CHECK(closed == 80);
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("limits: open connections are bounded (503 past --max-connections), idle ones time out") {
    auto& f = fx();
    server::server srv(f.m, f.tok, [] { auto o = opts(); o.max_connections = 8; o.read_timeout_s = 2; return o; }());
    const int port = srv.start();
    std::vector<std::unique_ptr<raw_conn>> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<raw_conn>(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto r = raw(port, http_request("GET", "/health"), 5);
    CHECK(r.is_error(503));
    // The idle ones are closed after the read timeout; then there is room again.
    for (auto& c : idle) {
        c->read_all(4);
        CHECK(c->closed());
    }
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("limits: a diffusion block past --max-block or a speculative one past --max-draft gets a 400 naming the field and the cap") {
    auto& f = fx();
    server::server srv(f.m, f.tok, opts());
    const int port = srv.start();
    // The audit's request: every pass a 1,024-row preview deciding one token.
    json hostile = {{"prompt", "x"}, {"decoder", "diffusion"}, {"block", 1024}, {"threshold", 1.0}, {"max_tokens", 4096}, {"stream", true}};
    auto r = post(port, "/v1/completions", hostile);
    REQUIRE(is_error(r, 400));
    CHECK(r.body["error"]["param"] == "block");
    const std::string msg = r.body["error"]["message"];
    CHECK(msg.find("at most 64") != std::string::npos);
    CHECK(msg.find("--max-block") != std::string::npos);
    hostile["decoder"] = "speculative";
    r = post(port, "/v1/completions", hostile);
    REQUIRE(is_error(r, 400));
    CHECK(r.body["error"]["param"] == "block");
    CHECK(r.body["error"]["message"].get<std::string>().find("at most 32") != std::string::npos);
    CHECK(r.body["error"]["message"].get<std::string>().find("--max-draft") != std::string::npos);
    // At the caps: accepted.
    for (auto [dec, block] : {std::pair{"diffusion", 64}, std::pair{"speculative", 32}}) {
        CAPTURE(dec);
        json ok = {{"prompt", "x"}, {"decoder", dec}, {"block", block}, {"max_tokens", 2}};
        CHECK(post(port, "/v1/completions", ok).status == 200);
    }
    // The operator's caps, and a default block above the cap refused at construction.
    auto o = opts();
    o.max_block = 8;
    server::server small(f.m, f.tok, [&] { auto p = o; p.block = 8; return p; }());
    const int p2 = small.start();
    CHECK(post(p2, "/v1/completions", json{{"prompt", "x"}, {"decoder", "diffusion"}, {"block", 8}, {"max_tokens", 2}}).status == 200);
    r = post(p2, "/v1/completions", json{{"prompt", "x"}, {"decoder", "diffusion"}, {"block", 9}, {"max_tokens", 2}});
    CHECK(is_error(r, 400));
    CHECK(r.body["error"]["message"].get<std::string>().find("at most 8") != std::string::npos);
    CHECK_THROWS_WITH_AS(server::server(f.m, f.tok, o), doctest::Contains("above --max-block"), error);
    o = opts();
    o.max_draft = 1;
    CHECK_THROWS_WITH_AS(server::server(f.m, f.tok, o), doctest::Contains("--max-draft at least 2"), error);
    o = opts();
    o.cache_scope = "tenant";
    CHECK_THROWS_WITH_AS(server::server(f.m, f.tok, o), doctest::Contains("--cache-scope"), error);
}
