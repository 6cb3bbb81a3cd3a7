#pragma once
// The gate in front of cpp-httplib: limits that hold before a request reaches a handler.
//
// httplib serves each connection on a pool thread that reads at the client's pace, and its
// default task queue has no bound: forty clients trickling their headers a byte a second, or
// sixty-four waiting for the model, leave no thread for /health. So gated_server takes every
// accepted socket itself (httplib hands it over through a TaskQueue that runs the accept
// callback inline, and the virtual process_and_close_socket):
//   * one admission thread holds new connections, without a pool thread, until their request
//     headers are complete, answering 408 past the request timeout, 431 past max_header_bytes,
//     400 for lines not ended by CRLF and 503 past max_connections. It reads what arrives into
//     the connection's own buffer (handed to the pool with it) rather than peeking: a peek
//     keeps returning the bytes already there, so a client that sent a few bytes and closed
//     looked alive until the request timeout, and 300 such ghosts locked everyone out with
//     503s (issue 38). Reading, a close is seen at once as the end of the stream;
//   * then a bounded pool serves them through httplib's Server::process_request, one request
//     per connection (no keep-alive: an idle kept-alive connection would hold a thread), over
//     our own socket stream, whose reads stop at the request's deadline (headers and body
//     within the request timeout, however slowly they trickle);
//   * answered connections are closed politely (FIN, then what the client still sends is
//     drained for a moment) so that an early 4xx is not lost to a reset.
// Handlers can ask whether their client is still there (client_gone), which is how a
// non-streaming request notices a client that hung up. A FIN alone does not say: a client
// that only shut down its sending side (`nc -N`, some proxies) still reads its answer, while
// one that closed resets anything sent to it. So at the first FIN an HTTP/1.1 client is sent
// an interim "100 Continue" (RFC 9110 15.2: clients must accept unexpected 1xx responses); a
// closed one answers with a reset, which the next look sees.
//
// After a request that read more than 1 MiB, the pool thread gives the allocator's free memory
// back to the system (malloc_trim): glibc keeps freed chunks in per-thread arenas, so 24 pool
// threads each keeping the space of a 4 MiB body (and its JSON tree) held ~1.3 GiB for good.
//
// Why we stay on Debian's cpp-httplib (libcpp-httplib-dev 0.11.4): it is packaged and
// maintained in Debian 12, already does HTTP parsing, routing, chunked responses and error
// pages for us, and its protected process_request plus this gate close the gaps found in
// issue 18 (unbounded queue, slow clients, unbounded chunked/length-less/compressed bodies,
// which server.hpp bounds with a counting content reader and by refusing Content-Encoding).
// Newer httplib releases have some of these knobs, but not in Debian 12; a libevent or Boost.Beast
// server would be a rewrite of what works. Revisit if Debian ships a release with a header
// deadline and a bounded queue.
#include <arpa/inet.h>
#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

// httplib pulls in <resolv.h>, whose `_res` macro breaks Eigen's templates when they come
// later; server.hpp includes the library's headers first.
#include <httplib.h>

namespace clover::server {

struct gate_options {
    int threads = 32;                      // requests served at once (pool threads)
    std::size_t max_connections = 256;     // open at once: waiting for headers, queued and served
    std::chrono::milliseconds request_timeout{30000};  // headers and body must arrive within this
    std::chrono::milliseconds read_timeout{30000}, write_timeout{30000};  // one read / one write
    std::size_t max_header_bytes = 16384;  // request line and headers
};

namespace gate_detail {

using clock = std::chrono::steady_clock;
#ifdef POLLRDHUP
inline constexpr short peer_closed = POLLRDHUP;  // Linux: the peer shut its side down
#else
inline constexpr short peer_closed = 0;  // elsewhere a peek that reads 0 bytes says it
#endif

inline int ms_until(clock::time_point t) {  // rounded up: 0 only once t has come
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - clock::now()).count();
    return int(std::clamp<long long>(ms, 0, 1 << 30));
}

inline bool wait_for(int fd, short events, int timeout_ms) {
    pollfd p{fd, events, 0};
    for (;;) {
        const int r = ::poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        return r > 0 && (p.revents & (events | POLLHUP | POLLERR));
    }
}

inline const char* reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

// Where the request line and headers end (just past the blank line), or npos while incomplete.
inline std::size_t head_end(std::string_view s, std::size_t from = 0) {
    const std::size_t at = s.find("\r\n\r\n", from < 3 ? 0 : from - 3);
    return at == std::string_view::npos ? at : at + 4;
}

// A CR or LF that is not part of a CRLF in the request line and headers (a CR at the very end
// may still get its LF). RFC 9112 2.2 lets a server refuse such lines; httplib and our search
// for the blank line only know CRLF, so a request ending its lines in a bare LF used to wait
// for the request timeout. Looks at head[from, to) only: what was looked at before is not
// looked at again (a header sent a byte at a time must not cost a pass over all of it per byte).
inline bool bare_line_break(std::string_view head, std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
        if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) return true;
        if (head[i] == '\r' && i + 1 < head.size() && head[i + 1] != '\n') return true;
    }
    return false;
}

// A complete small response, written without blocking (the socket's send buffer is empty).
inline void send_error(int fd, int status, const std::string& message) {
    nlohmann::json e = {{"error", {{"message", message}, {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                                   {"param", nullptr}, {"code", status}}}};
    const std::string body = e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
                    "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n\r\n" + body;
    if (status == 503) r.insert(r.find("\r\n") + 2, "Retry-After: 1\r\n");
    (void)::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace gate_detail

// httplib's Stream over one accepted socket, for one request: buffered reads that give up at
// the request's deadline or after read_timeout without data, writes that give up after
// write_timeout.
class socket_stream final : public httplib::Stream {
public:
    // `head`: what the admission thread already read (the headers, maybe the start of the
    // body), served before the socket. `http11`: the request line said HTTP/1.1 (a 1xx may be sent).
    socket_stream(int fd, gate_detail::clock::time_point deadline, const gate_options& o, std::string head = {}, bool http11 = false)
        : fd_(fd), deadline_(deadline), read_timeout_(o.read_timeout), write_timeout_(o.write_timeout), head_(std::move(head)),
          http11_(http11), bytes_read_(head_.size()) {}

    bool is_readable() const override { return head_pos_ < head_.size() || pos_ < len_ || wait_read(); }
    bool is_writable() const override { return gate_detail::wait_for(fd_, POLLOUT, int(write_timeout_.count())); }
    ssize_t read(char* ptr, size_t size) override {
        if (head_pos_ < head_.size()) {
            const std::size_t n = std::min(size, head_.size() - head_pos_);
            std::memcpy(ptr, head_.data() + head_pos_, n);
            head_pos_ += n;
            if (head_pos_ == head_.size()) {  // done with it: free it now
                std::string().swap(head_);
                head_pos_ = 0;
            }
            return ssize_t(n);
        }
        if (pos_ == len_) {
            if (!wait_read()) return -1;
            const ssize_t n = ::recv(fd_, buf_, sizeof buf_, 0);
            if (n <= 0) return n;
            pos_ = 0;
            len_ = std::size_t(n);
            bytes_read_ += std::size_t(n);
        }
        const std::size_t n = std::min(size, len_ - pos_);
        std::memcpy(ptr, buf_ + pos_, n);
        pos_ += n;
        return ssize_t(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
        if (!is_writable()) return -1;
        return ::send(fd_, ptr, size, MSG_NOSIGNAL);
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
    void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
    socket_t socket() const override { return fd_; }

    gate_detail::clock::time_point deadline() const { return deadline_; }
    // A read gave up because the request's time was over (not because data stopped or broke).
    bool deadline_passed() const { return deadline_passed_; }
    // Bytes of the request read so far (headers and body).
    std::size_t bytes_read() const { return bytes_read_; }
    // The body's Content-Length once the server has checked it (0: none or not yet), so that the
    // body can be read into one allocation of its size rather than a doubling string.
    void set_body_length(std::size_t n) { body_length_ = n; }
    std::size_t body_length() const { return body_length_; }
    // The client closed the connection or it broke (never reads). A client that only finished
    // sending (FIN) is still there: an HTTP/1.1 one is sent "100 Continue" once, to which a
    // closed socket answers with a reset that a later call sees (an HTTP/1.0 client cannot be
    // asked: it keeps its answer). Only for a handler that has not started its response.
    bool peer_gone() const {
        pollfd p{fd_, short(POLLIN | gate_detail::peer_closed), 0};
        if (::poll(&p, 1, 0) <= 0) return false;
        if (p.revents & (POLLHUP | POLLERR)) return true;  // reset (or closed both ways)
        bool fin = (p.revents & gate_detail::peer_closed) != 0;
        if (!fin && (p.revents & POLLIN)) {
            char c;
            const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
            fin = n == 0;
        }
        if (!fin || probed_) return false;
        probed_ = true;
        if (!http11_) return false;
        static constexpr std::string_view probe = "HTTP/1.1 100 Continue\r\n\r\n";
        const ssize_t n = ::send(fd_, probe.data(), probe.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    }

private:
    bool wait_read() const {
        // Past the deadline, only what has already arrived is read (a request that waited for a
        // thread still has its headers); the body reader refuses late bytes itself.
        const int left = gate_detail::ms_until(deadline_);
        if (gate_detail::wait_for(fd_, POLLIN, std::min(left, int(read_timeout_.count())))) return true;
        deadline_passed_ = gate_detail::clock::now() >= deadline_;
        return false;
    }
    void address(bool remote, std::string& ip, int& port) const {
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        ip.clear();
        port = -1;
        if ((remote ? ::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) : ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len)) != 0)
            return;
        char text[INET6_ADDRSTRLEN] = {};
        if (a.ss_family == AF_INET) {
            auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
            ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
            port = ntohs(v4->sin_port);
        } else if (a.ss_family == AF_INET6) {
            auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
            ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
            port = ntohs(v6->sin6_port);
        }
        ip = text;
    }

    int fd_;
    gate_detail::clock::time_point deadline_;
    std::chrono::milliseconds read_timeout_, write_timeout_;
    std::string head_;
    std::size_t head_pos_ = 0;
    bool http11_;
    std::size_t bytes_read_, body_length_ = 0;
    char buf_[16384];
    std::size_t pos_ = 0, len_ = 0;
    mutable bool deadline_passed_ = false, probed_ = false;
};

class gated_server : public httplib::Server {
public:
    explicit gated_server(gate_options o) : o_(std::move(o)) {
        o_.threads = std::max(1, o_.threads);
        o_.max_connections = std::max<std::size_t>(1, o_.max_connections);
        new_task_queue = [this] { return new inline_queue(*this); };
#if defined(__GLIBC__)
        // glibc raises its mmap threshold to the size of any large block freed (up to 32 MiB) and
        // its trim threshold to twice that; blocks below it then come from the threads' arenas,
        // and a thread arena's top goes back to the system only past the raised trim threshold
        // (malloc_trim trims the main arena's top alone). Across 32 pool threads and the model's,
        // bursts of requests left ~30 MiB beside a ~21 MiB idle server (the hostile-load test;
        // ~20 MiB with the threshold fixed at 1 MiB). Fixed at glibc's starting value, 128 KiB,
        // larger blocks are mapped and unmapped at once and arena tops are trimmed past 128 KiB
        // (a page-fault cost for temporaries of that size). Process-wide, once: an application
        // that tunes malloc itself can call mallopt again after start().
        static const bool fixed_threshold = ::mallopt(M_MMAP_THRESHOLD, 128 << 10) == 1;
        (void)fixed_threshold;
#endif
    }
    ~gated_server() override { stop_gate(); }

    // The stream of the request this thread is handling (nullptr outside a handler).
    static socket_stream* current() { return current_; }
    // True when the client of the request this thread handles has gone away.
    static bool client_gone() { return current_ && current_->peer_gone(); }
    // When the request this thread handles must have arrived (headers and body).
    static gate_detail::clock::time_point request_deadline() {
        return current_ ? current_->deadline() : gate_detail::clock::time_point::max();
    }
    std::size_t open_connections() const { return open_.load(); }

protected:
    // httplib's accept loop calls this (through inline_queue) with each accepted socket.
    bool process_and_close_socket(socket_t sock) override {
        admit(sock);
        return true;
    }

private:
    using clock = gate_detail::clock;

    // httplib asks for a TaskQueue to run "serve this socket" on; we run it at once, on the
    // accept thread, which lands in process_and_close_socket above: a hand-over, not the work.
    struct inline_queue : httplib::TaskQueue {
        explicit inline_queue(gated_server& s) : srv(s) { srv.start_gate(); }
        void enqueue(std::function<void()> fn) override { fn(); }
        void shutdown() override { srv.stop_gate(); }
        gated_server& srv;
    };

    struct waiting {
        int fd;
        clock::time_point since, deadline;
        std::string head;    // read so far: request line and headers (and body bytes sent with them)
        std::size_t scanned = 0;  // head[0, scanned) holds no blank line and no bare CR or LF
        bool ready = true;   // poll found it readable (a new one is tried at once)
        bool http11 = false;
    };
    struct lingering {
        int fd;
        clock::time_point until;
        std::size_t drained = 0;
    };

    void start_gate() {
        std::lock_guard lk(mu_);
        if (running_) return;
        running_ = true;
        if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
        admission_ = std::thread([this] { admission_loop(); });
        for (int i = 0; i < o_.threads; ++i) pool_.emplace_back([this] { worker_loop(); });
    }

    void stop_gate() {
        {
            std::lock_guard lk(mu_);
            if (!running_) return;
            running_ = false;
            for (int fd : active_) ::shutdown(fd, SHUT_RDWR);  // unblock reads of slow clients
        }
        wake();
        cv_.notify_all();
        if (admission_.joinable()) admission_.join();
        for (auto& t : pool_) t.join();
        pool_.clear();
        std::lock_guard lk(mu_);
        for (auto& w : waiting_) ::close(w.fd);
        for (auto& w : pending_) ::close(w.fd);
        for (auto& l : lingering_) ::close(l.fd);
        waiting_.clear();
        pending_.clear();
        lingering_.clear();
        open_ = 0;
        for (int& fd : wake_) {
            if (fd >= 0) ::close(fd);
            fd = -1;
        }
    }

    void wake() {
        if (wake_[1] >= 0) {
            const char c = 1;
            (void)!::write(wake_[1], &c, 1);
        }
    }

    void admit(int fd) {
        std::lock_guard lk(mu_);
        if (!running_) {
            ::close(fd);
            return;
        }
        if (open_ >= o_.max_connections) {
            gate_detail::send_error(fd, 503, "too many open connections (" + std::to_string(o_.max_connections) + "); retry later");
            linger_locked(fd);
            return;
        }
        ++open_;
        const auto now = clock::now();
        waiting_.push_back({fd, now, now + o_.request_timeout, {}});
        wake();
    }

    // Answered or refused: FIN after what we wrote, then read what the client still sends
    // for a moment, so that its unread request does not turn our answer into a reset.
    void linger_locked(int fd) {
        ::shutdown(fd, SHUT_WR);
        if (lingering_.size() >= o_.max_connections) {
            ::close(fd);
            return;
        }
        lingering_.push_back({fd, clock::now() + std::chrono::milliseconds(500)});
        wake();
    }

    void refuse_locked(const waiting& w, int status, const std::string& message) {
        gate_detail::send_error(w.fd, status, message);
        --open_;
        linger_locked(w.fd);
    }

    // Reads what `w` has sent, up to max_header_bytes + 1 in all. False: the client closed (or
    // the connection broke) before its headers were complete.
    bool read_head(waiting& w) {
        for (;;) {
            const std::size_t have = w.head.size();
            if (have > o_.max_header_bytes) return true;
            w.head.resize(have + std::min<std::size_t>(o_.max_header_bytes + 1 - have, 16384));
            const ssize_t n = ::recv(w.fd, w.head.data() + have, w.head.size() - have, MSG_DONTWAIT);
            w.head.resize(have + std::size_t(std::max<ssize_t>(n, 0)));
            if (n <= 0) return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
            if (gate_detail::head_end(w.head, have) != std::string::npos) return true;
        }
    }

    void admission_loop() {
        std::vector<pollfd> fds;
        std::unique_lock lk(mu_);
        while (running_) {
            fds.clear();
            fds.push_back({wake_[0], POLLIN, 0});
            auto next = clock::now() + std::chrono::seconds(1);
            // Only this thread removes from waiting_ (admit appends): the first `polled` entries
            // are still fds[1 .. polled] after the poll.
            const std::size_t polled = waiting_.size();
            for (const auto& w : waiting_) {
                fds.push_back({w.fd, POLLIN, 0});
                next = std::min(next, w.deadline);
            }
            for (const auto& l : lingering_) {
                fds.push_back({l.fd, POLLIN, 0});
                next = std::min(next, l.until);
            }
            const int timeout = std::max(1, gate_detail::ms_until(next));
            lk.unlock();
            (void)::poll(fds.data(), nfds_t(fds.size()), timeout);
            if (fds[0].revents & POLLIN) {
                char drain[64];
                while (::read(wake_[0], drain, sizeof drain) > 0) {
                }
            }
            lk.lock();
            for (std::size_t i = 0; i < polled; ++i) waiting_[i].ready = fds[1 + i].revents != 0;
            const auto now = clock::now();
            for (std::size_t i = 0; i < waiting_.size();) {
                waiting& w = waiting_[i];
                bool done = true;
                const bool open = !w.ready || read_head(w);
                const std::size_t end = open ? gate_detail::head_end(w.head, w.scanned) : std::string::npos;
                const std::size_t upto = end != std::string::npos ? end : w.head.size();
                const bool bare = open && gate_detail::bare_line_break(w.head, w.scanned, upto);
                w.scanned = upto - (upto > 0 && w.head[upto - 1] == '\r');  // a CR at the end may get its LF
                if (!open) {
                    ::close(w.fd);  // the client went away before its request was complete
                    --open_;
                } else if (bare) {
                    refuse_locked(w, 400, "the request's lines must end with CRLF (a bare CR or LF was sent)");
                } else if (end != std::string::npos) {
                    const std::string_view line = std::string_view(w.head).substr(0, w.head.find("\r\n"));
                    w.http11 = line.ends_with(" HTTP/1.1");
                    pending_.push_back(std::move(w));
                    cv_.notify_one();
                } else if (w.head.size() > o_.max_header_bytes) {
                    refuse_locked(w, 431, "the request line and headers are larger than " + std::to_string(o_.max_header_bytes) + " bytes");
                } else if (now >= w.deadline) {
                    refuse_locked(w, 408, "the request did not arrive within " + std::to_string(o_.request_timeout.count() / 1000) + " s");
                } else {
                    done = false;
                }
                w.ready = false;
                if (done) waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
                else ++i;
            }
            for (std::size_t i = 0; i < lingering_.size();) {
                lingering& l = lingering_[i];
                char sink[4096];
                ssize_t n;
                while ((n = ::recv(l.fd, sink, sizeof sink, MSG_DONTWAIT)) > 0) l.drained += std::size_t(n);
                const bool open = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
                if (!open || now >= l.until || l.drained > (1u << 20)) {
                    ::close(l.fd);
                    lingering_.erase(lingering_.begin() + std::ptrdiff_t(i));
                } else {
                    ++i;
                }
            }
        }
    }

    void worker_loop() {
        std::unique_lock lk(mu_);
        for (;;) {
            cv_.wait(lk, [&] { return !running_ || !pending_.empty(); });
            if (!running_) return;
            waiting w = std::move(pending_.front());
            pending_.pop_front();
            active_.insert(w.fd);
            lk.unlock();
            serve(w);
            lk.lock();
            active_.erase(w.fd);
            --open_;
            if (running_) linger_locked(w.fd);
            else ::close(w.fd);
        }
    }

    void serve(waiting& w) {
        socket_stream strm(w.fd, w.deadline, o_, std::move(w.head), w.http11);
        current_ = &strm;
        bool closed = true;
        try {
            (void)process_request(strm, /*close_connection=*/true, closed, nullptr);
        } catch (...) {
            // An exception outside httplib's handler try block (an error handler, a content
            // provider): the connection ends here instead of the process.
        }
        current_ = nullptr;
#if defined(__GLIBC__)
        if (strm.bytes_read() > (1u << 20)) ::malloc_trim(0);  // the body and its tree are freed by now
#endif
    }

    gate_options o_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool running_ = false;
    int wake_[2] = {-1, -1};
    std::thread admission_;
    std::vector<std::thread> pool_;
    std::vector<waiting> waiting_;
    std::deque<waiting> pending_;
    std::vector<lingering> lingering_;
    std::set<int> active_;
    std::atomic<std::size_t> open_{0};
    static inline thread_local socket_stream* current_ = nullptr;
};

}  // namespace clover::server
