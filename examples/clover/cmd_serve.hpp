#pragma once
// `clover serve` (cli.md): the OpenAI-compatible HTTP server (include/clover/server) over one
// model. Binds 127.0.0.1 unless --host says otherwise; Ctrl-C (SIGINT/SIGTERM) stops it.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include <clover/server/server.hpp>

#include "cmd_run.hpp"
#include "common.hpp"

namespace clover::cli {

inline std::atomic<bool> serve_stop{false};
inline void serve_on_signal(int) { serve_stop = true; }

// The keys: --api-key (repeatable), else the lines of --api-key-file (one key each; blank lines
// are skipped), else $CLOVER_API_KEY (none: no key). A file or the environment keep them out of
// `ps`. Several keys are several tenants: each its own prefix-cache scope by default.
inline std::vector<std::string> api_keys(const std::vector<std::string>& flags, const std::string& file) {
    if (!flags.empty() && !file.empty()) fail("serve: give --api-key or --api-key-file, not both");
    for (const auto& k : flags)
        if (k.empty()) fail("serve: --api-key must not be empty");
    if (!flags.empty()) return flags;
    if (!file.empty()) {
        std::ifstream f(file);
        if (!f) fail("serve: cannot read the API key file '", file, "'");
        std::vector<std::string> keys;
        for (std::string key; std::getline(f, key);) {
            while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
            if (!key.empty()) keys.push_back(key);
        }
        if (keys.empty()) fail("serve: the API key file '", file, "' is empty (one key per line)");
        return keys;
    }
    const char* env = std::getenv("CLOVER_API_KEY");
    return env && *env ? std::vector<std::string>{env} : std::vector<std::string>{};
}

inline void add_serve_commands(CLI::App& app) {
    auto* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health)");
    struct opts {
        std::string model, alias, key_file, kv = "f16";
        std::vector<std::string> keys;
        int threads = 0;
        bool quiet = false;
        device_flags dev;
        server::options srv;
    };
    auto o = std::make_shared<opts>();
    auto& s = o->srv;
    c->add_option("-m,--model", o->model, std::string("GGUF model file or HF folder (default: the bundled ") + bundled_model_name + ")");
    c->add_option("--host", s.host, "address to bind (default 127.0.0.1: this machine only)");
    c->add_option("--port", s.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
    c->add_option("--api-key", o->keys, "require 'Authorization: Bearer KEY' on /v1 requests; repeatable, one key per tenant "
                                        "(visible in ps: prefer --api-key-file or CLOVER_API_KEY)")
        ->allow_extra_args(false);
    c->add_option("--api-key-file", o->key_file, "read the API keys from this file, one per line");
    c->add_option("--cors", s.cors_origins, "allow browser pages from this origin (e.g. http://localhost:3000; '*': any); repeatable")
        ->allow_extra_args(false);
    c->add_option("--allow-host", s.allowed_hosts, "accept this Host name too (a reverse proxy's) when bound to loopback; repeatable")
        ->allow_extra_args(false);
    c->add_option("-a,--alias", o->alias, "model name served in /v1/models (default: the file name)");
    c->add_option("-c,--ctx-size", s.ctx, "context per request (prompt + answer)")->check(CLI::Range(16LL, 1LL << 24));
    c->add_option("--parallel", s.parallel, "requests generating together, one batched pass per step (continuous batching)")
        ->check(CLI::Range(1LL, 4096LL));
    c->add_option("--batch-tokens", s.batch_tokens, "rows per batched step: prompt chunks of new requests wait beyond it")
        ->check(CLI::Range(1LL, 1LL << 20));
    c->add_option("--max-block", s.max_block, "largest diffusion block a request may ask for (each preview pass computes it whole)")
        ->check(CLI::Range(1LL, 1LL << 20));
    c->add_option("--max-draft", s.max_draft, "largest speculative block (draft) a request may ask for")->check(CLI::Range(2LL, 1LL << 20));
    c->add_option("--max-rows-per-token", s.max_rows_per_token,
                  "progress rule: a diffusion block or speculative cycle costing more rows per token it decides halves the "
                  "request's block (0: off)")
        ->check(CLI::Range(0LL, 1LL << 20));
    c->add_option("--cache-scope", s.cache_scope, "who shares cached prefixes: key (each API key its own; the default with a key) "
                                                  "or global")
        ->check(CLI::IsMember({"key", "global"}));
    c->add_option("--cache-ram", s.cache_ram_mib, "MiB for the prefix cache (earlier prompts' KV pages and GDN states, reused by "
                                               "requests that share a prefix, e.g. the next turn of a chat; 0: off)")
        ->check(CLI::Range(0LL, 1LL << 30));
    c->add_option("--ctk,--cache-type-k", o->kv, "KV cache type: f16 (default) or f32")->check(CLI::IsMember({"f16", "f32"}));
    c->add_option("--max-tokens", s.max_tokens_limit, "largest max_tokens a request may ask for")->check(CLI::Range(1LL, 1LL << 24));
    c->add_option("-n,--n-predict", s.default_max_tokens, "max_tokens when a request gives none")->check(CLI::Range(1LL, 1LL << 24));
    c->add_option("--max-body", s.max_body_bytes, "largest request body in bytes")->check(CLI::Range(std::size_t(1024), std::size_t(1) << 30));
    c->add_option("--max-queue", s.max_queue, "requests that may wait for the model (more get 503)")->check(CLI::Range(std::size_t(1), std::size_t(1) << 20));
    c->add_option("--http-threads", s.http_threads, "requests served at once (a quarter kept for /health and other short ones)")
        ->check(CLI::Range(2, 4096));
    c->add_option("--max-connections", s.max_connections, "open connections at once (more get 503)")->check(CLI::Range(1, 1 << 20));
    c->add_option("--read-timeout", s.read_timeout_s, "seconds a request's headers and body may take to arrive")->check(CLI::Range(1, 3600));
    c->add_option("--decoder", s.decoder, "default decoder: ar | diffusion | speculative")->check(CLI::IsMember({"ar", "diffusion", "speculative"}));
    c->add_option("--block", s.block, "default diffusion block size")->check(CLI::Range(1LL, 1024LL));
    c->add_option("--threshold", s.threshold, "default diffusion confidence threshold")->check(CLI::Range(0.0f, 1.0f));
    c->add_option("--coreset", s.coreset, "default expert coreset for preview passes (-1: the file's)")->check(CLI::Range(-1LL, 1LL << 20));
    c->add_option("--temp", s.sampling.temperature, "default temperature")->check(CLI::Range(0.0f, 2.0f));
    c->add_option("--top-k", s.sampling.top_k, "default top-k")->check(CLI::Range(0, 1 << 30));
    c->add_option("--top-p", s.sampling.top_p, "default top-p")->check(CLI::Range(0.0f, 1.0f));
    c->add_option("--min-p", s.sampling.min_p, "default min-p")->check(CLI::Range(0.0f, 1.0f));
    c->add_flag("--no-think", [o](std::int64_t) { o->srv.enable_thinking = false; }, "thinking off unless a request turns it on");
    c->add_flag("-q,--quiet", o->quiet, "no progress bar");
    c->add_option("-t,--threads", o->threads, "model threads (0: all)");
    add_device_flags(c, o->dev);
    c->callback([o] {
        const std::string path = o->model.empty() ? bundled_model() : o->model;
        auto keys = api_keys(o->keys, o->key_file);
        if (!keys.empty()) {
            o->srv.api_key = keys.front();
            o->srv.api_keys.assign(keys.begin() + 1, keys.end());
        }
        if (o->srv.decoder == "speculative" && o->srv.block < 2) fail("serve: --block must be at least 2 for the speculative decoder");
        if (o->srv.block > o->srv.max_block) fail("serve: --block ", o->srv.block, " is above --max-block ", o->srv.max_block);
        if (o->srv.max_tokens_limit > o->srv.ctx) o->srv.max_tokens_limit = o->srv.ctx;
        o->srv.default_max_tokens = std::min(o->srv.default_max_tokens, o->srv.max_tokens_limit);
        o->srv.kv_f16 = o->kv == "f16";
        o->srv.model_id = o->alias.empty() ? std::filesystem::path(path).filename().replace_extension().string() : o->alias;
        const tokenizer tok = tokenizer::from_file(path);
        on_device(o->dev, [&]<class M>(std::type_identity<M>, const device_choice& dc) {
            auto m = load_with_progress<M>(path, o->threads, dc, o->quiet);
            check_vocab(tok, *m);
            server::basic_server<M> srv(*m, tok, o->srv);
            const int port = srv.start();
            const bool local = o->srv.host == "127.0.0.1" || o->srv.host == "localhost" || o->srv.host == "::1";
            if (!local && o->srv.api_key.empty())
                std::fprintf(stderr, "warning: listening on %s without --api-key: anyone who can reach this address can use the model\n",
                             o->srv.host.c_str());
            std::fprintf(stderr, "clover serve: model '%s' on http://%s:%d/v1 (ctx %lld, decoder %s%s); Ctrl-C stops\n",
                         o->srv.model_id.c_str(), o->srv.host.c_str(), port, (long long)o->srv.ctx, o->srv.decoder.c_str(),
                         o->srv.api_key.empty() ? "" : ", API key required");
            std::signal(SIGINT, serve_on_signal);
            std::signal(SIGTERM, serve_on_signal);
            while (!serve_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
            std::fprintf(stderr, "clover serve: stopping\n");
            srv.stop();
        });
    });
}

}  // namespace clover::cli
