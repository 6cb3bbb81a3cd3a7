// A model split by layers over MPI ranks against the whole model in one process (issue 40 item 6).
// One run of this driver measures one configuration; bench_pipeline.sh runs the four of the
// issue (one process with 2 threads, `mpirun -np 2` with 1 thread per rank; N = 1 and 8) and
// prints the table from their JSON lines (--report).
//
//   bench_pipeline -m MODEL --mode single|pipeline [-t THREADS] [-N SEQS] [-p PROMPT] [-n GEN]
//                  [--micro-batches M] [--layer-split 4,4] [--json FILE]
//   bench_pipeline --report FILE        the markdown table of the JSON lines in FILE
//
// Both modes drive N sequences through decode::engine (greedy AR, fixed prompt and generation
// lengths, parallel = N), on the whole model or on pipeline::pipeline, so the comparison is like
// for like. The first engine step prefills every prompt; the decode steps after it are what is
// measured: aggregate tokens/s, per-token latency (the mean decode step: each sequence gets one
// token per step), and for the pipeline every rank's time blocked on messages (% of the decode
// wall time), its bytes sent per generated token and its resident memory (VmHWM / VmRSS of
// /proc/self/status at the end). In "single" mode MPI is not initialized at all.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <clover/clover.hpp>
#include <clover/decode/engine.hpp>
#include <clover/dist/mpi.hpp>
#include <clover/pipeline/pipeline.hpp>

using namespace clover;
using rt_model = model<variants::from_file, backend::cpu>;
using rt_pipe = pipeline::pipeline<variants::from_file, backend::cpu>;
using clock_type = std::chrono::steady_clock;

namespace {

struct args {
    std::string model = "models/clover-small.gguf", mode = "single", json, report, split;
    int threads = 2;
    std::int64_t seqs = 1, prompt = 64, gen = 64, micro = 0;
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "bench_pipeline: %s\nusage: bench_pipeline -m MODEL --mode single|pipeline [-t THREADS] [-N SEQS] [-p PROMPT] "
                 "[-n GEN] [--micro-batches M] [--layer-split a,b] [--json FILE]\n       bench_pipeline --report FILE\n",
                 why.c_str());
    std::exit(2);
}

args parse(int argc, char** argv) {
    args a;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) usage(k + " needs a value");
            return argv[++i];
        };
        auto num = [&]() -> std::int64_t {
            const std::string v = val();
            char* end = nullptr;
            const long long x = std::strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end) usage(k + ": '" + v + "' is not a number");
            return x;
        };
        if (k == "-m") a.model = val();
        else if (k == "--mode") a.mode = val();
        else if (k == "-t") a.threads = int(num());
        else if (k == "-N") a.seqs = num();
        else if (k == "-p") a.prompt = num();
        else if (k == "-n") a.gen = num();
        else if (k == "--micro-batches") a.micro = num();
        else if (k == "--layer-split") a.split = val();
        else if (k == "--json") a.json = val();
        else if (k == "--report") a.report = val();
        else usage("unknown argument " + k);
    }
    if (a.report.empty() && a.mode != "single" && a.mode != "pipeline") usage("--mode is single or pipeline");
    if (a.threads < 1 || a.seqs < 1 || a.prompt < 1 || a.gen < 2 || a.micro < 0)
        usage("-t, -N and -p must be at least 1, -n at least 2, --micro-batches at least 0");
    return a;
}

// VmHWM and VmRSS of this process, in kB.
std::pair<std::int64_t, std::int64_t> memory_kb() {
    std::ifstream f("/proc/self/status");
    std::string line;
    std::int64_t hwm = -1, rss = -1;
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) hwm = std::atoll(line.c_str() + 6);
        if (line.rfind("VmRSS:", 0) == 0) rss = std::atoll(line.c_str() + 6);
    }
    return {hwm, rss};
}

// What one decode run measured (rank 0's view).
struct measured {
    double prefill_s = 0, decode_s = 0;
    std::int64_t decode_steps = 0, decode_tokens = 0;
};

// N sequences through the engine: the first step prefills (and gives each its first token), the
// rest decode; `between` runs after the prefill step and `after` after the last (counters).
template <class M, class F, class G>
measured drive(M& m, const args& a, F between, G after) {
    decode::engine<M> eng(m, {.parallel = a.seqs, .kv_f16 = true});
    const std::int64_t V = m.n_vocab();
    std::int64_t produced = 0;
    for (std::int64_t i = 0; i < a.seqs; ++i) {
        decode::engine_request<> r;
        std::uint64_t x = 0x9e3779b97f4a7c15ull * std::uint64_t(i + 1);
        for (std::int64_t k = 0; k < a.prompt; ++k) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            r.prompt.push_back(token((x >> 33) % std::uint64_t(V)));
        }
        r.gen.max_tokens = a.gen;
        r.gen.ignore_eos = true;
        r.dec = decode::ar{};
        r.sink.on_token = [&produced](token) {
            ++produced;
            return true;
        };
        eng.submit(std::move(r));
    }
    measured out;
    auto t0 = clock_type::now();
    bool more = eng.step();
    out.prefill_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    const std::int64_t after_prefill = produced;
    between();
    t0 = clock_type::now();
    while (more) {
        more = eng.step();
        ++out.decode_steps;
    }
    out.decode_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    out.decode_tokens = produced - after_prefill;
    after();
    if (produced != a.seqs * a.gen) fail("bench_pipeline: ", produced, " tokens generated, expected ", a.seqs * a.gen);
    return out;
}

std::string num(double x) {
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", x);
    return b;
}

struct rank_line {
    double wait_pct = 0, compute_pct = 0;
    std::uint64_t bytes_sent = 0, micro_batches = 0;
    std::int64_t hwm_kb = 0, rss_kb = 0;
};

std::string json_of(const args& a, int ranks, const measured& r, const std::vector<rank_line>& per, double fill_pct,
                    std::uint64_t passes, std::uint64_t micro) {
    std::string j = "{\"bench\": \"pipeline\", \"mode\": \"" + a.mode + "\", \"ranks\": " + std::to_string(ranks) +
                    ", \"threads\": " + std::to_string(a.threads) + ", \"seqs\": " + std::to_string(a.seqs) +
                    ", \"prompt\": " + std::to_string(a.prompt) + ", \"gen\": " + std::to_string(a.gen) +
                    ", \"prefill_s\": " + num(r.prefill_s) + ", \"decode_s\": " + num(r.decode_s) +
                    ", \"decode_steps\": " + std::to_string(r.decode_steps) + ", \"decode_tokens\": " + std::to_string(r.decode_tokens) +
                    ", \"tokens_per_s\": " + num(double(r.decode_tokens) / r.decode_s) +
                    ", \"ms_per_token\": " + num(1e3 * r.decode_s / double(std::max<std::int64_t>(r.decode_steps, 1))) +
                    ", \"decode_passes\": " + std::to_string(passes) + ", \"decode_micro_batches\": " + std::to_string(micro) +
                    ", \"fill_pct\": " + num(fill_pct);
    std::uint64_t sent = 0;
    for (const rank_line& l : per) sent += l.bytes_sent;
    j += ", \"bytes_sent_per_token\": " + num(double(sent) / double(std::max<std::int64_t>(r.decode_tokens, 1)));
    j += ", \"per_rank\": [";
    for (std::size_t i = 0; i < per.size(); ++i) {
        const rank_line& l = per[i];
        j += std::string(i ? ", " : "") + "{\"rank\": " + std::to_string(i) + ", \"wait_pct\": " + num(l.wait_pct) +
             ", \"compute_pct\": " + num(l.compute_pct) + ", \"bytes_sent\": " + std::to_string(l.bytes_sent) +
             ", \"micro_batches\": " + std::to_string(l.micro_batches) + ", \"vm_hwm_kb\": " + std::to_string(l.hwm_kb) +
             ", \"vm_rss_kb\": " + std::to_string(l.rss_kb) + "}";
    }
    return j + "]}";
}

void emit(const args& a, const std::string& j) {
    std::printf("%s\n", j.c_str());
    if (a.json.empty()) return;
    std::ofstream f(a.json, std::ios::app);
    if (!f) fail("bench_pipeline: cannot write ", a.json);
    f << j << "\n";
}

int run_single(const args& a) {
    const auto f = load(a.model);
    rt_model m(f, backend::cpu_options{.threads = a.threads});
    const measured r = drive(m, a, [] {}, [] {});
    const auto [hwm, rss] = memory_kb();
    rank_line l;
    l.hwm_kb = hwm;
    l.rss_kb = rss;
    emit(a, json_of(a, 1, r, {l}, 0, std::uint64_t(r.decode_steps), std::uint64_t(r.decode_steps)));
    return 0;
}

constexpr int tag_memory = 100;  // rank r > 0 to rank 0 after the shutdown: its VmHWM and VmRSS

int run_pipeline(int argc, char** argv, const args& a) {
    dist::mpi_session mpi(&argc, &argv);
    dist::mpi_communicator c;
    try {
        const auto f = load(a.model);
        const std::vector<std::int64_t> counts = a.split.empty() ? std::vector<std::int64_t>{} : pipeline::parse_layer_split(a.split);
        if (c.rank() != 0) {
            std::string why;
            {
                rt_model m(f, pipeline::stage_of_rank(*f, c, counts), backend::cpu_options{.threads = a.threads});
                why = pipeline::serve_stage(m, c);
            }
            const auto [hwm, rss] = memory_kb();
            c.send(0, tag_memory, dist::writer(1).i64(hwm).i64(rss).take(), dist::duration(30000));
            if (!why.empty()) std::fprintf(stderr, "bench_pipeline: rank %d: %s\n", c.rank(), why.c_str());
            return why.empty() ? 0 : 1;
        }
        const int S = c.size();
        measured r;
        std::vector<pipeline::rank_stats> s0, s1;
        std::uint64_t p0 = 0, p1 = 0;
        {
            rt_pipe p(f, c, {.layer_split = counts, .micro_batches = a.micro}, backend::cpu_options{.threads = a.threads});
            r = drive(p, a, [&] { s0 = p.gather_stats(); p0 = p.passes(); }, [&] { s1 = p.gather_stats(); p1 = p.passes(); });
        }  // shut down: every rank sends its memory
        std::vector<rank_line> per(static_cast<std::size_t>(S));
        const double wall_ns = r.decode_s * 1e9;
        for (int k = 0; k < S; ++k) {
            const auto& x = s0[std::size_t(k)];
            const auto& y = s1[std::size_t(k)];
            rank_line& l = per[std::size_t(k)];
            l.wait_pct = 100.0 * double((y.comm.waited - x.comm.waited).count()) / wall_ns;
            l.compute_pct = 100.0 * double((y.compute - x.compute).count()) / wall_ns;
            l.bytes_sent = y.comm.bytes_sent - x.comm.bytes_sent;
            l.micro_batches = y.micro_batches - x.micro_batches;
            if (k == 0) {
                std::tie(l.hwm_kb, l.rss_kb) = memory_kb();
            } else {
                const dist::bytes b = c.recv(k, tag_memory, dist::duration(30000));
                dist::reader rd(b, 1, "memory of rank " + std::to_string(k));
                l.hwm_kb = rd.i64();
                l.rss_kb = rd.i64();
                rd.finish();
            }
        }
        // A pass of m micro-batches over S equal stages keeps each rank idle for S - 1 of its
        // m + S - 1 micro-batch times: the pipeline's own fill and drain.
        const std::uint64_t passes = p1 - p0, micro = per[0].micro_batches;
        const double m = passes ? double(micro) / double(passes) : 1.0;
        const double fill = 100.0 * double(S - 1) / (m + double(S - 1));
        emit(a, json_of(a, S, r, per, fill, passes, micro));
    } catch (const std::exception& e) {
        c.abort(std::string("bench_pipeline: ") + e.what());
    }
    return 0;
}

// --report: the JSON lines of one bench_pipeline.sh run as a markdown table.
double field(const std::string& j, const std::string& key, std::size_t from = 0) {
    const std::size_t k = j.find("\"" + key + "\": ", from);
    if (k == std::string::npos) fail("bench_pipeline: no \"", key, "\" in ", j.substr(0, 80));
    return std::strtod(j.c_str() + k + key.size() + 4, nullptr);
}
std::string text_field(const std::string& j, const std::string& key) {
    const std::size_t k = j.find("\"" + key + "\": \"");
    if (k == std::string::npos) return "";
    const std::size_t b = k + key.size() + 5;
    return j.substr(b, j.find('"', b) - b);
}
// Every per-rank value of `key`, in rank order.
std::vector<double> per_rank(const std::string& j, const std::string& key) {
    std::vector<double> v;
    for (std::size_t at = j.find("\"per_rank\""); (at = j.find("{\"rank\"", at)) != std::string::npos; ++at) v.push_back(field(j, key, at));
    return v;
}
std::string list(const std::vector<double>& v, double scale, const char* fmt) {
    std::string s;
    for (double x : v) {
        char b[32];
        std::snprintf(b, sizeof b, fmt, x * scale);
        s += (s.empty() ? "" : " / ") + std::string(b);
    }
    return s;
}

int report(const std::string& path) {
    std::ifstream f(path);
    if (!f) fail("bench_pipeline: cannot read ", path);
    std::map<std::pair<std::string, std::int64_t>, std::string> runs;  // (mode, N) -> the last JSON line
    std::string line;
    while (std::getline(f, line))
        if (line.find("\"bench\": \"pipeline\"") != std::string::npos) runs[{text_field(line, "mode"), std::int64_t(field(line, "seqs"))}] = line;
    if (runs.empty()) fail("bench_pipeline: no results in ", path);
    std::printf("| config | N | tokens/s | ms/token | wait %% per rank | fill %% | compute %% per rank | bytes sent/token | VmHWM MB per rank |\n");
    std::printf("|---|---:|---:|---:|---|---:|---|---:|---|\n");
    std::vector<std::pair<std::string, std::int64_t>> order;  // by N, the single process first
    for (const auto& [key, j] : runs) order.push_back(key);
    using run_key = std::pair<std::string, std::int64_t>;
    std::stable_sort(order.begin(), order.end(), [](const run_key& x, const run_key& y) {
        if (x.second != y.second) return x.second < y.second;
        return x.first == "single" && y.first != "single";
    });
    for (const auto& key : order) {
        const std::string& j = runs[key];
        const std::string cfg = key.first == "single" ? "1 process, " + std::to_string(int(field(j, "threads"))) + " threads"
                                                      : std::to_string(int(field(j, "ranks"))) + " ranks, " +
                                                            std::to_string(int(field(j, "threads"))) + " thread each";
        std::printf("| %s | %lld | %.2f | %.1f | %s | %.1f | %s | %.0f | %s |\n", cfg.c_str(), (long long)key.second, field(j, "tokens_per_s"),
                    field(j, "ms_per_token"), key.first == "single" ? "-" : list(per_rank(j, "wait_pct"), 1, "%.1f").c_str(),
                    field(j, "fill_pct"), key.first == "single" ? "-" : list(per_rank(j, "compute_pct"), 1, "%.1f").c_str(),
                    field(j, "bytes_sent_per_token"), list(per_rank(j, "vm_hwm_kb"), 1.0 / 1024, "%.0f").c_str());
    }
    std::printf("\n| goal (issue 40 item 6) | measured | goal | met |\n|---|---:|---:|---|\n");
    for (std::int64_t n : {std::int64_t(1), std::int64_t(8)}) {
        const auto s = runs.find({"single", n}), p = runs.find({"pipeline", n});
        if (s == runs.end() || p == runs.end()) continue;
        const double ratio = field(p->second, "tokens_per_s") / field(s->second, "tokens_per_s");
        if (n == 8) std::printf("| N = 8 tokens/s, 2 ranks / 1 process | %.2fx | >= 0.7x | %s |\n", ratio, ratio >= 0.7 ? "yes" : "no");
        else std::printf("| N = 1 tokens/s, 2 ranks / 1 process | %.2fx | (no goal) | - |\n", ratio);
        const auto w = per_rank(p->second, "wait_pct");
        const double beyond = (w.empty() ? 0 : *std::max_element(w.begin(), w.end())) - field(p->second, "fill_pct");
        std::printf("| N = %lld wait beyond the fill, worst rank | %.1f %% | <= 5 %% | %s |\n", (long long)n, beyond,
                    beyond <= 5 ? "yes" : "no");
        const auto hs = per_rank(s->second, "vm_hwm_kb"), hp = per_rank(p->second, "vm_hwm_kb");
        if (!hs.empty() && !hp.empty()) {
            const double r = *std::max_element(hp.begin(), hp.end()) / hs[0];
            std::printf("| N = %lld VmHWM per rank / 1 process, worst rank | %.2fx | <= 0.6x | %s |\n", (long long)n, r, r <= 0.6 ? "yes" : "no");
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const args a = parse(argc, argv);
    try {
        if (!a.report.empty()) return report(a.report);
        if (a.mode == "single") return run_single(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
        return 1;
    }
    return run_pipeline(argc, argv, a);
}
