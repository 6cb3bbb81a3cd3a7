// bench_server: load test of `clover serve` (include/clover/server) over loopback. Starts the
// server in-process on an ephemeral port of 127.0.0.1 with the bundled model
// (models/clover-small.gguf; a synthetic tiny Clover model when it is absent, said so in the
// output), then C client threads each send R streaming chat requests with httplib::Client.
// Reports requests/s, output tokens/s, and percentiles of time to first token (TTFT), time per
// output token after the first (TPOT), inter-chunk gap and whole-request latency; a table, then
// one JSON line.
//
//   bench_server [MODEL] [--clients 16] [--requests 4] [--max-tokens 64] [--decoder ar|diffusion|speculative] [--threads N]
//                [--parallel N] [--batch-tokens N]     (the server's continuous batching; 1: one at a time)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <clover/model/synth.hpp>
#include <clover/server/server.hpp>

using namespace clover;
using json = server::json;
using clk = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double k = p / 100.0 * double(v.size() - 1);
    const auto lo = std::size_t(k);
    const auto hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (k - double(lo));
}

struct sample {
    double ttft = 0, total = 0, tpot = -1;
    std::vector<double> gaps;
    long tokens = 0;
    bool ok = false;
    std::string why;  // a failed request: its status or the client's error
};

}  // namespace

int main(int argc, char** argv) try {
    std::string path, decoder = "ar";
    int clients = 16, requests = 4, max_tokens = 64, threads = 0;
    long long parallel = 4, batch_tokens = 512;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&] {
            if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
            return std::string(argv[++i]);
        };
        if (a == "--clients") clients = std::stoi(next());
        else if (a == "--requests") requests = std::stoi(next());
        else if (a == "--max-tokens") max_tokens = std::stoi(next());
        else if (a == "--decoder") decoder = next();
        else if (a == "--threads") threads = std::stoi(next());
        else if (a == "--parallel") parallel = std::stoll(next());
        else if (a == "--batch-tokens") batch_tokens = std::stoll(next());
        else if (a == "-h" || a == "--help") {
            std::printf("bench_server [MODEL] [--clients N] [--requests R] [--max-tokens T] [--decoder ar|diffusion|speculative] [--threads N] [--parallel N] [--batch-tokens N]\n");
            return 0;
        } else path = a;
    }
    std::string note;
    if (path.empty()) {
        path = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";
        if (!std::filesystem::exists(path)) {
            auto s = synth::preset("tiny");
            s.arch = "clover_moe";
            path = (std::filesystem::temp_directory_path() / "bench_server_tiny.gguf").string();
            synth::write(s, path);
            note = "bundled model models/clover-small.gguf absent: synthetic tiny clover_moe (random weights)";
        }
    }
    model<variants::from_file, backend::cpu> m(load(path), backend::cpu_options{threads});
    const tokenizer tok = tokenizer::from_file(path);
    server::options o;
    o.port = 0;
    o.model_id = "bench";
    // A quarter of the HTTP threads is kept for short requests: enough that every client can hold
    // a completion (clients + 4 left the 16th client a 503).
    o.http_threads = clients * 4 / 3 + 4;
    o.max_queue = std::size_t(clients) * 2;
    o.decoder = decoder;
    o.parallel = parallel;
    o.batch_tokens = batch_tokens;
    server::server srv(m, tok, o);
    const int port = srv.start();

    const char* topics[] = {"the sea", "a city at night", "mountains", "a library", "rain", "the moon", "a market", "trains"};
    std::mutex mu;
    std::vector<sample> all;
    const auto t0 = clk::now();
    std::vector<std::thread> th;
    for (int c = 0; c < clients; ++c)
        th.emplace_back([&, c] {
            httplib::Client cli("127.0.0.1", port);
            cli.set_read_timeout(600);
            for (int r = 0; r < requests; ++r) {
                json body = {{"messages", json::array({{{"role", "user"}, {"content", std::string("Write a short poem about ") + topics[(c + r) % 8] + "."}}})},
                             {"max_tokens", max_tokens}, {"stream", true}, {"temperature", 0.7}, {"seed", c * 1000 + r},
                             {"chat_template_kwargs", {{"enable_thinking", false}}}};
                sample s;
                server::sse_reader rd;
                clk::time_point start = clk::now(), first{}, last{};
                bool got_first = false;
                httplib::Request req;
                req.method = "POST";
                req.path = "/v1/chat/completions";
                req.body = body.dump();
                req.set_header("Content-Type", "application/json");
                req.content_receiver = [&](const char* d, std::size_t n, std::uint64_t, std::uint64_t) {
                    rd.feed(std::string_view(d, n), [&](const std::string& data) {
                        if (data == "[DONE]") return;
                        json j = json::parse(data);
                        if (j.contains("usage")) s.tokens = j["usage"]["completion_tokens"];
                        if (!j.contains("choices") || j["choices"].empty()) return;
                        const json& delta = j["choices"][0]["delta"];
                        const bool text = (delta.contains("content") && delta["content"].is_string() && !delta["content"].get<std::string>().empty()) ||
                                          delta.contains("reasoning_content") || delta.contains("tool_calls");
                        if (!text) return;
                        const auto now = clk::now();
                        if (!got_first) { first = now; got_first = true; }
                        else s.gaps.push_back(std::chrono::duration<double>(now - last).count());
                        last = now;
                    });
                    return true;
                };
                auto res = cli.send(req);
                const auto end = clk::now();
                s.ok = res && res->status == 200;
                if (!s.ok) s.why = res ? "status " + std::to_string(res->status) + " " + res->body.substr(0, 160) : httplib::to_string(res.error());
                s.total = std::chrono::duration<double>(end - start).count();
                s.ttft = got_first ? std::chrono::duration<double>(first - start).count() : s.total;
                if (got_first && s.tokens > 1) s.tpot = std::chrono::duration<double>(last - first).count() / double(s.tokens - 1);
                std::lock_guard lk(mu);
                all.push_back(std::move(s));
            }
        });
    for (auto& t : th) t.join();
    const double wall = std::chrono::duration<double>(clk::now() - t0).count();
    srv.stop();

    for (const auto& s : all)
        if (!s.ok) std::printf("failed request: %s\n", s.why.c_str());
    std::vector<double> ttft, tpot, gaps, lat;
    long tokens = 0, ok = 0;
    for (const auto& s : all) {
        if (!s.ok) continue;
        ++ok;
        tokens += s.tokens;
        ttft.push_back(s.ttft * 1e3);
        lat.push_back(s.total * 1e3);
        if (s.tpot >= 0) tpot.push_back(s.tpot * 1e3);
        for (double g : s.gaps) gaps.push_back(g * 1e3);
    }
    std::printf("bench_server: %s%s%s\n", path.c_str(), note.empty() ? "" : " — ", note.c_str());
    std::printf("clients %d x requests %d, max_tokens %d, decoder %s, parallel %lld: %ld/%zu ok in %.2f s\n", clients, requests,
                max_tokens, decoder.c_str(), parallel, ok, all.size(), wall);
    std::printf("throughput: %.2f requests/s, %.1f output tokens/s\n", double(ok) / wall, double(tokens) / wall);
    std::printf("%-22s %10s %10s %10s %10s\n", "metric (ms)", "p50", "p90", "p99", "max");
    auto row = [](const char* n, const std::vector<double>& v) {
        std::printf("%-22s %10.2f %10.2f %10.2f %10.2f\n", n, pct(v, 50), pct(v, 90), pct(v, 99), pct(v, 100));
    };
    row("time to first token", ttft);
    row("time per output token", tpot);
    row("inter-chunk gap", gaps);
    row("request latency", lat);
    json j = {{"bench", "server"}, {"model", path}, {"note", note}, {"clients", clients}, {"requests", requests}, {"max_tokens", max_tokens},
              {"parallel", parallel}, {"batch_tokens", batch_tokens},
              {"decoder", decoder}, {"ok", ok}, {"total", all.size()}, {"seconds", wall}, {"requests_per_s", double(ok) / wall},
              {"tokens_per_s", double(tokens) / wall},
              {"ttft_ms", {{"p50", pct(ttft, 50)}, {"p90", pct(ttft, 90)}, {"p99", pct(ttft, 99)}}},
              {"tpot_ms", {{"p50", pct(tpot, 50)}, {"p90", pct(tpot, 90)}, {"p99", pct(tpot, 99)}}},
              {"latency_ms", {{"p50", pct(lat, 50)}, {"p90", pct(lat, 90)}, {"p99", pct(lat, 99)}}}};
    std::printf("%s\n", j.dump().c_str());
    return ok == long(all.size()) ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_server: %s\n", e.what());
    return 1;
}
