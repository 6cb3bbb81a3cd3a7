// clover::dist without MPI: the in-process group (local.hpp) through the communicator interface,
// and the message writer/reader. Every wait has a deadline, so a broken group fails, never hangs.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "clover/dist/communicator.hpp"
#include "clover/dist/local.hpp"
#include "clover/dist/message.hpp"

using namespace clover::dist;
using namespace std::chrono_literals;

namespace {

constexpr duration patience{10000};  // a correct test never comes near it

// Runs body(comm) on one thread per rank; rethrows the first failure of any rank.
void run_ranks(local_group& g, const std::function<void(communicator&)>& body) {
    std::vector<std::unique_ptr<local_communicator>> eps;
    for (int r = 0; r < g.size(); ++r) eps.push_back(g.endpoint(r));
    std::vector<std::exception_ptr> errs(std::size_t(g.size()));
    std::vector<std::thread> ts;
    for (int r = 0; r < g.size(); ++r)
        ts.emplace_back([&, r] {
            try {
                body(*eps[std::size_t(r)]);
            } catch (...) {
                errs[std::size_t(r)] = std::current_exception();
            }
        });
    for (auto& t : ts) t.join();
    for (auto& e : errs)
        if (e) std::rethrow_exception(e);
}

bytes msg_of(int round, int value) { return writer(7).i32(round).i32(value).take(); }
std::pair<int, int> read_msg(const bytes& b) {
    reader rd(b, 7, "test message");
    const int round = rd.i32(), value = rd.i32();
    rd.finish();
    return {round, value};
}

}  // namespace

TEST_CASE("local group: messages of one tag arrive in order, tags independent") {
    local_group g(2);
    run_ranks(g, [](communicator& c) {
        if (c.rank() == 0) {
            for (int i = 0; i < 5; ++i) {
                c.send(1, 1, msg_of(i, 100 + i));
                c.send(1, 2, msg_of(i, 200 + i));
            }
        } else {
            for (int i = 0; i < 5; ++i) CHECK(read_msg(c.recv(0, 2, patience)) == std::pair{i, 200 + i});
            for (int i = 0; i < 5; ++i) CHECK(read_msg(c.recv(0, 1, patience)) == std::pair{i, 100 + i});
        }
    });
}

TEST_CASE("local group: irecvs complete in post order and overlap the sender") {
    local_group g(2);
    auto a = g.endpoint(0), b = g.endpoint(1);
    std::vector<request> rs;
    for (int i = 0; i < 3; ++i) rs.push_back(b->irecv(0, 5));
    CHECK_FALSE(rs[0].test());  // nothing sent yet: pending, not an error
    std::thread sender([&] {
        for (int i = 0; i < 3; ++i) a->isend(1, 5, msg_of(i, i * 10)).wait(patience);
    });
    // Take them in reverse: each still holds the message of its own place in the order.
    for (int i = 2; i >= 0; --i) CHECK(read_msg(rs[std::size_t(i)].take(patience)) == std::pair{i, i * 10});
    sender.join();
    // A withdrawn receive does not swallow the next message.
    { request dropped = b->irecv(0, 6); }
    a->send(1, 6, msg_of(9, 9));
    CHECK(read_msg(b->recv(0, 6, patience)) == std::pair{9, 9});
}

TEST_CASE("local group: broadcast from any root, barrier") {
    local_group g(4);
    std::atomic<int> arrived{0};
    run_ranks(g, [&](communicator& c) {
        bytes b = c.rank() == 2 ? writer(3).str("from two").take() : bytes{};
        c.broadcast(2, b, patience);
        reader rd(b, 3, "broadcast");
        CHECK(rd.str() == "from two");
        ++arrived;
        c.barrier(patience);
        CHECK(arrived.load() == 4);  // nobody leaves the barrier before everyone arrived
        c.barrier(patience);
    });
}

TEST_CASE("local group: a deadline or a dead peer ends a wait with an error naming the rank") {
    local_group g(3);
    auto r0 = g.endpoint(0), r1 = g.endpoint(1), r2 = g.endpoint(2);

    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(r0->recv(1, 4, 100ms), doctest::Contains("no message from rank 1 (tag 4) within 100 ms"),
                         peer_error);
    CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);

    // A message sent before the death is still delivered; the next wait fails at once, by name.
    r2->send(0, 4, msg_of(1, 2));
    std::thread killer([&] {
        std::this_thread::sleep_for(50ms);
        g.kill(2);
    });
    CHECK(read_msg(r0->recv(2, 4, patience)) == std::pair{1, 2});
    try {
        r0->recv(2, 4);  // no deadline: only the death ends it
        FAIL("the receive from a killed rank returned");
    } catch (const peer_error& e) {
        CHECK(e.peer() == 2);
        CHECK(std::string(e.what()).find("rank 2 is gone (killed)") != std::string::npos);
    }
    killer.join();
    CHECK_THROWS_WITH_AS(r0->send(2, 4, {}), doctest::Contains("rank 2 is gone (killed): rank 0 cannot send to it"),
                         peer_error);
    CHECK_THROWS_WITH_AS(r2->send(0, 4, {}), doctest::Contains("rank 2 is gone (killed) and cannot send to rank 0"),
                         peer_error);

    // A closed endpoint is gone too; so is a rank that aborted.
    request pending = r0->irecv(1, 8);
    r1.reset();
    CHECK_THROWS_WITH_AS(pending.wait(patience), doctest::Contains("rank 1 is gone (its endpoint was closed)"), peer_error);
    CHECK_THROWS_WITH_AS(r0->abort("stage 0 failed"), doctest::Contains("rank 0 aborted: stage 0 failed"), clover::error);
}

TEST_CASE("local group: a barrier with a dead rank fails naming it") {
    local_group g(3);
    g.kill(1);
    auto r0 = g.endpoint(0);
    CHECK_THROWS_WITH_AS(r0->barrier(patience), doctest::Contains("rank 1 is gone (killed)"), peer_error);
}

TEST_CASE("local group: bad ranks, tags and endpoints") {
    local_group g(2);
    auto r0 = g.endpoint(0);
    CHECK_THROWS_WITH_AS(g.endpoint(0), doctest::Contains("endpoint of rank 0 was already taken"), clover::error);
    CHECK_THROWS_WITH_AS(g.endpoint(2), doctest::Contains("rank 2 is outside the local group of 2 ranks"), clover::error);
    CHECK_THROWS_WITH_AS(r0->send(5, 0, {}), doctest::Contains("cannot send to rank 5 (the group has 2 ranks)"), clover::error);
    CHECK_THROWS_WITH_AS(r0->irecv(1, tags::user_limit), doctest::Contains("tag 32000 is outside [0, 32000)"), clover::error);
    CHECK_THROWS_WITH_AS(r0->irecv(1, -1), doctest::Contains("tag -1 is outside"), clover::error);
    CHECK_THROWS_WITH_AS(local_group(0), doctest::Contains("at least one rank"), clover::error);
}

TEST_CASE("messages: a batch description and hidden rows round-trip") {
    const std::vector<std::int32_t> ids{5, 6, 7};
    const std::vector<std::uint8_t> kinds{0, 1, 1};
    const std::vector<std::int64_t> pos{10, 11, 0};
    std::vector<float> rows(3 * 16);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = float(i) * 0.5f - 3.f;
    const std::vector<std::uint16_t> bf16{0x3f80, 0xbf80};
    const bytes b = writer(42).u32(3).array(ids).array(kinds).array(pos).array(rows).array(bf16).f64(1.5).u64(9).take();

    reader rd(b, 42, "batch from rank 0");
    CHECK(rd.u32() == 3);
    CHECK(rd.array<std::int32_t>() == ids);
    CHECK(rd.array<std::uint8_t>() == kinds);
    CHECK(rd.array<std::int64_t>() == pos);
    std::vector<float> got(rows.size());
    rd.array_into(std::span<float>(got));
    CHECK(got == rows);
    CHECK(rd.array<std::uint16_t>() == bf16);
    CHECK(rd.f64() == 1.5);
    CHECK(rd.u64() == 9);
    CHECK(rd.remaining() == 0);
    rd.finish();
}

TEST_CASE("messages: a wrong kind, field, length or a short message is one clear error") {
    const std::vector<float> rows(8, 1.f);
    const bytes b = writer(42).i32(3).array(rows).take();

    CHECK_THROWS_WITH_AS(reader(b, 41, "batch from rank 0"),
                         doctest::Contains("batch from rank 0: expected a message of kind 41, got kind 42"), clover::error);
    {
        reader rd(b, 42, "m");
        CHECK_THROWS_WITH_AS(rd.u32(), doctest::Contains("m: field 0 is a i32, expected a u32"), clover::error);
    }
    {
        reader rd(b, 42, "m");
        rd.i32();
        std::vector<float> out(7);
        CHECK_THROWS_WITH_AS(rd.array_into(std::span<float>(out)), doctest::Contains("field 1 holds 8 elements, expected 7"),
                             clover::error);
    }
    {
        reader rd(b, 42, "m");
        rd.i32();
        CHECK_THROWS_WITH_AS(rd.array<std::uint16_t>(),
                             doctest::Contains("field 1 is an array of f32 (4 bytes each), expected u16 (2 bytes each)"),
                             clover::error);
    }
    {  // reading past the end
        reader rd(b, 42, "m");
        rd.i32();
        rd.array<float>();
        CHECK_THROWS_WITH_AS(rd.i32(), doctest::Contains("m: message ends inside field 2"), clover::error);
    }
    {  // a truncated array: its count promises more than the message holds
        const bytes cut(b.begin(), b.end() - 4);
        reader rd(cut, 42, "m");
        rd.i32();
        CHECK_THROWS_WITH_AS(rd.array<float>(), doctest::Contains("claims 8 elements of 4 bytes but only 28 bytes remain"),
                             clover::error);
    }
    {  // a hostile count that would overflow count * size
        bytes h = writer(1).take();
        const std::uint8_t head[] = {11, 8, 4};  // array, f32, 4 bytes
        for (auto c : head) h.push_back(std::byte(c));
        for (int i = 0; i < 8; ++i) h.push_back(std::byte(0xff));
        reader rd(h, 1, "m");
        CHECK_THROWS_WITH_AS(rd.array<float>(), doctest::Contains("claims 18446744073709551615 elements"), clover::error);
    }
    {  // more fields than the reader expects
        reader rd(b, 42, "m");
        rd.i32();
        CHECK_THROWS_WITH_AS(rd.finish(), doctest::Contains("m: 43 unread bytes after field 1"), clover::error);
    }
    CHECK_THROWS_WITH_AS(reader(bytes{}, 1, "empty"), doctest::Contains("empty: message ends inside field 0"), clover::error);
}

TEST_CASE("local group: stats count messages, bytes and the time blocked waiting; reset_stats zeroes them") {
    local_group g(2);
    run_ranks(g, [](communicator& c) {
        if (c.rank() == 0) {
            std::this_thread::sleep_for(150ms);  // rank 1 is blocked meanwhile
            c.send(1, 1, bytes(1000));
            c.isend(1, 1, bytes(24)).wait(patience);
            const stats s = c.stats();
            CHECK(s.messages_sent == 2);
            CHECK(s.bytes_sent == 1024);
            CHECK(s.messages_received == 0);
            CHECK(s.waited < 100ms);  // sends of the local group never block
            c.barrier(patience);
        } else {
            CHECK(c.recv(0, 1, patience).size() == 1000);
            request q = c.irecv(0, 1);
            CHECK(q.take(patience).size() == 24);
            const stats s = c.stats();
            CHECK(s.messages_received == 2);
            CHECK(s.bytes_received == 1024);
            CHECK(s.messages_sent == 0);
            CHECK(s.waited >= 100ms);
            c.reset_stats();
            CHECK(c.stats().messages_received == 0);
            CHECK(c.stats().waited == std::chrono::nanoseconds(0));
            c.barrier(patience);  // the communicator's own messages count too
            CHECK(c.stats().messages_sent == 1);
            CHECK(c.stats().messages_received == 1);
        }
    });
}
