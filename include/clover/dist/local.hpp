#pragma once
/// @file
/// @brief An in-process group of ranks: one endpoint per rank (each used by its own thread),
/// mailboxes under one mutex and condition variable. For tests without MPI, and for stages on
/// several devices of one process.
///
/// A rank is gone once its endpoint is destroyed, it calls abort(), or a test calls kill(rank).
/// Messages it sent before are still delivered; a wait for anything more from it fails at once
/// with a peer_error naming it, as does a send to it.
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/dist/communicator.hpp"

namespace clover::dist {

namespace detail {

struct local_hub {
    struct slot {
        bool filled = false, taken = false;
        bytes data;
    };
    // One (from, to, tag): messages that arrived before a receive, receives posted before a message.
    struct channel {
        std::vector<bytes> unexpected;  // FIFO: front is index `head`
        std::size_t head = 0;
        std::vector<std::shared_ptr<slot>> posted;
    };

    explicit local_hub(int n) : gone(std::size_t(n)), taken(std::size_t(n), false) {}

    std::mutex m;
    std::condition_variable cv;
    std::vector<std::string> gone;  // per rank: empty while alive, else why it is gone
    std::vector<bool> taken;        // endpoint handed out
    std::map<std::tuple<int, int, int>, channel> channels;

    // Under m, once self or peer is gone: the error of `self`'s operation `op` with `peer`.
    [[noreturn]] void fail_gone(int self, int peer, int tag, const char* op) const {
        if (!gone[std::size_t(self)].empty())
            throw peer_error(self, "dist: rank " + std::to_string(self) + " is gone (" + gone[std::size_t(self)] +
                                       ") and cannot " + op + " rank " + std::to_string(peer));
        throw peer_error(peer, "dist: rank " + std::to_string(peer) + " is gone (" + gone[std::size_t(peer)] + "): rank " +
                                   std::to_string(self) + " cannot " + op + " it (tag " + std::to_string(tag) + ")");
    }
    bool either_gone(int self, int peer) const { return !gone[std::size_t(self)].empty() || !gone[std::size_t(peer)].empty(); }

    void mark_gone(int r, std::string why) {
        {
            std::lock_guard lk(m);
            if (gone[std::size_t(r)].empty()) gone[std::size_t(r)] = std::move(why);
        }
        cv.notify_all();
    }
};

class local_send final : public request_state {
public:
    bool test() override { return true; }
    void wait(duration) override {}
    bytes take() override { return {}; }
};

class local_recv final : public request_state {
public:
    local_recv(std::shared_ptr<local_hub> hub, std::shared_ptr<local_hub::slot> s, int self, int from, int tag)
        : hub_(std::move(hub)), slot_(std::move(s)), self_(self), from_(from), tag_(tag) {}

    ~local_recv() override {
        // Withdraw an unmatched receive so that the next message goes to the next receive.
        std::lock_guard lk(hub_->m);
        if (slot_->filled) return;
        auto it = hub_->channels.find({from_, self_, tag_});
        if (it == hub_->channels.end()) return;
        auto& posted = it->second.posted;
        for (auto p = posted.begin(); p != posted.end(); ++p)
            if (*p == slot_) {
                posted.erase(p);
                break;
            }
    }

    bool test() override {
        std::lock_guard lk(hub_->m);
        if (slot_->filled) return true;
        if (hub_->either_gone(self_, from_)) hub_->fail_gone(self_, from_, tag_, "receive from");
        return false;
    }

    void wait(duration timeout) override {
        std::unique_lock lk(hub_->m);
        auto ready = [&] { return slot_->filled || hub_->either_gone(self_, from_); };
        if (!hub_->cv.wait_until(lk, deadline_after(timeout), ready))
            throw peer_error(from_, "dist: no message from rank " + std::to_string(from_) + " (tag " + std::to_string(tag_) +
                                        ") within " + std::to_string(millis(timeout)) + " ms: rank " +
                                        std::to_string(from_) + " is stuck or dead (rank " + std::to_string(self_) +
                                        " waited)");
        if (!slot_->filled) hub_->fail_gone(self_, from_, tag_, "receive from");
    }

    bytes take() override {
        std::lock_guard lk(hub_->m);
        if (!slot_->filled) fail("dist: take() of a receive that is not complete");
        if (slot_->taken) fail("dist: the message of this receive was already taken");
        slot_->taken = true;
        return std::move(slot_->data);
    }

private:
    std::shared_ptr<local_hub> hub_;
    std::shared_ptr<local_hub::slot> slot_;
    int self_, from_, tag_;
};

}  // namespace detail

/// One rank's endpoint in a local_group. Destroying it marks the rank gone.
class local_communicator final : public communicator {
public:
    /// Use local_group::endpoint().
    local_communicator(std::shared_ptr<detail::local_hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
    ~local_communicator() override { hub_->mark_gone(rank_, "its endpoint was closed"); }
    local_communicator(const local_communicator&) = delete;
    local_communicator& operator=(const local_communicator&) = delete;

    /// This rank.
    int rank() const override { return rank_; }
    /// The group's size.
    int size() const override { return int(hub_->gone.size()); }

    /// Marks every rank's waits as failing (this rank gone, with `message`), then throws it.
    [[noreturn]] void abort(const std::string& message) override {
        hub_->mark_gone(rank_, "it aborted: " + message);
        fail("dist: rank ", rank_, " aborted: ", message);
    }

protected:
    /// Delivers at once: to the oldest posted receive, else to the mailbox.
    request post_send(int to, int tag, bytes data) override {
        {
            std::lock_guard lk(hub_->m);
            if (hub_->either_gone(rank_, to)) hub_->fail_gone(rank_, to, tag, "send to");
            auto& ch = hub_->channels[{rank_, to, tag}];
            if (!ch.posted.empty()) {
                auto s = ch.posted.front();
                ch.posted.erase(ch.posted.begin());
                s->data = std::move(data);
                s->filled = true;
            } else {
                ch.unexpected.push_back(std::move(data));
            }
        }
        hub_->cv.notify_all();
        return request(std::make_unique<detail::local_send>());
    }

    /// Matches the oldest waiting message, else queues behind earlier receives.
    request post_recv(int from, int tag) override {
        auto s = std::make_shared<detail::local_hub::slot>();
        {
            std::lock_guard lk(hub_->m);
            auto& ch = hub_->channels[{from, rank_, tag}];
            if (ch.head < ch.unexpected.size()) {
                s->data = std::move(ch.unexpected[ch.head++]);
                s->filled = true;
                if (ch.head == ch.unexpected.size()) {
                    ch.unexpected.clear();
                    ch.head = 0;
                }
            } else {
                ch.posted.push_back(s);
            }
        }
        return request(std::make_unique<detail::local_recv>(hub_, std::move(s), rank_, from, tag));
    }

private:
    std::shared_ptr<detail::local_hub> hub_;
    int rank_;
};

/// N ranks in one process. Hand endpoint(r) to the thread of rank r; the group may be
/// destroyed before the endpoints (they share its state).
class local_group {
public:
    /// A group of `n` ranks (n >= 1).
    explicit local_group(int n) {
        if (n < 1) fail("dist: a local group needs at least one rank, got ", n);
        hub_ = std::make_shared<detail::local_hub>(n);
    }

    /// The number of ranks.
    int size() const { return int(hub_->gone.size()); }

    /// The endpoint of `rank`; each rank's endpoint can be taken once.
    std::unique_ptr<local_communicator> endpoint(int rank) {
        if (rank < 0 || rank >= size()) fail("dist: rank ", rank, " is outside the local group of ", size(), " ranks");
        {
            std::lock_guard lk(hub_->m);
            if (hub_->taken[std::size_t(rank)]) fail("dist: the endpoint of rank ", rank, " was already taken");
            hub_->taken[std::size_t(rank)] = true;
        }
        return std::make_unique<local_communicator>(hub_, rank);
    }

    /// Marks `rank` as dead (tests): its peers' waits on it fail, naming it.
    void kill(int rank) {
        if (rank < 0 || rank >= size()) fail("dist: rank ", rank, " is outside the local group of ", size(), " ranks");
        hub_->mark_gone(rank, "killed");
    }

private:
    std::shared_ptr<detail::local_hub> hub_;
};

}  // namespace clover::dist
