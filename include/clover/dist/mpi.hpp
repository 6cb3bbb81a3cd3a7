#pragma once
/// @file
/// @brief The MPI implementation of the communicator (Open MPI from Debian; any MPI-3 library).
///
/// The only clover header that includes <mpi.h>; link MPI::MPI_CXX (CMake's FindMPI) to use it.
/// mpi_session owns MPI_Init_thread / MPI_Finalize. mpi_communicator works on a duplicate of
/// MPI_COMM_WORLD with MPI_ERRORS_RETURN, so an MPI error becomes a clover::error naming the rank,
/// and every wait polls (MPI_Test / MPI_Improbe with short sleeps) so it can end at a deadline.
///
/// Failed ranks. Under a plain `mpirun`, Open MPI itself ends the job when a rank dies: it sends
/// SIGTERM to the other ranks within about a second, prints "mpirun noticed that process rank R
/// ... exited on signal S" and exits non-zero (137 for a SIGKILL). mpi_session then prints one
/// line per surviving rank saying it was stopped by the launcher, which peers on its host are gone
/// (their processes no longer exist) and which rank it was waiting on.
/// Under `mpirun --enable-recovery` the job goes on without the dead rank: then the heartbeats below
/// find the dead rank and the wait throws a peer_error naming it; rank 0 reports it and calls
/// abort() (MPI_Abort ends every rank). Open MPI 4.1's mpirun then exits 0 all the same (under
/// --enable-recovery it ignores the ranks' exit status): scripts must read the output there.
/// Every rank's heartbeat thread sends a small message to every peer a few times a second; a peer
/// silent for longer than `dead_after` is dead, whatever the rank was waiting on.
///
/// Progress. MPI moves a large message (above the transport's eager limit: a pipeline's rows)
/// only while the sender calls into MPI, so a rank that starts a send and then computes would hold
/// its peer back until its next MPI call. The same background thread therefore tests the sends in
/// flight every `progress` interval while there are any, so that a send overlaps the computation
/// that follows it.
#ifndef OMPI_SKIP_MPICXX
/// Only MPI's C API: Open MPI's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
/// Only MPI's C API: MPICH's deprecated C++ bindings stay out.
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/dist/communicator.hpp"

namespace clover::dist {

namespace detail {

// For the SIGTERM note: which rank this is, which peer it waits on (-1: none), and the process ids
// of the peers on this host (0: another host or unknown), filled by mpi_communicator.
inline std::atomic<int> mpi_self{-1};
inline std::atomic<int> mpi_waiting_on{-1};
inline constexpr int mpi_pid_slots = 256;
inline std::atomic<int> mpi_n_pids{0};
inline pid_t mpi_local_pid[mpi_pid_slots] = {};

inline void mpi_term_note(int) {
    // Async-signal-safe: fixed buffers, write(2), _exit(2).
    char line[200];
    int n = 0;
    auto put = [&](const char* s) {
        while (*s && n < int(sizeof line) - 1) line[n++] = *s++;
    };
    auto put_int = [&](int v) {
        char d[12];
        int k = 0;
        if (v < 0) v = 0;
        do d[k++] = char('0' + v % 10); while ((v /= 10) && k < 11);
        while (k && n < int(sizeof line) - 1) line[n++] = d[--k];
    };
    put("clover: rank ");
    put_int(mpi_self.load());
    put(": stopped by SIGTERM (the MPI launcher sends it when another rank fails; its message names that rank)");
    // A peer on this host whose process is gone is the failed one (the launcher reaped it first).
    for (int r = 0, n_pids = mpi_n_pids.load(); r < n_pids; ++r) {
        const pid_t pid = mpi_local_pid[r];
        if (r == mpi_self.load() || pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
        put("; rank ");
        put_int(r);
        put(" (pid ");
        put_int(int(pid));
        put(") is gone");
    }
    if (const int w = mpi_waiting_on.load(); w >= 0) {
        put("; this rank was waiting on rank ");
        put_int(w);
    }
    put("\n");
    [[maybe_unused]] auto written = ::write(2, line, std::size_t(n));
    ::_exit(143);
}

inline std::string mpi_error_text(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
    return std::string(text, std::size_t(len));
}

}  // namespace detail

/// Owns MPI's initialization: MPI_Init_thread (MPI_THREAD_SERIALIZED at least: the heartbeat
/// thread and the caller's thread call MPI, one at a time) and MPI_Finalize. If MPI was already
/// initialized, it neither initializes nor finalizes. While it lives, SIGTERM prints one line
/// naming this rank (and the peer it waited on) before exiting.
class mpi_session {
public:
    /// Initializes MPI with the program's arguments (either may be null).
    mpi_session(int* argc, char*** argv) {
        int done = 0;
        MPI_Initialized(&done);
        if (!done) {
            if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided_) != MPI_SUCCESS)
                fail("dist: MPI_Init_thread failed");
            owns_ = true;
        } else {
            MPI_Query_thread(&provided_);
        }
        if (provided_ < MPI_THREAD_SERIALIZED) {
            if (owns_) MPI_Finalize();
            fail("dist: the MPI library provides thread level ", provided_, "; clover needs MPI_THREAD_SERIALIZED");
        }
        int r = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        detail::mpi_self = r;
        previous_ = std::signal(SIGTERM, detail::mpi_term_note);
    }
    ~mpi_session() {
        std::signal(SIGTERM, previous_ == SIG_ERR ? SIG_DFL : previous_);
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (owns_ && !finalized) MPI_Finalize();
    }
    mpi_session(const mpi_session&) = delete;
    mpi_session& operator=(const mpi_session&) = delete;

    /// The thread level MPI provides.
    int thread_level() const { return provided_; }
    /// Whether this session initialized MPI (and will finalize it).
    bool owns() const { return owns_; }

private:
    int provided_ = 0;
    bool owns_ = false;
    void (*previous_)(int) = SIG_DFL;
};

/// Liveness settings of mpi_communicator.
struct mpi_options {
    /// How often each rank tells its peers that it is alive (0: no heartbeats).
    duration heartbeat{250};
    /// A peer silent this long is dead (checked by every wait and test).
    duration dead_after{3000};
    /// How often the background thread tests the sends in flight, while there are any (0: only
    /// the caller's waits move them).
    std::chrono::microseconds progress{200};
};

namespace detail {

// Shared by the communicator and its requests (which may outlive it briefly).
struct mpi_core {
    ~mpi_core() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
    MPI_Comm comm = MPI_COMM_NULL;
    int self = 0, n = 0;
    mpi_options opt;
    std::mutex m;  // every MPI call on `comm` holds it (MPI_THREAD_SERIALIZED)
    std::vector<std::chrono::steady_clock::time_point> last_seen;  // per peer, under m

    struct send_op {
        MPI_Request req = MPI_REQUEST_NULL;
        bytes data;
        bool done = false;
    };
    std::vector<std::shared_ptr<send_op>> sending;  // sends in flight, for the progress thread; under m
    // Wakes the background thread when a send starts (it then polls while sends are in flight).
    std::mutex wake_m;
    std::condition_variable wake_cv;
    std::uint64_t posted = 0;  // sends started, under wake_m
    bool stop = false;         // under wake_m

    void send_started() {
        {
            std::lock_guard lk(wake_m);
            ++posted;
        }
        wake_cv.notify_one();
    }
    // Under m: tests the sends in flight, forgets the finished ones; true when some remain.
    bool progress_sends() {
        std::erase_if(sending, [](const std::shared_ptr<send_op>& op) {
            if (op->done) return true;
            int flag = 0;
            if (MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true;  // its owner's wait reports it
            op->done = flag != 0;
            return op->done;
        });
        return !sending.empty();
    }

    struct recv_op {
        int from = 0, tag = 0;
        bool matched = false, done = false, taken = false;
        MPI_Request req = MPI_REQUEST_NULL;
        bytes data;
    };
    std::map<std::pair<int, int>, std::deque<std::shared_ptr<recv_op>>> waiting;  // (from, tag), under m

    void check(int rc, int peer, const char* what) const {
        if (rc == MPI_SUCCESS) return;
        throw peer_error(peer, "dist: rank " + std::to_string(self) + ": " + what + " rank " + std::to_string(peer) +
                                   " failed: " + mpi_error_text(rc));
    }

    // Under m: throws naming the peer silent the longest, if one is past dead_after.
    void check_alive(int waiting_on, int tag) const {
        if (opt.heartbeat.count() <= 0) return;
        const auto now = std::chrono::steady_clock::now();
        int worst = -1;
        for (int r = 0; r < n; ++r)
            if (r != self && now - last_seen[std::size_t(r)] > opt.dead_after &&
                (worst < 0 || last_seen[std::size_t(r)] < last_seen[std::size_t(worst)]))
                worst = r;
        if (worst < 0) return;
        const auto silent = std::chrono::duration_cast<duration>(now - last_seen[std::size_t(worst)]);
        throw peer_error(worst, "dist: rank " + std::to_string(worst) + " stopped answering (no heartbeat for " +
                                    std::to_string(millis(silent)) + " ms): it died or its host is gone; rank " +
                                    std::to_string(self) + " was waiting on rank " + std::to_string(waiting_on) +
                                    " (tag " + std::to_string(tag) + ")");
    }

    // Under m: gives queued receives of (from, tag), oldest first, the messages that have arrived.
    void match(int from, int tag) {
        auto it = waiting.find({from, tag});
        if (it == waiting.end()) return;
        auto& q = it->second;
        while (!q.empty()) {
            int flag = 0;
            MPI_Message msg;
            MPI_Status st;
            check(MPI_Improbe(from, tag, comm, &flag, &msg, &st), from, "probe for a message from");
            if (!flag) break;
            int count = 0;
            check(MPI_Get_count(&st, MPI_BYTE, &count), from, "size of a message from");
            auto op = q.front();
            q.pop_front();
            op->data.resize(std::size_t(count));
            static std::byte none;
            check(MPI_Imrecv(count ? op->data.data() : &none, count, MPI_BYTE, &msg, &op->req), from,
                  "receive from");
            op->matched = true;
        }
        if (q.empty()) waiting.erase(it);
    }

    // Poll `done` (under m) until it says true, with sleeps between polls (without m).
    template <class Poll>
    void poll_until(Poll done, duration timeout, int peer, int tag, const char* what) {
        const auto until = deadline_after(timeout);
        auto nap = std::chrono::microseconds(0);
        int spins = 0;
        mpi_waiting_on = peer;
        struct reset {
            ~reset() { mpi_waiting_on = -1; }
        } r;
        for (;;) {
            {
                std::lock_guard lk(m);
                if (done()) return;
                check_alive(peer, tag);
            }
            if (std::chrono::steady_clock::now() >= until)
                throw peer_error(peer, "dist: rank " + std::to_string(self) + ": " + what + " rank " + std::to_string(peer) +
                                           " (tag " + std::to_string(tag) + ") did not complete within " +
                                           std::to_string(millis(timeout)) + " ms: rank " + std::to_string(peer) +
                                           " is stuck or dead");
            // Spin briefly (a pipeline's next message is often imminent), then back off to 200 us
            // so that waiting ranks leave the cores to computing ones.
            if (++spins < 64) {
                std::this_thread::yield();
            } else {
                nap = std::max(nap, std::chrono::microseconds(5));
                std::this_thread::sleep_for(nap);
                nap = std::min(nap * 2, std::chrono::microseconds(200));
            }
        }
    }
};

class mpi_send final : public request_state {
public:
    mpi_send(std::shared_ptr<mpi_core> core, int to, int tag, bytes data)
        : core_(std::move(core)), op_(std::make_shared<mpi_core::send_op>()), to_(to), tag_(tag) {
        if (data.size() > std::size_t(std::numeric_limits<int>::max()))
            fail("dist: rank ", core_->self, ": a message of ", data.size(), " bytes to rank ", to, " exceeds MPI's int count");
        op_->data = std::move(data);
        static std::byte none;
        {
            std::lock_guard lk(core_->m);
            core_->check(MPI_Isend(op_->data.empty() ? &none : op_->data.data(), int(op_->data.size()), MPI_BYTE, to, tag,
                                   core_->comm, &op_->req),
                         to, "send to");
            int flag = 0;
            if (MPI_Test(&op_->req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
                op_->done = true;  // eager: nothing left to move
                return;
            }
            core_->sending.push_back(op_);
        }
        core_->send_started();
    }
    ~mpi_send() override {
        std::lock_guard lk(core_->m);
        if (op_->done) return;
        int flag = 0;
        if (MPI_Test(&op_->req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
            op_->done = true;
            return;
        }
        // Still in flight (the peer never took it): let MPI finish it and keep the bytes alive.
        MPI_Request_free(&op_->req);
        op_->done = true;
        new bytes(std::move(op_->data));  // intentionally leaked: MPI may still read it
    }
    bool test() override {
        std::lock_guard lk(core_->m);
        return poll();
    }
    void wait(duration timeout) override { core_->poll_until([this] { return poll(); }, timeout, to_, tag_, "send to"); }
    bytes take() override { return {}; }

private:
    bool poll() {  // under core_->m
        if (op_->done) return true;
        int flag = 0;
        core_->check(MPI_Test(&op_->req, &flag, MPI_STATUS_IGNORE), to_, "send to");
        op_->done = flag != 0;
        if (!op_->done) core_->check_alive(to_, tag_);
        return op_->done;
    }
    std::shared_ptr<mpi_core> core_;
    std::shared_ptr<mpi_core::send_op> op_;  // shared with the progress thread while in flight
    int to_, tag_;
};

class mpi_recv final : public request_state {
public:
    mpi_recv(std::shared_ptr<mpi_core> core, std::shared_ptr<mpi_core::recv_op> op) : core_(std::move(core)), op_(std::move(op)) {}
    ~mpi_recv() override {
        std::lock_guard lk(core_->m);
        if (op_->done) return;
        if (!op_->matched) {  // withdraw it from the queue of its (from, tag)
            auto it = core_->waiting.find({op_->from, op_->tag});
            if (it != core_->waiting.end()) {
                auto& q = it->second;
                for (auto p = q.begin(); p != q.end(); ++p)
                    if (*p == op_) {
                        q.erase(p);
                        break;
                    }
                if (q.empty()) core_->waiting.erase(it);
            }
            return;
        }
        int flag = 0;
        if (MPI_Test(&op_->req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) return;
        MPI_Request_free(&op_->req);
        new bytes(std::move(op_->data));  // intentionally leaked: MPI may still write it
    }
    bool test() override {
        std::lock_guard lk(core_->m);
        return poll();
    }
    void wait(duration timeout) override {
        core_->poll_until([this] { return poll(); }, timeout, op_->from, op_->tag, "receive from");
    }
    bytes take() override {
        std::lock_guard lk(core_->m);
        if (!op_->done) fail("dist: take() of a receive that is not complete");
        if (op_->taken) fail("dist: the message of this receive was already taken");
        op_->taken = true;
        return std::move(op_->data);
    }

private:
    bool poll() {  // under core_->m
        if (op_->done) return true;
        if (!op_->matched) core_->match(op_->from, op_->tag);
        if (op_->matched) {
            int flag = 0;
            core_->check(MPI_Test(&op_->req, &flag, MPI_STATUS_IGNORE), op_->from, "receive from");
            op_->done = flag != 0;
        }
        if (!op_->done) core_->check_alive(op_->from, op_->tag);
        return op_->done;
    }
    std::shared_ptr<mpi_core> core_;
    std::shared_ptr<mpi_core::recv_op> op_;
};

}  // namespace detail

/// The ranks of MPI_COMM_WORLD (a duplicate of it, so clover's tags never meet the program's).
/// Needs a live mpi_session; collective: every rank constructs and destroys one together.
class mpi_communicator final : public communicator {
public:
    /// Duplicates MPI_COMM_WORLD, sets MPI_ERRORS_RETURN and starts the heartbeat thread.
    explicit mpi_communicator(mpi_options opt = {}) : core_(std::make_shared<detail::mpi_core>()) {
        core_->opt = opt;
        if (MPI_Comm_dup(MPI_COMM_WORLD, &core_->comm) != MPI_SUCCESS) fail("dist: MPI_Comm_dup failed");
        MPI_Comm_set_errhandler(core_->comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(core_->comm, &core_->self);
        MPI_Comm_size(core_->comm, &core_->n);
        core_->last_seen.assign(std::size_t(core_->n), std::chrono::steady_clock::now());
        share_pids();
        if ((opt.heartbeat.count() > 0 || opt.progress.count() > 0) && core_->n > 1)
            beat_ = std::thread([this] { background_loop(); });
    }
    ~mpi_communicator() override {
        {
            std::lock_guard lk(core_->wake_m);
            core_->stop = true;
        }
        core_->wake_cv.notify_all();
        if (beat_.joinable()) beat_.join();
        // The duplicate communicator is freed with the last request that uses it (mpi_core).
    }
    mpi_communicator(const mpi_communicator&) = delete;
    mpi_communicator& operator=(const mpi_communicator&) = delete;

    /// This rank in MPI_COMM_WORLD.
    int rank() const override { return core_->self; }
    /// The number of ranks.
    int size() const override { return core_->n; }

    /// Prints "clover: rank R: message" and ends every rank with MPI_Abort (exit status 1).
    [[noreturn]] void abort(const std::string& message) override {
        std::fprintf(stderr, "clover: rank %d: %s\n", core_->self, message.c_str());
        std::fflush(stderr);
        MPI_Abort(core_->comm, 1);
        std::_Exit(1);
    }

protected:
    /// MPI_Isend of the bytes (kept alive by the request).
    request post_send(int to, int tag, bytes data) override {
        return request(std::make_unique<detail::mpi_send>(core_, to, tag, std::move(data)));
    }
    /// Queues the receive; it is matched (MPI_Improbe + MPI_Imrecv, sized by the message) when tested.
    request post_recv(int from, int tag) override {
        auto op = std::make_shared<detail::mpi_core::recv_op>();
        op->from = from;
        op->tag = tag;
        {
            std::lock_guard lk(core_->m);
            core_->waiting[{from, tag}].push_back(op);
            core_->match(from, tag);
        }
        return request(std::make_unique<detail::mpi_recv>(core_, std::move(op)));
    }

private:
    // Every rank's process id and host, so that mpi_session's SIGTERM note can tell which peer on
    // this host is gone (collective, once).
    void share_pids() {
        struct who {
            long long pid;
            char host[64];
        };
        who me{};
        me.pid = ::getpid();
        ::gethostname(me.host, sizeof me.host - 1);
        std::vector<who> all(std::size_t(core_->n));
        core_->check(MPI_Allgather(&me, int(sizeof me), MPI_BYTE, all.data(), int(sizeof me), MPI_BYTE, core_->comm),
                     core_->self, "exchanging process ids with");
        const int slots = std::min(core_->n, detail::mpi_pid_slots);
        for (int r = 0; r < slots; ++r)
            detail::mpi_local_pid[r] =
                std::string_view(all[std::size_t(r)].host) == std::string_view(me.host) ? pid_t(all[std::size_t(r)].pid) : 0;
        detail::mpi_n_pids = slots;
    }

    // Heartbeats every opt.heartbeat; while sends are in flight, tests them every opt.progress.
    void background_loop() {
        using clock = std::chrono::steady_clock;
        static const std::byte beat{1};  // content unused; a static so freed sends never dangle
        const bool beats = core_->opt.heartbeat.count() > 0, progress = core_->opt.progress.count() > 0;
        auto next_beat = clock::now();
        std::uint64_t seen = 0;
        std::unique_lock wake_lk(core_->wake_m);
        while (!core_->stop) {
            seen = core_->posted;
            wake_lk.unlock();
            bool busy = false;
            {
                std::lock_guard lk(core_->m);
                if (beats && clock::now() >= next_beat) {
                    for (int r = 0; r < core_->n; ++r) {
                        if (r == core_->self) continue;
                        MPI_Request q;
                        if (MPI_Isend(&beat, 1, MPI_BYTE, r, tags::heartbeat, core_->comm, &q) == MPI_SUCCESS)
                            MPI_Request_free(&q);
                    }
                    for (;;) {
                        int flag = 0;
                        MPI_Status st;
                        if (MPI_Iprobe(MPI_ANY_SOURCE, tags::heartbeat, core_->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
                        std::byte b;
                        if (MPI_Recv(&b, 1, MPI_BYTE, st.MPI_SOURCE, tags::heartbeat, core_->comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                            break;
                        core_->last_seen[std::size_t(st.MPI_SOURCE)] = clock::now();
                    }
                    next_beat = clock::now() + core_->opt.heartbeat;
                }
                if (progress) busy = core_->progress_sends();
            }
            wake_lk.lock();
            if (core_->stop) break;
            // (no time_point::max(): some libraries overflow converting it for the wait)
            const auto until = busy ? clock::now() + core_->opt.progress : beats ? next_beat : clock::now() + std::chrono::hours(1);
            core_->wake_cv.wait_until(wake_lk, until, [&] { return core_->stop || (progress && core_->posted != seen); });
        }
    }

    std::shared_ptr<detail::mpi_core> core_;
    std::thread beat_;
};

}  // namespace clover::dist
