#pragma once
// `clover serve` as a library: an OpenAI-compatible HTTP server over one model.
//
//   clover::server::server srv(model, tokenizer, {.port = 0});
//   int port = srv.start();   // bound (0: an ephemeral port); serving on background threads
//   ...
//   srv.stop();
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (each streaming as SSE or not),
// GET /v1/models, GET /health, GET /metrics (Prometheus text). Connections pass the gate (guard.hpp: headers complete within
// the request timeout, bounded connections, a bounded pool); a quarter of the pool is kept
// for requests other than completions, so /health answers while completions wait. Before a
// handler runs, every request passes the trust checks (trust.hpp: Host, Origin/CORS, API key)
// and the body checks (no Content-Encoding, a length or chunks, at most max_body_bytes, counted
// as it is read, JSON at most 512 levels deep). The server is HTTP <-> engine only: a completion
// becomes a decode::engine_request (decode/engine.hpp), whose FIFO queue, admission, prefix cache
// and continuous batch run on a single model thread (engine::serve): up to `parallel` requests
// generate together, one batched pass per step, each with its own session, decoder and sampler;
// a request's output is what it would be alone (greedy). The engine streams tokens into the
// request's job, which its HTTP thread turns into the answer. A client that goes away is noticed
// (streaming: at the next write, tokens or keep-alive comments while it waits; otherwise by
// looking at its socket while waiting) and its request is abandoned: the engine drops it at the
// next step and the model moves on.
//
// Every error answer is JSON made with error_handler_t::replace: a path, header or message with
// bytes that are not UTF-8 cannot make a dump() throw.
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <algorithm>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "clover/decode/engine.hpp"
#include "clover/server/answer_json.hpp"
#include "clover/server/body_buffer.hpp"
#include "clover/server/metrics.hpp"
#include "clover/server/protocol.hpp"
#include "clover/server/response.hpp"
#include "clover/server/sse.hpp"
#include "clover/server/trust.hpp"

// After the library's headers: httplib pulls in <resolv.h>, whose `_res` macro breaks Eigen's
// templates when they come later.
#include "clover/server/guard.hpp"

namespace clover::server {

template <class Model>
class basic_server {
public:
    basic_server(Model& m, const tokenizer& tok, options o = {}) : model_(m), tok_(tok), opt_(std::move(o)) {
        fmt_ = chat::detect_format(tok_.chat_template());
        mi_.n_expert = m.hp().n_expert;
        mi_.diffusion_unavailable = m.diffusion_unavailable();
        if (opt_.ctx < 2) fail("serve: the context must hold at least 2 tokens");
        if (opt_.parallel < 1) fail("serve: --parallel must be at least 1");
        if (opt_.batch_tokens < 1) fail("serve: --batch-tokens must be at least 1");
        if (opt_.max_block < 1 || opt_.max_draft < 2 || opt_.max_rows_per_token < 0)
            fail("serve: --max-block must be at least 1, --max-draft at least 2, --max-rows-per-token at least 0");
        if (opt_.block > opt_.max_block) fail("serve: --block ", opt_.block, " is above --max-block ", opt_.max_block);
        if (opt_.cache_scope != "auto" && opt_.cache_scope != "key" && opt_.cache_scope != "global")
            fail("serve: --cache-scope must be key or global (got '", opt_.cache_scope, "')");
        if (opt_.api_key.empty() && !opt_.api_keys.empty()) fail("serve: more API keys given without a first one");
        if (opt_.cache_scope == "auto") opt_.cache_scope = opt_.api_key.empty() ? "global" : "key";
        if (opt_.decoder != "ar" && !mi_.diffusion_unavailable.empty())
            fail("serve: decoder '", opt_.decoder, "' needs block diffusion, which this model cannot run: ", mi_.diffusion_unavailable);
        // Prompt ids must be rows of the model. More rows than tokens is how checkpoints pad
        // their vocabulary; the worker refuses an id past the tokenizer if one is ever produced.
        if (tok_.n_vocab() > std::size_t(m.n_vocab()))
            fail("serve: the tokenizer has ", tok_.n_vocab(), " tokens but the model only ", m.n_vocab(),
                 " rows (token_embd): they do not belong together");
        if (opt_.http_threads < 2) fail("serve: at least 2 HTTP threads are needed");
        if (opt_.cache_ram_mib < 0) fail("serve: --cache-ram must not be negative");
        decode::engine_options eo;
        eo.parallel = opt_.parallel;
        eo.token_budget = opt_.batch_tokens;
        // exact: a request's output does not depend on what else is in the batch (free on quantized
        // weights; on F32/F16 ones batched products skip Eigen's blocking, whose sums depend on the rows).
        // fair: a request's passes take no more rows over time than another's (runner.hpp).
        eo.exact = eo.fair = true;
        eo.kv_f16 = opt_.kv_f16;
        eo.max_queue = opt_.max_queue;
        eo.cache_bytes = std::size_t(opt_.cache_ram_mib) << 20;
        if (auto b = tok_.find_token("<|im_start|>")) eo.boundary = *b;  // where chat messages start
        engine_.emplace(model_, eo);
        slots_ = opt_.http_threads - std::max(1, opt_.http_threads / 4);
        policy_.api_key = opt_.api_key;
        policy_.more_keys = opt_.api_keys;
        policy_.cors_origins = opt_.cors_origins;
        policy_.allowed_hosts = opt_.allowed_hosts;
        policy_.loopback = is_loopback_name(host_name(opt_.host));
    }
    basic_server(const basic_server&) = delete;
    ~basic_server() { stop(); }

    const options& opts() const { return opt_; }
    int port() const { return port_; }

    // Binds and starts serving; returns the bound port. Throws clover::error when it cannot bind.
    int start() {
        if (svr_) return port_;
        std::signal(SIGPIPE, SIG_IGN);  // a client that went away must not kill the process
        gate_options g;
        g.threads = opt_.http_threads;
        g.max_connections = std::size_t(std::max(1, opt_.max_connections));
        g.request_timeout = g.read_timeout = std::chrono::seconds(std::max(1, opt_.read_timeout_s));
        g.write_timeout = std::chrono::seconds(std::max(1, opt_.write_timeout_s));
        svr_ = std::make_unique<gated_server>(g);
        configure(*svr_);
        port_ = opt_.port == 0 ? svr_->bind_to_any_port(opt_.host) : (svr_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
        if (port_ <= 0) {
            svr_.reset();
            fail("serve: cannot listen on ", opt_.host, ":", opt_.port, " (address in use or not available)");
        }
        raise_backlog(port_);
        engine_->reopen();
        worker_ = std::thread([this] { engine_->serve(); });
        listener_ = std::thread([this] { svr_->listen_after_bind(); });
        // httplib's stop() does nothing until the server runs: a stop() right after start()
        // would leave the listener blocked in accept() and join() hanging (seen in test_server
        // under ASan, where the thread starts late). So start() returns once it runs.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!svr_->is_running() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return port_;
    }

    // Cancels what is queued and running, then stops listening. Idempotent.
    void stop() {
        if (!svr_) return;
        engine_->shutdown("the server is shutting down");
        if (worker_.joinable()) worker_.join();
        svr_->stop();
        if (listener_.joinable()) listener_.join();
        svr_.reset();
    }

    counters stats() const {
        counters c;
        static_cast<decode::engine_stats&>(c) = engine_->stats();
        c.rejected = rejected_;
        c.busy = c.running > 0;
        return c;
    }

private:
    // httplib listens with a backlog of 5: more clients connecting at once lose their SYN and
    // retry a second later. Linux lets listen() on the listening socket raise the backlog.
    static void raise_backlog(int port) {
#ifdef __linux__
        namespace fs = std::filesystem;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
            int fd = -1;
            try {
                fd = std::stoi(e.path().filename().string());
            } catch (...) {
                continue;
            }
            int listening = 0;
            socklen_t len = sizeof listening;
            if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
            sockaddr_storage addr{};
            socklen_t alen = sizeof addr;
            if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
            int p = -1;
            if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
            if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
            if (p == port) ::listen(fd, 512);
        }
#else
        (void)port;
#endif
    }

    // A completion's side of the engine: the tokens its sink has received so far, for the HTTP
    // thread that answers it (the engine's model thread appends, the HTTP thread waits).
    struct job {
        request req;
        std::shared_ptr<decode::request_handle> h;  // stop(): a stop string matched; abandon(): the client went away
        std::mutex mu;
        std::condition_variable cv;
        std::vector<token> tokens;  // produced so far (the model thread appends)
        std::vector<decode::token_logprob> logprobs;  // tokens' (request.gen.logprobs >= 0), in step
        bool finished = false;
        std::string error;
        decode::generate_stats stats;
        // The model thread's own: a token id without text, and the next token's log-probability
        // until its on_token takes it.
        std::string bad_token;
        std::optional<decode::token_logprob> lp;
    };

    static void finish_job(job& j, const std::string& error) {
        {
            std::lock_guard lk(j.mu);
            j.error = error;
            j.finished = true;
        }
        j.cv.notify_all();
    }

    // Waits up to `d` for tokens past `seen`; appends them to `out`. True when the job is over
    // and everything has been taken.
    static bool wait(job& j, std::size_t& seen, std::vector<token>& out, std::chrono::milliseconds d,
                     std::vector<decode::token_logprob>* lps = nullptr) {
        std::unique_lock lk(j.mu);
        j.cv.wait_for(lk, d, [&] { return j.finished || j.tokens.size() > seen; });
        out.insert(out.end(), j.tokens.begin() + std::ptrdiff_t(seen), j.tokens.end());
        if (lps && j.logprobs.size() == j.tokens.size())
            lps->insert(lps->end(), j.logprobs.begin() + std::ptrdiff_t(seen), j.logprobs.end());
        seen = j.tokens.size();
        return j.finished;
    }

    // The request goes to the engine (decode/engine.hpp), whose model thread streams its tokens
    // into the job.
    std::shared_ptr<job> submit(request r) {
        auto j = std::make_shared<job>();
        j->req = std::move(r);
        decode::engine_request<decoder_choice> er;
        er.prompt = j->req.prompt;
        er.gen = j->req.gen;
        er.dec = j->req.dec;
        er.ctx = j->req.ctx;
        er.cache_prompt = j->req.cache_prompt;
        er.cache_scope = j->req.cache_scope;
        er.sink.on_logprob = [j](const decode::token_logprob& lp) { j->lp = lp; };
        er.sink.on_token = [j, n_vocab = tok_.n_vocab()](token t) {
            if (t < 0 || std::size_t(t) >= n_vocab) {
                j->bad_token = "the model produced token id " + std::to_string(t) + ", which its tokenizer (" + std::to_string(n_vocab) +
                               " tokens) has no text for";
                return false;
            }
            {
                std::lock_guard lk(j->mu);
                if (j->lp) j->logprobs.push_back(std::move(*j->lp));
                j->lp.reset();
                j->tokens.push_back(t);
            }
            j->cv.notify_all();
            return true;
        };
        er.sink.on_end = [j](const decode::engine_result& res) {
            {
                std::lock_guard lk(j->mu);
                j->stats = res.stats;
            }
            finish_job(*j, res.error.empty() ? j->bad_token : res.error);
        };
        try {
            j->h = engine_->submit(std::move(er));
        } catch (const decode::engine_refused& e) {
            if (e.shutting_down) throw http_error(503, "the server is shutting down", {}, "server_error");
            throw http_error(503, "the server is busy: " + std::to_string(e.queued) + " requests are waiting; retry later", {},
                             "server_error");
        }
        return j;
    }

    static std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
    static void reply_error(httplib::Response& res, int status, const std::string& msg, const std::string& type = {},
                            const std::string& param = {}) {
        res.status = status;
        // Every 503 says when to come back (the README promises it; the queue-full one lacked it).
        if (status == 503 && !res.has_header("Retry-After")) res.set_header("Retry-After", "1");
        res.set_content(dump(error_body(status, msg, type, param)), "application/json");
    }

    bool is_route(const std::string& method, const std::string& path) const {
        static const char* posts[] = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"};
        if (method == "POST") return std::any_of(std::begin(posts), std::end(posts), [&](const char* p) { return path == p; });
        return true;  // GET and HEAD: httplib's router answers 404 itself, with nothing to read
    }

    // The body's framing, for every method (RFC 9112 6.3): a length and chunks together, or two
    // different lengths, make the request's end ambiguous (the way requests are smuggled past
    // a proxy), and httplib would read chunks where the client sent a plain body and wait for
    // the read timeout. An empty string: fine.
    static std::string framing_problem(const httplib::Request& req) {
        const std::size_t lengths = req.get_header_value_count("Content-Length");
        if (lengths > 0 && req.has_header("Transfer-Encoding"))
            return "the request has both Content-Length and Transfer-Encoding; send one of them";
        for (std::size_t i = 0; i < lengths; ++i) {
            const std::string len = req.get_header_value("Content-Length", i);
            if (len.empty() || !std::all_of(len.begin(), len.end(), [](char c) { return c >= '0' && c <= '9'; }))
                return "the Content-Length '" + len + "' is not a number of bytes";
            if (len != req.get_header_value("Content-Length", 0)) return "the request has two different Content-Length headers";
        }
        return {};
    }

    // Before routing, and before any body is read: method, Host, Origin/CORS, body framing,
    // API key. Handled: the answer is in `res`.
    httplib::Server::HandlerResponse admit(const httplib::Request& req, httplib::Response& res) {
        using R = httplib::Server::HandlerResponse;
        if (const std::string bad = framing_problem(req); !bad.empty()) return reply_error(res, 400, bad), R::Handled;
        const std::string& m = req.method;
        if (m != "GET" && m != "HEAD" && m != "POST" && m != "OPTIONS") {
            res.set_header("Allow", "GET, HEAD, POST, OPTIONS");
            reply_error(res, 405, "method " + m + " is not allowed (GET, POST, OPTIONS)");
            return R::Handled;
        }
        const std::string host = req.get_header_value("Host");
        if (!policy_.host_ok(host))
            return reply_error(res, 403, "Host '" + host + "' is not this server (a DNS-rebinding page?); a reverse proxy's name "
                                         "can be allowed with --allow-host NAME", "permission_error"), R::Handled;
        const std::string origin = req.get_header_value("Origin");
        const auto kind = policy_.origin(origin, host);
        if (kind == access_policy::origin_kind::refused)
            return reply_error(res, 403, "cross-origin request from '" + origin + "' refused; allow it with --cors " + origin,
                               "permission_error"), R::Handled;
        if (kind == access_policy::origin_kind::allowed) {
            res.set_header("Access-Control-Allow-Origin", policy_.any_origin() ? std::string("*") : origin);
            res.set_header("Vary", "Origin");
        }
        if (m == "OPTIONS") {  // a CORS preflight (or a plain OPTIONS): never needs the key
            res.status = 204;
            res.set_header("Allow", "GET, HEAD, POST, OPTIONS");
            if (kind == access_policy::origin_kind::allowed) {
                res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
                const std::string asked = req.get_header_value("Access-Control-Request-Headers");
                res.set_header("Access-Control-Allow-Headers", asked.empty() ? "authorization, content-type, x-api-key" : asked);
                res.set_header("Access-Control-Max-Age", "600");
            }
            return R::Handled;
        }
        if (m == "POST") {
            if (!is_route(m, req.path)) return reply_error(res, 404, "no such endpoint: POST " + req.path), R::Handled;
            const std::string enc = lower(req.get_header_value("Content-Encoding"));
            if (!enc.empty() && enc != "identity")
                return reply_error(res, 415, "Content-Encoding '" + enc + "' is not accepted: send the body uncompressed"), R::Handled;
            if (lower(req.get_header_value("Content-Type")).starts_with("multipart/"))
                return reply_error(res, 415, "multipart bodies are not accepted: send JSON"), R::Handled;
            const std::string te = lower(req.get_header_value("Transfer-Encoding"));
            if (!te.empty() && te != "chunked")
                return reply_error(res, 501, "Transfer-Encoding '" + te + "' is not supported (chunked is)"), R::Handled;
            if (te.empty()) {
                if (!req.has_header("Content-Length"))
                    return reply_error(res, 411, "a request body needs a Content-Length (or chunked transfer encoding)"), R::Handled;
                const std::string len = req.get_header_value("Content-Length");  // digits (framing_problem)
                if (len.size() > 18 || std::stoull(len) > opt_.max_body_bytes) return reply_error(res, 413, body_too_large()), R::Handled;
                if (socket_stream* s = gated_server::current()) s->set_body_length(std::stoull(len));
            }
        }
        if (req.path != "/health" && req.path != "/v1/health" &&
            !policy_.key_ok(req.get_header_value("Authorization"), req.get_header_value("X-Api-Key")))
            return reply_error(res, 401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                               "authentication_error"), R::Handled;
        return R::Unhandled;
    }
    std::string body_too_large() const { return "the request body is larger than " + std::to_string(opt_.max_body_bytes) + " bytes"; }

    // The body, counted as it arrives (chunked and length-less bodies too), within the
    // request's deadline. False: the answer is in `res`.
    bool read_body(const httplib::ContentReader& reader, httplib::Response& res, body_buffer& body) {
        const auto deadline = gated_server::request_deadline();
        // One piece of the declared size (at most max_body_bytes, checked in admit), given back
        // to the system when the request ends (body_buffer.hpp: freed memory stayed in glibc's arenas).
        if (const socket_stream* s = gated_server::current(); s && s->body_length() <= opt_.max_body_bytes) body.reserve(s->body_length());
        int refuse = 0;
        const bool ok = reader([&](const char* d, std::size_t n) {
            if (body.size() + n > opt_.max_body_bytes) refuse = 413;
            else if (std::chrono::steady_clock::now() > deadline) refuse = 408;
            else body.append(d, n);
            return refuse == 0;
        });
        const socket_stream* strm = gated_server::current();
        if (refuse == 413) reply_error(res, 413, body_too_large());
        else if (refuse == 408 || (!ok && strm && strm->deadline_passed()))
            reply_error(res, 408, "the request body did not arrive within " + std::to_string(opt_.read_timeout_s) + " s");
        else if (!ok) reply_error(res, 400, "the request body could not be read (malformed chunks, or the client went away)");
        return ok && refuse == 0;
    }

    // Completions in flight (reading, waiting, generating or streaming), at most slots_: the
    // rest of the pool stays free for /health, /v1/models and quick refusals.
    struct slot {
        explicit slot(basic_server& s) : srv(s) {}
        slot(const slot&) = delete;
        ~slot() { --srv.in_flight_; }
        basic_server& srv;
    };
    std::shared_ptr<slot> take_slot() {
        if (++in_flight_ > slots_) {
            --in_flight_;
            return nullptr;
        }
        return std::make_shared<slot>(*this);
    }

    void configure(httplib::Server& svr) {
        svr.set_payload_max_length(opt_.max_body_bytes);
        svr.set_read_timeout(opt_.read_timeout_s);
        svr.set_write_timeout(opt_.write_timeout_s);
        svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            try {
                return admit(req, res);
            } catch (const std::exception& e) {
                reply_error(res, 400, std::string("bad request: ") + e.what());
                return httplib::Server::HandlerResponse::Handled;
            }
        });
        // Runs outside httplib's try block: it must not throw (a path that is not UTF-8 used to
        // make dump() throw here and end the process).
        svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            try {
                std::string msg = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                                  : res.status == 413 ? body_too_large()
                                  : res.status == 405 ? "method not allowed"
                                                      : "HTTP error " + std::to_string(res.status);
                res.set_content(dump(error_body(res.status, msg)), "application/json");
            } catch (...) {
                res.set_content(R"({"error": {"message": "HTTP error", "type": "invalid_request_error", "param": null, "code": 400}})",
                                "application/json");
            }
        });
        svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string msg = "internal error";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                msg = e.what();
            } catch (...) {
            }
            reply_error(res, 500, msg);
        });
        auto health = [this](const httplib::Request& req, httplib::Response& res) {
            const std::string broken = model_broken();
            json j = {{"status", broken.empty() ? "ok" : "error"}};
            // Counters tell a stranger how busy the server is and what it serves: with a key,
            // only for whoever has it.
            if (opt_.api_key.empty() || policy_.key_ok(req.get_header_value("Authorization"), req.get_header_value("X-Api-Key"))) {
                const counters c = stats();
                j = {{"status", broken.empty() ? "ok" : "error"}, {"model", opt_.model_id}, {"busy", c.busy}, {"running", c.running},
                     {"queued", c.queued}, {"requests", c.requests}, {"completed", c.completed}, {"cancelled", c.cancelled}};
                if (!broken.empty()) j["error"] = broken;
            }
            if (!broken.empty()) res.status = 503;
            res.set_content(dump(j), "application/json");
        };
        svr.Get("/health", health);
        svr.Get("/v1/health", health);
        // Prometheus text format (version 0.0.4). With an API key it needs the key, as /v1 does.
        svr.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
            if (!opt_.api_key.empty() && !policy_.key_ok(req.get_header_value("Authorization"), req.get_header_value("X-Api-Key")))
                return reply_error(res, 401, "/metrics needs the API key (Authorization: Bearer KEY)", "authentication_error");
            res.set_content(metrics_text(stats(), opt_), "text/plain; version=0.0.4");
        });
        auto models = [this](const httplib::Request&, httplib::Response& res) {
            json list = {{"object", "list"}, {"data", json::array({model_json()})}};
            res.set_content(dump(list), "application/json");
        };
        svr.Get("/v1/models", models);
        svr.Get("/models", models);
        svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
            if (req.matches[1] != opt_.model_id)
                return reply_error(res, 404, "the model '" + std::string(req.matches[1]) + "' does not exist", {}, "model");
            res.set_content(dump(model_json()), "application/json");
        });
        // Content-reader handlers: httplib hands us the body as it arrives instead of reading
        // all of it first (chunked and length-less bodies had no bound).
        auto chat_h = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
            completion(req, res, rd, true);
        };
        auto text_h = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
            completion(req, res, rd, false);
        };
        svr.Post("/v1/chat/completions", chat_h);
        svr.Post("/chat/completions", chat_h);
        svr.Post("/v1/completions", text_h);
        svr.Post("/completions", text_h);
    }

    json model_json() const {
        return {{"id", opt_.model_id}, {"object", "model"}, {"created", created_}, {"owned_by", "clover"},
                {"meta", {{"n_ctx", opt_.ctx}, {"max_tokens", opt_.max_tokens_limit}, {"n_vocab", model_.n_vocab()},
                          {"chat_format", std::string(chat::format_name(fmt_))}, {"diffusion", mi_.diffusion_unavailable.empty()}}}};
    }

    void rejected() {
        ++rejected_;
    }

    // The prefix cache's scope of a request (prefix_cache.hpp): its API key's (--cache-scope key)
    // and its cache_salt, each part in its own unambiguous form.
    std::string cache_scope_of(const httplib::Request& h, const request& r) const {
        std::string s;
        if (opt_.cache_scope == "key" && !opt_.api_key.empty())
            s = "key " + std::to_string(policy_.key_index(h.get_header_value("Authorization"), h.get_header_value("X-Api-Key")));
        if (!r.cache_salt.empty()) s += "\nsalt " + r.cache_salt;
        return s;
    }

    // Why the model can no longer run, or "": a model type that can fail for good (a model split
    // over processes whose stage is gone: pipeline::pipeline) says so through broken().
    std::string model_broken() const {
        if constexpr (requires(Model& m) { { m.broken() } -> std::convertible_to<std::string>; }) return model_.broken();
        else return {};
    }

    void completion(const httplib::Request& hreq, httplib::Response& res, const httplib::ContentReader& reader, bool chat_api) {
        if (const std::string why = model_broken(); !why.empty()) {
            rejected();  // reply_error adds Retry-After to every 503
            return reply_error(res, 503, "the model cannot run: " + why, "server_error");
        }
        auto held = take_slot();
        if (!held) {
            rejected();  // reply_error adds Retry-After to every 503
            return reply_error(res, 503, "the server is busy: " + std::to_string(slots_) + " completion requests are in progress; retry later",
                               {}, "server_error");
        }
        body_buffer text;
        if (!read_body(reader, res, text)) return rejected();
        std::shared_ptr<job> j;
        try {
            request r = parse_request(parse_body(text.view()), chat_api, tok_, mi_, opt_, fmt_);
            text.release();
            r.cache_scope = cache_scope_of(hreq, r);
            j = submit(std::move(r));
        } catch (const http_error& e) {
            rejected();
            return reply_error(res, e.status, e.what(), e.type, e.param);
        } catch (const std::exception& e) {  // e.g. a json type error the checks missed
            rejected();
            return reply_error(res, 400, std::string("bad request: ") + e.what());
        }
        const std::string id = std::string(chat_api ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
        const std::int64_t created = std::int64_t(std::time(nullptr));
        if (!j->req.stream) {
            response_builder rb(tok_, j->req);
            std::size_t seen = 0, offset = 0;
            std::vector<token> got;
            std::vector<decode::token_logprob> lps;
            for (bool done = false; !done;) {
                got.clear();
                done = wait(*j, seen, got, std::chrono::milliseconds(100), &lps);
                for (token t : got) rb.push(t);
                if (rb.stopped_by_string()) j->h->stop();
                if (!done && gated_server::client_gone()) {  // nobody will read the answer: stop making it
                    j->h->abandon();
                    reply_error(res, 400, "the client went away");
                    return;
                }
            }
            rb.finish();
            if (!j->error.empty())  // 503 when the model failed for good (model_broken), else 500
                return reply_error(res, model_broken().empty() ? 500 : 503, "generation failed: " + j->error, "server_error");
            json choice = {{"index", 0}};
            if (chat_api) choice["message"] = rb.message();
            else choice["text"] = rb.text_so_far();
            choice["logprobs"] = answer_logprobs(tok_, j->req, lps, offset);
            choice["finish_reason"] = finish_reason(rb, j->stats);
            json out = {{"id", id}, {"object", chat_api ? "chat.completion" : "text_completion"}, {"created", created},
                        {"model", opt_.model_id}, {"choices", json::array({choice})}, {"usage", usage_json(j->req, j->stats)},
                        {"timings", timings_json(j->req, j->stats)}};
            res.set_content(dump(out), "application/json");
            return;
        }
        struct stream_state {
            std::shared_ptr<job> j;
            std::shared_ptr<slot> held;  // the completion slot, until the stream ends
            response_builder rb;
            std::size_t seen = 0, offset = 0;
            std::vector<decode::token_logprob> lps;  // of tokens whose text no chunk has carried yet
            bool started = false;
            std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
            stream_state(std::shared_ptr<job> jj, std::shared_ptr<slot> h, const tokenizer& tok)
                : j(std::move(jj)), held(std::move(h)), rb(tok, j->req) {}
        };
        auto st = std::make_shared<stream_state>(j, std::move(held), tok_);
        auto chunk = [this, id, created, chat_api](json delta, json finish, json logprobs) {
            json c = {{"index", 0}};
            if (chat_api) c["delta"] = std::move(delta);
            else c["text"] = delta.value("text", "");
            c["logprobs"] = std::move(logprobs);
            c["finish_reason"] = std::move(finish);
            return json{{"id", id}, {"object", chat_api ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                        {"model", opt_.model_id}, {"choices", json::array({c})}};
        };
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, st, chunk, chat_api](std::size_t, httplib::DataSink& sink) {
                // httplib calls this outside its try block: an exception here used to end the process.
                try {
                    return stream_step(*st, chunk, chat_api, sink);
                } catch (const std::exception& e) {
                    st->j->h->abandon();
                    const std::string ev = sse_data(error_body(500, std::string("streaming failed: ") + e.what())) + sse_done();
                    sink.write(ev.data(), ev.size());
                    sink.done();
                    return true;
                } catch (...) {
                    st->j->h->stop();
                    return false;
                }
            },
            [st](bool success) {
                if (!success) {
                    st->j->h->abandon();
                }
            });
    }

    template <class State, class Chunk>
    bool stream_step(State& state, const Chunk& chunk, bool chat_api, httplib::DataSink& sink) {
        State* st = &state;
        auto gone = [&] {
            st->j->h->abandon();
            return false;
        };
        auto put = [&](const std::string& s) {
            st->last_write = std::chrono::steady_clock::now();
            return sink.write(s.data(), s.size());
        };
        if (!st->started) {
            st->started = true;
            json d = chat_api ? json{{"role", "assistant"}, {"content", ""}} : json{{"text", ""}};
            if (!put(sse_data(chunk(d, nullptr, nullptr)))) return gone();
        }
        std::vector<token> got;
        std::vector<decode::token_logprob> fresh;
        const bool done = wait(*st->j, st->seen, got, std::chrono::milliseconds(100), &fresh);
        // A token's log-probability rides on the first chunk that carries text after it came.
        auto lp = [&] {
            json v = st->lps.empty() ? json(nullptr) : answer_logprobs(tok_, st->j->req, st->lps, st->offset);
            st->lps.clear();
            return v;
        };
        for (std::size_t i = 0; i < got.size(); ++i) {
            if (i < fresh.size()) st->lps.push_back(std::move(fresh[i]));
            for (auto& d : st->rb.push(got[i]))
                if (!put(sse_data(chunk(std::move(d), nullptr, lp())))) return gone();
        }
        if (st->rb.stopped_by_string()) st->j->h->stop();
        if (!done) {
            if (got.empty() && std::chrono::steady_clock::now() - st->last_write > std::chrono::milliseconds(250))
                if (!put(sse_comment("waiting"))) return gone();
            return true;
        }
        for (auto& d : st->rb.finish())
            if (!put(sse_data(chunk(std::move(d), nullptr, lp())))) return gone();
        if (!st->j->error.empty()) {
            if (!put(sse_data(error_body(500, "generation failed: " + st->j->error)))) return gone();
        } else {
            json last = chunk(json::object(), finish_reason(st->rb, st->j->stats), lp());
            last["usage"] = usage_json(st->j->req, st->j->stats);
            last["timings"] = timings_json(st->j->req, st->j->stats);
            if (!put(sse_data(last))) return gone();
            if (st->j->req.include_usage) {
                json u = last;
                u["choices"] = json::array();
                u.erase("timings");
                if (!put(sse_data(u))) return gone();
            }
        }
        if (!put(sse_done())) return gone();
        sink.done();
        return true;
    }

    Model& model_;
    const tokenizer& tok_;
    options opt_;
    chat::format fmt_;
    model_info mi_;
    std::int64_t created_ = std::int64_t(std::time(nullptr));
    std::atomic<std::int64_t> next_id_{1};

    // The queue, admission, the prefix cache and the batch runner; its model thread is worker_.
    std::optional<decode::engine<Model, decoder_choice>> engine_;
    std::atomic<std::int64_t> rejected_{0};  // 4xx / 503 answers to completion requests

    access_policy policy_;
    int slots_ = 1;
    std::atomic<int> in_flight_{0};

    std::unique_ptr<gated_server> svr_;
    std::thread worker_, listener_;
    int port_ = -1;
};

// The server over the runtime model type (dimensions from the file, CPU backend).
using server = basic_server<model<variants::from_file, backend::cpu>>;

}  // namespace clover::server
