#pragma once
// A batch: the rows of one forward pass, from many sequences. Rows of one sequence form one
// segment (contiguous rows, one pass kind, consecutive positions from the sequence's n_past).
// A pass's control flow depends only on this shape (execution.md rule 1): how many rows, which
// sequences, which kinds; never on a tensor's values.
#include <cstdint>
#include <span>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/core/pass.hpp"

namespace clover {

struct segment {
    seq_id seq = -1;
    pass_kind kind = pass_kind::commit;
    std::int64_t row0 = 0, n = 0;  // rows [row0, row0 + n) of the batch
    std::int64_t pos0 = 0;         // position of the first row (the sequence's n_past)
    std::int64_t coreset = 0;      // preview: experts in the block's coreset (0: no restriction)
    std::int64_t logits_from = 0;  // rows [logits_from, n) of the segment produce logits
    std::int64_t out_row0 = 0;     // their first row in the pass's logits output
    std::int64_t n_logits() const { return n - logits_from; }
};

class batch {
public:
    // Row-exact mode: every row is computed exactly as it would be alone in a one-row pass (the
    // same summation order in every product, the GDN recurrence row by row). Verify segments
    // are always row-exact; `exact` extends it to the whole batch (tests, parity checks).
    bool exact = false;

    // Appends a segment of `ids` for sequence `seq` at positions [pos0, pos0 + n). logits:
    // how many of its last rows produce logits (0: none; n: all).
    segment& add(seq_id seq, pass_kind kind, std::span<const token> ids, std::int64_t pos0, std::int64_t logits = 0,
                 std::int64_t coreset = 0) {
        const std::int64_t n = std::int64_t(ids.size());
        if (n < 1) fail("batch: a segment needs at least one row");
        if (logits < 0 || logits > n) fail("batch: a segment of ", n, " rows cannot give ", logits, " logits rows");
        for (const segment& s : segs_)
            if (s.seq == seq) fail("batch: sequence ", seq, " has two segments in one pass");
        segment s;
        s.seq = seq;
        s.kind = kind;
        s.row0 = std::int64_t(tokens_.size());
        s.n = n;
        s.pos0 = pos0;
        s.coreset = kind == pass_kind::preview ? coreset : 0;
        s.logits_from = n - logits;
        s.out_row0 = n_logits_;
        n_logits_ += logits;
        tokens_.insert(tokens_.end(), ids.begin(), ids.end());
        segs_.push_back(s);
        return segs_.back();
    }
    void clear() {
        tokens_.clear();
        segs_.clear();
        n_logits_ = 0;
    }

    std::int64_t rows() const { return std::int64_t(tokens_.size()); }
    std::int64_t n_logits() const { return n_logits_; }
    std::span<const token> tokens() const { return tokens_; }
    std::span<const segment> segments() const { return segs_; }
    bool empty() const { return segs_.empty(); }
    bool has(pass_kind k) const {
        for (const segment& s : segs_)
            if (s.kind == k) return true;
        return false;
    }
    // Row-exactness of the products over these rows (see `exact`).
    bool row_exact() const { return exact || has(pass_kind::verify); }
    // The rows whose logits are asked for, in output order: [n_logits] batch row indices.
    std::vector<std::int32_t> logits_rows() const {
        std::vector<std::int32_t> r;
        r.reserve(std::size_t(n_logits_));
        for (const segment& s : segs_)
            for (std::int64_t i = s.logits_from; i < s.n; ++i) r.push_back(std::int32_t(s.row0 + i));
        return r;
    }

private:
    std::vector<token> tokens_;
    std::vector<segment> segs_;
    std::int64_t n_logits_ = 0;
};

}  // namespace clover
