#pragma once
/// @file
/// @brief The communicator interface of clover::dist: point-to-point messages between ranks,
/// non-blocking requests, broadcast, barrier, deadlines and abort.
///
/// It knows nothing of models: stages (model/) send batch descriptions and hidden rows through
/// it as messages (message.hpp). Implementations: local_group (threads of one process, local.hpp)
/// and mpi_communicator (MPI ranks, mpi.hpp). A peer that is gone (killed, closed, stopped
/// answering) or a deadline that passes ends a wait with a peer_error naming the peer rank, so a
/// pipeline never hangs on a dead stage.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/dist/message.hpp"

/// \namespace clover::dist
/// Messages between the ranks of a split model: the communicator interface, the in-process group
/// (local_group) and MPI (mpi_communicator). Knows nothing of models.
namespace clover::dist {

/// How long a wait may take.
using duration = std::chrono::milliseconds;
/// A wait without a deadline (it still ends when the peer is known to be gone).
inline constexpr duration no_deadline = duration::max();

/// A peer rank is gone or did not answer before the deadline.
class peer_error : public clover::error {
public:
    /// `peer`: the rank at fault; `what`: the whole message (it names the rank).
    peer_error(int peer, const std::string& what) : clover::error(what), peer_(peer) {}
    /// The rank at fault (for a pipeline: the stage it runs).
    int peer() const { return peer_; }

private:
    int peer_;
};

/// Message tags. Users tag their messages with [0, user_limit); the rest is the communicator's.
namespace tags {
/// First tag reserved for the communicator itself (MPI guarantees tags up to 32767).
inline constexpr int user_limit = 32000;
/// Barrier: a rank's arrival (to rank 0).
inline constexpr int barrier_arrive = 32000;
/// Barrier: rank 0's release (to every rank).
inline constexpr int barrier_release = 32001;
/// Broadcast payloads (root to every rank).
inline constexpr int broadcast = 32002;
/// Liveness messages of an implementation (mpi.hpp).
inline constexpr int heartbeat = 32003;
}  // namespace tags

/// What a communicator has done since it was made or reset_stats() was called: messages and
/// bytes (payloads, the communicator's own barrier and broadcast messages included, an
/// implementation's heartbeats not), and the time its caller spent blocked in a wait (send,
/// recv, request::wait / take, broadcast, barrier): for a pipeline, the time a rank waits on
/// its peers rather than computing.
struct stats {
    std::uint64_t messages_sent = 0;      ///< messages sent
    std::uint64_t bytes_sent = 0;         ///< their payload bytes
    std::uint64_t messages_received = 0;  ///< messages received (taken)
    std::uint64_t bytes_received = 0;     ///< their payload bytes
    std::chrono::nanoseconds waited{0};   ///< time blocked waiting for operations to complete
};

namespace detail {
// The counters behind stats: relaxed atomics (a few adds per message), shared with the requests
// so that a request that outlives its communicator still counts somewhere valid.
struct counters {
    std::atomic<std::uint64_t> n_sent{0}, sent{0}, n_received{0}, received{0}, wait_ns{0};
    stats snapshot() const {
        stats s;
        s.messages_sent = n_sent.load(std::memory_order_relaxed);
        s.bytes_sent = sent.load(std::memory_order_relaxed);
        s.messages_received = n_received.load(std::memory_order_relaxed);
        s.bytes_received = received.load(std::memory_order_relaxed);
        s.waited = std::chrono::nanoseconds(wait_ns.load(std::memory_order_relaxed));
        return s;
    }
    void reset() {
        for (auto* a : {&n_sent, &sent, &n_received, &received, &wait_ns}) a->store(0, std::memory_order_relaxed);
    }
};
}  // namespace detail

/// What an implementation provides for one non-blocking operation.
class request_state {
public:
    virtual ~request_state() = default;
    /// True once the operation is complete; throws peer_error if it can no longer complete.
    virtual bool test() = 0;
    /// Blocks until complete; throws peer_error when the peer is gone or `timeout` passes.
    virtual void wait(duration timeout) = 0;
    /// The received message (a receive, once complete; empty for a send). Once only.
    virtual bytes take() = 0;
};

/// A pending isend or irecv. Move-only. Destroying an incomplete receive withdraws it (a
/// message already matched to it is dropped); an incomplete send goes on in the background.
class request {
public:
    /// An empty request (valid() is false).
    request() = default;
    /// Wraps an implementation's state.
    explicit request(std::unique_ptr<request_state> s) : s_(std::move(s)) {}

    /// Whether this request refers to an operation.
    bool valid() const { return bool(s_); }
    /// True once complete (never blocks); throws peer_error if it can no longer complete.
    bool test() { return state().test(); }
    /// Blocks until complete, or throws peer_error (peer gone, or `timeout` passed).
    void wait(duration timeout = no_deadline) {
        request_state& st = state();
        if (!c_) return st.wait(timeout);
        const auto t0 = std::chrono::steady_clock::now();
        struct count {  // the time blocked counts also when the wait throws
            detail::counters& c;
            std::chrono::steady_clock::time_point t0;
            ~count() {
                c.wait_ns.fetch_add(std::uint64_t((std::chrono::steady_clock::now() - t0).count()), std::memory_order_relaxed);
            }
        } cnt{*c_, t0};
        st.wait(timeout);
    }
    /// Waits, then moves the received message out (a receive; a send gives an empty message).
    bytes take(duration timeout = no_deadline) {
        wait(timeout);
        bytes b = state().take();
        if (c_ && recv_) {
            c_->n_received.fetch_add(1, std::memory_order_relaxed);
            c_->received.fetch_add(b.size(), std::memory_order_relaxed);
        }
        return b;
    }

private:
    friend class communicator;
    request_state& state() {
        if (!s_) fail("dist: use of an empty request");
        return *s_;
    }
    std::unique_ptr<request_state> s_;
    std::shared_ptr<detail::counters> c_;  // the communicator's counters (null: not counted)
    bool recv_ = false;                     // a receive: take() counts the message
};

/// A group of ranks exchanging messages. Messages between one pair of ranks with one tag
/// arrive in the order they were sent; receives of one (peer, tag) complete in the order they
/// were posted. Sends are buffered: a send completes once its bytes are owned by the
/// communicator or delivered, never later than the matching receive.
class communicator {
public:
    virtual ~communicator() = default;

    /// This rank, in [0, size()).
    virtual int rank() const = 0;
    /// The number of ranks.
    virtual int size() const = 0;

    /// Sends `data` to rank `to` with `tag` in [0, tags::user_limit) and waits until it is sent.
    void send(int to, int tag, std::span<const std::byte> data, duration timeout = no_deadline) {
        isend(to, tag, bytes(data.begin(), data.end())).wait(timeout);
    }
    /// Receives the next message from rank `from` with `tag`; throws peer_error naming `from`
    /// when that rank is gone or `timeout` passes first (the watchdog of a pipeline).
    bytes recv(int from, int tag, duration timeout = no_deadline) { return irecv(from, tag).take(timeout); }

    /// Starts sending `data` (moved in: it stays alive until the send completes).
    request isend(int to, int tag, bytes data) {
        check_peer(to, "send to");
        check_tag(tag);
        return counted_send(to, tag, std::move(data));
    }
    /// Starts receiving the next message from `from` with `tag`.
    request irecv(int from, int tag) {
        check_peer(from, "receive from");
        check_tag(tag);
        return counted_recv(from, tag);
    }

    /// Every rank calls it with the same `root`: the root's `data` replaces `data` on the others.
    /// Point-to-point underneath, so a dead root or rank fails by name like any receive.
    void broadcast(int root, bytes& data, duration timeout = no_deadline) {
        check_peer(root, "broadcast from");
        if (rank() == root) {
            std::vector<request> sent;
            for (int r = 0; r < size(); ++r)
                if (r != root) sent.push_back(counted_send(r, tags::broadcast, data));
            for (request& q : sent) q.wait(timeout);
        } else {
            data = counted_recv(root, tags::broadcast).take(timeout);
        }
    }

    /// Returns once every rank has called it; throws peer_error naming a rank that is gone or
    /// that did not arrive within `timeout`.
    void barrier(duration timeout = no_deadline) {
        if (size() == 1) return;
        if (rank() == 0) {
            for (int r = 1; r < size(); ++r) counted_recv(r, tags::barrier_arrive).take(timeout);
            std::vector<request> sent;
            for (int r = 1; r < size(); ++r) sent.push_back(counted_send(r, tags::barrier_release, {}));
            for (request& q : sent) q.wait(timeout);
        } else {
            counted_send(0, tags::barrier_arrive, {}).wait(timeout);
            counted_recv(0, tags::barrier_release).take(timeout);
        }
    }

    /// Ends the whole group with `message` (printed once, naming this rank): the way out when a
    /// peer failed. MPI: MPI_Abort. Local group: every rank's waits fail; throws clover::error here.
    [[noreturn]] virtual void abort(const std::string& message) = 0;

    /// This rank's counters (messages, bytes, time blocked) since construction or reset_stats().
    /// Cheap; any thread.
    dist::stats stats() const { return counters_->snapshot(); }
    /// Zeroes the counters (e.g. after a warm-up).
    void reset_stats() { counters_->reset(); }

protected:
    /// Starts a send (rank and tag already checked; tags at or above user_limit are internal).
    virtual request post_send(int to, int tag, bytes data) = 0;
    /// Starts a receive (rank and tag already checked).
    virtual request post_recv(int from, int tag) = 0;

private:
    request counted_send(int to, int tag, bytes data) {
        const std::size_t n = data.size();
        request q = post_send(to, tag, std::move(data));
        counters_->n_sent.fetch_add(1, std::memory_order_relaxed);
        counters_->sent.fetch_add(n, std::memory_order_relaxed);
        q.c_ = counters_;
        return q;
    }
    request counted_recv(int from, int tag) {
        request q = post_recv(from, tag);
        q.c_ = counters_;
        q.recv_ = true;
        return q;
    }
    std::shared_ptr<detail::counters> counters_ = std::make_shared<detail::counters>();

    void check_peer(int r, const char* what) const {
        if (r < 0 || r >= size()) fail("dist: rank ", rank(), ": cannot ", what, " rank ", r, " (the group has ", size(), " ranks)");
    }
    void check_tag(int tag) const {
        if (tag < 0 || tag >= tags::user_limit)
            fail("dist: rank ", rank(), ": tag ", tag, " is outside [0, ", tags::user_limit, ")");
    }
};

/// Deadline arithmetic without overflow: the time point `timeout` from now (max for no_deadline).
inline std::chrono::steady_clock::time_point deadline_after(duration timeout) {
    using clock = std::chrono::steady_clock;
    if (timeout == no_deadline) return clock::time_point::max();
    const auto now = clock::now();
    if (timeout > std::chrono::duration_cast<duration>(clock::time_point::max() - now)) return clock::time_point::max();
    return now + timeout;
}

/// Milliseconds of a duration, for messages.
inline long long millis(duration d) { return static_cast<long long>(d.count()); }

}  // namespace clover::dist
