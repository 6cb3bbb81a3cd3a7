// clover::dist over MPI, run under mpiexec by ctest (tests/dist/CMakeLists.txt). One mode per run:
//   ring       rounds of a batch description plus hidden rows (8 x 2048 f32 and bf16 bits) around
//              the ranks, all sends and receives posted ahead (non-blocking, overlapping); every
//              rank checks the bytes it got, rank 0 the whole round trip
//   broadcast  broadcasts from the last rank and from rank 0, barriers, and a receive whose
//              deadline passes (the error must name the silent rank)
//   killed     the ring, but rank 1 raises SIGKILL on itself after a few rounds: rank 0 must say
//              which rank failed and end the job (expect_failure.sh checks the words and the time)
//   killed-without-heartbeats  the same with the heartbeats off: rank 0 then only learns of the
//              death at its 30 s deadline, so under expect_failure.sh it fails (shows the test can)
//   progress   rank 0 starts a 4 MB send and then computes (sleeps) without calling MPI: the
//              communicator's progress thread must move it, so rank 1 has it long before rank 0
//              waits; the counters (stats) count its bytes and rank 1's time blocked
//   progress-off  the same with the progress thread's polling off: rank 1 reports how long the
//              message waited (ctest expects "waited for its sender's next MPI call": the check
//              of `progress` can fail)
// Exit status 0 when every check held on every rank.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "clover/dist/message.hpp"
#include "clover/dist/mpi.hpp"

using namespace clover::dist;

namespace {

constexpr int rows = 8, n_embd = 2048, rounds = 12;
constexpr std::uint32_t kind_hidden = 0x48494400;  // what a stage boundary carries
constexpr duration patience{30000};                 // far beyond the heartbeats' dead_after

int failures = 0;
void check(bool ok, int rank, const std::string& what) {
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "FAIL rank %d: %s\n", rank, what.c_str());
}

float value(int round, int i, int hops) { return float(i % 4096) * 0.25f + float(round) + float(hops); }

bytes hidden_message(int round, int hops) {
    std::vector<std::int32_t> ids(rows);
    std::vector<std::int64_t> pos(rows);
    std::vector<std::uint8_t> kinds(rows);
    std::vector<float> h(std::size_t(rows) * n_embd);  // [rows, n_embd]
    std::vector<std::uint16_t> h16(std::size_t(rows) * n_embd);
    for (int r = 0; r < rows; ++r) {
        ids[std::size_t(r)] = 1000 + r + round;
        pos[std::size_t(r)] = std::int64_t(r) + round;
        kinds[std::size_t(r)] = std::uint8_t(r % 3);
    }
    for (std::size_t i = 0; i < h.size(); ++i) {
        h[i] = value(round, int(i), hops);
        h16[i] = std::uint16_t(i * 7 + std::size_t(round));
    }
    return writer(kind_hidden).i32(round).i32(hops).array(ids).array(kinds).array(pos).array(h).array(h16).take();
}

// Checks a ring message; returns its hop count.
int check_hidden(const bytes& b, int rank, int from, int round) {
    reader rd(b, kind_hidden, "hidden rows from rank " + std::to_string(from));
    const int got_round = rd.i32(), hops = rd.i32();
    check(got_round == round, rank, "round " + std::to_string(got_round) + ", expected " + std::to_string(round));
    const auto ids = rd.array<std::int32_t>();
    const auto kinds = rd.array<std::uint8_t>();
    const auto pos = rd.array<std::int64_t>();
    std::vector<float> h(std::size_t(rows) * n_embd);
    rd.array_into(std::span<float>(h));
    const auto h16 = rd.array<std::uint16_t>();
    rd.finish();
    bool ok = ids.size() == rows && kinds.size() == rows && pos.size() == rows && h16.size() == h.size();
    for (int r = 0; ok && r < rows; ++r)
        ok = ids[std::size_t(r)] == 1000 + r + round && pos[std::size_t(r)] == r + round && kinds[std::size_t(r)] == r % 3;
    for (std::size_t i = 0; ok && i < h.size(); ++i)
        ok = h[i] == value(round, int(i), hops) && h16[i] == std::uint16_t(i * 7 + std::size_t(round));
    check(ok, rank, "the payload of round " + std::to_string(round) + " from rank " + std::to_string(from) + " changed");
    return hops;
}

void ring(mpi_communicator& c, int die_at_round) {
    const int me = c.rank(), n = c.size(), next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<request> sent;
    if (me == 0) {
        std::vector<request> back;
        for (int k = 0; k < rounds; ++k) back.push_back(c.irecv(prev, 1));
        for (int k = 0; k < rounds; ++k) sent.push_back(c.isend(next, 1, hidden_message(k, 0)));
        for (int k = 0; k < rounds; ++k) {
            const int hops = check_hidden(back[std::size_t(k)].take(patience), me, prev, k);
            check(hops == n - 1, me, "round " + std::to_string(k) + " made " + std::to_string(hops) + " hops");
        }
    } else {
        for (int k = 0; k < rounds; ++k) {
            if (k == die_at_round && me == 1) std::raise(SIGKILL);
            request in = c.irecv(prev, 1);
            const int hops = check_hidden(in.take(patience), me, prev, k);
            sent.push_back(c.isend(next, 1, hidden_message(k, hops + 1)));
        }
    }
    for (request& q : sent) q.wait(patience);
}

// expect_progress false (progress-off): the wait is reported, not checked, so the job ends
// normally either way (a rank aborting while the other finalizes made Open MPI's mpirun hang);
// ctest matches the report.
void progress(mpi_communicator& c, bool expect_progress) {
    const int me = c.rank();
    constexpr std::size_t size = std::size_t(4) << 20;  // far above any eager limit
    constexpr auto busy = std::chrono::milliseconds(800);
    c.barrier(patience);
    const stats before = c.stats();
    if (me == 0) {
        request q = c.isend(1, 3, bytes(size, std::byte{7}));
        std::this_thread::sleep_for(busy);  // a stage computing its next micro-batch
        q.wait(patience);
        check(c.stats().bytes_sent - before.bytes_sent == size, me, "bytes sent counted");
    } else if (me == 1) {
        const auto t0 = std::chrono::steady_clock::now();
        const bytes b = c.recv(0, 3, patience);
        const auto took = std::chrono::steady_clock::now() - t0;
        check(b.size() == size && b.back() == std::byte{7}, me, "the large message");
        const std::string ms = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) + " ms";
        if (expect_progress) check(took < busy / 2, me, "the large message waited for its sender's next MPI call (" + ms + ")");
        else
            std::printf("mpi_driver progress-off: rank 1: %s\n",
                        (took < busy / 2 ? "the large message arrived while its sender computed (" + ms + ")"
                                         : "the large message waited for its sender's next MPI call (" + ms + ")")
                            .c_str());
        const stats s = c.stats();
        check(s.bytes_received - before.bytes_received == size && s.messages_received - before.messages_received == 1, me,
              "bytes received counted");
        check(s.waited - before.waited >= took / 2, me, "time blocked counted");
    }
    c.barrier(patience);
}

void broadcast(mpi_communicator& c) {
    const int me = c.rank(), last = c.size() - 1;
    bytes b = me == last ? hidden_message(5, 0) : bytes{};
    c.broadcast(last, b, patience);
    check_hidden(b, me, last, 5);
    c.barrier(patience);
    bytes small = me == 0 ? writer(9).str("config from rank 0").take() : bytes{};
    c.broadcast(0, small, patience);
    reader rd(small, 9, "broadcast from rank 0");
    check(rd.str() == "config from rank 0", me, "the small broadcast");
    // The watchdog: rank 1 never sends on tag 77, so rank 0's receive ends at its deadline.
    if (me == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
            c.recv(1, 77, duration(300));
            check(false, me, "a receive nobody answers returned");
        } catch (const peer_error& e) {
            const std::string w = e.what();
            check(e.peer() == 1 && w.find("rank 1 (tag 77) did not complete within 300 ms") != std::string::npos, me,
                  "the deadline error: " + w);
        }
        check(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5), me, "the deadline took too long");
    }
    c.barrier(patience);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    mpi_session session(&argc, &argv);
    mpi_options opt;
    if (mode == "killed-without-heartbeats") opt.heartbeat = duration(0);
    if (mode == "progress-off") opt.progress = std::chrono::microseconds(0);
    mpi_communicator c(opt);
    try {
        if (mode == "ring") ring(c, -1);
        else if (mode == "broadcast") broadcast(c);
        else if (mode == "progress" || mode == "progress-off") progress(c, mode == "progress");
        else if (mode == "killed" || mode == "killed-without-heartbeats") ring(c, 3);
        else c.abort("mpi_driver: unknown mode '" + mode + "' (ring, broadcast, killed, progress)");
    } catch (const peer_error& e) {
        // Rank 0 speaks for the job: it names the failed rank and ends every rank. The others
        // report what they saw and leave the ending to rank 0.
        if (c.rank() == 0) c.abort("the stage on rank " + std::to_string(e.peer()) + " failed: " + e.what());
        std::fprintf(stderr, "clover: rank %d: %s\n", c.rank(), e.what());
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::_Exit(3);
    } catch (const std::exception& e) {
        c.abort(std::string("mpi_driver: ") + e.what());
    }
    if (failures) c.abort(std::to_string(failures) + " check(s) failed");
    if (c.rank() == 0) std::printf("mpi_driver %s: %d ranks ok\n", mode.c_str(), c.size());
    return 0;
}
