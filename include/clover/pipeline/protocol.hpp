#pragma once
/// \file
/// The messages between rank 0 (pipeline.hpp) and the ranks that serve a stage (serve.hpp).
//
// Rank 0 sends every rank one command per session or state operation, in the order it applies
// them to its own stage, on one tag: message order per (pair, tag) is the communicator's
// promise, so every rank applies the same operations in the same order and its state pool
// (sequence ids, page tables, checkpoints) moves in step with rank 0's. Commands need no answer
// (no round trip per operation); a rank that fails one reports it on the error tag, which rank 0
// checks before each operation. A pass is a command too (the batch description); then the hidden
// rows go rank to rank on the rows tag and the last rank sends the logits to rank 0 on the out
// tag. A rank that fails inside a pass sends its error down the chain in place of the rows, so
// the rank waiting on it never waits in vain. A step of many sequences is several passes in a row
// (micro-batches, pipeline.hpp), each its own command and rows: a rank runs them as they come.
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "clover/core/pass.hpp"
#include "clover/dist/communicator.hpp"
#include "clover/dist/message.hpp"

namespace clover::pipeline {

/// Message tags of a pipeline (in the communicator's user range).
namespace tags {
inline constexpr int command = 1;  ///< rank 0 to every rank: session operations and passes
inline constexpr int rows = 2;     ///< rank r to rank r + 1: a pass's hidden rows [rows, n_embd] f32
inline constexpr int out = 3;      ///< the last rank to rank 0: a pass's logits
inline constexpr int error = 4;    ///< any rank to rank 0: a command that failed there
inline constexpr int reply = 5;    ///< any rank to rank 0: the answer to a query (hello, checkpoints)
}  // namespace tags

/// The operations of a command message (its first field).
enum class op : std::uint8_t {
    hello = 1,    ///< the split and the file's dimensions, checked by each rank; it replies
    open,         ///< new_session
    open_from,    ///< new_session_from (held pages, a saved state)
    close,        ///< a session closed
    rollback,     ///< keep the first rows of the last verify
    checkpoint,   ///< save the GDN states at the session's position
    restore,      ///< back to 0 or a checkpoint
    copy_prefix,  ///< dst <- src's first pos tokens
    copy_state,   ///< dst <- src
    hold,         ///< hold_pages
    drop,         ///< drop_pages
    save,         ///< save_state / take_state under a handle
    drop_saved,   ///< a saved state's last holder let go
    pass,         ///< run a pass (the batch description follows)
    checkpoints,  ///< query: a session's checkpoint positions (replied)
    shutdown,     ///< serve_stage returns
    stats         ///< query: the rank's counters (replied)
};

/// Message kinds (the dist::writer kind of each message).
namespace kinds {
inline constexpr std::uint32_t command = 0x43504c50;  ///< a command (tags::command)
inline constexpr std::uint32_t rows = 0x52504c50;     ///< rows or logits, or the error in their place
inline constexpr std::uint32_t error = 0x45504c50;    ///< a rank's failure (tags::error)
inline constexpr std::uint32_t reply = 0x59504c50;    ///< a query's answer (tags::reply)
}  // namespace kinds

/// One sequence's segment of a pass, as every rank receives it. pool/id: rank 0's session.
struct segment_desc {
    std::int32_t pool = 0;           ///< its state pool (0: f32 KV, 1: f16)
    seq_id id = -1;                  ///< rank 0's session id (each rank maps it to its own)
    pass_kind kind = pass_kind::commit;  ///< commit, preview or verify
    std::vector<token> ids;          ///< its rows' token ids
    std::int64_t logits = 0;         ///< logits of the last rows
    std::int64_t coreset = -1;       ///< preview: the coreset (-1: the file's default)
};

/// Appends a pass's description (after op::pass) to a command.
inline void write_pass(dist::writer& w, bool exact, std::span<const segment_desc> segs) {
    w.u8(exact ? 1 : 0).u32(std::uint32_t(segs.size()));
    for (const segment_desc& s : segs)
        w.i32(s.pool).i32(s.id).u8(std::uint8_t(s.kind)).array(s.ids).i64(s.logits).i64(s.coreset);
}

/// Reads a pass's description (after op::pass); `exact` receives the flag.
inline std::vector<segment_desc> read_pass(dist::reader& rd, bool& exact) {
    exact = rd.u8() != 0;
    const std::uint32_t n = rd.u32();
    if (n == 0 || n > rd.remaining()) fail("pipeline: a pass of ", n, " segments");
    std::vector<segment_desc> segs(n);
    for (segment_desc& s : segs) {
        s.pool = rd.i32();
        s.id = rd.i32();
        const std::uint8_t k = rd.u8();
        if (k > std::uint8_t(pass_kind::preview)) fail("pipeline: a segment of unknown kind ", unsigned(k));
        s.kind = pass_kind(k);
        s.ids = rd.array<token>();
        s.logits = rd.i64();
        s.coreset = rd.i64();
    }
    return segs;
}

/// A rows message: the rows (or logits) of a pass.
inline dist::bytes rows_message(std::span<const float> v) {
    return dist::writer(kinds::rows).u8(1).array(v).take();
}
/// A rows message carrying a stage's failure instead (`stage`: the rank that failed).
inline dist::bytes failed_rows_message(int stage, const std::string& what) {
    return dist::writer(kinds::rows).u8(0).i32(stage).str(what).take();
}

/// What a rows message holds: the rows, or the failure of the stage that sent it first.
struct rows_result {
    bool ok = false;        ///< rows, not a failure
    std::vector<float> v;   ///< the rows (ok)
    int stage = -1;         ///< the stage that failed (not ok)
    std::string what;       ///< its error (not ok)
};

/// Reads a rows message (`from`: for errors about the message itself).
inline rows_result read_rows(const dist::bytes& b, const std::string& from) {
    dist::reader rd(b, kinds::rows, from);
    rows_result r;
    r.ok = rd.u8() != 0;
    if (r.ok) {
        r.v = rd.array<float>();
    } else {
        r.stage = rd.i32();
        r.what = rd.str();
    }
    rd.finish();
    return r;
}

/// What a rank reports of its stage in reply to hello (the parts rank 0 sums over stages).
struct stage_info {
    std::string error;                    ///< non-empty: the rank cannot serve (a mismatch with the split)
    std::uint64_t page_bytes[2] = {0, 0};  ///< bytes of one KV page of its layers, per pool
    std::uint64_t checkpoint_bytes = 0;   ///< bytes of one GDN checkpoint of its layers
    std::int64_t page_size = 0;           ///< tokens per KV page
};

/// What one rank has done (pipeline::gather_stats): its communicator's counters and its stage's work.
struct rank_stats {
    dist::stats comm;                     ///< messages, bytes and time blocked on its communicator
    std::uint64_t micro_batches = 0;      ///< passes of its layers (one per micro-batch)
    std::uint64_t rows = 0;               ///< rows those passes ran
    std::chrono::nanoseconds compute{0};  ///< time in its layers
};

/// Appends a rank's counters to a message.
inline void write_stats(dist::writer& w, const rank_stats& s) {
    w.u64(s.comm.messages_sent).u64(s.comm.bytes_sent).u64(s.comm.messages_received).u64(s.comm.bytes_received)
        .i64(s.comm.waited.count()).u64(s.micro_batches).u64(s.rows).i64(s.compute.count());
}
/// Reads what write_stats wrote.
inline rank_stats read_stats(dist::reader& rd) {
    rank_stats s;
    s.comm.messages_sent = rd.u64();
    s.comm.bytes_sent = rd.u64();
    s.comm.messages_received = rd.u64();
    s.comm.bytes_received = rd.u64();
    s.comm.waited = std::chrono::nanoseconds(rd.i64());
    s.micro_batches = rd.u64();
    s.rows = rd.u64();
    s.compute = std::chrono::nanoseconds(rd.i64());
    return s;
}

}  // namespace clover::pipeline
