#pragma once
// `clover run` (cli.md): chat with a model in the terminal. The prompt is one user turn in the
// model's chat format (--raw: the text as it is); the answer streams to stdout as it is
// decoded (never half a UTF-8 character), and a one-line summary (tokens, passes, tokens per
// pass, tok/s) goes to stderr. --chat keeps a conversation going, one line per user turn.
// Without -m it runs the model bundled with the project (models/clover-small.gguf).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <clover/chat/parse.hpp>
#include <clover/chat/render.hpp>
#include <clover/decode/engine.hpp>
#include <clover/server/protocol.hpp>
#include <clover/tokenizer/streaming_decoder.hpp>

#include "common.hpp"

namespace clover::cli {

inline constexpr const char* bundled_model_name = "models/clover-small.gguf";

// The bundled model: ./models/clover-small.gguf, or next to the executable (build/clover →
// ../models). A clear error when it is not there.
inline std::string bundled_model() {
    namespace fs = std::filesystem;
    std::vector<fs::path> look{fs::current_path() / bundled_model_name};
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        look.push_back(exe.parent_path() / bundled_model_name);
        look.push_back(exe.parent_path().parent_path() / bundled_model_name);
        look.push_back(exe.parent_path().parent_path() / "share" / "clover" / "clover-small.gguf");
    }
    std::vector<std::string> seen;
    for (const auto& p : look) {
        if (fs::is_regular_file(p, ec)) return p.string();
        const std::string n = p.lexically_normal().string();
        if (std::find(seen.begin(), seen.end(), n) == seen.end()) seen.push_back(n);
    }
    std::string where;
    for (const auto& p : seen) where += (where.empty() ? "" : ", ") + p;
    fail("no model given (-m MODEL) and the bundled model ", bundled_model_name, " is not there (looked in: ", where,
         "); pass -m MODEL, or write a random-weight test model with `clover gguf synth --arch clover_moe --preset tiny -o tiny.gguf`");
}

// A tokenizer must not name rows the model lacks. More rows than tokens is how checkpoints pad
// their vocabulary (ids past the tokenizer are refused if a model ever produces one).
template <class M>
void check_vocab(const tokenizer& tok, const M& m) {
    if (tok.n_vocab() > std::size_t(m.n_vocab()))
        fail("the tokenizer has ", tok.n_vocab(), " tokens but the model only ", m.n_vocab(), " rows (token_embd): they do not belong together");
}

// Opens the model, then pages its tensor bytes in, with a progress bar on stderr.
template <class M>
std::unique_ptr<M> load_with_progress(const std::string& path, int threads, const device_choice& dc, bool quiet) {
    const std::string name = std::filesystem::path(path).filename().string();
    const auto t0 = std::chrono::steady_clock::now();
    const bool tty = isatty(2) != 0;
    if (!quiet) std::fprintf(stderr, "loading %s ...", name.c_str());
    auto m = open_model<M>(path, threads, dc);
    // A pipeline's stages map only their own layers (populated as each loads): faulting the
    // whole file in here would undo that.
    const auto& tensors = stage0(*m).weights().file->tensors();
    const std::size_t n_fault = is_pipeline<M> ? 0 : tensors.size();
    std::size_t total = 0, done = 0;
    for (std::size_t k = 0; k < n_fault; ++k) total += tensors[k].nbytes;
    volatile unsigned char sink = 0;
    int shown = -1;
    auto bar = [&] {
        const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
        if (quiet || !tty || pct == shown) return;
        shown = pct;
        char b[41];
        for (int i = 0; i < 40; ++i) b[i] = i < pct * 40 / 100 ? '#' : '.';
        b[40] = 0;
        std::fprintf(stderr, "\rloading %s [%s] %3d%% %zu/%zu MiB", name.c_str(), b, pct, done >> 20, total >> 20);
        std::fflush(stderr);
    };
    for (std::size_t k = 0; k < n_fault; ++k) {
        const auto& t = tensors[k];
        const auto* p = reinterpret_cast<const unsigned char*>(t.data);
        for (std::size_t i = 0; p && i < t.nbytes; i += 4096) sink = sink ^ p[i];  // fault the pages in
        done += t.nbytes;
        bar();
    }
    done = total;
    if (n_fault) bar();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if constexpr (is_pipeline<M>) {
        const stage_range r = m->split()[0];
        if (!quiet)
            std::fprintf(stderr, " loaded %s: stage 0 of %zu (layers [%lld, %lld)) in %.2f s\n", name.c_str(), m->split().size(),
                         (long long)r.first, (long long)r.last, secs);
    } else if (!quiet) {
        std::fprintf(stderr, "%sloaded %s: %zu MiB in %.2f s\n", tty && n_fault ? "\n" : " ", name.c_str(), total >> 20, secs);
    }
    return m;
}

// `run --chat`'s prefix cache: at most this much memory (KV pages and GDN states), the least
// recently used resume points going first; serve's --cache-ram default.
inline constexpr int chat_cache_mib = 4096;

inline std::atomic<int> run_interrupts{0};
inline void run_on_sigint(int) {
    if (run_interrupts.fetch_add(1) >= 1) std::_Exit(130);  // the second Ctrl-C quits
}

inline void add_run_commands(CLI::App& app) {
    auto* c = app.add_subcommand("run", "Stream a model's answer to a prompt (--chat: a conversation)");
    struct opts {
        std::string model, prompt, system, decoder = "ar", kv = "f16";
        long long n = 512, ctx = 4096, block = 32, coreset = -1;
        int threads = 0, top_k = 20;
        float temp = 0.6f, top_p = 0.95f, min_p = 0.f, threshold = 0.95f, repeat_penalty = 1.f, presence_penalty = 0.f;
        unsigned long long seed = 0;
        bool seed_set = false, greedy = false, no_think = false, chat = false, raw = false, quiet = false, ignore_eos = false;
        bool no_cache = false;
        device_flags dev;
    };
    auto o = std::make_shared<opts>();
    c->add_option("-m,--model", o->model, std::string("GGUF model file or HF folder (default: the bundled ") + bundled_model_name + ")");
    c->add_option("-p,--prompt", o->prompt, "the prompt (one user turn; --raw: plain text)");
    c->add_option("--system", o->system, "system prompt");
    c->add_option("-n,--n-predict", o->n, "most tokens per answer")->check(CLI::Range(1LL, 1LL << 30));
    c->add_option("-c,--ctx-size", o->ctx, "context size (prompt + answer; the whole conversation with --chat)")->check(CLI::Range(16LL, 1LL << 24));
    c->add_option("--decoder", o->decoder, "ar | diffusion | speculative")->check(CLI::IsMember({"ar", "diffusion", "speculative"}));
    c->add_option("--block", o->block, "diffusion block size")->check(CLI::Range(1LL, 1024LL));
    c->add_option("--threshold", o->threshold, "diffusion confidence threshold")->check(CLI::Range(0.0f, 1.0f));
    c->add_option("--coreset", o->coreset, "expert coreset size for preview passes (default: the file's)")->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("--temp", o->temp, "temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
    c->add_option("--top-k", o->top_k, "top-k (0: off)")->check(CLI::Range(0, 1 << 30));
    c->add_option("--top-p", o->top_p, "top-p")->check(CLI::Range(0.0f, 1.0f));
    c->add_option("--min-p", o->min_p, "min-p")->check(CLI::Range(0.0f, 1.0f));
    c->add_option("--repeat-penalty", o->repeat_penalty, "repetition penalty (1: off)")->check(CLI::Range(0.01f, 10.0f));
    c->add_option("--presence-penalty", o->presence_penalty, "presence penalty")->check(CLI::Range(-2.0f, 2.0f));
    c->add_option("--seed", o->seed, "sampling seed (default: random)")->each([o](const std::string&) { o->seed_set = true; });
    c->add_flag("--greedy", o->greedy, "argmax decoding");
    c->add_flag("--ignore-eos", o->ignore_eos, "do not stop at end-of-generation tokens");
    c->add_flag("--no-think", o->no_think, "no thinking: the prompt closes the think block");
    c->add_flag("--chat", o->chat, "interactive conversation on stdin (/reset clears it, /exit or EOF ends)");
    c->add_flag("--raw", o->raw, "send the prompt as plain text, without the chat format");
    c->add_flag("--no-cache", o->no_cache, "--chat: compute every turn's prompt from its start (by default a turn resumes from the "
                                           "longest cached state that the new prompt still begins with, as a server's prefix cache does)");
    c->add_flag("-q,--quiet", o->quiet, "no progress bar");
    c->add_option("-t,--threads", o->threads, "threads (0: all)");
    c->add_option("--ctk,--cache-type-k", o->kv, "KV cache type: f16 (default) or f32")->check(CLI::IsMember({"f16", "f32"}));
    add_device_flags(c, o->dev);
    c->callback([o] {
        if (!o->chat && o->prompt.empty()) fail("run: give a prompt (-p TEXT) or --chat");
        if (o->chat && o->raw) fail("run: --raw and --chat do not go together");
        if (o->decoder == "speculative" && o->block < 2) fail("run: --block must be at least 2 for the speculative decoder");
        const std::string path = o->model.empty() ? bundled_model() : o->model;
        const tokenizer tok = tokenizer::from_file(path);
        on_device(o->dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) {
            auto m = load_with_progress<M>(path, o->threads, dc, o->quiet);
            check_vocab(tok, *m);
            if (o->decoder != "ar") m->require_diffusion();
            const chat::format fmt = chat::detect_format(tok.chat_template());

            decode::generate_options g;
            g.max_tokens = o->n;
            g.ignore_eos = o->ignore_eos;
            g.eog = tok.eog_ids();
            if (!o->greedy && o->temp > 0) {
                g.sampling.temperature = o->temp;
                g.sampling.top_k = o->top_k;
                g.sampling.top_p = o->top_p;
                g.sampling.min_p = o->min_p;
                g.sampling.seed = o->seed_set ? o->seed : std::random_device{}();
            }
            g.sampling.repetition_penalty = o->repeat_penalty;
            g.sampling.presence_penalty = o->presence_penalty;
            if (auto t = tok.find_token("</think>")) g.sampling.think_end = *t;
            server::decoder_choice dec = decode::ar{};
            if (o->decoder == "diffusion") dec = decode::low_confidence{o->block, o->threshold, o->coreset};
            if (o->decoder == "speculative") dec = decode::self_speculative{o->block, 1, o->threshold, o->coreset};
            std::signal(SIGINT, run_on_sigint);

            std::vector<chat::message> conv;
            if (!o->system.empty()) conv.push_back(chat::system_msg(o->system));
            // The engine a server runs (decode/engine.hpp), with one request at a time. --chat: its
            // prefix cache is the conversation's memory, as a server's is a client's: a turn resumes
            // from the longest cached cut that its prompt begins with — a cut goes after every
            // message start, so the next turn resumes at the start of the previous answer, whose
            // rendering the Qwen template changes (it drops past reasoning) — and computes only the
            // rest; the summary says how many prompt tokens were cached, as a server's usage does.
            // The cuts are the same with --no-cache, so both give the same answers.
            decode::engine_options eo;
            eo.kv_f16 = o->kv == "f16";
            if (o->chat) {
                if (auto b = tok.find_token("<|im_start|>")) eo.boundary = *b;
                eo.boundary_gap = 1;  // every message start: a terminal's turns are often shorter than a server's 64-token gap
                if (!o->no_cache) eo.cache_bytes = std::size_t(chat_cache_mib) << 20;
            }
            decode::engine<M> eng(*m, eo);
            // One answer: render, generate while streaming, summary on stderr; returns the text.
            auto answer = [&](bool& opened_think) {
                chat::render_options ro;
                ro.enable_thinking = !o->no_think;
                std::string prompt_text = o->raw ? o->prompt : chat::render(fmt, conv, ro);
                opened_think = !o->raw && chat::prompt_opens_think(prompt_text);
                encode_options eo2;
                eo2.parse_special = !o->raw;
                auto ids = tok.encode(prompt_text, eo2);
                if (ids.empty()) fail("run: the prompt is empty");
                if (std::int64_t(ids.size()) >= o->ctx)
                    fail("run: the prompt has ", ids.size(), " tokens; the context holds ", o->ctx, " (raise -c/--ctx-size)");
                const std::int64_t n_prompt = std::int64_t(ids.size());
                decode::engine_request<> r;
                r.prompt = std::move(ids);
                r.gen = g;
                r.gen.max_tokens = std::min<std::int64_t>(o->n, o->ctx - n_prompt);
                r.dec = dec;
                r.ctx = o->ctx;
                streaming_decoder sd(tok);
                std::string text;
                if (opened_think) std::fputs("<think>\n", stdout);
                run_interrupts = 0;
                std::string bad_token;
                r.sink.on_token = [&](token t) {
                    if (t < 0 || std::size_t(t) >= tok.n_vocab()) {
                        bad_token = std::to_string(t);
                        return false;
                    }
                    const std::string piece = sd.push(t);
                    text += piece;
                    std::fwrite(piece.data(), 1, piece.size(), stdout);
                    std::fflush(stdout);
                    return run_interrupts.load() == 0;
                };
                decode::engine_result res;
                r.sink.on_end = [&](const decode::engine_result& e) { res = e; };
                eng.submit(std::move(r));
                eng.run_until_idle();
                const decode::generate_stats& st = res.stats;
                const std::string rest = sd.finish();
                text += rest;
                std::fwrite(rest.data(), 1, rest.size(), stdout);
                std::fputs("\n", stdout);
                std::fflush(stdout);
                if (!res.error.empty()) fail("run: ", res.error);
                if (!bad_token.empty())
                    fail("run: the model produced token id ", bad_token, ", which its tokenizer (", tok.n_vocab(), " tokens) has no text for");
                std::fprintf(stderr, "[%lld tokens, %lld passes, TPF %.2f, %.1f tok/s | prompt %lld tokens (%lld cached) in %.2f s | %s, stop: %s]\n",
                             (long long)st.tokens, (long long)st.passes(), st.tokens_per_pass(),
                             st.seconds > 0 ? double(st.tokens) / st.seconds : 0.0, (long long)n_prompt, (long long)st.cached_tokens,
                             st.prompt_seconds, server::decoder_name(dec).c_str(),
                             st.stop_reason == "callback" ? "interrupted" : st.stop_reason.c_str());
                return text;
            };
            if (!o->chat) {
                if (!o->raw) conv.push_back(chat::user_msg(o->prompt));
                bool think = false;
                answer(think);
                return;
            }
            std::string line = o->prompt;
            bool have = !line.empty();
            for (;;) {
                if (!have) {
                    std::fputs("> ", stderr);
                    std::fflush(stderr);
                    if (!std::getline(std::cin, line)) break;
                }
                have = false;
                if (line == "/exit" || line == "/quit") break;
                if (line == "/reset") {
                    conv.resize(o->system.empty() ? 0 : 1);
                    std::fputs("(conversation cleared)\n", stderr);
                    continue;
                }
                if (line.empty()) continue;
                conv.push_back(chat::user_msg(line));
                bool think = false;
                try {
                    const std::string text = answer(think);
                    chat::parse_options po;
                    po.in_reasoning = think;
                    conv.push_back(chat::parse(fmt, text, po).to_message());
                } catch (const clover::error& e) {
                    conv.pop_back();
                    std::fprintf(stderr, "error: %s\n", e.what());
                }
            }
        });
    });
}

}  // namespace clover::cli
