#pragma once
// `clover logits` and `clover generate` (cli.md). generate, one prompt or many (--parallel), runs
// on the engine that `clover serve` and `clover run` run (decode/engine.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>

#include <clover/decode/engine.hpp>

#include "common.hpp"

namespace clover::cli {

// The most tokens one session may hold: the model's context (context_length), and never more
// than 2^24 (what -c allows elsewhere). Checked before a session is sized: a file of a million
// lines of ids used to make a 3M-token session and grow to gigabytes before failing (issue 38).
template <class M>
std::int64_t context_limit(const M& m) {
    const std::int64_t c = m.hp().n_ctx_train;
    return std::min<std::int64_t>(c > 0 ? c : std::int64_t(1) << 24, std::int64_t(1) << 24);
}

// `generate --parallel`: the most lines (sequences) one run takes. Each holds a job, its
// output and its stats (~1 KB); a million-line file would hold ~1 GB before the first pass.
inline constexpr std::size_t max_parallel_lines = 65536;
// `logits`: the most bytes of logits written (rows x vocabulary x 4), held in memory first.
inline constexpr std::size_t max_logits_bytes = std::size_t(4) << 30;

// The generation options and decoder `generate` asks for.
template <class M, class Opts>
decode::generate_options generate_options_of(const Opts& o, M& m) {
    decode::generate_options g;
    g.max_tokens = o.n;
    g.ignore_eos = o.ignore_eos;
    if (auto eos = stage0(m).weights().file->get_int("tokenizer.ggml.eos_token_id")) g.eog.push_back(token(*eos));
    if (!o.greedy) g.sampling = {o.temp, o.top_k, o.top_p, o.min_p, o.seed};
    return g;
}
template <class Opts>
decode::builtin_decoder decoder_of(const Opts& o) {
    if (o.decoder == "diffusion") return decode::low_confidence{o.block, o.threshold, o.coreset_set ? o.coreset : -1};
    if (o.decoder == "speculative") return decode::self_speculative{o.block, 1, o.threshold, o.coreset_set ? o.coreset : -1};
    return decode::ar{};
}

// What one prompt of `generate` got.
struct generated {
    std::vector<token> tokens;
    decode::generate_stats stats;
};

// Runs the prompts on the engine a server runs (decode/engine.hpp), up to `parallel` together
// (admitted in input order, one batched pass per step); session size ctx (0: prompt, -n and a
// block, never past the model's context: the answer then ends there, stop_reason "context").
// A request the engine refuses or that fails fails the command.
template <class M, class Opts>
std::vector<generated> generate_on_engine(M& m, const Opts& o, const std::vector<std::vector<token>>& prompts, std::int64_t parallel) {
    const decode::generate_options g = generate_options_of(o, m);
    const decode::builtin_decoder dec = decoder_of(o);
    const std::int64_t limit = context_limit(m);
    decode::engine<M> eng(m, {.parallel = std::max<std::int64_t>(1, parallel), .kv_f16 = o.kv == "f16"});
    std::vector<generated> out(prompts.size());
    std::vector<std::string> errors(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        decode::engine_request<> r;
        r.prompt = prompts[i];
        r.gen = g;
        r.dec = dec;
        r.ctx = o.ctx > 0 ? o.ctx : std::min<std::int64_t>(std::int64_t(prompts[i].size()) + o.n + o.block, limit);
        r.sink.on_token = [&out, i](token t) {
            out[i].tokens.push_back(t);
            return true;
        };
        r.sink.on_end = [&out, &errors, i](const decode::engine_result& e) {
            out[i].stats = e.stats;
            errors[i] = e.error;
        };
        eng.submit(std::move(r));
    }
    eng.run_until_idle();
    for (std::size_t i = 0; i < prompts.size(); ++i)
        if (!errors[i].empty()) fail("generate", prompts.size() > 1 ? " (prompt " + std::to_string(i + 1) + ")" : std::string(), ": ", errors[i]);
    return out;
}

// One --parallel run on the model type of the chosen device.
template <class M, class Opts>
void generate_parallel_on(const Opts& o, const std::vector<std::vector<token>>& prompts, const device_choice& dc) {
    auto m = open_model<M>(o.model, o.threads, dc);
    if (o.decoder != "ar") m->require_diffusion();  // before any prompt starts
    const std::int64_t limit = context_limit(*m);
    for (std::size_t i = 0; i < prompts.size(); ++i)
        if (std::int64_t(prompts[i].size()) >= limit)
            fail(o.ids_file, " line ", i + 1, ": ", prompts[i].size(), " ids; the model's context holds ", limit,
                 " tokens (prompt and answer)");
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<generated> out = generate_on_engine(*m, o, prompts, o.parallel);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::int64_t total = 0;
    for (const auto& r : out) {
        std::printf("%s\n", join_ids(r.tokens).c_str());
        total += std::int64_t(r.tokens.size());
    }
    std::fflush(stdout);
    for (const auto& r : out) std::fprintf(stderr, "%s\n", r.stats.json().c_str());
    std::fprintf(stderr, "{\"sequences\": %zu, \"parallel\": %lld, \"tokens\": %lld, \"seconds\": %.6g, \"tokens_per_second\": %.6g}\n",
                 prompts.size(), o.parallel, (long long)total, secs, secs > 0 ? double(total) / secs : 0.0);
}

// `clover generate --ids-file F --parallel N`: every line of F a prompt; stats JSON per
// sequence on stderr (in input order), then one aggregate line. Output line k answers input
// line k, so a blank line is an error (skipping it would shift every answer after it); only
// the end of the file may follow the last newline.
template <class Opts>
void generate_parallel(const Opts& o) {
    if (o.ids_file.empty() || !o.ids.empty()) fail("generate: --parallel takes the prompts from --ids-file (one per line)");
    std::vector<std::vector<token>> prompts;
    {
        const std::string text = read_file(o.ids_file);
        const std::size_t lines = std::size_t(std::count(text.begin(), text.end(), '\n')) + (text.ends_with('\n') ? 0 : 1);
        if (lines > max_parallel_lines)
            fail(o.ids_file, ": ", lines, " lines; --parallel takes at most ", max_parallel_lines, " prompts a run (split the file)");
        std::size_t a = 0, line = 0;
        while (a < text.size()) {
            std::size_t b = text.find('\n', a);
            if (b == std::string::npos) b = text.size();
            ++line;
            const std::string l = text.substr(a, b - a);
            if (l.find_first_not_of(" \t\r") == std::string::npos)
                fail(o.ids_file, " line ", line, " is blank: every line is one prompt (output line k answers input line k)");
            auto ids = parse_ids(l, o.ids_file + " line " + std::to_string(line));
            if (ids.empty()) fail(o.ids_file, " line ", line, ": no token ids");
            prompts.push_back(std::move(ids));
            a = b + 1;
        }
    }
    if (prompts.empty()) fail(o.ids_file, ": no prompts (one line of ids per sequence)");
    on_device(o.dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) { generate_parallel_on<M>(o, prompts, dc); });
}

inline void add_model_commands(CLI::App& app) {
    {
        auto* c = app.add_subcommand("logits", "Evaluate ids as one prompt and write float32 logits [n_ids, n_vocab]");
        struct opts {
            std::string model, ids, ids_file, out, block_ids, kv = "f32";
            device_flags dev;
            int threads = 0;
            long long coreset = -1;
        };
        auto o = std::make_shared<opts>();
        c->add_option("-m,--model", o->model, "GGUF model file")->required();
        c->add_option("--ids", o->ids, "prompt token ids, comma separated");
        c->add_option("--ids-file", o->ids_file, "file with prompt ids (comma or whitespace separated)");
        c->add_option("-o,--output", o->out, "output file (float32, little-endian, row-major)")->required();
        c->add_option("--block-ids", o->block_ids, "block rows for one preview pass after the prompt");
        c->add_option("--ctk,--cache-type-k", o->kv, "KV cache type: f32 (default here: parity checks compare with F32 references) or f16")
            ->check(CLI::IsMember({"f16", "f32"}));
        c->add_option("--coreset", o->coreset, "expert coreset size for the preview pass (default: the file's)")
            ->check(CLI::Range(0LL, 1LL << 20));
        c->add_option("-t,--threads", o->threads, "threads (0: all)");
        add_device_flags(c, o->dev);
        c->callback([o] {
            if (o->ids.empty() == o->ids_file.empty()) fail("logits: give exactly one of --ids or --ids-file");
            std::vector<token> ids = o->ids.empty() ? parse_ids(read_file(o->ids_file), o->ids_file) : parse_ids(o->ids, "--ids");
            if (ids.empty()) fail("logits: no token ids given");
            std::vector<token> block;
            if (!o->block_ids.empty()) block = parse_ids(o->block_ids, "--block-ids");
            if (!o->block_ids.empty() && block.empty()) fail("logits: --block-ids is empty");
            if (o->coreset >= 0 && block.empty()) fail("logits: --coreset needs --block-ids");
            on_device(o->dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) {
                auto m = open_model<M>(o->model, o->threads, dc);
                // Before the session and the logits are sized (a file of a million lines used to
                // grow to gigabytes before failing).
                const std::int64_t limit = context_limit(*m);
                if (std::int64_t(ids.size() + block.size()) > limit)
                    fail("logits: ", ids.size(), " ids", block.empty() ? "" : " and " + std::to_string(block.size()) + " block rows",
                         " exceed the model's context of ", limit, " tokens");
                const double rows = double(block.empty() ? ids.size() : block.size());
                if (rows * double(m->n_vocab()) * 4 > double(max_logits_bytes))
                    fail("logits: ", std::size_t(rows), " rows of ", m->n_vocab(), " logits would take more than ", max_logits_bytes >> 30,
                         " GiB; pass fewer ids");
                auto s = m->new_session({.ctx = std::int64_t(ids.size() + block.size()), .kv_f16 = o->kv == "f16"});
                std::vector<float> logits;
                if (block.empty()) {
                    m->commit(s, ids, logits_rows::all, logits);
                } else {  // prefix by a commit pass, then ONE preview pass over the block rows
                    m->require_diffusion();
                    m->commit(s, ids, logits_rows::none, logits);
                    m->preview(s, block, o->coreset, logits);
                }
                write_output_file(o->out, std::as_bytes(std::span(logits)), {o->model, o->ids_file});
            });
        });
    }
    {
        auto* c = app.add_subcommand("generate", "Generate token ids after a prompt of ids");
        struct opts {
            std::string model, ids, ids_file, decoder = "ar", kv = "f32";
            long long n = 32, ctx = 0, block = 32, coreset = -1;
            bool coreset_set = false;
            int threads = 0;
            bool greedy = false, ignore_eos = false;
            float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, threshold = 0.95f;
            int top_k = 40;
            unsigned long long seed = 0;
            long long parallel = 0;
            device_flags dev;
        };
        auto o = std::make_shared<opts>();
        c->add_option("-m,--model", o->model, "GGUF model file")->required();
        c->add_option("--ids", o->ids, "prompt token ids, comma separated");
        c->add_option("--ids-file", o->ids_file, "file with prompt ids");
        c->add_option("-n,--n-predict", o->n, "tokens to generate")->check(CLI::Range(1LL, 1LL << 30));
        c->add_flag("--greedy", o->greedy, "argmax decoding");
        c->add_flag("--ignore-eos", o->ignore_eos, "do not stop at end-of-generation tokens");
        c->add_option("--decoder", o->decoder, "ar | diffusion | speculative")->check(CLI::IsMember({"ar", "diffusion", "speculative"}));
        c->add_option("--block", o->block, "diffusion block size")->check(CLI::Range(1LL, 4096LL));
        c->add_option("--threshold", o->threshold, "diffusion confidence threshold")->check(CLI::Range(0.0f, 1.0f));
        c->add_option("--coreset", o->coreset, "expert coreset size for preview passes (default: the file's)")
            ->check(CLI::Range(0LL, 1LL << 20))
            ->each([o](const std::string&) { o->coreset_set = true; });
        c->add_option("--temp", o->temp, "temperature (ignored with --greedy)")->check(CLI::Range(0.0f, 100.0f));
        c->add_option("--top-k", o->top_k, "top-k (0: off)")->check(CLI::Range(0, 1 << 30));
        c->add_option("--top-p", o->top_p, "top-p")->check(CLI::Range(0.0f, 1.0f));
        c->add_option("--min-p", o->min_p, "min-p")->check(CLI::Range(0.0f, 1.0f));
        c->add_option("--seed", o->seed, "sampling seed");
        c->add_option("-c,--ctx-size", o->ctx, "context size (0: prompt + n)")->check(CLI::Range(0LL, 1LL << 31));
        c->add_option("-t,--threads", o->threads, "threads (0: all)");
        c->add_option("--ctk,--cache-type-k", o->kv, "KV cache type: f32 (default here: parity checks compare with F32 references) or f16")
            ->check(CLI::IsMember({"f16", "f32"}));
        c->add_option("--parallel", o->parallel,
                      "each line of --ids-file is one sequence; up to N decode together (one batched pass per step); "
                      "one line of ids per sequence on stdout, in input order")
            ->check(CLI::Range(1LL, 4096LL));
        add_device_flags(c, o->dev);
        c->callback([o] {
            if (o->parallel > 0) return generate_parallel(*o);
            if (o->ids.empty() == o->ids_file.empty()) fail("generate: give exactly one of --ids or --ids-file");
            std::vector<token> ids = o->ids.empty() ? parse_ids(read_file(o->ids_file), o->ids_file) : parse_ids(o->ids, "--ids");
            if (ids.empty()) fail("generate: no token ids given");
            on_device(o->dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) {
                auto m = open_model<M>(o->model, o->threads, dc);
                const std::int64_t limit = context_limit(*m);
                if (std::int64_t(ids.size()) >= limit)
                    fail("generate: the prompt has ", ids.size(), " ids; the model's context holds ", limit, " tokens (prompt and answer)");
                if (o->decoder != "ar") m->require_diffusion();
                const generated r = std::move(generate_on_engine(*m, *o, {ids}, 1).at(0));
                const auto& out = r.tokens;
                const auto& st = r.stats;
                std::printf("%s\n", join_ids(out).c_str());
                std::fflush(stdout);
                std::fprintf(stderr, "%s\n", st.json().c_str());
            });
        });
    }
}

}  // namespace clover::cli
