// llama_bench_peer: times llama.cpp (the PREBUILT v0.5.0 CPU libraries of tools/peers/setup.sh) on
// the llama-bench tests, so benchmarks/bench_cpu_vs_llama.sh can put it side by side with
// `clover bench` in one run. It follows llama-bench's procedure and defaults, written here against
// the public libllama API (nothing of llama-bench is copied):
//   * model: mmap, weight repacking on (extra buffer types), as a user of llama.cpp gets it;
//   * context: n_ctx = p + n, n_batch 2048, n_ubatch 512, K/V cache f16, flash attention auto;
//   * a persistent ggml threadpool with `--poll` (llama-bench's default 50) attached to the context;
//   * ppN: clear the memory, decode N random tokens as one batch (logits of the last only);
//     tgN: clear the memory, decode N single random tokens; one warmup run of each first.
//
//   llama_bench_peer -m MODEL [-p 512] [-n 128] [-t 1] [-r 5] [--poll 50] [--no-repack]
//                    [--load-mode mmap|none] [-ctk f16|f32] [-fa on|off|auto] [--cpu-variant NAME]
//                    [--json]
//
// Output: a llama-bench-style table, or with --json one JSON object per test (avg_ts, stddev_ts,
// samples_ts, threads, the CPU variant that ggml loaded, load seconds). Failure: one line, exit 1.

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef LLAMA_PEER_BACKENDS_DIR
#define LLAMA_PEER_BACKENDS_DIR ""
#endif

namespace {

struct options {
    std::string model, backends = LLAMA_PEER_BACKENDS_DIR, cpu_variant, ctk = "f16", fa = "auto", load_mode = "mmap";
    int n_prompt = 512, n_gen = 128, threads = 1, reps = 5, poll = 50, parallel = 0, par_prompt = 32;  // parallel 0: the plain tg test
    bool repack = true, json = false;
};

[[noreturn]] void fail(const std::string& msg) {
    std::fprintf(stderr, "llama_bench_peer: %s\n", msg.c_str());
    std::exit(1);
}

int to_int(const std::string& s, const char* what) {
    try {
        size_t used = 0;
        const long v = std::stol(s, &used);
        if (used != s.size() || v < 0 || v > 1 << 30) throw std::invalid_argument(s);
        return int(v);
    } catch (const std::exception&) {
        fail(std::string("bad ") + what + ": '" + s + "'");
    }
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) fail("missing value after " + a);
            return argv[++i];
        };
        if (a == "-m") o.model = next();
        else if (a == "-p") o.n_prompt = to_int(next(), "-p");
        else if (a == "-n") o.n_gen = to_int(next(), "-n");
        else if (a == "-t") o.threads = to_int(next(), "-t");
        else if (a == "-r") o.reps = to_int(next(), "-r");
        else if (a == "--poll") o.poll = to_int(next(), "--poll");
        else if (a == "--parallel") o.parallel = to_int(next(), "--parallel");
        else if (a == "--parallel-prompt") o.par_prompt = to_int(next(), "--parallel-prompt");
        else if (a == "--no-repack") o.repack = false;
        else if (a == "--load-mode") o.load_mode = next();
        else if (a == "-ctk") o.ctk = next();
        else if (a == "-fa") o.fa = next();
        else if (a == "--backends") o.backends = next();
        else if (a == "--cpu-variant") o.cpu_variant = next();
        else if (a == "--json") o.json = true;
        else fail("unknown argument '" + a + "'");
    }
    if (o.model.empty()) fail("-m MODEL.gguf is required");
    if (o.threads < 1) fail("-t must be >= 1");
    if (o.reps < 1) fail("-r must be >= 1");
    if (o.parallel < 0 || o.parallel > 256) fail("--parallel must be in [1, 256]");
    if (o.par_prompt < 1) fail("--parallel-prompt must be >= 1");
    if (o.poll > 100) fail("--poll must be in [0, 100]");
    if (o.ctk != "f16" && o.ctk != "f32") fail("-ctk must be f16 or f32");
    if (o.fa != "on" && o.fa != "off" && o.fa != "auto") fail("-fa must be on, off or auto");
    if (o.load_mode != "mmap" && o.load_mode != "none") fail("--load-mode must be mmap or none");
    if (o.backends.empty()) fail("no backend folder: pass --backends DIR");
    return o;
}

std::string g_errors;
void quiet_log(ggml_log_level level, const char* text, void*) {
    if (level != GGML_LOG_LEVEL_ERROR) return;
    std::string s(text);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    if (!s.empty()) g_errors += (g_errors.empty() ? "" : " | ") + s;
}
std::string why() { return g_errors.empty() ? "" : ": " + g_errors; }

std::string loaded_cpu_variant() {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
        const size_t p = line.find("libggml-cpu-");
        if (p != std::string::npos) {
            std::string v = line.substr(p + 12);
            return v.substr(0, v.find(".so"));
        }
    }
    return "?";
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::mt19937 g_rng(1234);

void decode_or_fail(llama_context* ctx, std::vector<llama_token>& toks, const char* what) {
    if (const int rc = llama_decode(ctx, llama_batch_get_one(toks.data(), int(toks.size()))); rc != 0)
        fail(std::string("llama_decode(") + what + ") returned " + std::to_string(rc) + why());
}

// One ppN run: N random tokens as one batch from an empty memory.
void run_prompt(llama_context* ctx, int n, int n_vocab) {
    std::vector<llama_token> toks(static_cast<std::size_t>(n));
    for (auto& t : toks) t = llama_token(g_rng() % std::uint32_t(n_vocab));
    decode_or_fail(ctx, toks, "prompt");
    llama_synchronize(ctx);
}

// One tgN run: N single-token decodes from an empty memory.
void run_gen(llama_context* ctx, int n, int n_vocab) {
    std::vector<llama_token> tok(1);
    for (int i = 0; i < n; ++i) {
        tok[0] = llama_token(g_rng() % std::uint32_t(n_vocab));
        decode_or_fail(ctx, tok, "generation");
        llama_synchronize(ctx);
    }
}

// llama-batched-bench's method for N sequences: their prompts in one llama_batch (sequence i at
// positions 0..P-1), then n steps that each decode one llama_batch of N rows (one per sequence,
// logits on). Only the steps are timed; returns aggregate generated tokens per second.
double run_parallel(llama_context* ctx, int N, int P, int n, int n_vocab) {
    llama_batch b = llama_batch_init(std::max(N * P, N), 0, 1);
    b.n_tokens = 0;
    for (int s = 0; s < N; ++s)
        for (int i = 0; i < P; ++i) {
            const int k = b.n_tokens++;
            b.token[k] = llama_token(g_rng() % std::uint32_t(n_vocab));
            b.pos[k] = i;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = s;
            b.logits[k] = i == P - 1;
        }
    if (const int rc = llama_decode(ctx, b); rc != 0) fail("llama_decode(parallel prompts) returned " + std::to_string(rc) + why());
    llama_synchronize(ctx);
    const double t0 = now_s();
    for (int step = 0; step < n; ++step) {
        b.n_tokens = 0;
        for (int s = 0; s < N; ++s) {
            const int k = b.n_tokens++;
            b.token[k] = llama_token(g_rng() % std::uint32_t(n_vocab));
            b.pos[k] = P + step;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = s;
            b.logits[k] = true;
        }
        if (const int rc = llama_decode(ctx, b); rc != 0) fail("llama_decode(parallel step) returned " + std::to_string(rc) + why());
        llama_synchronize(ctx);
    }
    const double dt = now_s() - t0;
    llama_batch_free(b);
    return double(n) * double(N) / dt;
}

}  // namespace

int main(int argc, char** argv) {
    const options o = parse(argc, argv);
    llama_log_set(quiet_log, nullptr);
    if (o.cpu_variant.empty()) {
        ggml_backend_load_all_from_path(o.backends.c_str());
    } else {
        const std::string path = o.backends + "/libggml-cpu-" + o.cpu_variant + ".so";
        if (!ggml_backend_load(path.c_str())) fail("cannot load CPU backend " + path);
    }
    if (ggml_backend_dev_count() == 0) fail("no ggml backend found in " + o.backends);
    llama_backend_init();

    // The threadpool functions live in the dynamically loaded CPU backend: look them up there.
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) fail("no CPU device");
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    auto* tp_new = reinterpret_cast<decltype(ggml_threadpool_new)*>(ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new"));
    auto* tp_free = reinterpret_cast<decltype(ggml_threadpool_free)*>(ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free"));
    if (!tp_new || !tp_free) fail("the CPU backend does not export ggml_threadpool_new");

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mode = o.load_mode == "mmap" ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    mp.use_extra_bufts = o.repack;
    mp.load_mtp = false;
    const double t_load0 = now_s();
    llama_model* model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) fail("cannot load model " + o.model + why());
    const double load_s = now_s() - t_load0;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = std::uint32_t(std::max({1, o.n_prompt + o.n_gen, std::max(1, o.parallel) * (o.par_prompt + o.n_gen + 1)}));
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = std::uint32_t(std::max(1, o.parallel));
    cp.n_threads = cp.n_threads_batch = o.threads;
    cp.type_k = cp.type_v = o.ctk == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.flash_attn_type = o.fa == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                         : o.fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.no_perf = true;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) fail("cannot create context" + why());

    ggml_threadpool_params tpp = ggml_threadpool_params_default(o.threads);
    tpp.poll = std::uint32_t(o.poll);
    ggml_threadpool* tp = tp_new(&tpp);
    if (!tp) fail("cannot create a threadpool of " + std::to_string(o.threads) + " threads");
    llama_attach_threadpool(ctx, tp, nullptr);
    llama_set_n_threads(ctx, o.threads, o.threads);

    const std::string variant = loaded_cpu_variant();
    char desc[256];
    std::snprintf(desc, sizeof desc, "%s", "qwen35moe");
    llama_model_desc(model, desc, sizeof desc);
    const double size_gib = double(llama_model_size(model)) / (1024.0 * 1024 * 1024);
    const double params_b = double(llama_model_n_params(model)) / 1e9;

    struct test { std::string name; int p, n; };
    std::vector<test> tests;
    if (o.n_prompt > 0) tests.push_back({"pp" + std::to_string(o.n_prompt), o.n_prompt, 0});
    if (o.n_gen > 0)
        tests.push_back({"tg" + std::to_string(o.n_gen) + (o.parallel > 0 ? "x" + std::to_string(o.parallel) : ""), 0, o.n_gen});
    if (!o.json) {
        std::printf("| %-24s | %9s | %7s | %-10s | %7s | %8s | %16s |\n", "model", "size", "params", "backend", "threads",
                    "test", "t/s");
        std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", std::string(24, '-').c_str(), std::string(9, '-').c_str(),
                    std::string(7, '-').c_str(), std::string(10, '-').c_str(), std::string(7, '-').c_str(),
                    std::string(8, '-').c_str(), std::string(16, '-').c_str());
    }
    for (const test& t : tests) {
        // warmup (llama-bench: one prompt run, or one generated token)
        llama_memory_clear(llama_get_memory(ctx), false);
        if (t.p > 0) run_prompt(ctx, t.p, n_vocab);
        else if (o.parallel > 0) run_parallel(ctx, o.parallel, o.par_prompt, 1, n_vocab);
        else run_gen(ctx, 1, n_vocab);
        std::vector<double> ts;
        for (int r = 0; r < o.reps; ++r) {
            llama_memory_clear(llama_get_memory(ctx), false);
            if (t.p == 0 && o.parallel > 0) {
                ts.push_back(run_parallel(ctx, o.parallel, o.par_prompt, t.n, n_vocab));
                continue;
            }
            const double t0 = now_s();
            if (t.p > 0) run_prompt(ctx, t.p, n_vocab);
            else run_gen(ctx, t.n, n_vocab);
            ts.push_back(double(t.p + t.n) / (now_s() - t0));
        }
        double avg = 0, sd = 0;
        for (double x : ts) avg += x;
        avg /= double(ts.size());
        for (double x : ts) sd += (x - avg) * (x - avg);
        sd = ts.size() > 1 ? std::sqrt(sd / double(ts.size() - 1)) : 0.0;
        if (o.json) {
            std::string samples;
            for (std::size_t i = 0; i < ts.size(); ++i) {
                if (i) samples += ',';
                samples += std::to_string(ts[i]);
            }
            std::printf("{\"engine\":\"llama.cpp\",\"build\":\"v0.5.0\",\"cpu_variant\":\"%s\",\"model\":\"%s\",\"size_gib\":%.3f,"
                        "\"params_b\":%.3f,\"threads\":%d,\"poll\":%d,\"repack\":%s,\"test\":\"%s\",\"n_prompt\":%d,\"n_gen\":%d,"
                        "\"avg_ts\":%.4f,\"stddev_ts\":%.4f,\"samples_ts\":[%s],\"tokens_per_pass\":%d,\"load_s\":%.3f,\"parallel\":%d}\n",
                        variant.c_str(), desc, size_gib, params_b, o.threads, o.poll, o.repack ? "true" : "false",
                        t.name.c_str(), t.p, t.n, avg, sd, samples.c_str(), t.p > 0 ? t.p : 1, load_s,
                        t.p > 0 ? 1 : std::max(1, o.parallel));
        } else {
            std::printf("| %-24.24s | %5.2f GiB | %5.2f B | %-10s | %7d | %8s | %8.2f ± %5.2f |\n", desc, size_gib, params_b,
                        ("CPU " + variant).c_str(), o.threads, t.name.c_str(), avg, sd);
        }
        std::fflush(stdout);
    }
    llama_free(ctx);
    tp_free(tp);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
