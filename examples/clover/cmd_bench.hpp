#pragma once
// `clover bench` (cli.md): llama-bench's tests on our engine, with the same procedure as
// tools/llama_bench_peer so benchmarks/bench_cpu_vs_llama.sh can put the two side by side:
//   ppN: a fresh session, N random ids as one commit pass (logits of the last row only);
//   tgN: a fresh session, N single-id commit passes with random ids (logits every time);
// KV cache F16 by default (--ctk), as llama-bench;
// one warmup run of each first, then -r repetitions; t/s = tokens / wall seconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <clover/core/rng.hpp>

#include "clover/backend/trace.hpp"
#include "common.hpp"

namespace clover::cli {

namespace bench_detail {

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct result {
    std::string test;
    std::int64_t n_prompt = 0, n_gen = 0;
    std::vector<double> ts;
    double avg() const {
        double s = 0;
        for (double x : ts) s += x;
        return ts.empty() ? 0 : s / double(ts.size());
    }
    double sd() const {
        if (ts.size() < 2) return 0;
        double a = avg(), s = 0;
        for (double x : ts) s += (x - a) * (x - a);
        return std::sqrt(s / double(ts.size() - 1));
    }
};

// Weight bytes one generated token reads (the numerator of the memory roofline): every matrix
// once, but only n_expert_used/n_expert of each routed-expert tensor and one row of the token
// embedding (unless it is also the LM head).
inline double gen_bytes_per_token(const io::gguf_file& f, const hparams& h) {
    const bool tied = f.find_tensor("output.weight") == nullptr;
    double b = 0;
    for (const auto& t : f.tensors()) {
        if (t.name == "token_embd.weight" && !tied) b += double(t.nbytes) / double(std::max<std::int64_t>(1, t.ne[1]));
        else if (t.n_dims == 3 && t.ne[2] == h.n_expert) b += double(t.nbytes) * double(h.n_expert_used) / double(h.n_expert);
        else b += double(t.nbytes);
    }
    return b;
}

inline std::string type_summary(const io::gguf_file& f) {
    // The file type the way llama-bench names it: the most common matrix type by bytes.
    std::vector<std::pair<std::size_t, std::string>> by;
    for (const auto& t : f.tensors()) {
        if (t.n_dims < 2) continue;
        const std::string n(dtype_name(t.type));
        auto it = std::find_if(by.begin(), by.end(), [&](auto& p) { return p.second == n; });
        if (it == by.end()) by.push_back({t.nbytes, n});
        else it->first += t.nbytes;
    }
    std::sort(by.begin(), by.end(), std::greater<>());
    std::string s;
    for (std::size_t i = 0; i < by.size() && i < 2; ++i) s += (i ? "+" : "") + by[i].second;
    return s;
}

// One pass of each kind through backend::trace<cpu>, N sequences each: a prefill chunk of 32
// rows, a decode row, a 32-row preview block (coreset from the file), an 8-row verify segment.
// One JSON line per pass kind (execution.md §3: the figures the trace tests hold).
inline void trace_passes(const std::string& path, int threads, std::int64_t N) {
    using traced = model<variants::from_file, backend::trace<backend::cpu>>;
    traced m(open_weights(path), backend::cpu_options{threads}, &warn);
    const std::int64_t V = m.n_vocab(), L = m.hp().n_layer;
    rng r(7);
    auto ids = [&](std::int64_t n) {
        std::vector<token> v(static_cast<std::size_t>(n));
        for (auto& t : v) t = token(r.next() % std::uint64_t(V));
        return v;
    };
    std::vector<session> ss;
    for (std::int64_t i = 0; i < N; ++i) ss.push_back(m.new_session({.ctx = 128}));
    std::vector<float> logits;
    auto one_pass = [&](const char* name, pass_kind kind, std::int64_t rows) {
        std::vector<std::vector<token>> data;
        std::vector<pass_request> reqs;
        for (std::int64_t i = 0; i < N; ++i) {
            data.push_back(ids(rows));
            if (kind == pass_kind::preview && m.hp().mask_token_id >= 0)
                for (std::size_t k = 1; k < data.back().size(); ++k) data.back()[k] = token(m.hp().mask_token_id);
        }
        for (std::int64_t i = 0; i < N; ++i)
            reqs.push_back({&ss[std::size_t(i)], kind, data[std::size_t(i)], kind == pass_kind::commit && rows > 1 ? 1 : rows});
        m.backend().clear();
        m.run(reqs, logits);
        const auto calls = m.backend().calls();
        std::int64_t in_layers = 0;
        for (const auto& c : calls) in_layers += c.layer >= 0;
        std::printf("{\"pass\":\"%s\",\"sequences\":%lld,\"rows\":%lld,\"layers\":%lld,\"primitives\":%zu,"
                    "\"primitives_per_layer\":%.3f,\"passes\":%lld,\"readbacks\":%lld}\n",
                    name, (long long)N, (long long)(rows * N), (long long)L, calls.size(), double(in_layers) / double(L),
                    (long long)m.backend().passes(), (long long)m.backend().readbacks());
    };
    one_pass("prefill", pass_kind::commit, 32);
    one_pass("decode", pass_kind::commit, 1);
    if (m.diffusion_unavailable().empty()) one_pass("preview", pass_kind::preview, 32);
    else std::fprintf(stderr, "trace: no preview pass: %s\n", m.diffusion_unavailable().c_str());
    one_pass("verify", pass_kind::verify, 8);
}

}  // namespace bench_detail

inline void add_bench_commands(CLI::App& app) {
    auto* c = app.add_subcommand("bench", "llama-bench-style prompt (pp) and generation (tg) throughput");
    struct opts {
        std::string model, decoder = "ar", kv = "f16";
        long long n_prompt = 512, n_gen = 128, reps = 5, parallel = 0, par_prompt = 32;  // parallel 0: the plain tg test
        int threads = 0;
        bool json = false, trace = false;
    };
    auto o = std::make_shared<opts>();
    c->add_option("-m,--model", o->model, "GGUF model file")->required();
    c->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens of the pp test (0: skip)")->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("-n,--n-gen", o->n_gen, "generated tokens of the tg test (0: skip)")->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("-r,--repetitions", o->reps, "repetitions of each test")->check(CLI::Range(1LL, 1000LL));
    c->add_option("--decoder", o->decoder, "ar | diffusion | speculative")->check(CLI::IsMember({"ar", "diffusion", "speculative"}));
    c->add_option("-t,--threads", o->threads, "threads (0: all)");
    c->add_option("--ctk,--cache-type-k", o->kv, "KV cache type: f16 (llama-bench's default) or f32")
        ->check(CLI::IsMember({"f16", "f32"}));
    c->add_flag("--json", o->json, "one JSON object per test instead of the table");
    c->add_option("--parallel", o->parallel,
                  "sequences decoding together in the tg test (tg<n>x<N>: each after a prompt of --parallel-prompt tokens, "
                  "n steps of N rows; aggregate t/s)")
        ->check(CLI::Range(1LL, 4096LL));
    c->add_option("--parallel-prompt", o->par_prompt, "prompt tokens of each sequence of a --parallel tg test")
        ->check(CLI::Range(1LL, 1LL << 20));
    c->add_flag("--trace", o->trace,
                "run one pass of each kind (prefill chunk, decode, preview, verify; --parallel N sequences) through the "
                "trace backend and print one JSON line per pass kind: primitives and read-backs");
    c->callback([o] {
        if (o->trace) return bench_detail::trace_passes(o->model, o->threads, std::max<long long>(1, o->parallel));
        if (o->decoder != "ar") fail("bench: --decoder ", o->decoder, " is not available in this build yet (use ar)");
        using bench_detail::now_s;
        const double t0 = now_s();
        auto m = open_model(o->model, o->threads);
        const double load_s = now_s() - t0;
        const auto& f = *m->weights().file;
        std::size_t bytes = 0, params = 0;
        for (const auto& t : f.tensors()) {
            bytes += t.nbytes;
            params += std::size_t(t.nelements());
        }
        const std::int64_t V = m->n_vocab();
        const double gen_bytes = bench_detail::gen_bytes_per_token(f, m->hp());
        const std::int64_t ctx = std::max<std::int64_t>(1, o->n_prompt + o->n_gen);
        const bool kv16 = o->kv == "f16";
        rng r(1234);
        auto random_ids = [&](std::int64_t n) {
            std::vector<token> ids(static_cast<std::size_t>(n));
            for (auto& t : ids) t = token(r.next() % std::uint64_t(V));
            return ids;
        };
        std::vector<float> logits;
        auto run_pp = [&](std::int64_t n) {
            auto s = m->new_session({.ctx = ctx, .batch = std::max<std::int64_t>(1, std::min<std::int64_t>(n, 512)), .kv_f16 = kv16});
            auto ids = random_ids(n);
            const double a = now_s();
            m->commit(s, ids, logits_rows::last, logits);
            return double(n) / (now_s() - a);
        };
        const std::int64_t N = std::max<long long>(1, o->parallel);
        const bool par = o->parallel > 0;
        auto run_tg_parallel = [&](std::int64_t n) {
            std::vector<session> ss;
            std::vector<std::vector<token>> rows;
            for (std::int64_t i = 0; i < N; ++i) {
                ss.push_back(m->new_session({.ctx = o->par_prompt + n + 1, .kv_f16 = kv16}));
                m->commit(ss.back(), random_ids(o->par_prompt), logits_rows::last, logits);
                rows.push_back(random_ids(n));
            }
            std::vector<pass_request> reqs(static_cast<std::size_t>(N));
            const double a = now_s();
            for (std::int64_t step = 0; step < n; ++step) {
                for (std::int64_t i = 0; i < N; ++i)
                    reqs[std::size_t(i)] = {&ss[std::size_t(i)], pass_kind::commit,
                                            std::span<const token>(&rows[std::size_t(i)][std::size_t(step)], 1), 1};
                m->run(reqs, logits);
            }
            return double(n * N) / (now_s() - a);
        };
        auto run_tg = [&](std::int64_t n) {
            if (par) return run_tg_parallel(n);
            auto s = m->new_session({.ctx = ctx, .kv_f16 = kv16});
            auto ids = random_ids(n);
            const double a = now_s();
            for (std::int64_t i = 0; i < n; ++i) m->commit(s, std::span<const token>(&ids[i], 1), logits_rows::last, logits);
            return double(n) / (now_s() - a);
        };
        std::vector<bench_detail::result> res;
        if (o->n_prompt > 0) res.push_back({"pp" + std::to_string(o->n_prompt), o->n_prompt, 0, {}});
        if (o->n_gen > 0)
            res.push_back({"tg" + std::to_string(o->n_gen) + (par ? "x" + std::to_string(N) : ""), 0, o->n_gen, {}});
        const std::string desc = m->hp().arch + " " + std::to_string(m->hp().n_layer) + "L " + bench_detail::type_summary(f);
        const int threads = m->backend().threads();
        if (!o->json) {
            std::printf("| %-28s | %9s | %7s | %-10s | %7s | %8s | %16s |\n", "model", "size", "params", "backend", "threads",
                        "test", "t/s");
            std::printf("| ---------------------------- | --------- | ------- | ---------- | ------- | -------- | ---------------- |\n");
            if (par) std::printf("(tg%lldx%lld: %lld sequences decoding together after %lld-token prompts; aggregate t/s)\n",
                                   o->n_gen, (long long)N, (long long)N, o->par_prompt);
        }
        for (auto& t : res) {
            if (t.n_prompt > 0) run_pp(t.n_prompt);  // warmup
            else run_tg(1);
            for (long long i = 0; i < o->reps; ++i) t.ts.push_back(t.n_prompt > 0 ? run_pp(t.n_prompt) : run_tg(t.n_gen));
            const double tpp = t.n_prompt > 0 ? double(t.n_prompt) / double((t.n_prompt + 511) / 512) : 1.0;
            if (o->json) {
                std::string samples;
                for (std::size_t i = 0; i < t.ts.size(); ++i) {
                    char b[32];
                    std::snprintf(b, sizeof b, "%s%.4f", i ? "," : "", t.ts[i]);
                    samples += b;
                }
                std::printf("{\"engine\":\"clover\",\"model\":\"%s\",\"size_gib\":%.3f,\"params_b\":%.3f,\"backend\":\"%s\","
                            "\"isa\":\"%s\",\"threads\":%d,\"type_kv\":\"%s\",\"decoder\":\"%s\",\"test\":\"%s\",\"n_prompt\":%lld,\"n_gen\":%lld,"
                            "\"avg_ts\":%.4f,\"stddev_ts\":%.4f,\"samples_ts\":[%s],\"tokens_per_pass\":%.4g,\"load_s\":%.3f,"
                            "\"gen_bytes_per_token\":%.0f,\"parallel\":%lld}\n",
                            desc.c_str(), double(bytes) / (1024.0 * 1024 * 1024), double(params) / 1e9, backend::cpu::name,
                            backend::cpu::isa_name(), threads, o->kv.c_str(), o->decoder.c_str(), t.test.c_str(), (long long)t.n_prompt,
                            (long long)t.n_gen, t.avg(), t.sd(), samples.c_str(), tpp, load_s, gen_bytes,
                            t.n_gen > 0 ? (long long)N : 1LL);
            } else {
                std::printf("| %-28.28s | %5.2f GiB | %5.2f B | %-10s | %7d | %8s | %8.2f ± %5.2f |\n", desc.c_str(),
                            double(bytes) / (1024.0 * 1024 * 1024), double(params) / 1e9,
                            (std::string(backend::cpu::name) + " " + backend::cpu::isa_name()).c_str(), threads,
                            t.test.c_str(), t.avg(), t.sd());
            }
            std::fflush(stdout);
        }
        if (!o->json)
            std::printf("\nload: %.3f s (weights mmapped in place); a generated token reads %.1f MB of weights\n", load_s,
                        gen_bytes / 1e6);
    });
}

}  // namespace clover::cli
