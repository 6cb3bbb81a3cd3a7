#pragma once
/// \file
/// clover::pipeline::pipeline: rank 0's model of a model split by layers over the ranks of a
/// communicator. It runs the first stage itself and drives the others (serve.hpp), and offers
/// what the decode engine, runner, decoders and prefix cache use of a model, so they drive it
/// unchanged.
//
// Every session or state operation is applied to rank 0's stage first (so bad input fails there
// with the model's own message and nothing is sent), then sent to every rank as one command,
// under one lock, so every rank applies the same operations in the same order. A pass runs
// stage 0 first, then sends the batch description to every rank and the hidden rows to rank 1;
// the last rank sends the logits back. A pass of several sequences is cut into micro-batches by
// sequence (micro_batch_cuts) that follow each other through the stages: stage 0 runs
// micro-batch k + 1 while rank 1 runs k, every send is non-blocking, and rank 0 takes the logits
// of each micro-batch in order. In exact mode a row's logits do not depend on the other rows of
// its pass, so the cut changes no bit. Answers about state come from rank 0's stage where it
// knows them (page size, pages used), from the sums the ranks reported at start (bytes of a KV
// page, of a GDN checkpoint), or, for what a stage without GDN layers does not keep (checkpoint
// positions), from the first rank that has GDN layers (one round trip).
//
// Failures: a rank that is gone or stuck (dist::peer_error), or that reports a failure, makes the
// operation that finds it throw a stage_error naming the stage, and the pipeline is broken for
// good (the stages' states no longer agree): every later operation throws the same error.
// Rank 0 checks the error reports before each operation, so a dead rank fails the next one.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clover/dist/communicator.hpp"
#include "clover/dist/message.hpp"
#include "clover/model/model.hpp"
#include "clover/pipeline/protocol.hpp"
#include "clover/pipeline/serve.hpp"
#include "clover/pipeline/split.hpp"

namespace clover::pipeline {

/// A stage failed (a rank gone, stuck, or reporting an error): the pipeline no longer runs.
class stage_error : public clover::error {
public:
    /// `stage`: the failed stage (its rank); `what`: the whole message, naming it.
    stage_error(int stage, const std::string& what) : clover::error(what), stage_(stage) {}
    /// The failed stage, which is also its rank.
    int stage() const { return stage_; }

private:
    int stage_;
};

/// How rank 0 drives the pipeline.
struct pipeline_options {
    /// Layers per rank (`--layer-split 3,5`); empty: an even split (split.hpp).
    std::vector<std::int64_t> layer_split = {};
    /// The longest wait for a pass's logits or a rank's reply (a stuck stage). A rank that is
    /// gone fails the wait at once, whatever this is.
    dist::duration timeout{600000};
    /// Micro-batches a pass of several sequences is cut into (at most one per sequence); 0: one
    /// per stage. With m micro-batches over S stages a pass takes about m + S - 1 micro-batch
    /// times, and every stage reads its dense weights (the last also its head) once per
    /// micro-batch: more micro-batches shorten the fill and drain of the pipeline but add weight
    /// reads. S is the fewest with which every stage works at once at some point of the pass.
    std::int64_t micro_batches = 0;
};

/// Where a pass is cut into micro-batches: `rows[i]` is request i's row count, in pass order; the
/// result holds the cut points, 0 first and rows.size() last, of contiguous groups of requests
/// with about equal rows (a request is never split). `want` groups (0: one per stage), at most
/// one per request; one group for one stage or one request.
inline std::vector<std::size_t> micro_batch_cuts(std::span<const std::int64_t> rows, int stages, std::int64_t want = 0) {
    const std::size_t n = rows.size();
    if (want < 0) fail("pipeline: ", want, " micro-batches");
    std::size_t m = want > 0 ? std::size_t(want) : std::size_t(std::max(stages, 1));
    if (stages <= 1 || n <= 1) m = 1;
    m = std::min(m, n);
    std::int64_t total = 0;
    for (std::int64_t r : rows) total += r;
    std::vector<std::size_t> cuts{0};
    std::int64_t acc = 0;
    for (std::size_t i = 0; i + 1 < n && cuts.size() < m; ++i) {
        acc += rows[i];
        const std::size_t closed = cuts.size();  // groups closed once this one is
        const std::size_t left = n - (i + 1);    // requests after i
        // Close a group once it holds its share of the rows, or when each group left needs one of
        // the requests left.
        if (left >= m - closed && (acc * std::int64_t(m) >= total * std::int64_t(closed) || left == m - closed)) cuts.push_back(i + 1);
    }
    cuts.push_back(n);
    return cuts;
}

namespace detail {

// What the pipeline and the saved states it handed out share: the communicator, the lock that
// keeps every rank's commands in one order, and whether the pipeline still works.
struct link {
    dist::communicator* comm = nullptr;
    dist::duration timeout{};
    std::vector<stage_range> split;
    std::recursive_mutex mu;  // recursive: a saved state may be let go of inside an operation
    std::string broken;       // why the pipeline stopped ("" while it works)
    std::mutex why_mu;        // also guards `broken`, for broken(), which must not wait out a pass under mu
    int broken_stage = -1;
    bool down = false;        // shut down: no more commands

    // The stage error for a failure of `stage` (recorded: the first one stays).
    stage_error broke(int stage, const std::string& what) {
        if (stage < 0 || stage >= int(split.size())) stage = 0;
        if (broken.empty()) {
            std::lock_guard g(why_mu);
            broken = what;
            broken_stage = stage;
        }
        return stage_error(broken_stage, broken);
    }
    stage_error broke_peer(const dist::peer_error& e) {
        const int s = std::clamp(e.peer(), 0, int(split.size()) - 1);
        return broke(s, "pipeline: " + stage_name(s, split[std::size_t(s)]) + " failed: " + e.what());
    }
    // A command to every other rank, in rank order.
    void to_all(const dist::bytes& b) {
        for (int r = 1; r < comm->size(); ++r) comm->send(r, tags::command, b, timeout);
    }
    // For what runs in a destructor: a command whose failure only breaks the pipeline.
    void to_all_quietly(const dist::bytes& b) noexcept {
        if (!broken.empty() || down) return;
        try {
            to_all(b);
        } catch (const dist::peer_error& e) {
            broke_peer(e);
        } catch (const std::exception& e) {
            broke(0, std::string("pipeline: ") + e.what());
        }
    }
};

inline dist::writer command(op o) {
    dist::writer w(kinds::command);
    w.u8(std::uint8_t(o));
    return w;
}

}  // namespace detail

/// Rank 0 of a model split by layers over the ranks of a communicator: it runs the first stage
/// and drives the others (each running serve_stage). Its interface is the part of clover::model
/// that decode:: uses (run, sessions, rollback, checkpoints, prefix sharing), so an engine,
/// runner or decoder takes a pipeline in place of a model. In exact mode its logits equal the
/// unsplit model's bit for bit.
template <variant V, class Backend = backend::cpu>
class pipeline : private clover::detail::sequence_owner {
public:
    using variant_type = V;                  ///< the dimensions (clover::variants)
    using backend_type = Backend;            ///< the backend policy of rank 0's stage
    using stage_model = model<V, Backend>;   ///< rank 0's stage

    /// GDN states saved at a position (save_state), kept on every rank; letting go of the last
    /// reference lets every rank go of its copy.
    class saved_handle {
    public:
        /// Use save_state or take_state.
        saved_handle(std::uint64_t id, std::int64_t pos, typename stage_model::saved_state local, std::shared_ptr<detail::link> l)
            : id_(id), pos_(pos), local_(std::move(local)), link_(std::move(l)) {}
        saved_handle(const saved_handle&) = delete;
        saved_handle& operator=(const saved_handle&) = delete;
        ~saved_handle() {
            std::lock_guard lk(link_->mu);
            link_->to_all_quietly(detail::command(op::drop_saved).u64(id_).take());
        }
        std::int64_t pos() const { return pos_; }  ///< the position the states are of

    private:
        friend class pipeline;
        std::uint64_t id_;
        std::int64_t pos_;
        typename stage_model::saved_state local_;  // rank 0's stage's (null where it has no GDN layers)
        std::shared_ptr<detail::link> link_;
    };
    /// What save_state returns: null for position 0 or a model without GDN layers (as a model's).
    using saved_state = std::shared_ptr<const saved_handle>;

    /// Rank 0 of communicator `c` (which must outlive the pipeline): splits the file's layers over
    /// c.size() ranks (po.layer_split, or evenly; a bad split is an error before anything is
    /// loaded), loads the first stage with backend options `opt`, and checks with every other
    /// rank (each in serve_stage with its own stage of the same split) that the split and the
    /// file agree; a rank that disagrees or is gone is an error naming its stage.
    pipeline(std::shared_ptr<const io::gguf_file> file, dist::communicator& c, pipeline_options po = {},
             typename Backend::options opt = {}, void (*warn)(const std::string&) = nullptr)
        : link_(std::make_shared<detail::link>()) {
        if (c.rank() != 0) fail("pipeline: rank ", c.rank(), " serves a stage (serve_stage); rank 0 drives the pipeline");
        link_->comm = &c;
        link_->timeout = po.timeout;
        if (po.micro_batches < 0) fail("pipeline: ", po.micro_batches, " micro-batches per pass");
        micro_ = po.micro_batches;
        const hparams hp = read_hparams(*file);
        link_->split = split_layers(hp.n_layer, c.size(), po.layer_split);
        try {
            stage0_ = std::make_unique<stage_model>(std::move(file), link_->split[0], opt, warn);
            hello();
        } catch (...) {
            shutdown();
            throw;
        }
        for (int r = 1; r < c.size(); ++r) errs_.push_back(c.irecv(r, tags::error));
    }
    pipeline(const pipeline&) = delete;
    pipeline& operator=(const pipeline&) = delete;
    /// Shuts the other ranks down (shutdown()).
    ~pipeline() override { shutdown(); }

    /// Ends serve_stage on every other rank; later operations are errors. Idempotent; never throws.
    void shutdown() noexcept {
        std::lock_guard lk(link_->mu);
        if (link_->down || !link_->comm) return;
        link_->down = true;
        const dist::bytes b = detail::command(op::shutdown).take();
        for (int r = 1; r < link_->comm->size(); ++r) {
            try {  // a rank that is gone needs no shutdown; a stuck one gets a few seconds
                link_->comm->send(r, tags::command, b, std::min(link_->timeout, dist::duration(5000)));
            } catch (...) {
            }
        }
    }

    const hparams& hp() const { return stage0_->hp(); }                ///< the file's hyperparameters
    dims<V> dim() const { return stage0_->dim(); }                     ///< the dimensions
    std::int64_t n_vocab() const { return stage0_->n_vocab(); }        ///< rows of the LM head
    std::span<const stage_range> split() const { return link_->split; }  ///< the stages, by rank
    stage_model& first_stage() { return *stage0_; }                    ///< rank 0's stage
    /// Why this file cannot run block diffusion, or "" when it can.
    std::string diffusion_unavailable() const { return stage0_->diffusion_unavailable(); }
    /// Throws clover::error saying why, when the file cannot run block diffusion.
    void require_diffusion() const { stage0_->require_diffusion(); }
    /// The failure that broke the pipeline, or "" while it works.
    std::string broken() const {
        std::lock_guard lk(link_->why_mu);
        return link_->broken;
    }

    /// A sequence of up to o.ctx tokens on every stage.
    session new_session(session_options o = {}) {
        return guarded([&] {
            session s0 = stage0_->new_session(o);
            const int pool = s0.pool();
            const seq_id id = s0.id();
            s0_[{pool, id}] = std::move(s0);
            link_->to_all(detail::command(op::open).i32(pool).i32(id).i64(o.ctx).i64(o.batch).u8(o.kv_f16 ? 1 : 0).take());
            return session(this, pool, id, o);
        });
    }
    /// A session whose first tokens.size() positions are held `pages` (hold_pages) with GDN
    /// states `st` (save_state at that position), on every stage.
    session new_session_from(session_options o, std::span<const std::int32_t> pages, std::span<const token> tokens,
                             const saved_state& st) {
        return guarded([&] {
            if (st && st->link_ != link_) fail("pipeline: the saved state belongs to another pipeline");
            // Rank 0's stage may keep no GDN states; the stages that do would refuse these.
            if (ckpt_bytes_ > 0 && (!st || st->pos_ != std::int64_t(tokens.size())))
                fail("state pool: the saved GDN states are not those of position ", tokens.size());
            session s0 = stage0_->new_session_from(o, pages, tokens, st ? st->local_ : typename stage_model::saved_state{});
            const int pool = s0.pool();
            const seq_id id = s0.id();
            s0_[{pool, id}] = std::move(s0);
            link_->to_all(detail::command(op::open_from).i32(pool).i32(id).i64(o.ctx).i64(o.batch).u8(o.kv_f16 ? 1 : 0)
                              .array(pages).array(tokens).u64(st ? st->id_ : 0).take());
            session s(this, pool, id, o);
            s.mutable_tokens().assign(tokens.begin(), tokens.end());
            return s;
        });
    }
    /// dst takes src's state (KV rows, GDN states, tokens).
    void copy_state(session& dst, const session& src) {
        guarded([&] {
            stage0_->copy_state(local(dst), local(src));
            link_->to_all(detail::command(op::copy_state).i32(dst.pool()).i32(dst.id()).i32(src.id()).i64(0).take());
            dst.mutable_tokens() = src.tokens();
        });
    }

    std::int64_t page_size() { return stage0_->page_size(); }  ///< tokens per KV page (every stage's)
    std::size_t checkpoint_bytes() const { return ckpt_bytes_; }  ///< one GDN checkpoint, summed over the stages
    /// Bytes of one KV page, summed over the stages.
    std::size_t page_bytes(int pool) const {
        if (pool < 0 || pool > 1) fail("pipeline: no state pool ", pool);
        return page_bytes_[std::size_t(pool)];
    }
    std::int64_t kv_pages_used(int pool) { return stage0_->kv_pages_used(pool); }  ///< KV pages allocated (every stage alike)

    /// Saves every GDN layer's state at s's position, on every stage.
    void checkpoint(session& s) {
        guarded([&] {
            stage0_->checkpoint(local(s));
            link_->to_all(detail::command(op::checkpoint).i32(s.pool()).i32(s.id()).take());
        });
    }
    /// The positions s has checkpoints at.
    std::vector<std::int64_t> checkpoints(const session& s) {
        return guarded([&] { return positions(s); });
    }
    /// Returns s to position pos: 0 or one of its checkpoints.
    void restore(session& s, std::int64_t pos) {
        guarded([&] {
            check_position(s, pos);
            stage0_->restore(local(s), pos);
            link_->to_all(detail::command(op::restore).i32(s.pool()).i32(s.id()).i64(pos).take());
            s.mutable_tokens().resize(std::size_t(pos));
        });
    }
    /// dst becomes src's first pos tokens (0 or a checkpoint of src) without recomputing them.
    void copy_prefix(session& dst, const session& src, std::int64_t pos) {
        guarded([&] {
            check_position(src, pos);
            stage0_->copy_prefix(local(dst), local(src), pos);
            link_->to_all(detail::command(op::copy_prefix).i32(dst.pool()).i32(dst.id()).i32(src.id()).i64(pos).take());
            dst.mutable_tokens().assign(src.tokens().begin(), src.tokens().begin() + pos);
        });
    }
    /// Holds count KV pages of s from page `first` on, on every stage; the page numbers are rank 0's.
    std::vector<std::int32_t> hold_pages(const session& s, std::int64_t first, std::int64_t count) {
        return guarded([&] {
            auto v = stage0_->hold_pages(local(s), first, count);
            link_->to_all(detail::command(op::hold).i32(s.pool()).i32(s.id()).i64(first).i64(count).array(v).take());
            return v;
        });
    }
    /// Releases pages that hold_pages held, on every stage.
    void drop_pages(int pool, std::span<const std::int32_t> pages) {
        guarded([&] {
            stage0_->drop_pages(pool, pages);
            link_->to_all(detail::command(op::drop).i32(pool).array(pages).take());
        });
    }
    /// A copy of s's GDN states at pos (0 or a checkpoint of s), on every stage.
    saved_state save_state(const session& s, std::int64_t pos) { return save(s, pos, false); }
    /// save_state without a copy: the session loses its checkpoint at pos.
    saved_state take_state(session& s, std::int64_t pos) { return save(s, pos, true); }

    /// Keeps the first `keep` rows of the last verify pass, on every stage.
    void rollback(session& s, std::int64_t keep) {
        guarded([&] {
            session& s0 = local(s);
            stage0_->rollback(s0, keep);
            link_->to_all(detail::command(op::rollback).i32(s.pool()).i32(s.id()).i64(keep).take());
            s.mutable_tokens().resize(std::size_t(s0.n_past()));
        });
    }

    /// One pass over segments of many sessions, through every stage (model::run: the same
    /// checks, made on rank 0 before anything is sent). logits: [Σ logits rows, n_vocab]. Several
    /// sessions over several stages run as micro-batches, one behind the other (options).
    void run(std::span<const pass_request> reqs, std::vector<float>& logits, bool exact = false) {
        guarded([&] {
            if (reqs.empty()) fail("run: no sequences in the pass");
            std::vector<pass_request> r0;
            std::vector<segment_desc> segs;
            for (const pass_request& r : reqs) {
                session& s0 = local(*r.s);
                r0.push_back({&s0, r.kind, r.ids, r.logits, r.coreset});
                segs.push_back({s0.pool(), s0.id(), r.kind, std::vector<token>(r.ids.begin(), r.ids.end()), r.logits, r.coreset});
            }
            if (link_->comm->size() == 1) {
                stage0_->run(r0, logits, exact);
                ++st_.micro_batches;
            } else {
                stream(r0, segs, logits, exact);
            }
            ++passes_;
            for (const pass_request& r : reqs)
                if (r.kind != pass_kind::preview) {
                    auto& t = r.s->mutable_tokens();
                    t.insert(t.end(), r.ids.begin(), r.ids.end());
                }
        });
    }

    /// Passes run (run calls) since the pipeline was made.
    std::uint64_t passes() const {
        std::lock_guard lk(link_->mu);
        return passes_;
    }
    /// Rank 0's counters: its communicator's, and its stage's micro-batches, rows and time.
    rank_stats stats() const {
        std::lock_guard lk(link_->mu);
        rank_stats s = st_;
        s.comm = link_->comm->stats();
        return s;
    }
    /// Every rank's counters, by rank: rank 0's (stats()) and each other rank's answer (one round
    /// trip per rank). A benchmark takes them before and after what it measures.
    std::vector<rank_stats> gather_stats() {
        return guarded([&] {
            std::vector<rank_stats> v{stats()};
            const dist::bytes q = detail::command(op::stats).take();
            for (int r = 1; r < link_->comm->size(); ++r) {
                link_->comm->send(r, tags::command, q, link_->timeout);
                const dist::bytes b = link_->comm->recv(r, tags::reply, link_->timeout);
                dist::reader rd(b, kinds::reply, "stats from rank " + std::to_string(r));
                if (op(rd.u8()) != op::stats) fail("pipeline: rank ", r, " answered another query");
                if (rd.u8() == 0) throw link_->broke(r, "pipeline: " + rd.str());
                v.push_back(read_stats(rd));
                rd.finish();
            }
            return v;
        });
    }

private:
    // An operation under the lock, once the pipeline is known to work; a peer failure during it
    // breaks the pipeline, naming the stage.
    template <class F>
    auto guarded(F&& f) -> decltype(f()) {
        std::lock_guard lk(link_->mu);
        usable();
        try {
            return f();
        } catch (const dist::peer_error& e) {
            throw link_->broke_peer(e);
        }
    }

    // Throws when broken or shut down, or when a rank has reported a failure or is gone.
    void usable() {
        if (!link_->broken.empty()) throw stage_error(link_->broken_stage, link_->broken);
        if (link_->down) fail("pipeline: shut down");
        for (std::size_t i = 0; i < errs_.size(); ++i) {
            const int r = int(i) + 1;
            try {
                if (!errs_[i].test()) continue;
                const dist::bytes b = errs_[i].take();
                dist::reader rd(b, kinds::error, "error report of rank " + std::to_string(r));
                const int stage = rd.i32();
                const std::string what = rd.str();
                throw link_->broke(stage, "pipeline: " + what);
            } catch (const dist::peer_error& e) {
                throw link_->broke_peer(e);
            } catch (const stage_error&) {
                throw;
            } catch (const std::exception& e) {
                throw link_->broke(r, "pipeline: " + stage_name(r, link_->split[i + 1]) + ": " + e.what());
            }
        }
    }

    // Stage 0's layers over one micro-batch, counted.
    void run_first(std::span<const pass_request> part, bool exact) {
        const auto t0 = std::chrono::steady_clock::now();
        stage0_->run_stage(part, nullptr, h_, exact);
        st_.compute += std::chrono::steady_clock::now() - t0;
        ++st_.micro_batches;
        for (const pass_request& r : part) st_.rows += r.ids.size();
    }

    // A pass over two or more stages: its micro-batches one behind the other. Stage 0 runs a
    // micro-batch, then its description goes to every rank and its rows to rank 1, both without
    // waiting, and stage 0 goes on to the next one while rank 1 runs it; the last rank's logits of
    // each micro-batch come back in order (their receives are posted first).
    void stream(std::span<const pass_request> r0, std::span<const segment_desc> segs, std::vector<float>& logits, bool exact) {
        const int n = link_->comm->size(), last = n - 1;
        std::vector<std::int64_t> rows;
        for (const segment_desc& d : segs) rows.push_back(std::int64_t(d.ids.size()));
        const std::vector<std::size_t> cuts = micro_batch_cuts(rows, n, micro_);
        const std::size_t m = cuts.size() - 1;
        // One micro-batch: stage 0's own checks come first, as before any pass. Several: the whole
        // pass is checked before the first one leaves, so bad input moves no stage.
        if (m > 1) precheck(r0);
        std::vector<dist::request> outs, sends;
        for (std::size_t k = 0; k < m; ++k) outs.push_back(link_->comm->irecv(last, tags::out));
        std::vector<std::int64_t> want(m, 0);  // logits rows of each micro-batch
        std::int64_t n_logits = 0;
        for (std::size_t k = 0; k < m; ++k) {
            const std::span<const pass_request> part = r0.subspan(cuts[k], cuts[k + 1] - cuts[k]);
            const std::span<const segment_desc> desc = segs.subspan(cuts[k], cuts[k + 1] - cuts[k]);
            for (const segment_desc& d : desc) want[k] += d.logits;
            n_logits += want[k];
            try {
                run_first(part, exact);
            } catch (const std::exception& e) {
                if (k == 0) throw;  // nothing sent: no stage moved
                throw link_->broke(0, "pipeline: " + stage_name(0, link_->split[0]) + " failed in micro-batch " + std::to_string(k + 1) +
                                          " of " + std::to_string(m) + ", after the others had left: " + e.what());
            }
            dist::writer w = detail::command(op::pass);
            write_pass(w, exact, desc);
            const dist::bytes cmd = w.take();
            for (int r = 1; r < n; ++r) sends.push_back(link_->comm->isend(r, tags::command, cmd));
            sends.push_back(link_->comm->isend(1, tags::rows, rows_message(h_)));
            std::erase_if(sends, [](dist::request& q) { return q.test(); });
        }
        const std::int64_t nv = n_vocab();
        if (m > 1) logits.resize(std::size_t(n_logits * nv));
        std::size_t at = 0;
        for (std::size_t k = 0; k < m; ++k) {
            rows_result res;
            try {
                res = read_rows(outs[k].take(link_->timeout), "logits from rank " + std::to_string(last));
            } catch (const dist::peer_error&) {
                throw;
            } catch (const std::exception& e) {  // a message that cannot be read: the stages no longer agree
                throw link_->broke(last, std::string("pipeline: ") + e.what());
            }
            if (!res.ok) throw link_->broke(res.stage, "pipeline: " + res.what);
            if (std::int64_t(res.v.size()) != want[k] * nv)
                throw link_->broke(last, "pipeline: " + stage_name(last, link_->split.back()) + " sent " + std::to_string(res.v.size()) +
                                             " logits, expected " + std::to_string(want[k] * nv));
            if (m == 1) {
                logits = std::move(res.v);
            } else {
                std::copy(res.v.begin(), res.v.end(), logits.begin() + std::ptrdiff_t(at));
                at += res.v.size();
            }
        }
        for (dist::request& q : sends) q.wait(link_->timeout);
    }

    // model::run's checks over the whole pass, with its messages, on rank 0's sessions: with
    // micro-batches a request that stage 0 would refuse must fail before the first one leaves.
    void precheck(std::span<const pass_request> r0) {
        const int pool = r0[0].s->pool();
        const std::int64_t nv = n_vocab();
        for (std::size_t i = 0; i < r0.size(); ++i) {
            const pass_request& r = r0[i];
            const session& s = *r.s;
            if (s.pool() != pool) fail("run: sessions with different KV formats cannot share a pass");
            for (std::size_t k = 0; k < r.ids.size(); ++k)
                if (r.ids[k] < 0 || r.ids[k] >= nv) fail("token id ", r.ids[k], " at position ", k, " is out of range [0, ", nv, ")");
            const std::int64_t n = std::int64_t(r.ids.size());
            if (n < 1) fail(pass_name(r.kind), " pass: no rows");
            if (s.n_past() + n > s.n_ctx()) fail("context full: ", s.n_past(), " + ", n, " tokens exceed the context size ", s.n_ctx());
            if (r.kind == pass_kind::preview) stage0_->require_diffusion();
            if (r.logits < 0 || r.logits > n) fail("batch: a segment of ", n, " rows cannot give ", r.logits, " logits rows");
            for (std::size_t j = 0; j < i; ++j)
                if (r0[j].s->id() == s.id()) fail("batch: sequence ", s.id(), " has two segments in one pass");
        }
    }

    // Rank 0's stage's session of a pipeline session.
    session& local(const session& s) {
        if (!s.open()) fail("pipeline: the session is closed");
        if (!s.opened_by(this)) fail("pipeline: the session was opened by another model (open it with the pipeline's new_session)");
        auto it = s0_.find({s.pool(), s.id()});
        if (it == s0_.end()) fail("pipeline: session ", s.id(), " is not open");
        return it->second;
    }

    void close_sequence(int pool, seq_id id) noexcept override {
        std::lock_guard lk(link_->mu);
        s0_.erase({pool, id});
        link_->to_all_quietly(detail::command(op::close).i32(pool).i32(id).take());
    }

    // The checkpoint positions of s: rank 0's stage's, unless it keeps no GDN states and another
    // stage does (then that rank's: one round trip).
    std::vector<std::int64_t> positions(const session& s) {
        session& s0 = local(s);
        if (gdn_rank_ <= 0) return stage0_->checkpoints(s0);
        link_->comm->send(gdn_rank_, tags::command, detail::command(op::checkpoints).i32(s.pool()).i32(s.id()).take(), link_->timeout);
        const dist::bytes b = link_->comm->recv(gdn_rank_, tags::reply, link_->timeout);
        dist::reader rd(b, kinds::reply, "checkpoints from rank " + std::to_string(gdn_rank_));
        if (op(rd.u8()) != op::checkpoints) fail("pipeline: rank ", gdn_rank_, " answered another query");
        if (rd.u8() == 0) throw link_->broke(gdn_rank_, "pipeline: " + rd.str());
        auto v = rd.array<std::int64_t>();
        rd.finish();
        return v;
    }
    // pos must be 0 or a checkpoint of s on every stage; rank 0's stage checks it itself when it
    // keeps GDN states, else it is checked here, before any rank is asked to go there.
    void check_position(const session& s, std::int64_t pos) {
        if (pos == 0 || gdn_rank_ <= 0) return;
        const auto v = positions(s);
        if (std::find(v.begin(), v.end(), pos) != v.end()) return;
        std::string have;
        for (std::int64_t c : v) have += ", " + std::to_string(c);
        fail("state pool: no GDN checkpoint at position ", pos, " (checkpoints at: 0", have, ")");
    }

    saved_state save(const session& s, std::int64_t pos, bool take) {
        return guarded([&]() -> saved_state {
            check_position(s, pos);
            session& s0 = local(s);
            auto st = take ? stage0_->take_state(s0, pos) : stage0_->save_state(s0, pos);
            if (pos == 0 || ckpt_bytes_ == 0) return nullptr;  // the zero state: nothing to keep anywhere
            const std::uint64_t h = ++next_saved_;
            link_->to_all(detail::command(op::save).i32(s.pool()).i32(s.id()).i64(pos).u64(h).u8(take ? 1 : 0).take());
            return std::make_shared<const saved_handle>(h, pos, std::move(st), link_);
        });
    }

    // Checks the split and the file with every other rank; sums what they keep per page and checkpoint.
    void hello() {
        const hparams& hp = stage0_->hp();
        std::vector<std::int64_t> cuts;
        for (const stage_range& r : link_->split) cuts.push_back(r.first);
        cuts.push_back(link_->split.back().last);
        page_bytes_ = {stage0_->page_bytes(0), stage0_->page_bytes(1)};
        ckpt_bytes_ = stage0_->checkpoint_bytes();
        gdn_rank_ = ckpt_bytes_ > 0 ? 0 : -1;
        try {
            link_->to_all(detail::command(op::hello).i64(hp.n_layer).i64(hp.n_vocab).i64(hp.n_embd).array(cuts).take());
            for (int r = 1; r < link_->comm->size(); ++r) {
                const dist::bytes b = link_->comm->recv(r, tags::reply, link_->timeout);
                const std::string who = stage_name(r, link_->split[std::size_t(r)]);
                dist::reader rd(b, kinds::reply, "reply of " + who + " to hello");
                if (op(rd.u8()) != op::hello) fail("pipeline: ", who, " answered another query");
                const bool ok = rd.u8() != 0;
                const std::string err = rd.str();
                const std::uint64_t pb0 = rd.u64(), pb1 = rd.u64(), ck = rd.u64();
                const std::int64_t ps = rd.i64();
                rd.finish();
                if (!ok) fail("pipeline: ", who, ": ", err);
                if (ps != stage0_->page_size())
                    fail("pipeline: ", who, " has KV pages of ", ps, " tokens, rank 0 of ", stage0_->page_size());
                page_bytes_[0] += pb0;
                page_bytes_[1] += pb1;
                ckpt_bytes_ += ck;
                if (ck > 0 && gdn_rank_ < 0) gdn_rank_ = r;
            }
        } catch (const dist::peer_error& e) {
            throw link_->broke_peer(e);
        }
    }

    std::shared_ptr<detail::link> link_;
    std::unique_ptr<stage_model> stage0_;
    // Rank 0's stage's sessions, by (pool, id): the pipeline's sessions carry the same pool and
    // id. Declared after stage0_: they close into it first.
    std::map<std::pair<int, seq_id>, session> s0_;
    std::vector<dist::request> errs_;  // per rank 1..N-1: its error report, if it sends one
    std::array<std::size_t, 2> page_bytes_{};
    std::size_t ckpt_bytes_ = 0;
    int gdn_rank_ = -1;  // the first rank whose stage keeps GDN states (-1: none)
    std::uint64_t next_saved_ = 0;
    std::vector<float> h_;  // stage 0's rows [rows, n_embd]
    std::int64_t micro_ = 0;    // pipeline_options::micro_batches
    std::uint64_t passes_ = 0;  // run calls
    rank_stats st_;             // stage 0's work (the communicator's counters are added by stats())
};

}  // namespace clover::pipeline
