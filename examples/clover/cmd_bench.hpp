#pragma once
// `clover bench` (cli.md): llama-bench's tests on our engine, with the same procedure as
// tools/llama_bench_peer so benchmarks/bench_cpu_vs_llama.sh can put the two side by side:
//   ppN: a fresh session, N random ids as one commit pass (logits of the last row only);
//   tgN: a fresh session, N single-id commit passes with random ids (logits every time);
// KV cache F16 by default (--ctk), as llama-bench;
// one warmup run of each first, then -r repetitions; t/s = tokens / wall seconds.
// Beyond llama-bench (bench_detail::run_tests): the diffusion and speculative decoders' tgN,
// tgNxP (P sequences decoding together), pvB (one preview pass), on the device --device picks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <sys/resource.h>

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

// One pass of each kind through backend::trace<the device's backend>, N sequences each: a prefill chunk of 32
// rows, a decode row, a 32-row preview block (coreset from the file), an 8-row verify segment.
// One JSON line per pass kind (execution.md §3: the figures the trace tests hold).
template <class Backend>
void trace_passes(const std::string& path, int threads, const device_choice& dc, std::int64_t N) {
    using traced = model<variants::from_file, backend::trace<Backend>>;
    traced m(open_weights(path), backend_options(std::type_identity<backend::trace<Backend>>{}, threads, dc), &warn);
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

// This process's page faults so far (getrusage): minor ones map a page that is in memory,
// major ones read it from disk.
struct fault_counts {
    long long minor = 0, major = 0;
    fault_counts operator-(const fault_counts& o) const { return {minor - o.minor, major - o.major}; }
    fault_counts operator+(const fault_counts& o) const { return {minor + o.minor, major + o.major}; }
};
inline fault_counts read_fault_counts() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return {u.ru_minflt, u.ru_majflt};
}
// Resident memory (VmRSS of /proc/self/status) in MiB; 0 where unreadable.
inline double resident_mib() {
    std::ifstream st("/proc/self/status");
    for (std::string key; st >> key;) {
        if (key == "VmRSS:") {
            double kb = 0;
            st >> kb;
            return kb / 1024.0;
        }
        st.ignore(1 << 12, '\n');
    }
    return 0;
}

// The options of `clover bench` (add_bench_commands).
struct options {
    std::string model, decoder = "ar", kv = "f16";
    long long n_prompt = 512, n_gen = 128, reps = 5, parallel = 0, gen_prompt = 32;  // parallel 0: the plain tg test
    long long block = 32, coreset = -1, preview = 0;
    float threshold = 0.95f;
    int threads = 0;
    bool json = false, trace = false;
    device_flags dev;
};

// The tests, on the model type of the chosen device:
//   ppN       fresh session, N random ids as one commit pass (logits of the last row);
//   tgN (ar)  fresh session, N single-id commit passes with random ids (llama-bench's method);
//   tgN (diffusion | speculative)  fresh session, a --gen-prompt of random ids (not timed),
//             then the decoder generates N tokens greedily, end-of-generation ignored;
//             t/s = N / the generation's seconds, tokens_per_pass as the decoder reached it;
//   tgNxP     P sequences after --gen-prompt-token prompts, N steps of P rows (aggregate t/s);
//   pvB[cC]   one preview pass of B rows (a random id, then mask ids) after a --gen-prompt
//             prefix; t/s = B / the pass's seconds; cC: --coreset C given.
template <class M>
void run_tests(const options& o, const device_choice& dc) {
    const double t0 = now_s();
    auto m = open_model<M>(o.model, o.threads, dc);
    const double load_s = now_s() - t0;
    const std::string placement = weights_placement(stage0(*m).backend());
    const bool with_decoder = o.decoder != "ar";
    if (with_decoder || o.preview > 0) m->require_diffusion();
    const auto& f = *stage0(*m).weights().file;
    std::size_t bytes = 0, params = 0;
    for (const auto& t : f.tensors()) {
        bytes += t.nbytes;
        params += std::size_t(t.nelements());
    }
    const std::int64_t V = m->n_vocab();
    const double gen_bytes = gen_bytes_per_token(f, m->hp());
    const std::int64_t ctx = std::max<std::int64_t>(1, o.n_prompt + o.n_gen);
    const bool kv16 = o.kv == "f16";
    rng r(1234);
    auto random_ids = [&](std::int64_t n) {
        std::vector<token> ids(static_cast<std::size_t>(n));
        for (auto& t : ids) t = token(r.next() % std::uint64_t(V));
        return ids;
    };
    std::vector<float> logits;
    // Each run: t/s, tokens per pass, and milliseconds per pass (0: t/s and tokens per pass say it).
    struct sample {
        double ts, per_pass, ms = 0;
    };
    auto run_pp = [&](std::int64_t n) -> sample {
        auto s = m->new_session({.ctx = ctx, .batch = std::max<std::int64_t>(1, std::min<std::int64_t>(n, 512)), .kv_f16 = kv16});
        auto ids = random_ids(n);
        const double a = now_s();
        m->commit(s, ids, logits_rows::last, logits);
        return {double(n) / (now_s() - a), double(n) / double((n + 511) / 512)};
    };
    const std::int64_t N = std::max<long long>(1, o.parallel);
    const bool par = o.parallel > 0;
    auto run_tg_parallel = [&](std::int64_t n) -> sample {
        std::vector<session> ss;
        std::vector<std::vector<token>> rows;
        for (std::int64_t i = 0; i < N; ++i) {
            ss.push_back(m->new_session({.ctx = o.gen_prompt + n + 1, .kv_f16 = kv16}));
            m->commit(ss.back(), random_ids(o.gen_prompt), logits_rows::last, logits);
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
        return {double(n * N) / (now_s() - a), 1.0};
    };
    auto run_tg_decoder = [&](std::int64_t n) -> sample {
        auto s = m->new_session({.ctx = o.gen_prompt + n + 2 * o.block + 1, .kv_f16 = kv16});
        const auto prompt = random_ids(o.gen_prompt);
        decode::generate_options g;
        g.max_tokens = n;
        g.ignore_eos = true;
        auto keep = [](token) { return true; };
        const decode::generate_stats st =
            o.decoder == "diffusion"
                ? decode::generate(*m, s, prompt, g, keep, decode::low_confidence{o.block, o.threshold, o.coreset})
                : decode::generate(*m, s, prompt, g, keep, decode::self_speculative{o.block, 1, o.threshold, o.coreset});
        // tokens_per_pass counts the prompt's pass (the cli.md figure); the time per pass is the
        // generation's seconds over the generation's passes (the prompt is one pass, runner.hpp).
        const std::int64_t gen_passes = std::max<std::int64_t>(1, st.passes() - 1);
        return {st.seconds > 0 ? double(st.tokens) / st.seconds : 0.0, st.tokens_per_pass(), 1e3 * st.seconds / double(gen_passes)};
    };
    // Page faults in the second half of each plain tg run: a steady decode, after the session's
    // state and KV pages were first touched (those faults are the session's, not the weights').
    fault_counts steady_faults{};
    auto run_tg = [&](std::int64_t n) -> sample {
        if (par) return run_tg_parallel(n);
        if (with_decoder) return run_tg_decoder(n);
        auto s = m->new_session({.ctx = ctx, .kv_f16 = kv16});
        auto ids = random_ids(n);
        const double a = now_s();
        fault_counts half{};
        for (std::int64_t i = 0; i < n; ++i) {
            if (i == n / 2) half = read_fault_counts();
            m->commit(s, std::span<const token>(&ids[i], 1), logits_rows::last, logits);
        }
        steady_faults = steady_faults + (read_fault_counts() - half);
        return {double(n) / (now_s() - a), 1.0};
    };
    // The preview test's session: its prefix committed once (a preview pass leaves it as it is).
    std::optional<session> pv_session;
    std::vector<token> pv_block;
    auto run_pv = [&](std::int64_t b) -> sample {
        if (!pv_session) {
            pv_session.emplace(m->new_session({.ctx = o.gen_prompt + b, .kv_f16 = kv16}));
            m->commit(*pv_session, random_ids(o.gen_prompt), logits_rows::none, logits);
            pv_block = random_ids(b);
            for (std::size_t k = 1; k < pv_block.size(); ++k) pv_block[k] = token(m->hp().mask_token_id);
        }
        const double a = now_s();
        m->preview(*pv_session, pv_block, o.coreset, logits);
        return {double(b) / (now_s() - a), double(b)};
    };

    enum class kind { pp, tg, pv };
    struct test {
        kind k;
        result res;
    };
    std::vector<test> tests;
    if (o.n_prompt > 0) tests.push_back({kind::pp, {"pp" + std::to_string(o.n_prompt), o.n_prompt, 0, {}}});
    if (o.n_gen > 0)
        tests.push_back({kind::tg, {"tg" + std::to_string(o.n_gen) + (par ? "x" + std::to_string(N) : ""), 0, o.n_gen, {}}});
    if (o.preview > 0)
        tests.push_back({kind::pv, {"pv" + std::to_string(o.preview) + (o.coreset >= 0 ? "c" + std::to_string(o.coreset) : ""),
                                    o.gen_prompt, 0, {}}});
    using B = typename M::backend_type;
    const std::string desc = m->hp().arch + " " + std::to_string(m->hp().n_layer) + "L " + type_summary(f);
    const std::string isa = backend_isa(stage0(*m).backend());
    const int threads = stage0(*m).backend().threads();
    const std::int64_t coreset_used = o.coreset >= 0 ? o.coreset : m->hp().diffusion_coreset;
    if (!o.json) {
        std::printf("| %-28s | %9s | %7s | %-10s | %7s | %8s | %16s |\n", "model", "size", "params", "backend", "threads", "test", "t/s");
        std::printf("| ---------------------------- | --------- | ------- | ---------- | ------- | -------- | ---------------- |\n");
        if (par)
            std::printf("(tg%lldx%lld: %lld sequences decoding together after %lld-token prompts; aggregate t/s)\n", o.n_gen,
                        (long long)N, (long long)N, o.gen_prompt);
        if (with_decoder)
            std::printf("(tg%lld: the %s decoder, block %lld, threshold %.2f, coreset %lld, after a %lld-token prompt)\n", o.n_gen,
                        o.decoder.c_str(), o.block, double(o.threshold), (long long)coreset_used, o.gen_prompt);
        if (o.preview > 0)
            std::printf("(pv%lld: one preview pass of %lld rows after a %lld-token prefix, coreset %lld; t/s = rows / seconds)\n",
                        o.preview, o.preview, o.gen_prompt, (long long)coreset_used);
    }
    std::string notes;  // the decoders' tokens per pass and the preview's pass time, under the table
    for (auto& [k, t] : tests) {
        auto once = [&]() -> sample {
            if (k == kind::pp) return run_pp(t.n_prompt);
            if (k == kind::pv) return run_pv(o.preview);
            return run_tg(t.n_gen);
        };
        if (k == kind::tg) run_tg(with_decoder ? std::min<std::int64_t>(t.n_gen, 2 * o.block) : 1);  // warmup
        else once();
        double tpp = 0, ms_per_pass = 0;
        // Page faults during the timed runs: a steady decode of weights that fit in memory should
        // take none (issue 41: 7 % of a 40-layer decode was spent in faults inside the products).
        const fault_counts faults0 = read_fault_counts();
        steady_faults = {};
        for (long long i = 0; i < o.reps; ++i) {
            const sample x = once();
            t.ts.push_back(x.ts);
            tpp += x.per_pass / double(o.reps);
            // A tgNxP step is one pass of P rows: its aggregate t/s counts P tokens per pass.
            const double rows_per_pass = k == kind::tg && par ? double(N) : x.per_pass;
            ms_per_pass += (x.ms > 0 ? x.ms : x.ts > 0 ? 1e3 * rows_per_pass / x.ts : 0.0) / double(o.reps);
        }
        const fault_counts faults = read_fault_counts() - faults0;
        if (o.json) {
            std::string samples;
            for (std::size_t i = 0; i < t.ts.size(); ++i) {
                char b[32];
                std::snprintf(b, sizeof b, "%s%.4f", i ? "," : "", t.ts[i]);
                samples += b;
            }
            const bool pv = k == kind::pv;
            std::printf("{\"engine\":\"clover\",\"model\":\"%s\",\"size_gib\":%.3f,\"params_b\":%.3f,\"backend\":\"%s\","
                        "\"isa\":\"%s\",\"threads\":%d,\"type_kv\":\"%s\",\"decoder\":\"%s\",\"test\":\"%s\",\"n_prompt\":%lld,\"n_gen\":%lld,"
                        "\"avg_ts\":%.4f,\"stddev_ts\":%.4f,\"samples_ts\":[%s],\"tokens_per_pass\":%.4g,\"ms_per_pass\":%.4f,"
                        "\"load_s\":%.3f,\"huge_pages\":%s,\"gen_bytes_per_token\":%.0f,\"parallel\":%lld",
                        desc.c_str(), double(bytes) / (1024.0 * 1024 * 1024), double(params) / 1e9, B::name, isa.c_str(), threads,
                        o.kv.c_str(), pv ? "preview" : k == kind::pp || par ? "ar" : o.decoder.c_str(), t.test.c_str(), (long long)t.n_prompt, (long long)t.n_gen,
                        t.avg(), t.sd(), samples.c_str(), tpp, ms_per_pass, load_s, f.map().in_huge_pages() ? "true" : "false", gen_bytes, t.n_gen > 0 ? (long long)N : 1LL);
            std::printf(",\"faults_minor\":%lld,\"faults_major\":%lld,\"rss_mib\":%.1f", faults.minor, faults.major,
                        resident_mib());
            if (k == kind::tg && !par && !with_decoder)
                std::printf(",\"steady_faults_minor\":%lld,\"steady_faults_major\":%lld", steady_faults.minor, steady_faults.major);
            if (pv || (k == kind::tg && with_decoder))
                std::printf(",\"block\":%lld,\"coreset\":%lld%s", pv ? o.preview : o.block, (long long)coreset_used,
                            pv ? "" : (",\"threshold\":" + std::to_string(o.threshold)).c_str());
            std::printf("}\n");
        } else {
            std::printf("| %-28.28s | %5.2f GiB | %5.2f B | %-10s | %7d | %8s | %8.2f ± %5.2f |\n", desc.c_str(),
                        double(bytes) / (1024.0 * 1024 * 1024), double(params) / 1e9, (std::string(B::name) + " " + isa).c_str(),
                        threads, t.test.c_str(), t.avg(), t.sd());
            char b[160];
            std::snprintf(b, sizeof b, "%s: %lld minor and %lld major page faults in the timed runs", t.test.c_str(), faults.minor,
                          faults.major);
            notes += b;
            if (k == kind::tg && !par && !with_decoder) {
                std::snprintf(b, sizeof b, "; %lld minor and %lld major in their second halves (a steady decode)", steady_faults.minor,
                              steady_faults.major);
                notes += b;
            }
            notes += "\n";
            if (k == kind::pv || (k == kind::tg && with_decoder)) {
                std::snprintf(b, sizeof b, "%s: %.2f tokens per pass, %.2f ms per pass\n", t.test.c_str(), tpp, ms_per_pass);
                notes += b;
            }
        }
        std::fflush(stdout);
    }
    if (!o.json && !notes.empty()) std::printf("\n%s", notes.c_str());
    if (!o.json)
        std::printf("\nload: %.3f s (%s); a generated token reads %.1f MB of weights; resident %.0f MiB\n", load_s, placement.c_str(),
                    gen_bytes / 1e6, resident_mib());
}

}  // namespace bench_detail

inline void add_bench_commands(CLI::App& app) {
    auto* c = app.add_subcommand("bench", "llama-bench-style prompt (pp) and generation (tg) throughput");
    auto o = std::make_shared<bench_detail::options>();
    c->add_option("-m,--model", o->model, "GGUF model file")->required();
    c->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens of the pp test (0: skip)")->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("-n,--n-gen", o->n_gen, "generated tokens of the tg test (0: skip)")->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("-r,--repetitions", o->reps, "repetitions of each test")->check(CLI::Range(1LL, 1000LL));
    c->add_option("--decoder", o->decoder,
                  "the tg test's decoder: ar (random ids fed one per pass, llama-bench's method) | diffusion | speculative "
                  "(the decoder generates greedily after a --gen-prompt)")
        ->check(CLI::IsMember({"ar", "diffusion", "speculative"}));
    c->add_option("--block", o->block, "diffusion / speculative block size")->check(CLI::Range(2LL, 1024LL));
    c->add_option("--threshold", o->threshold, "diffusion confidence threshold")->check(CLI::Range(0.0f, 1.0f));
    c->add_option("--coreset", o->coreset, "expert coreset of preview passes (default: the file's; 0: every routed expert)")
        ->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("--preview", o->preview,
                  "also time one preview pass of this many rows (test pvB, or pvBcC with --coreset C) after a --gen-prompt prefix")
        ->check(CLI::Range(0LL, 4096LL));
    c->add_option("-t,--threads", o->threads, "threads (0: all)");
    c->add_option("--ctk,--cache-type-k", o->kv, "KV cache type: f16 (llama-bench's default) or f32")
        ->check(CLI::IsMember({"f16", "f32"}));
    c->add_flag("--json", o->json, "one JSON object per test instead of the table");
    c->add_option("--parallel", o->parallel,
                  "sequences decoding together in the tg test (tg<n>x<N>: each after a prompt of --gen-prompt tokens, "
                  "n steps of N rows; aggregate t/s)")
        ->check(CLI::Range(1LL, 4096LL));
    c->add_option("--gen-prompt,--parallel-prompt", o->gen_prompt,
                  "prompt tokens before a --parallel or --decoder tg test and before the --preview pass")
        ->check(CLI::Range(1LL, 1LL << 20));
    c->add_flag("--trace", o->trace,
                "run one pass of each kind (prefill chunk, decode, preview, verify; --parallel N sequences) through the "
                "trace backend over the chosen device and print one JSON line per pass kind: primitives and read-backs");
    add_device_flags(c, o->dev);
    c->callback([o, c] {
        if (o->trace) {
            on_device(o->dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) {
                if (is_pipeline<M>) fail("bench: --trace runs one process; it does not go with --pipeline");
                bench_detail::trace_passes<typename M::backend_type>(o->model, o->threads, dc, std::max<long long>(1, o->parallel));
            });
            return;
        }
        // Flags a test would ignore: one warning naming them (the run goes on).
        std::string unused;
        auto note_unused = [&](const char* flag, bool used) {
            if (c->count(flag) > 0 && !used) unused += std::string(unused.empty() ? "" : ", ") + flag;
        };
        const bool decodes = o->decoder != "ar" && o->n_gen > 0;
        note_unused("--block", decodes);
        note_unused("--threshold", decodes);
        note_unused("--coreset", decodes || o->preview > 0);
        note_unused("--gen-prompt", decodes || o->preview > 0 || o->parallel > 0);
        if (!unused.empty())
            warn("bench: " + unused + " ha" + (unused.find(',') == std::string::npos ? "s" : "ve") +
                 " no effect on these tests (they apply to --decoder diffusion|speculative, --preview or --parallel)");
        if (o->parallel > 0 && o->decoder != "ar")
            fail("bench: --parallel times AR decode steps; for --decoder ", o->decoder,
                 " over many sequences use `clover generate --ids-file F --parallel N --decoder ", o->decoder,
                 "` (its last stderr line is the aggregate tokens/s)");
        on_device(o->dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) { bench_detail::run_tests<M>(*o, dc); });
    });
}

}  // namespace clover::cli
