// bench_server: load tests of `clover serve` (include/clover/server) over loopback. Starts the
// server in-process on an ephemeral port of 127.0.0.1 with the bundled model
// (models/clover-small.gguf; a synthetic tiny Clover model when it is absent, said so in the
// output); clients are threads with httplib::Client sending streaming chat requests. Three modes:
//
// load (default): C clients each send R requests (sampled, temperature 0.7). Reports requests/s,
//   output tokens/s, and percentiles of time to first token (TTFT), time per output token after
//   the first (TPOT), inter-chunk gap and whole-request latency; a table, then one JSON line.
// --sweep 1,4,8,16: the load test once per client count, each on a fresh server with the same
//   options, greedy with ignore_eos (every request makes exactly max_tokens tokens), fixed prompts
//   of about --prompt-tokens tokens, one per client and request. A row per count (aggregate
//   tokens/s, TTFT and TPOT p50/p95, both against 1 client), a JSON line per count, and a summary
//   line with issue 17's goals: 8 clients >= 2.5x the tokens/s of 1; TTFT p95 at 16 clients
//   <= 4x the 1-client TTFT p50.
// --conversation: one client runs an agent-like chat of --turns turns (thinking on, greedy): a
//   history of about --history-tokens tokens, to which every turn adds a user message of about
//   --turn-tokens tokens (from turn 2 after the previous answer's content, not its reasoning, as
//   an OpenAI client sends it back). Against two fresh servers, the prefix cache on and off, each
//   turn sent to one and then the other. A row per turn: prompt tokens, new tokens (past the longest common token prefix with
//   the previous turn's prompt, computed here with the server's own rendering), tokens computed
//   with the cache on, TTFT on and off; JSON lines; a summary of the goals from turn 2 on:
//   computed <= 1.2x new and TTFT(on) <= 0.2x TTFT(off). --repeat N: N such conversations, then
//   the median of each turn's on/off ratio, which the goals are judged on.
//
//   bench_server [MODEL] [--clients 16] [--requests 4] [--max-tokens 64] [--decoder ar|diffusion|speculative] [--threads N]
//                [--parallel N] [--batch-tokens N]     (the server's continuous batching; 1: one at a time)
//                [--ctx N]                             (tokens per request; default 4096, the conversation: what it needs)
//                [--sweep 1,4,8,16] [--prompt-tokens 128]
//                [--conversation] [--turns 8] [--history-tokens 2000] [--turn-tokens 500] [--repeat 1]
//                [--cache-mib 4096]                    (the server's prefix cache budget, 0: off; the conversation's "on" run)
//                [--json-out FILE]                     (appends every JSON line to FILE, e.g. benchmarks/results/*.jsonl)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <clover/model/synth.hpp>
#include <clover/server/server.hpp>

#include "bench_server_util.hpp"

using namespace clover;
using bench::json;
using bench::pct;
using model_t = model<variants::from_file, backend::cpu>;

namespace {

struct config {
    std::string path, decoder = "ar", json_out, note;
    int clients = 16, requests = 4, max_tokens = -1, threads = 0;
    long long parallel = 4, batch_tokens = 512, ctx = -1, cache_mib = 4096;
    std::vector<int> sweep;
    long prompt_tokens = -1;
    bool conversation = false;
    int turns = 8, repeat = 1;
    long history_tokens = 2000, turn_tokens = 500;
};

constexpr const char* usage_text =
    "bench_server [MODEL] [--clients N] [--requests R] [--max-tokens T] [--decoder ar|diffusion|speculative] [--threads N]\n"
    "             [--parallel N] [--batch-tokens N] [--ctx N] [--json-out FILE]\n"
    "             [--sweep 1,4,8,16] [--prompt-tokens N]\n"
    "             [--conversation] [--turns N] [--history-tokens N] [--turn-tokens N] [--cache-mib N] [--repeat N]\n";

long long positive(const std::string& flag, const std::string& v, long long lo = 1) {
    std::size_t used = 0;
    long long x = 0;
    try {
        x = std::stoll(v, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != v.size() || v.empty() || x < lo)
        throw std::runtime_error(flag + " needs an integer of at least " + std::to_string(lo) + " (got \"" + v + "\")");
    return x;
}

std::vector<int> counts_of(const std::string& v) {
    std::vector<int> out;
    std::stringstream ss(v);
    for (std::string part; std::getline(ss, part, ',');) out.push_back(int(positive("--sweep", part)));
    if (out.empty()) throw std::runtime_error("--sweep needs client counts, e.g. 1,4,8,16");
    return out;
}

config parse_args(int argc, char** argv) {
    config c;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&] {
            if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
            return std::string(argv[++i]);
        };
        if (a == "--clients") c.clients = int(positive(a, next()));
        else if (a == "--requests") c.requests = int(positive(a, next()));
        else if (a == "--max-tokens") c.max_tokens = int(positive(a, next()));
        else if (a == "--decoder") c.decoder = next();
        else if (a == "--threads") c.threads = int(positive(a, next(), 0));
        else if (a == "--parallel") c.parallel = positive(a, next());
        else if (a == "--batch-tokens") c.batch_tokens = positive(a, next());
        else if (a == "--ctx") c.ctx = positive(a, next(), 2);
        else if (a == "--sweep") c.sweep = counts_of(next());
        else if (a == "--prompt-tokens") c.prompt_tokens = long(positive(a, next(), 0));
        else if (a == "--conversation") c.conversation = true;
        else if (a == "--turns") c.turns = int(positive(a, next()));
        else if (a == "--repeat") c.repeat = int(positive(a, next()));
        else if (a == "--history-tokens") c.history_tokens = long(positive(a, next()));
        else if (a == "--turn-tokens") c.turn_tokens = long(positive(a, next()));
        else if (a == "--cache-mib") c.cache_mib = positive(a, next(), 0);
        else if (a == "--json-out") c.json_out = next();
        else if (a == "-h" || a == "--help") {
            std::printf("%s", usage_text);
            std::exit(0);
        } else if (a.size() > 1 && a[0] == '-') throw std::runtime_error("unknown option " + a + "\n" + usage_text);
        else c.path = a;
    }
    if (c.conversation && !c.sweep.empty()) throw std::runtime_error("--sweep and --conversation are separate runs: give one");
    if (c.max_tokens < 0) c.max_tokens = c.conversation ? 32 : 64;
    if (c.prompt_tokens < 0) c.prompt_tokens = c.sweep.empty() ? 0 : 128;
    return c;
}

server::options server_options(const config& c, int max_clients) {
    server::options o;
    o.port = 0;
    o.model_id = "bench";
    // A quarter of the HTTP threads is kept for short requests: enough that every client can hold
    // a completion (clients + 4 left the 16th client a 503).
    o.http_threads = max_clients * 4 / 3 + 4;
    o.max_queue = std::size_t(max_clients) * 2;
    o.decoder = c.decoder;
    o.parallel = c.parallel;
    o.batch_tokens = c.batch_tokens;
    o.cache_ram_mib = c.cache_mib;
    if (c.ctx > 0) {
        o.ctx = c.ctx;
        o.max_tokens_limit = std::max<std::int64_t>(o.max_tokens_limit, c.ctx);
    }
    return o;
}

// One request before measuring, with a prompt about as long as the measured ones (`text`, which
// shares nothing with them but the template's first token): the weights are mapped in, the
// threads started and the buffers of a long prompt grown.
void warm_up(int port, const std::string& text) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(600);
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "Warm-up: " + text}}})}, {"max_tokens", 2}, {"stream", true},
                 {"temperature", 0}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
    const auto r = bench::stream_chat(cli, body);
    if (!r.ok) throw std::runtime_error("the warm-up request failed: " + r.why);
}

struct load_result {
    std::vector<bench::reply> all;
    double wall = 0;
};

using body_table = std::vector<std::vector<json>>;  // [client][request], made before the clock starts

body_table make_bodies(int clients, int requests, const std::function<json(int, int)>& body) {
    body_table t(static_cast<std::size_t>(clients));
    for (int c = 0; c < clients; ++c)
        for (int r = 0; r < requests; ++r) t[std::size_t(c)].push_back(body(c, r));
    return t;
}

// `clients` threads each send `requests` requests (bodies[c][r]) to a fresh server.
load_result run_load(model_t& m, const tokenizer& tok, const server::options& o, int clients, int requests, const body_table& bodies,
                     const std::string& warm_text = {}) {
    server::server srv(m, tok, o);
    const int port = srv.start();
    if (!warm_text.empty()) warm_up(port, warm_text);
    load_result out;
    std::mutex mu;
    const auto t0 = bench::clk::now();
    std::vector<std::thread> th;
    for (int c = 0; c < clients; ++c)
        th.emplace_back([&, c] {
            httplib::Client cli("127.0.0.1", port);
            cli.set_read_timeout(600);
            for (int r = 0; r < requests; ++r) {
                auto s = bench::stream_chat(cli, bodies[std::size_t(c)][std::size_t(r)]);
                std::lock_guard lk(mu);
                out.all.push_back(std::move(s));
            }
        });
    for (auto& t : th) t.join();
    out.wall = bench::seconds(bench::clk::now() - t0);
    srv.stop();
    return out;
}

struct load_stats {
    std::vector<double> ttft, tpot, gaps, lat;  // ms
    long tokens = 0, ok = 0, cached = 0;  // cached: prompt tokens the prefix cache gave (-1: not reported)
};

load_stats summarize(const load_result& r) {
    load_stats s;
    for (const auto& x : r.all) {
        if (!x.ok) {
            std::printf("failed request: %s\n", x.why.c_str());
            continue;
        }
        ++s.ok;
        s.tokens += x.tokens;
        const long cached = bench::cached_tokens(x.usage);
        s.cached = cached < 0 || s.cached < 0 ? -1 : s.cached + cached;
        s.ttft.push_back(x.ttft * 1e3);
        s.lat.push_back(x.total * 1e3);
        if (x.tpot >= 0) s.tpot.push_back(x.tpot * 1e3);
        for (double g : x.gaps) s.gaps.push_back(g * 1e3);
    }
    return s;
}

const char* topics[] = {"the sea", "a city at night", "mountains", "a library", "rain", "the moon", "a market", "trains"};

// The user message of client c's request r: a topic, padded with fixed notes so that the
// rendered prompt has about `prompt_tokens` tokens (0: no padding).
std::string poem_request(const bench::prompt_counter& pc, int c, int r, long prompt_tokens, bool numbered) {
    std::string head = std::string(numbered ? "Request " + std::to_string(c) + "." + std::to_string(r) + ": w" : "W") +
                       "rite a short poem about " + topics[(c + r) % 8] + ".";
    if (prompt_tokens <= 0) return head;
    head += " Draw on these notes:\n";
    auto body_of = [](const std::string& text) {
        return json{{"messages", json::array({{{"role", "user"}, {"content", text}}})},
                    {"chat_template_kwargs", {{"enable_thinking", false}}}};
    };
    const long base = pc.count(body_of(head));
    return head + bench::filler(pc.tok, prompt_tokens - base, c * 1000 + r);
}

int load_mode(model_t& m, const tokenizer& tok, const config& c, bench::json_lines& out) {
    const server::options o = server_options(c, c.clients);
    const bench::prompt_counter pc{tok, o};
    const body_table bodies = make_bodies(c.clients, c.requests, [&](int cl, int r) {
        return json{{"messages", json::array({{{"role", "user"}, {"content", poem_request(pc, cl, r, c.prompt_tokens, false)}}})},
                    {"max_tokens", c.max_tokens}, {"stream", true}, {"temperature", 0.7}, {"seed", cl * 1000 + r},
                    {"chat_template_kwargs", {{"enable_thinking", false}}}};
    });
    const auto lr = run_load(m, tok, o, c.clients, c.requests, bodies);
    const load_stats s = summarize(lr);
    const double wall = lr.wall;
    std::printf("bench_server: %s%s%s\n", c.path.c_str(), c.note.empty() ? "" : " — ", c.note.c_str());
    std::printf("clients %d x requests %d, max_tokens %d, decoder %s, parallel %lld: %ld/%zu ok in %.2f s\n", c.clients, c.requests,
                c.max_tokens, c.decoder.c_str(), c.parallel, s.ok, lr.all.size(), wall);
    std::printf("throughput: %.2f requests/s, %.1f output tokens/s\n", double(s.ok) / wall, double(s.tokens) / wall);
    std::printf("%-22s %10s %10s %10s %10s\n", "metric (ms)", "p50", "p90", "p99", "max");
    auto row = [](const char* n, const std::vector<double>& v) {
        std::printf("%-22s %10.2f %10.2f %10.2f %10.2f\n", n, pct(v, 50), pct(v, 90), pct(v, 99), pct(v, 100));
    };
    row("time to first token", s.ttft);
    row("time per output token", s.tpot);
    row("inter-chunk gap", s.gaps);
    row("request latency", s.lat);
    json j = {{"bench", "server"}, {"model", c.path}, {"note", c.note}, {"clients", c.clients}, {"requests", c.requests},
              {"max_tokens", c.max_tokens}, {"parallel", c.parallel}, {"batch_tokens", c.batch_tokens},
              {"decoder", c.decoder}, {"ok", s.ok}, {"total", lr.all.size()}, {"seconds", wall}, {"requests_per_s", double(s.ok) / wall},
              {"tokens_per_s", double(s.tokens) / wall},
              {"ttft_ms", {{"p50", pct(s.ttft, 50)}, {"p90", pct(s.ttft, 90)}, {"p99", pct(s.ttft, 99)}}},
              {"tpot_ms", {{"p50", pct(s.tpot, 50)}, {"p90", pct(s.tpot, 90)}, {"p99", pct(s.tpot, 99)}}},
              {"latency_ms", {{"p50", pct(s.lat, 50)}, {"p90", pct(s.lat, 90)}, {"p99", pct(s.lat, 99)}}}};
    if (c.prompt_tokens > 0) j["prompt_tokens"] = c.prompt_tokens;
    out.emit(j);
    return s.ok == long(lr.all.size()) ? 0 : 1;
}

json ratio_or_null(std::optional<double> x) { return x ? json(*x) : json(nullptr); }

int sweep_mode(model_t& m, const tokenizer& tok, const config& c, bench::json_lines& out) {
    const int most = *std::max_element(c.sweep.begin(), c.sweep.end());
    const server::options o = server_options(c, most);
    const bench::prompt_counter pc{tok, o};
    // Every (client, request) has its own prompt, numbered first so that no two share more than a
    // few tokens (a prefix cache finds next to nothing to reuse between them).
    const body_table bodies = make_bodies(most, c.requests, [&](int cl, int r) {
        return json{{"messages", json::array({{{"role", "user"}, {"content", poem_request(pc, cl, r, c.prompt_tokens, true)}}})},
                    {"max_tokens", c.max_tokens}, {"ignore_eos", true}, {"stream", true}, {"temperature", 0},
                    {"chat_template_kwargs", {{"enable_thinking", false}}}};
    });
    long prompt_sum = 0;
    for (const auto& per_client : bodies)
        for (const auto& b : per_client) prompt_sum += pc.count(b);
    const double prompt_mean = double(prompt_sum) / double(most * c.requests);
    const std::string warm_text = bench::filler(tok, std::max(16L, c.prompt_tokens), 999);

    struct row_t {
        int clients;
        long ok, total, tokens, cached;
        double wall, tps, ttft50, ttft95, tpot50, tpot95;
    };
    std::vector<row_t> rows;
    int failed = 0;
    for (int n : c.sweep) {
        const auto lr = run_load(m, tok, o, n, c.requests, bodies, warm_text);
        const load_stats s = summarize(lr);
        failed += int(lr.all.size()) - int(s.ok);
        rows.push_back({n, s.ok, long(lr.all.size()), s.tokens, s.cached, lr.wall, double(s.tokens) / lr.wall, pct(s.ttft, 50), pct(s.ttft, 95),
                        pct(s.tpot, 50), pct(s.tpot, 95)});
    }
    const row_t* one = nullptr;
    for (const auto& r : rows)
        if (r.clients == 1) one = &r;
    auto vs_tps = [&](const row_t& r) -> std::optional<double> { return one ? std::optional(r.tps / one->tps) : std::nullopt; };
    auto vs_ttft = [&](const row_t& r) -> std::optional<double> { return one ? std::optional(r.ttft95 / one->ttft50) : std::nullopt; };

    std::printf("bench_server --sweep: %s%s%s\n", c.path.c_str(), c.note.empty() ? "" : " — ", c.note.c_str());
    std::printf("requests %d per client, max_tokens %d (greedy, ignore_eos), prompts ~%.0f tokens, decoder %s, parallel %lld, "
                "batch_tokens %lld, ctx %lld, prefix cache %s; one fresh server per count, one warm-up request each\n",
                c.requests, c.max_tokens, prompt_mean, c.decoder.c_str(), c.parallel, c.batch_tokens, (long long)o.ctx,
                c.cache_mib > 0 ? (std::to_string(c.cache_mib) + " MiB").c_str() : "off");
    std::printf("%7s %7s %10s %10s %10s %10s %10s %13s %20s\n", "clients", "ok", "tok/s", "TTFT p50", "TTFT p95", "TPOT p50",
                "TPOT p95", "tok/s vs 1", "TTFT p95/1-cl. p50");
    auto ratio = [](std::optional<double> x) {
        char b[32];
        if (x) std::snprintf(b, sizeof b, "%.2fx", *x);
        else std::snprintf(b, sizeof b, "-");
        return std::string(b);
    };
    for (const auto& r : rows)
        std::printf("%7d %3ld/%-3ld %10.1f %10.2f %10.2f %10.3f %10.3f %13s %20s\n", r.clients, r.ok, r.total, r.tps, r.ttft50, r.ttft95,
                    r.tpot50, r.tpot95, ratio(vs_tps(r)).c_str(), ratio(vs_ttft(r)).c_str());
    std::printf("(times in ms; TPOT: per output token after the first)\n");
    if (!one) std::printf("no 1-client row: the ratios and goals need --sweep to include 1\n");

    for (const auto& r : rows)
        out.emit({{"bench", "server_sweep"}, {"model", c.path}, {"note", c.note}, {"clients", r.clients}, {"requests", c.requests},
                  {"max_tokens", c.max_tokens}, {"prompt_tokens", prompt_mean}, {"decoder", c.decoder}, {"parallel", c.parallel},
                  {"batch_tokens", c.batch_tokens}, {"ctx", o.ctx}, {"ok", r.ok}, {"total", r.total}, {"tokens", r.tokens},
                  {"cached_tokens", r.cached},
                  {"seconds", r.wall}, {"tokens_per_s", r.tps}, {"ttft_ms", {{"p50", r.ttft50}, {"p95", r.ttft95}}},
                  {"tpot_ms", {{"p50", r.tpot50}, {"p95", r.tpot95}}}, {"tokens_per_s_vs_1", ratio_or_null(vs_tps(r))},
                  {"ttft_p95_vs_1_p50", ratio_or_null(vs_ttft(r))}});
    // Issue 17's goals; null where the sweep has no row to judge.
    std::optional<double> tps8, ttft16;
    for (const auto& r : rows) {
        if (r.clients == 8) tps8 = vs_tps(r);
        if (r.clients == 16) ttft16 = vs_ttft(r);
    }
    const json met8 = tps8 ? json(*tps8 >= 2.5) : json(nullptr), met16 = ttft16 ? json(*ttft16 <= 4.0) : json(nullptr);
    std::printf("goals: 8 clients tok/s >= 2.5x 1 client: %s (%s); 16 clients TTFT p95 <= 4x 1-client TTFT p50: %s (%s)\n",
                ratio(tps8).c_str(), met8.is_null() ? "not measured" : met8.get<bool>() ? "met" : "NOT met", ratio(ttft16).c_str(),
                met16.is_null() ? "not measured" : met16.get<bool>() ? "met" : "NOT met");
    out.emit({{"bench", "server_sweep_summary"}, {"model", c.path}, {"note", c.note}, {"clients", c.sweep}, {"requests", c.requests},
              {"max_tokens", c.max_tokens}, {"prompt_tokens", prompt_mean}, {"parallel", c.parallel},
              {"tokens_per_s_8_vs_1", ratio_or_null(tps8)}, {"tokens_per_s_goal", 2.5}, {"tokens_per_s_met", met8},
              {"ttft_p95_16_vs_1_p50", ratio_or_null(ttft16)}, {"ttft_goal", 4.0}, {"ttft_met", met16}});
    return failed == 0 ? 0 : 1;
}

// --- the agent conversation ---

// One turn as the client saw it; -1 where the server did not say.
struct turn_result {
    bench::reply r;
    std::vector<token> ids;  // the prompt as the server renders it (empty: it did not fit the context)
    long prompt = -1, cached = -1, prompt_n = -1, cache_n = -1;
    long computed() const { return prompt_n >= 0 ? prompt_n : cached >= 0 && prompt >= 0 ? prompt - cached : -1; }
};

// The conversation's fixed texts, in the shape: a history of about --history-tokens
// tokens (the system prompt with the workspace state), then every turn, the first included, adds
// one user message of about --turn-tokens tokens of tool output. (Until 2026-12-05 the first turn
// was the history alone, so that turn k here is what turn k + 1 was then.)
struct script {
    std::string system;
    std::vector<std::string> turns;  // the user message of turn k: turns[k - 1]
};

json turn_body(const json& messages, const config& c) {
    return {{"messages", messages}, {"max_tokens", c.max_tokens}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
            {"temperature", 0}, {"chat_template_kwargs", {{"enable_thinking", true}}}};
}

script make_script(const bench::prompt_counter& pc, const config& c) {
    const std::string system_head =
        "You are a coding agent working in a repository. Read the workspace state and the tool output, then answer in one short "
        "sentence.\n\nWorkspace state:\n";
    const std::string tail = "What should I look at next?";
    script s;
    for (int k = 1; k <= c.turns; ++k) {
        const std::string head = k == 1 ? "Task: find why the build prints warnings and which tests are slow. Output of `make && make test`:\n"
                                        : "Output of step " + std::to_string(k) + " (tool run):\n";
        const long fixed = long(pc.tok.encode(head).size() + pc.tok.encode(tail).size());
        s.turns.push_back(head + bench::filler(pc.tok, std::max(0L, c.turn_tokens - fixed), 100 + k) + tail);
    }
    // The system prompt fills what turn 1's rendering lacks of history + one turn.
    const json first = turn_body(json::array({{{"role", "system"}, {"content", system_head}}, {{"role", "user"}, {"content", s.turns[0]}}}), c);
    s.system = system_head + bench::filler(pc.tok, std::max(0L, c.history_tokens + c.turn_tokens - pc.count(first)), 1);
    return s;
}

// One conversation against one server: turn k's messages, then its reply.
struct conversation {
    const bench::prompt_counter pc;
    server::server srv;
    int port;
    httplib::Client cli;
    json msgs;
    std::vector<turn_result> out;

    conversation(model_t& m, const tokenizer& tok, const server::options& o, const config& c, const script& sc)
        : pc{tok, o}, srv(m, tok, o), port(srv.start()), cli("127.0.0.1", port),
          msgs(json::array({{{"role", "system"}, {"content", sc.system}}})) {
        cli.set_read_timeout(600);
        warm_up(port, bench::filler(tok, c.history_tokens, 999));
    }
    ~conversation() { srv.stop(); }
    // False when the turn failed (the conversation cannot go on).
    bool turn(int k, const config& c, const script& sc) {
        // What an OpenAI client sends back: the content, not the reasoning.
        if (k > 1) msgs.push_back({{"role", "assistant"}, {"content", out.back().r.content}});
        msgs.push_back({{"role", "user"}, {"content", sc.turns[std::size_t(k - 1)]}});
        const json body = turn_body(msgs, c);
        turn_result t;
        try {
            t.ids = pc.ids(body);
        } catch (const server::http_error&) {  // too long for the context: the server says so below
        }
        t.r = bench::stream_chat(cli, body);
        t.prompt = t.r.usage.value("prompt_tokens", -1L);
        t.cached = bench::cached_tokens(t.r.usage);
        t.prompt_n = t.r.timings.value("prompt_n", -1L);
        t.cache_n = t.r.timings.value("cache_n", -1L);
        out.push_back(std::move(t));
        return out.back().r.ok;
    }
};

int conversation_mode(model_t& m, const tokenizer& tok, config c, bench::json_lines& out) {
    // Enough context for every turn unless --ctx says otherwise (then a turn that does not fit
    // fails with the server's 400, shown below).
    const long need = c.history_tokens + long(c.turns) * (c.turn_tokens + c.max_tokens + 32) + 64;
    if (c.ctx <= 0) c.ctx = std::max(4096L, (need + 255) / 256 * 256);
    const server::options o = server_options(c, 1);
    const long long trained = m.hp().n_ctx_train;
    const script sc = make_script(bench::prompt_counter{tok, o}, c);
    server::options on = o, off = o;
    off.cache_ram_mib = 0;
    // Both servers up at once (one model; the requests never overlap), each turn sent to one and
    // then the other: a shared machine's load, which drifts over minutes, then weighs on both
    // sides of a turn's ratio alike (run one after the other, the same uncached turn 1 differed
    // by up to 1.26x between the two runs on 2026-12-05).
    // [turn] on/off TTFT ratios, one per run
    std::vector<std::vector<double>> ratios(std::size_t(c.turns));
    bool same_all = true, all_ok = true, computed_all_met = true;
    for (int rep = 0; rep < c.repeat; ++rep) {
        std::vector<turn_result> with, without;
        {
            conversation a(m, tok, on, c, sc), b(m, tok, off, c, sc);
            for (int k = 1; k <= c.turns; ++k) {
                const bool ok_a = a.turn(k, c, sc), ok_b = b.turn(k, c, sc);
                if (!ok_a || !ok_b) break;
            }
            with = std::move(a.out);
            without = std::move(b.out);
        }

        std::printf("bench_server --conversation (run %d of %d): %s%s%s\n", rep + 1, c.repeat, c.path.c_str(), c.note.empty() ? "" : " — ", c.note.c_str());
        std::printf("%d turns, history ~%ld tokens, ~%ld new per turn, max_tokens %d (thinking on, greedy), decoder %s, ctx %lld%s; "
                    "prefix cache on (%lld MiB) and off, two fresh servers after one warm-up request each, turns sent to both in turn\n",
                    c.turns, c.history_tokens, c.turn_tokens, c.max_tokens, c.decoder.c_str(), c.ctx,
                    c.ctx > trained ? (" (beyond the model's trained context of " + std::to_string(trained) + ")").c_str() : "", c.cache_mib);
        if (c.cache_mib == 0) std::printf("--cache-mib 0: both runs are without the prefix cache\n");
        std::printf("%4s %7s %6s %7s %9s %9s %10s %10s %8s %7s %5s\n", "turn", "prompt", "new", "cached", "computed", "comp/new", "TTFT on",
                    "TTFT off", "on/off", "goals", "same");
        const std::size_t n = std::max(with.size(), without.size());
        json met_computed = json::array(), met_ttft = json::array();
        bool all_met = true, all_known = true, counted_differ = false;
        for (std::size_t i = 0; i < n; ++i) {
            const int k = int(i) + 1;
            const turn_result* a = i < with.size() ? &with[i] : nullptr;
            const turn_result* b = i < without.size() ? &without[i] : nullptr;
            if (!a || !b || !a->r.ok || !b->r.ok) {
                all_ok = false;
                if (a && !a->r.ok) std::printf("turn %d failed with the cache on: %s\n", k, a->r.why.c_str());
                if (b && !b->r.ok) std::printf("turn %d failed with the cache off: %s\n", k, b->r.why.c_str());
                continue;
            }
            const long prompt = a->prompt;
            if (long(a->ids.size()) != prompt) counted_differ = true;
            const long fresh = i == 0 || with[i - 1].ids.empty() || a->ids.empty()
                                   ? prompt
                                   : long(a->ids.size() - bench::common_prefix(a->ids, with[i - 1].ids));
            const long computed = a->computed();
            const double on_ms = a->r.ttft * 1e3, off_ms = b->r.ttft * 1e3;
            ratios[i].push_back(on_ms / off_ms);
            const double per_new = computed >= 0 && fresh > 0 ? double(computed) / double(fresh) : -1;
            const bool same = a->r.content == b->r.content && a->r.reasoning == b->r.reasoning;
            same_all = same_all && same;
            json comp_met = nullptr, ttft_met = nullptr;
            if (k >= 2) {
                if (computed >= 0) comp_met = double(computed) <= 1.2 * double(fresh);
                if (computed < 0 || !comp_met.get<bool>()) computed_all_met = false;
                ttft_met = on_ms <= 0.2 * off_ms;
                if (comp_met.is_null()) all_known = false;
                else if (comp_met.get<bool>()) met_computed.push_back(k);
                if (ttft_met.get<bool>()) met_ttft.push_back(k);
                all_met = all_met && comp_met == true && ttft_met == true;
            }
            auto yn = [](const json& x) { return x.is_null() ? "-" : x.get<bool>() ? "y" : "n"; };
            char comp[32] = "-", ratio[32] = "-", cached[32] = "-";
            if (computed >= 0) std::snprintf(comp, sizeof comp, "%ld", computed);
            if (per_new >= 0) std::snprintf(ratio, sizeof ratio, "%.2fx", per_new);
            if (a->cached >= 0) std::snprintf(cached, sizeof cached, "%ld", a->cached);
            std::printf("%4d %7ld %6ld %7s %9s %9s %10.1f %10.1f %7.2fx %5s/%s %5s\n", k, prompt, fresh, cached, comp, ratio, on_ms, off_ms,
                        on_ms / off_ms, yn(comp_met), yn(ttft_met), same ? "yes" : "NO");
            auto side = [](const turn_result& t) {
                return json{{"prompt_tokens", t.prompt}, {"cached_tokens", t.cached}, {"computed_tokens", t.computed()},
                            {"prompt_n", t.prompt_n}, {"cache_n", t.cache_n}, {"server_prompt_ms", t.r.timings.value("prompt_ms", -1.0)},
                            {"completion_tokens", t.r.tokens}, {"ttft_ms", t.r.ttft * 1e3},
                            {"latency_ms", t.r.total * 1e3}};
            };
            out.emit({{"bench", "server_conversation"}, {"model", c.path}, {"note", c.note}, {"run", rep + 1}, {"turn", k}, {"prompt_tokens", prompt},
                      {"new_tokens", fresh}, {"cache_on", side(*a)}, {"cache_off", side(*b)},
                      {"computed_vs_new", per_new >= 0 ? json(per_new) : json(nullptr)}, {"ttft_on_vs_off", on_ms / off_ms},
                      {"computed_met", comp_met}, {"ttft_met", ttft_met}, {"same_answer", same}});
        }
        std::printf("(TTFT in ms; new: prompt tokens past the longest common prefix with the previous turn's prompt; goals from turn 2: "
                    "computed <= 1.2x new / TTFT on <= 0.2x off; same: the answer is the same with the cache on and off)\n");
        if (counted_differ) std::printf("note: the prompt ids rendered here differ in length from the server's usage.prompt_tokens\n");
        const bool judged = all_ok && all_known && n >= 2;
        std::printf("goals from turn 2: computed <= 1.2x new on turns %s; TTFT on <= 0.2x off on turns %s: %s\n", met_computed.dump().c_str(),
                    met_ttft.dump().c_str(), !judged ? "not judged (see above)" : all_met ? "met" : "NOT met");
        out.emit({{"bench", "server_conversation_summary"}, {"model", c.path}, {"note", c.note}, {"run", rep + 1}, {"turns", c.turns},
                  {"history_tokens", c.history_tokens}, {"first_prompt_tokens", with.empty() ? -1L : with[0].prompt}, {"turn_tokens", c.turn_tokens}, {"max_tokens", c.max_tokens},
                  {"decoder", c.decoder}, {"ctx", c.ctx}, {"n_ctx_train", trained}, {"cache_mib", c.cache_mib}, {"computed_goal", 1.2}, {"ttft_goal", 0.2}, {"computed_met_turns", met_computed},
                  {"ttft_met_turns", met_ttft}, {"all_met", judged ? json(all_met) : json(nullptr)}, {"same_answers", same_all},
                  {"all_ok", all_ok}});
    }
    if (c.repeat > 1) {
        json med = json::array(), met = json::array();
        bool ttft_all_met = all_ok;
        std::printf("median over %d runs of TTFT on / off:", c.repeat);
        for (std::size_t i = 0; i < ratios.size(); ++i) {
            if (ratios[i].size() != std::size_t(c.repeat)) { ttft_all_met = false; continue; }
            const double r = bench::pct(ratios[i], 50);
            med.push_back(r);
            std::printf(" %zu: %.3fx", i + 1, r);
            if (i >= 1) {
                if (r <= 0.2) met.push_back(int(i) + 1);
                else ttft_all_met = false;
            }
        }
        std::printf("\ngoals from turn 2 over %d runs: computed <= 1.2x new %s; median TTFT on <= 0.2x off on turns %s: %s\n", c.repeat,
                    computed_all_met ? "on every turn of every run" : "NOT on every turn", met.dump().c_str(),
                    computed_all_met && ttft_all_met ? "met" : "NOT met");
        out.emit({{"bench", "server_conversation_median"}, {"model", c.path}, {"note", c.note}, {"runs", c.repeat}, {"turns", c.turns},
                  {"ttft_on_vs_off_median", med}, {"ttft_met_turns", met}, {"computed_met", computed_all_met},
                  {"all_met", all_ok ? json(computed_all_met && ttft_all_met) : json(nullptr)}, {"same_answers", same_all}, {"all_ok", all_ok}});
    }
    return all_ok ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) try {
    config c = parse_args(argc, argv);
    bench::json_lines out(c.json_out);  // opened first: a bad path fails before anything runs
    if (c.path.empty()) {
        c.path = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";
        if (!std::filesystem::exists(c.path)) {
            auto s = synth::preset("tiny");
            s.arch = "clover_moe";
            c.path = (std::filesystem::temp_directory_path() / "bench_server_tiny.gguf").string();
            synth::write(s, c.path);
            c.note = "bundled model models/clover-small.gguf absent: synthetic tiny clover_moe (random weights)";
        }
    }
    model_t m(load(c.path), backend::cpu_options{c.threads});
    const tokenizer tok = tokenizer::from_file(c.path);
    if (c.conversation) return conversation_mode(m, tok, c, out);
    if (!c.sweep.empty()) return sweep_mode(m, tok, c, out);
    return load_mode(m, tok, c, out);
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_server: %s\n", e.what());
    return 1;
}
