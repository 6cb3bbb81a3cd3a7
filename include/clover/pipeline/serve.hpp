#pragma once
/// \file
/// serve_stage: what a rank other than 0 runs: it applies rank 0's commands to its own stage
/// model, in order, and runs its layers of every pass, until rank 0 sends shutdown.
//
// A rank needs only the file, its stage range (stage_of_rank: the split every rank computes
// alike) and the communicator. It keeps its own sessions, held pages and saved states, keyed by
// rank 0's handles (session ids and page numbers of rank 0's stage; saved-state handles rank 0
// numbers): the pools move in step, but nothing here relies on their numbers being equal.
//
// A rank that fails (an operation its model refuses, a message it cannot read, a peer that does
// not answer) reports it to rank 0 and keeps serving in a failed mode: it runs nothing more, but
// still passes a failure down the chain for each pass, so no rank waits for rows that will never
// come, and it returns at shutdown with the error.
//
// Micro-batches (pipeline.hpp) arrive as passes back to back: each pass's rows (or logits) leave
// with a non-blocking send, so this rank goes on to the next micro-batch while they travel.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clover/dist/communicator.hpp"
#include "clover/dist/message.hpp"
#include "clover/io/gguf.hpp"
#include "clover/model/model.hpp"
#include "clover/pipeline/protocol.hpp"
#include "clover/pipeline/split.hpp"
#include "clover/arch/registry.hpp"

namespace clover::pipeline {

/// How a rank serves its stage.
struct serve_options {
    /// The longest wait for the previous stage's rows within a pass (a stage that is stuck: its
    /// failure names that stage). A rank that is gone fails the wait at once, whatever this is.
    dist::duration timeout{600000};
};

/// "stage r (rank r, layers [a, b))": how errors name a stage.
inline std::string stage_name(int r, const stage_range& s) {
    return "stage " + std::to_string(r) + " (rank " + std::to_string(r) + ", layers [" + std::to_string(s.first) + ", " +
           std::to_string(s.last) + "))";
}

/// The layers rank c.rank() runs: split_layers over the file's layer count and c.size() ranks
/// (`counts`: the --layer-split counts; empty: even). An error for a bad split, before anything
/// is loaded; every rank computes the same split.
inline stage_range stage_of_rank(const io::gguf_file& f, const dist::communicator& c, std::span<const std::int64_t> counts = {}) {
    const hparams hp = read_hparams(f);
    return split_layers(hp.n_layer, c.size(), counts)[std::size_t(c.rank())];
}

namespace detail {

template <class Model>
class stage_server {
public:
    stage_server(Model& m, dist::communicator& c, const serve_options& o) : m_(m), c_(c), o_(o), r_(c.rank()) {}

    std::string run() {
        for (;;) {
            // No deadline: an idle server waits for work; rank 0 gone ends the wait (peer_error).
            const dist::bytes b = c_.recv(0, tags::command);
            dist::reader rd(b, kinds::command, "command from rank 0 to " + name());
            const op o = op(rd.u8());
            if (o == op::shutdown) {
                finish_sends();
                return failed_;
            }
            if (o == op::pass) {
                pass(rd);
                continue;
            }
            if (o == op::stats) {  // answered in a failed mode too: the counters still mean something
                reply_stats(rd);
                continue;
            }
            if (!failed_.empty()) {
                if (o == op::checkpoints || o == op::hello) reply_error(o, failed_);
                continue;
            }
            try {
                apply(o, rd);
            } catch (const std::exception& e) {
                fail_with(e.what());
                if (o == op::checkpoints || o == op::hello) reply_error(o, failed_);
                try {
                    c_.send(0, tags::error, dist::writer(kinds::error).i32(r_).str(failed_).take(), o_.timeout);
                } catch (const dist::peer_error&) {  // rank 0 gone: its own wait says so
                }
            }
        }
    }

private:
    std::string name() const { return stage_name(r_, m_.stage()); }
    void fail_with(const std::string& what) {
        if (failed_.empty()) failed_ = name() + " failed: " + what;
    }

    session& seq(std::int32_t pool, seq_id id) {
        auto it = sess_.find({pool, id});
        if (it == sess_.end()) fail("no session ", id, " of pool ", pool, " is open here");
        return it->second;
    }

    void apply(op o, dist::reader& rd) {
        switch (o) {
            case op::hello: hello(rd); break;
            case op::open: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                session_options so;
                so.ctx = rd.i64();
                so.batch = rd.i64();
                so.kv_f16 = rd.u8() != 0;
                rd.finish();
                add(pool, id, m_.new_session(so));
                break;
            }
            case op::open_from: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                session_options so;
                so.ctx = rd.i64();
                so.batch = rd.i64();
                so.kv_f16 = rd.u8() != 0;
                const auto pages = rd.array<std::int32_t>();
                const auto toks = rd.array<token>();
                const std::uint64_t h = rd.u64();
                rd.finish();
                std::vector<std::int32_t> own;
                for (std::int32_t p : pages) {
                    auto it = held_.find({pool, p});
                    if (it == held_.end() || it->second.empty()) fail("page ", p, " of pool ", pool, " is not held here");
                    own.push_back(it->second.back());
                }
                typename Model::saved_state st{};
                if (h) {
                    auto it = saved_.find(h);
                    if (it == saved_.end()) fail("no saved state ", h, " here");
                    st = it->second;
                }
                add(pool, id, m_.new_session_from(so, own, toks, st));
                break;
            }
            case op::close: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                rd.finish();
                sess_.erase({pool, id});
                break;
            }
            case op::rollback: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                const std::int64_t keep = rd.i64();
                rd.finish();
                m_.rollback(seq(pool, id), keep);
                break;
            }
            case op::checkpoint: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                rd.finish();
                m_.checkpoint(seq(pool, id));
                break;
            }
            case op::restore: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                const std::int64_t pos = rd.i64();
                rd.finish();
                m_.restore(seq(pool, id), pos);
                break;
            }
            case op::copy_prefix:
            case op::copy_state: {
                const std::int32_t pool = rd.i32();
                const seq_id dst = rd.i32(), src = rd.i32();
                const std::int64_t pos = rd.i64();
                rd.finish();
                if (o == op::copy_prefix) m_.copy_prefix(seq(pool, dst), seq(pool, src), pos);
                else m_.copy_state(seq(pool, dst), seq(pool, src));
                break;
            }
            case op::hold: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                const std::int64_t first = rd.i64(), count = rd.i64();
                const auto theirs = rd.array<std::int32_t>();
                rd.finish();
                const auto own = m_.hold_pages(seq(pool, id), first, count);
                if (own.size() != theirs.size())
                    fail("held ", own.size(), " pages where rank 0 held ", theirs.size());
                for (std::size_t i = 0; i < own.size(); ++i) held_[{pool, theirs[i]}].push_back(own[i]);
                break;
            }
            case op::drop: {
                const std::int32_t pool = rd.i32();
                const auto theirs = rd.array<std::int32_t>();
                rd.finish();
                for (std::int32_t p : theirs) {
                    auto it = held_.find({pool, p});
                    if (it == held_.end() || it->second.empty()) fail("page ", p, " of pool ", pool, " is not held here");
                    const std::int32_t own = it->second.back();
                    it->second.pop_back();
                    if (it->second.empty()) held_.erase(it);
                    m_.drop_pages(pool, std::span<const std::int32_t>(&own, 1));
                }
                break;
            }
            case op::save: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                const std::int64_t pos = rd.i64();
                const std::uint64_t h = rd.u64();
                const bool take = rd.u8() != 0;
                rd.finish();
                session& s = seq(pool, id);
                saved_[h] = take ? m_.take_state(s, pos) : m_.save_state(s, pos);
                break;
            }
            case op::drop_saved: {
                const std::uint64_t h = rd.u64();
                rd.finish();
                saved_.erase(h);
                break;
            }
            case op::checkpoints: {
                const std::int32_t pool = rd.i32();
                const seq_id id = rd.i32();
                rd.finish();
                const auto v = m_.checkpoints(seq(pool, id));
                c_.send(0, tags::reply, dist::writer(kinds::reply).u8(std::uint8_t(o)).u8(1).array(v).take(), o_.timeout);
                break;
            }
            default: fail("unknown command ", unsigned(o));
        }
    }

    void add(std::int32_t pool, seq_id id, session s) {
        if (s.pool() != pool) fail("session ", id, " opened in pool ", s.pool(), ", rank 0's is in pool ", pool);
        if (!sess_.emplace(std::pair{pool, id}, std::move(s)).second) fail("session ", id, " of pool ", pool, " is already open here");
    }

    // The split and the file's dimensions, as rank 0 has them, against this rank's stage.
    void hello(dist::reader& rd) {
        const std::int64_t n_layer = rd.i64(), n_vocab = rd.i64(), n_embd = rd.i64();
        const auto cuts = rd.array<std::int64_t>();
        rd.finish();
        const hparams& hp = m_.hp();
        stage_info si;
        if (n_layer != hp.n_layer || n_vocab != hp.n_vocab || n_embd != hp.n_embd)
            si.error = "its file has " + std::to_string(hp.n_layer) + " layers, " + std::to_string(hp.n_vocab) + " tokens and width " +
                       std::to_string(hp.n_embd) + "; rank 0's has " + std::to_string(n_layer) + ", " + std::to_string(n_vocab) +
                       " and " + std::to_string(n_embd);
        else if (std::int64_t(cuts.size()) != c_.size() + 1)
            si.error = "rank 0 splits the layers into " + std::to_string(cuts.size() - 1) + " stages for " + std::to_string(c_.size()) + " ranks";
        else if (m_.stage() != stage_range(cuts[std::size_t(r_)], cuts[std::size_t(r_) + 1]))
            si.error = "it runs layers [" + std::to_string(m_.stage().first) + ", " + std::to_string(m_.stage().last) +
                       ") but rank 0's split gives it [" + std::to_string(cuts[std::size_t(r_)]) + ", " +
                       std::to_string(cuts[std::size_t(r_) + 1]) + ")";
        if (si.error.empty()) {
            si.page_bytes[0] = m_.page_bytes(0);
            si.page_bytes[1] = m_.page_bytes(1);
            si.checkpoint_bytes = m_.checkpoint_bytes();
            si.page_size = m_.page_size();
        } else {
            fail_with(si.error);
        }
        c_.send(0, tags::reply,
                dist::writer(kinds::reply).u8(std::uint8_t(op::hello)).u8(si.error.empty() ? 1 : 0).str(si.error)
                    .u64(si.page_bytes[0]).u64(si.page_bytes[1]).u64(si.checkpoint_bytes).i64(si.page_size).take(),
                o_.timeout);
    }

    void reply_stats(dist::reader& rd) {
        try {
            rd.finish();
            rank_stats st = st_;
            st.comm = c_.stats();
            dist::writer w(kinds::reply);
            w.u8(std::uint8_t(op::stats)).u8(1);
            write_stats(w, st);
            c_.send(0, tags::reply, w.take(), o_.timeout);
        } catch (const dist::peer_error&) {  // rank 0 gone: its own wait says so
        } catch (const std::exception& e) {
            fail_with(e.what());
            reply_error(op::stats, failed_);
        }
    }

    // Forgets the sends that completed; a send that can no longer complete fails this stage.
    void reap_sends() {
        std::erase_if(sends_, [this](dist::request& q) {
            try {
                return q.test();
            } catch (const dist::peer_error& e) {  // the next stage is gone: rank 0 finds out from it
                fail_with(e.what());
                return true;
            }
        });
    }
    // At shutdown: the last sends complete (rank 0 has taken every logits message by then).
    void finish_sends() {
        for (dist::request& q : sends_) {
            try {
                q.wait(std::min(o_.timeout, dist::duration(5000)));
            } catch (const dist::peer_error&) {
            }
        }
        sends_.clear();
    }

    void reply_error(op o, const std::string& what) {
        try {
            dist::writer w(kinds::reply);
            w.u8(std::uint8_t(o)).u8(0).str(what);
            if (o == op::hello) w.u64(0).u64(0).u64(0).i64(0);
            c_.send(0, tags::reply, w.take(), o_.timeout);
        } catch (const dist::peer_error&) {  // rank 0 gone: its own wait says so
        }
    }

    // One pass: the rows from the previous rank, this stage's layers, the rows (or the last
    // stage's logits) on. Whatever fails, something goes on down the chain.
    void pass(dist::reader& rd) {
        const int last = c_.size() - 1;
        const int to = r_ == last ? 0 : r_ + 1;
        const int tag = r_ == last ? tags::out : tags::rows;
        std::vector<segment_desc> segs;
        bool exact = false;
        std::string bad;
        try {
            segs = read_pass(rd, exact);
            rd.finish();
        } catch (const std::exception& e) {
            bad = e.what();
        }
        dist::bytes out;
        rows_result in;
        try {
            in = read_rows(c_.recv(r_ - 1, tags::rows, o_.timeout), "rows from rank " + std::to_string(r_ - 1) + " to " + name());
        } catch (const dist::peer_error& e) {
            in.stage = e.peer();
            in.what = std::string("its rows did not come: ") + e.what();
        } catch (const std::exception& e) {
            bad = e.what();
            in.ok = true;
        }
        if (!in.ok) {
            // Stages before this one ran, this one does not: its state is behind, for good.
            fail_with("stage " + std::to_string(in.stage) + " before it failed");
            out = failed_rows_message(in.stage, in.what);
        } else if (!bad.empty() || !failed_.empty()) {
            fail_with(bad);
            out = failed_rows_message(r_, failed_);
        } else {
            try {
                std::vector<pass_request> reqs;
                std::uint64_t rows = 0;
                for (const segment_desc& s : segs) {
                    reqs.push_back({&seq(s.pool, s.id), s.kind, s.ids, s.logits, s.coreset});
                    rows += s.ids.size();
                }
                const auto t0 = std::chrono::steady_clock::now();
                m_.run_stage(reqs, in.v.data(), h_, exact);
                st_.compute += std::chrono::steady_clock::now() - t0;
                ++st_.micro_batches;
                st_.rows += rows;
                out = rows_message(h_);
            } catch (const std::exception& e) {
                fail_with(e.what());
                out = failed_rows_message(r_, failed_);
            }
        }
        reap_sends();
        try {  // not waited for: the next micro-batch's command may be here already
            sends_.push_back(c_.isend(to, tag, std::move(out)));
        } catch (const dist::peer_error& e) {  // the next stage is gone: rank 0 finds out from it
            fail_with(e.what());
        }
    }

    Model& m_;
    dist::communicator& c_;
    serve_options o_;
    int r_;
    std::string failed_;  // the first failure: nothing runs after it
    std::map<std::pair<std::int32_t, seq_id>, session> sess_;               // by rank 0's (pool, id)
    std::map<std::pair<std::int32_t, std::int32_t>, std::vector<std::int32_t>> held_;  // rank 0's page -> ours (per hold)
    std::map<std::uint64_t, typename Model::saved_state> saved_;            // by rank 0's handle
    std::vector<float> h_;  // [rows, n_embd] or the logits
    std::vector<dist::request> sends_;  // rows or logits on their way to the next rank
    rank_stats st_;                     // this stage's work (the communicator's counters are added on query)
};

}  // namespace detail

/// Serves stage `m` (a model made with this rank's stage_range) on communicator `c` (rank > 0)
/// until rank 0's pipeline shuts down: applies its session commands, runs its layers of every
/// pass. Returns "" after a clean shutdown, or the first failure of this stage (also reported to
/// rank 0 when it happened). Throws dist::peer_error when rank 0 itself is gone.
template <class Model>
std::string serve_stage(Model& m, dist::communicator& c, const serve_options& o = {}) {
    if (c.rank() == 0) fail("serve_stage: rank 0 drives the pipeline (pipeline::pipeline), it serves no stage");
    if (m.first_stage()) fail("serve_stage: rank ", c.rank(), " holds the first stage; rank 0 runs it");
    return detail::stage_server<Model>(m, c, o).run();
}

}  // namespace clover::pipeline
