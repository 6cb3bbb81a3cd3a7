#pragma once
// The state pool of every backend: every sequence's KV rows in pages of P tokens (F16 or F32),
// its GDN states and conv rings, and the record of its last verify segment. A sequence is a
// page table plus one GDN slot per recurrent layer; the model and decoders hold only its id.
// Pages are reserved when the sequence opens (its capacity), against the pool's token budget,
// so a pass can never run out of memory half way: that is an error at open(), before anything
// is written.
//
// The bookkeeping (page tables, holders, checkpoints, prefix sharing) is the same wherever the
// bytes live, so it is written once over a Store, which says where they live and how they are
// copied (execution.md §3: state is backend-owned):
//   Store::floats              an owning float array with value semantics: copy = deep copy,
//                              data() (the backend's pointer), size(), zero()
//   store.floats_of(n)         n zeroed floats
//   store.bytes_of(n)          n zeroed bytes (a KV chunk), as an owning handle with get()
//   store.copy(dst, src, n)    n bytes between two of the store's pointers
//   store.equal(a, b, n)       byte equality (tests: a preview pass leaves the state untouched)
//   store.equal(fa, fb)        float-array equality
// host_store (backend/cpu/state.hpp) keeps them in host memory; the CUDA backend's store keeps
// them on the device and copies on its stream.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/core/error.hpp"

namespace clover::backend {

// What a verify segment keeps per GDN layer so the decoder can roll back to any prefix of the
// verified rows by replaying the recurrence (clover-diffusion.md §4), without re-reading weights.
template <class Floats>
struct basic_gdn_record {
    Floats S0, ring0;  // state and conv ring at the segment start
    Floats m;          // [n, C] pre-conv rows
    Floats y;          // [n, C] post-conv rows: q̃ (scaled), k̂, v
    Floats g, beta;    // [n, Hv]
    std::int64_t n = 0;
};

// Every GDN layer's state and conv ring at a page boundary (state_pool::checkpoint).
template <class Floats>
struct basic_gdn_checkpoint {
    std::int64_t pos = 0;
    std::vector<Floats> S, ring;  // per GDN layer of the pool
};

template <class Floats>
struct basic_gdn_slot {
    Floats S;     // [Hv][dk][dv]  (row = key index, column = value index)
    Floats ring;  // [K-1][C]: the last K-1 pre-conv inputs, oldest first
    basic_gdn_record<Floats> rec;

    // A verify segment of n rows starts here: what a rollback restores before it replays (the
    // backend then records the segment's rows, records_rollback below).
    void begin_record(std::int64_t n) {
        rec.S0 = S;
        rec.ring0 = ring;
        rec.n = n;
    }
};

// Whether a segment keeps the record a rollback replays (verify segments only: a commit is final,
// a preview leaves the state as it was).
inline bool records_rollback(const segment& s) { return s.kind == pass_kind::verify; }

template <class Store>
class basic_state_pool {
public:
    using floats = typename Store::floats;
    using gdn_record = basic_gdn_record<floats>;
    using gdn_checkpoint = basic_gdn_checkpoint<floats>;
    using gdn_slot = basic_gdn_slot<floats>;
    // A GDN checkpoint copied out of a sequence (a prefix cache keeps it after the sequence
    // closes); null: position 0 or no GDN layers, the zero state.
    using saved_state = std::shared_ptr<const gdn_checkpoint>;

    basic_state_pool(std::span<const layer_state_spec> spec, const state_options& o, Store store = {})
        : opt_(o), spec_(spec.begin(), spec.end()), store_(std::move(store)) {
        if (o.page < 1) fail("state pool: page size must be at least 1");
        if (o.token_budget < 0) fail("state pool: token budget must not be negative");
        if (o.gdn_checkpoints < 0) fail("state pool: the number of GDN checkpoints must not be negative");
        slot_of_.resize(spec_.size());
        for (std::size_t l = 0; l < spec_.size(); ++l) {
            if (spec_[l].k == layer_state_spec::kind::attention) {
                slot_of_[l] = std::int32_t(kv_layers_.size());
                kv_layers_.push_back(std::int32_t(l));
            } else if (spec_[l].k == layer_state_spec::kind::gdn) {
                slot_of_[l] = std::int32_t(gdn_layers_.size());
                gdn_layers_.push_back(std::int32_t(l));
            } else {
                slot_of_[l] = -1;  // another stage's layer: no pages, no slot
            }
        }
        max_pages_ = o.token_budget > 0 ? (o.token_budget + o.page - 1) / o.page : -1;
        // Never reallocated (a pass reads chunks while another thread opens a sequence).
        chunks_.reserve(std::size_t(kMaxChunks));
    }
    basic_state_pool(basic_state_pool&&) = default;

    std::int64_t page_size() const { return opt_.page; }
    bool kv_f16() const { return opt_.kv_f16; }
    const state_options& options() const { return opt_; }
    std::int64_t pages_used() const {
        std::lock_guard lk(*mu_);
        return n_pages_ - std::int64_t(free_pages_.size());
    }
    std::int64_t pages_free() const {
        std::lock_guard lk(*mu_);
        return max_pages_ < 0 ? -1 : max_pages_ - (n_pages_ - std::int64_t(free_pages_.size()));
    }

    // ---- sequences ----
    seq_id open(std::int64_t capacity) {
        if (capacity < 1) fail("state pool: a sequence must hold at least one token");
        const std::int64_t need = (capacity + opt_.page - 1) / opt_.page;
        std::lock_guard lk(*mu_);
        const std::int64_t in_use = n_pages_ - std::int64_t(free_pages_.size());
        if (!kv_layers_.empty() && max_pages_ >= 0 && in_use + need > max_pages_)
            fail("state pool: out of KV memory: a sequence of ", capacity, " tokens needs ", need, " pages of ", opt_.page,
                 " tokens, ", max_pages_ - in_use, " of ", max_pages_, " are free (raise the token budget)");
        seq_id id = -1;
        for (std::size_t i = 0; i < seqs_.size(); ++i)
            if (!seqs_[i]) { id = seq_id(i); break; }
        if (id < 0) {
            id = seq_id(seqs_.size());
            seqs_.emplace_back();
        }
        auto s = std::make_unique<sequence>();
        s->cap = capacity;
        // A pool without attention layers (a stage of a split model) keeps page tables all the
        // same, of pages without bytes, so prefix sharing works on every stage alike.
        for (std::int64_t p = 0; p < need; ++p) s->pages.push_back(take_page());
        s->gdn.resize(gdn_layers_.size());
        for (std::size_t g = 0; g < gdn_layers_.size(); ++g) {
            const auto& sp = spec_[std::size_t(gdn_layers_[g])];
            s->gdn[g].S = store_.floats_of(std::size_t(sp.gdn_heads * sp.gdn_dk * sp.gdn_dv));
            s->gdn[g].ring = store_.floats_of(std::size_t(sp.conv_rows * sp.conv_channels));
        }
        seqs_[std::size_t(id)] = std::move(s);
        return id;
    }
    void close(seq_id id) {
        std::lock_guard lk(*mu_);
        sequence& s = get_locked(id);
        for (std::int32_t p : s.pages) unref_locked(p);
        seqs_[std::size_t(id)].reset();
    }
    std::int64_t n_past(seq_id id) const { return get(id).n_past; }
    std::int64_t capacity(seq_id id) const { return get(id).cap; }
    // Called by the backend after a pass wrote rows [n_past, n) of the sequence.
    void set_n_past(seq_id id, std::int64_t n) {
        sequence& s = get(id);
        if (n < 0 || n > s.cap) fail("state pool: position ", n, " outside the sequence's capacity ", s.cap);
        s.n_past = n;
    }
    void truncate(seq_id id, std::int64_t n) {
        sequence& s = get(id);
        if (n < 0 || n > s.n_past) fail("state pool: cannot truncate a sequence of ", s.n_past, " tokens to ", n);
        make_private(s, n / opt_.page);
        s.n_past = n;
        std::erase_if(s.checkpoints, [&](const gdn_checkpoint& c) { return c.pos > n; });  // their rows are gone
    }

    // ---- GDN checkpoints ----
    // Saves every GDN layer's state and ring at the sequence's position: a page boundary (where
    // a prefix cache can share whole KV pages) or the end of a chat message (where the next
    // turn resumes). One at the same position is replaced; beyond options().gdn_checkpoints
    // the oldest goes.
    void checkpoint(seq_id id) {
        sequence& s = get(id);
        if (s.n_past == 0 || opt_.gdn_checkpoints == 0 || gdn_layers_.empty()) return;  // 0: the zero state, always there
        std::erase_if(s.checkpoints, [&](const gdn_checkpoint& c) { return c.pos == s.n_past; });
        if (std::int64_t(s.checkpoints.size()) >= opt_.gdn_checkpoints) s.checkpoints.erase(s.checkpoints.begin());
        gdn_checkpoint c;
        c.pos = s.n_past;
        for (const gdn_slot& g : s.gdn) {
            c.S.push_back(g.S);
            c.ring.push_back(g.ring);
        }
        const auto at = std::find_if(s.checkpoints.begin(), s.checkpoints.end(), [&](const gdn_checkpoint& x) { return x.pos > c.pos; });
        s.checkpoints.insert(at, std::move(c));
    }
    // Positions with a checkpoint, ascending (0, the zero state, is implicit and not listed).
    std::vector<std::int64_t> checkpoints(seq_id id) const {
        std::vector<std::int64_t> v;
        for (const gdn_checkpoint& c : get(id).checkpoints) v.push_back(c.pos);
        return v;
    }
    // Back to position `pos` (0, or one with a checkpoint): KV rows past it are dead, the GDN
    // states are the checkpoint's, later checkpoints and the verify record are dropped.
    void restore(seq_id id, std::int64_t pos) {
        sequence& s = get(id);
        if (pos < 0 || pos > s.n_past) fail("state pool: cannot restore a sequence of ", s.n_past, " tokens to position ", pos);
        const gdn_checkpoint* c = find_checkpoint(s, pos);
        make_private(s, pos / opt_.page);
        set_gdn(s, c);
        s.n_past = pos;
        s.verify_start = -1;
        std::erase_if(s.checkpoints, [&](const gdn_checkpoint& x) { return x.pos > pos; });
    }
    // dst <- src's first `pos` tokens: KV rows [0, pos) and the GDN states of src's checkpoint
    // at pos (pos 0: the zero state). dst's own checkpoints are dropped; it keeps a copy of the
    // one at pos. A shared prompt prefix is computed once this way.
    void copy_prefix(seq_id dst, seq_id src, std::int64_t pos) {
        if (dst == src) fail("state pool: copy_prefix needs two different sequences");
        sequence& d = get(dst);
        const sequence& s = get(src);
        if (pos < 0 || pos > s.n_past) fail("state pool: cannot copy ", pos, " tokens of a sequence of ", s.n_past);
        if (pos > d.cap) fail("state pool: cannot copy ", pos, " tokens into a sequence of capacity ", d.cap);
        const gdn_checkpoint* c = find_checkpoint(s, pos);
        make_private(d, 0);
        copy_kv(d, s, pos);
        set_gdn(d, c);
        d.n_past = pos;
        d.verify_start = -1;
        d.checkpoints.clear();
        if (c) d.checkpoints.push_back(*c);
    }
    // Bytes one checkpoint takes (every GDN layer's state and ring).
    std::size_t checkpoint_bytes() const {
        std::size_t b = 0;
        for (std::int32_t l : gdn_layers_) {
            const auto& sp = spec_[std::size_t(l)];
            b += std::size_t(sp.gdn_heads * sp.gdn_dk * sp.gdn_dv + sp.conv_rows * sp.conv_channels) * sizeof(float);
        }
        return b;
    }
    // dst <- src: KV rows [0, n_past), GDN states and rings, n_past. dst must hold src's tokens.
    void copy(seq_id dst, seq_id src) {
        if (dst == src) return;
        sequence& d = get(dst);
        const sequence& s = get(src);
        if (s.n_past > d.cap) fail("state pool: cannot copy ", s.n_past, " tokens into a sequence of capacity ", d.cap);
        make_private(d, 0);
        copy_kv(d, s, s.n_past);
        for (std::size_t g = 0; g < gdn_layers_.size(); ++g) {
            d.gdn[g].S = s.gdn[g].S;
            d.gdn[g].ring = s.gdn[g].ring;
        }
        d.n_past = s.n_past;
        d.verify_start = -1;
        d.checkpoints = s.checkpoints;
    }
    // ---- prefix sharing (a server's prefix cache, decode/prefix_cache.hpp) ----
    // A page holds page_size() rows of every attention layer. Pages have holders: the sequences
    // whose page tables list them and whoever called hold_pages; a page is free when the last
    // one lets go. A sequence never writes a page it shares: its writes start at n_past, and
    // going back below its shared prefix (restore, truncate, copy into it) first gives it
    // private copies of those pages.
    std::size_t page_bytes() const {
        std::size_t b = 0;
        for (std::size_t a = 0; a < kv_layers_.size(); ++a) b += 2 * std::size_t(opt_.page * row_elems(a)) * elem_bytes();
        return b;
    }
    // Pages [first, first + count) of the sequence, each with one more holder.
    std::vector<std::int32_t> hold_pages(seq_id id, std::int64_t first, std::int64_t count) {
        std::lock_guard lk(*mu_);
        sequence& s = get_locked(id);
        if (first < 0 || count < 0 || first + count > std::int64_t(s.pages.size()))
            fail("state pool: pages [", first, ", ", first + count, ") outside the sequence's ", s.pages.size(), " pages");
        std::vector<std::int32_t> v(s.pages.begin() + first, s.pages.begin() + first + count);
        for (std::int32_t p : v) ++refs(p);
        // The sequence now shares them too: going back below them gives it copies first.
        s.shared = std::max(s.shared, first + count);
        return v;
    }
    // Lets go of pages taken with hold_pages.
    void drop_pages(std::span<const std::int32_t> pages) {
        std::lock_guard lk(*mu_);
        for (std::int32_t p : pages) unref_locked(p);
    }
    // The GDN states at `pos` (0 or a checkpoint of the sequence), copied out.
    saved_state save(seq_id id, std::int64_t pos) const {
        const gdn_checkpoint* c = find_checkpoint(get(id), pos);
        return c ? std::make_shared<const gdn_checkpoint>(*c) : nullptr;
    }
    // The same, moved out of a sequence that will not go back to `pos` (its checkpoint there is
    // gone): what a prefix cache keeps of a finished request, without a copy. Copying was most
    // of the time between one answer and the next turn's first pass (the fresh memory's page
    // faults: 193 ms for turn 1's six checkpoints of the 8-layer 35B-A3B file on a 2-core VM).
    saved_state take(seq_id id, std::int64_t pos) {
        sequence& s = get(id);
        const gdn_checkpoint* c = find_checkpoint(s, pos);  // as save(): null at 0, the error where none is
        if (!c) return nullptr;
        const auto it = s.checkpoints.begin() + (c - s.checkpoints.data());
        auto out = std::make_shared<const gdn_checkpoint>(std::move(*it));
        s.checkpoints.erase(it);
        return out;
    }
    std::size_t saved_bytes(const saved_state& c) const { return c ? checkpoint_bytes() : 0; }
    // A new sequence of `capacity` tokens whose first `pos` rows are those of `pages`
    // (ceil(pos / page) of them, from hold_pages) and whose GDN states are `st` (saved at pos).
    // Whole pages are shared; a last partial page is copied, since the sequence writes its
    // rows from pos on. Pages beyond are reserved as open() does.
    seq_id open_from(std::int64_t capacity, std::span<const std::int32_t> pages, std::int64_t pos, const saved_state& st) {
        const std::int64_t P = opt_.page;
        if (pos < 1 || pos >= capacity) fail("state pool: a shared prefix of ", pos, " tokens does not fit a sequence of ", capacity);
        if (std::int64_t(pages.size()) != (pos + P - 1) / P)
            fail("state pool: a prefix of ", pos, " tokens needs ", (pos + P - 1) / P, " pages, ", pages.size(), " were given");
        if (!gdn_layers_.empty() && (!st || st->pos != pos || st->S.size() != gdn_layers_.size()))
            fail("state pool: the saved GDN states are not those of position ", pos);
        const std::int64_t shared = pos / P;
        const std::int64_t need = (capacity + P - 1) / P - shared;
        std::lock_guard lk(*mu_);
        const std::int64_t in_use = n_pages_ - std::int64_t(free_pages_.size());
        if (!kv_layers_.empty() && max_pages_ >= 0 && in_use + need > max_pages_)
            fail("state pool: out of KV memory: a sequence of ", capacity, " tokens needs ", need, " new pages of ", P, " tokens, ",
                 max_pages_ - in_use, " of ", max_pages_, " are free (raise the token budget)");
        auto s = std::make_unique<sequence>();
        s->cap = capacity;
        for (std::int64_t p = 0; p < shared; ++p) {
            ++refs(pages[std::size_t(p)]);
            s->pages.push_back(pages[std::size_t(p)]);
        }
        s->shared = shared;
        while (std::int64_t(s->pages.size()) < shared + need) s->pages.push_back(take_page());
        if (pos % P) copy_page(s->pages[std::size_t(shared)], pages[std::size_t(shared)], pos % P);
        s->gdn.resize(gdn_layers_.size());
        for (std::size_t g = 0; g < gdn_layers_.size(); ++g) {
            s->gdn[g].S = st->S[g];
            s->gdn[g].ring = st->ring[g];
        }
        if (st) s->checkpoints.push_back(*st);
        s->n_past = pos;
        seq_id id = -1;
        for (std::size_t i = 0; i < seqs_.size(); ++i)
            if (!seqs_[i]) { id = seq_id(i); break; }
        if (id < 0) {
            id = seq_id(seqs_.size());
            seqs_.emplace_back();
        }
        seqs_[std::size_t(id)] = std::move(s);
        return id;
    }

    // Exact equality of two sequences' live state (tests: a preview pass leaves it untouched).
    bool same_state(seq_id a_id, seq_id b_id) const {
        const sequence& a = get(a_id);
        const sequence& b = get(b_id);
        if (a.n_past != b.n_past) return false;
        for (std::size_t l = 0; l < kv_layers_.size(); ++l)
            for (std::int64_t p = 0; p < a.n_past; ++p)
                for (int kv = 0; kv < 2; ++kv)
                    if (!store_.equal(kv_row(l, a, p, kv), kv_row(l, b, p, kv), std::size_t(row_elems(l)) * elem_bytes()))
                        return false;
        for (std::size_t g = 0; g < gdn_layers_.size(); ++g)
            if (!store_.equal(a.gdn[g].S, b.gdn[g].S) || !store_.equal(a.gdn[g].ring, b.gdn[g].ring)) return false;
        return true;
    }

    // ---- what primitives read and write ----
    std::int32_t slot(std::int64_t layer) const {
        if (layer < 0 || std::size_t(layer) >= slot_of_.size() || slot_of_[std::size_t(layer)] < 0)
            fail("state pool: layer ", layer, " keeps no state here (another stage's layer)");
        return slot_of_[std::size_t(layer)];
    }
    std::int64_t n_gdn_layers() const { return std::int64_t(gdn_layers_.size()); }  // layers with a GDN slot
    gdn_slot& gdn(std::int64_t layer, seq_id id) { return get(id).gdn[std::size_t(slot(layer))]; }
    // K (kv = 0) or V (kv = 1) row of position `pos` of attention layer `layer`: F32 or F16 bits.
    void* kv(std::int64_t layer, seq_id id, std::int64_t pos, int which) {
        return kv_row(std::size_t(slot(layer)), get(id), pos, which);
    }
    const void* kv(std::int64_t layer, seq_id id, std::int64_t pos, int which) const {
        return kv_row(std::size_t(slot(layer)), get(id), pos, which);
    }
    // Rows [pos, pos + run) are contiguous in one page; run = rows left in pos's page.
    std::int64_t run_from(std::int64_t pos) const { return opt_.page - pos % opt_.page; }
    std::int64_t kv_width(std::int64_t layer) const { return spec_[std::size_t(layer)].kv_width; }

    // The page layout, for backends whose kernels address KV rows themselves (a device cannot
    // call kv()): row r of page g of attention slot a lives at
    //   chunk_base(a, g / chunk_pages, which) + ((g % chunk_pages) * page_size() + r) * row bytes.
    static constexpr std::int64_t chunk_pages = 16;
    std::int64_t n_chunks() const {
        std::lock_guard lk(*mu_);
        return std::int64_t(chunks_.size());
    }
    std::int64_t n_kv_slots() const { return std::int64_t(kv_layers_.size()); }
    const std::byte* chunk_base(std::int64_t a, std::int64_t chunk, int which) const {
        return (which ? chunks_[std::size_t(chunk)]->v : chunks_[std::size_t(chunk)]->k)[std::size_t(a)].get();
    }
    // The sequence's page ids, in position order (valid until its pages change).
    const std::vector<std::int32_t>& page_ids(seq_id id) const { return get(id).pages; }

    // The verify segment of a sequence: where it started (-1: none since the last rollback).
    std::int64_t& verify_start(seq_id id) { return get(id).verify_start; }

    // ---- what a pass and a rollback mean for a sequence (the same on every backend) ----
    // After a pass: the commit and verify segments' sequences now hold their rows; a verify
    // segment's start is where a rollback keeps from. Preview rows are never kept.
    void advance(const batch& bt) {
        for (const segment& s : bt.segments()) {
            if (s.kind == pass_kind::preview) continue;
            verify_start(s.seq) = records_rollback(s) ? s.pos0 : -1;
            set_n_past(s.seq, s.pos0 + s.n);
        }
    }
    // Keeps the first `keep` rows of the sequence's last verify segment and forgets the rest:
    // KV rows truncated, every GDN slot replayed by `replay(slot, keep)` (the backend's kernels,
    // from the slot's record: no weights read). Anything but 0..n verified rows is an error that
    // changes nothing.
    template <class Replay>
    void rollback(seq_id id, std::int64_t keep, Replay&& replay) {
        std::int64_t& start = verify_start(id);
        const std::int64_t n = n_past(id) - start;
        if (start < 0 || keep < 0 || keep > n) fail("rollback: cannot keep ", keep, " of ", start < 0 ? 0 : n, " verified rows");
        for (gdn_slot& slot : get(id).gdn) replay(slot, keep);
        truncate(id, start + keep);  // KV rows past n_past are dead
        start = -1;
    }
    Store& store() { return store_; }

private:
    struct sequence {
        std::int64_t cap = 0, n_past = 0, verify_start = -1;
        std::vector<std::int32_t> pages;
        std::int64_t shared = 0;  // leading pages that may have other holders (never written)
        std::vector<gdn_slot> gdn;
        std::vector<gdn_checkpoint> checkpoints;  // ascending positions
    };

    // The checkpoint at pos (nullptr: pos 0, the zero state); an error naming the positions
    // that have one otherwise.
    const gdn_checkpoint* find_checkpoint(const sequence& s, std::int64_t pos) const {
        if (pos == 0 || gdn_layers_.empty()) return nullptr;
        for (const gdn_checkpoint& c : s.checkpoints)
            if (c.pos == pos) return &c;
        std::string have;
        for (const gdn_checkpoint& c : s.checkpoints) have += (have.empty() ? "" : ", ") + std::to_string(c.pos);
        fail("state pool: no GDN checkpoint at position ", pos, " (checkpoints at: 0", have.empty() ? "" : ", ", have, ")");
    }
    void set_gdn(sequence& s, const gdn_checkpoint* c) {
        for (std::size_t g = 0; g < s.gdn.size(); ++g) {
            if (c) {
                s.gdn[g].S = c->S[g];
                s.gdn[g].ring = c->ring[g];
            } else {
                s.gdn[g].S.zero();
                s.gdn[g].ring.zero();
            }
        }
    }
    void copy_kv(sequence& d, const sequence& s, std::int64_t n) {
        for (std::size_t a = 0; a < kv_layers_.size(); ++a)
            for (std::int64_t p0 = 0; p0 < n; p0 += opt_.page) {
                const std::int64_t rows = std::min(opt_.page, n - p0);
                const std::size_t bytes = std::size_t(rows * row_elems(a)) * elem_bytes();
                store_.copy(kv_row(a, d, p0, 0), kv_row(a, s, p0, 0), bytes);
                store_.copy(kv_row(a, d, p0, 1), kv_row(a, s, p0, 1), bytes);
            }
    }
    static constexpr std::int64_t kChunk = chunk_pages, kMaxChunks = 1 << 16;  // 2^20 pages
    struct page_chunk {  // kChunk pages of every attention layer, K and V
        std::vector<typename Store::bytes> k, v;
        std::int32_t refs[kChunk] = {};  // holders of each page (0: free)
    };
    std::int32_t& refs(std::int32_t page) { return chunks_[std::size_t(page / kChunk)]->refs[page % kChunk]; }
    void unref_locked(std::int32_t page) {
        if (--refs(page) == 0) free_pages_.push_back(page);
    }
    // The first `rows` rows of page src (every attention layer, K and V) into page dst.
    void copy_page(std::int32_t dst, std::int32_t src, std::int64_t rows) {
        for (std::size_t a = 0; a < kv_layers_.size(); ++a) {
            const std::size_t row_bytes = std::size_t(row_elems(a)) * elem_bytes();
            for (int kv = 0; kv < 2; ++kv) {
                std::byte* d = page_row(a, dst, 0, kv);
                const std::byte* s = page_row(a, src, 0, kv);
                store_.copy(d, s, std::size_t(rows) * row_bytes);
            }
        }
    }
    std::byte* page_row(std::size_t a, std::int64_t page, std::int64_t r, int which) const {
        const page_chunk& c = *chunks_[std::size_t(page / kChunk)];
        const std::int64_t row = (page % kChunk) * opt_.page + r;
        return (which ? c.v : c.k)[a].get() + std::size_t(row * row_elems(a)) * elem_bytes();
    }
    // Pages [first, shared) of s become its own (copies where others hold them), so it may
    // write them: the step before any write below its shared prefix. Checks the budget first.
    void make_private(sequence& s, std::int64_t first) {
        if (first >= s.shared) return;
        std::lock_guard lk(*mu_);
        std::int64_t need = 0;
        for (std::int64_t p = first; p < s.shared; ++p) need += refs(s.pages[std::size_t(p)]) > 1;
        const std::int64_t in_use = n_pages_ - std::int64_t(free_pages_.size());
        if (!kv_layers_.empty() && max_pages_ >= 0 && in_use + need > max_pages_)
            fail("state pool: out of KV memory: going back into a shared prefix needs ", need, " private pages, ",
                 max_pages_ - in_use, " are free (raise the token budget)");
        for (std::int64_t p = first; p < s.shared; ++p) {
            std::int32_t& page = s.pages[std::size_t(p)];
            if (refs(page) == 1) continue;
            const std::int32_t fresh = take_page();
            copy_page(fresh, page, opt_.page);
            unref_locked(page);
            page = fresh;
        }
        s.shared = first;
    }

    std::size_t elem_bytes() const { return opt_.kv_f16 ? 2 : 4; }
    std::int64_t row_elems(std::size_t a) const { return spec_[std::size_t(kv_layers_[a])].kv_width; }

    sequence& get(seq_id id) {
        std::lock_guard lk(*mu_);
        return get_locked(id);
    }
    const sequence& get(seq_id id) const { return const_cast<basic_state_pool*>(this)->get(id); }
    sequence& get_locked(seq_id id) {
        if (id < 0 || std::size_t(id) >= seqs_.size() || !seqs_[std::size_t(id)])
            fail("state pool: sequence ", id, " is not open");
        return *seqs_[std::size_t(id)];
    }
    std::int32_t take_page() {
        if (!free_pages_.empty()) {
            const std::int32_t p = free_pages_.back();
            free_pages_.pop_back();
            refs(p) = 1;
            return p;
        }
        if (n_pages_ % kChunk == 0) {
            if (std::int64_t(chunks_.size()) >= kMaxChunks) fail("state pool: more than ", kMaxChunks * kChunk, " KV pages");
            auto c = std::make_unique<page_chunk>();
            const std::size_t rows = std::size_t(kChunk * opt_.page);
            for (std::int32_t l : kv_layers_) {
                const std::size_t bytes = rows * std::size_t(spec_[std::size_t(l)].kv_width) * elem_bytes();
                c->k.push_back(store_.bytes_of(bytes));
                c->v.push_back(store_.bytes_of(bytes));
            }
            chunks_.push_back(std::move(c));
        }
        refs(std::int32_t(n_pages_)) = 1;
        return std::int32_t(n_pages_++);
    }
    void* kv_row(std::size_t a, const sequence& s, std::int64_t pos, int which) const {
        if (pos < 0 || pos >= s.cap) fail("state pool: KV position ", pos, " outside the sequence's capacity ", s.cap);
        return page_row(a, s.pages[std::size_t(pos / opt_.page)], pos % opt_.page, which);
    }

    state_options opt_;
    std::vector<layer_state_spec> spec_;
    std::vector<std::int32_t> slot_of_, kv_layers_, gdn_layers_;
    std::vector<std::unique_ptr<sequence>> seqs_;
    std::vector<std::unique_ptr<page_chunk>> chunks_;
    std::vector<std::int32_t> free_pages_;
    std::int64_t n_pages_ = 0, max_pages_ = -1;
    // mutable: equal() may stage bytes through the store's scratch (a device store copies to host).
    mutable Store store_;
    std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
};

}  // namespace clover::backend
