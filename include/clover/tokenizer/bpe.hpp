#pragma once
// Byte-level BPE over token ids.
//
// A piece starts as one token per byte and the pair with the lowest merge rank is merged
// until no adjacent pair has a rank; ties go to the leftmost pair (HF tokenizers and the
// JavaScript encoder break ties the same way). The merge table is an open-addressing hash from
// (left id, right id) to (rank, merged id). Short pieces, nearly all of them, use a direct scan;
// long ones (a megabyte of spaces is one piece) a heap over a linked list, so the cost stays
// n·log n. Results are memoised per thread, piece bytes -> ids: real text repeats its pieces,
// and the cache is what makes the tokenizer fast.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "clover/core/error.hpp"

namespace clover::tok {

inline std::uint64_t hash_bytes(std::string_view s) {
    auto mix = [](std::uint64_t x) {
        x ^= x >> 32;
        x *= 0xD6E8FEB86659FD93ull;
        x ^= x >> 32;
        return x;
    };
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ (std::uint64_t(s.size()) * 0xFF51AFD7ED558CCDull);
    const char* p = s.data();
    std::size_t n = s.size(), i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t v;
        std::memcpy(&v, p + i, 8);
        h = mix(h ^ v) * 0x9E3779B97F4A7C15ull;
    }
    if (i < n) {
        std::uint64_t v = 0;
        std::memcpy(&v, p + i, n - i);
        h = mix(h ^ v) * 0x9E3779B97F4A7C15ull;
    }
    return mix(h);
}

// Bytes -> id, for vocabularies: an open-addressing table over an owned arena of keys. The
// first insertion of a key wins (as in HF and llama.cpp, a duplicate token keeps its first id).
class string_index {
public:
    void reserve(std::size_t n) {
        std::size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        rehash(cap);
        entries_.reserve(n);
    }
    bool insert(std::string_view key, std::int32_t value) {
        if ((entries_.size() + 1) * 2 > table_.size()) rehash(std::max<std::size_t>(16, table_.size() * 2));
        std::uint64_t h = hash_bytes(key);
        std::size_t mask = table_.size() - 1;
        std::size_t i = std::size_t(h) & mask;
        for (; table_[i] != 0; i = (i + 1) & mask)
            if (equal(entries_[table_[i] - 1], h, key)) return false;
        entries_.push_back({h, std::uint32_t(arena_.size()), std::uint32_t(key.size()), value});
        arena_.append(key);
        table_[i] = std::uint32_t(entries_.size());
        return true;
    }
    const std::int32_t* find(std::string_view key) const {
        if (table_.empty()) return nullptr;
        std::uint64_t h = hash_bytes(key);
        std::size_t mask = table_.size() - 1;
        for (std::size_t i = std::size_t(h) & mask; table_[i] != 0; i = (i + 1) & mask)
            if (const entry& e = entries_[table_[i] - 1]; equal(e, h, key)) return &e.value;
        return nullptr;
    }
    std::size_t size() const { return entries_.size(); }

private:
    struct entry {
        std::uint64_t hash;
        std::uint32_t off, len;
        std::int32_t value;
    };
    bool equal(const entry& e, std::uint64_t h, std::string_view key) const {
        return e.hash == h && e.len == key.size() && std::memcmp(arena_.data() + e.off, key.data(), key.size()) == 0;
    }
    void rehash(std::size_t cap) {
        table_.assign(cap, 0);
        for (std::size_t k = 0; k < entries_.size(); ++k) {
            std::size_t i = std::size_t(entries_[k].hash) & (cap - 1);
            while (table_[i] != 0) i = (i + 1) & (cap - 1);
            table_[i] = std::uint32_t(k + 1);
        }
    }
    std::vector<std::uint32_t> table_;  // entry index + 1; 0 is empty
    std::vector<entry> entries_;
    std::string arena_;
};

class bpe {
public:
    bpe() = default;

    // byte_ids[b]: the token of the single byte b. merges: (left, right, merged) ids in rank order.
    bpe(const std::int32_t (&byte_ids)[256], const std::vector<std::array<std::int32_t, 3>>& merges)
        : instance_(next_instance()) {
        std::copy(std::begin(byte_ids), std::end(byte_ids), byte_ids_);
        std::size_t cap = 16;
        while (cap < merges.size() * 2) cap <<= 1;
        slots_.assign(cap, slot{});
        mask_ = cap - 1;
        for (std::size_t r = 0; r < merges.size(); ++r) {
            auto [a, b, m] = merges[r];
            std::uint64_t key = pair_key(a, b);
            std::size_t i = slot_of(key);
            while (slots_[i].rank != none && slots_[i].key != key) i = (i + 1) & mask_;
            if (slots_[i].rank != none) continue;  // a repeated merge keeps its first (lowest) rank
            slots_[i] = {key, std::uint32_t(r), m};
        }
        // The first round of every piece looks up pairs of byte tokens: a dense 256×256 table
        // (512 KiB, cache-resident) answers those without touching the large hash.
        byte_pairs_.assign(256 * 256, pair_rank{});
        for (unsigned a = 0; a < 256; ++a)
            for (unsigned b = 0; b < 256; ++b)
                if (const slot* sl = find(byte_ids_[a], byte_ids_[b])) byte_pairs_[a * 256 + b] = {sl->rank, sl->merged};
    }

    // Appends the ids of one piece.
    void encode(std::string_view piece, std::vector<std::int32_t>& out) const {
        if (piece.empty()) return;
        if (piece.size() == 1) { out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]); return; }
        cache& c = thread_cache();
        if (c.owner != instance_) c.reset(instance_);
        const bool cacheable = piece.size() <= max_cached_piece;
        std::uint64_t h = 0;
        if (cacheable) {
            h = hash_bytes(piece);
            if (c.find(h, piece, out)) return;
        }
        std::size_t start = out.size();
        if (piece.size() <= small_piece) merge_small(piece, out);
        else merge_large(piece, out);
        if (cacheable) c.insert(h, piece, out.data() + start, out.size() - start);
    }

    // Rank of merging (a, b), or -1.
    std::int64_t rank(std::int32_t a, std::int32_t b) const {
        auto s = find(a, b);
        return s ? std::int64_t(s->rank) : -1;
    }

private:
    static constexpr std::uint32_t none = 0xFFFFFFFFu;
    static constexpr std::size_t max_cached_piece = 256;
    struct slot {
        std::uint64_t key = 0;
        std::uint32_t rank = none;
        std::int32_t merged = -1;
    };

    static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
        return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b);
    }
    std::size_t slot_of(std::uint64_t key) const {
        return std::size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
    }
    const slot* find(std::int32_t a, std::int32_t b) const {
        if (slots_.empty()) return nullptr;
        std::uint64_t key = pair_key(a, b);
        for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
            const slot& s = slots_[i];
            if (s.rank == none) return nullptr;
            if (s.key == key) return &s;
        }
    }

    // Up to small_piece bytes: the ranks of all adjacent pairs in an array, the lowest found by
    // a scan. Quadratic, but with no allocation and in cache it beats a heap on every piece of
    // real text (CJK clauses run to 100 bytes).
    static constexpr std::size_t small_piece = 128;
    void merge_small(std::string_view piece, std::vector<std::int32_t>& out) const {
        std::int32_t sym[small_piece];
        std::uint32_t rk[small_piece];  // rk[i]: rank of merging sym[i] with sym[i + 1]
        std::int32_t mg[small_piece];
        std::size_t n = piece.size();
        for (std::size_t i = 0; i < n; ++i) sym[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
        auto pair_at = [&](std::size_t i) {
            const slot* s = find(sym[i], sym[i + 1]);
            rk[i] = s ? s->rank : none;
            mg[i] = s ? s->merged : -1;
        };
        for (std::size_t i = 0; i + 1 < n; ++i) {
            const pair_rank& p = byte_pairs_[static_cast<unsigned char>(piece[i]) * 256u + static_cast<unsigned char>(piece[i + 1])];
            rk[i] = p.rank;
            mg[i] = p.merged;
        }
        while (n > 1) {
            std::size_t best = 0;
            for (std::size_t i = 1; i + 1 < n; ++i)
                if (rk[i] < rk[best]) best = i;
            if (rk[best] == none) break;
            sym[best] = mg[best];
            --n;
            std::memmove(sym + best + 1, sym + best + 2, (n - best - 1) * sizeof sym[0]);
            if (best + 1 < n) {  // pairs best+1 .. n-2 are the old best+2 .. n-1
                std::memmove(rk + best + 1, rk + best + 2, (n - best - 2) * sizeof rk[0]);
                std::memmove(mg + best + 1, mg + best + 2, (n - best - 2) * sizeof mg[0]);
                pair_at(best);
            } else {
                rk[best] = none;
            }
            if (best > 0) pair_at(best - 1);
        }
        out.insert(out.end(), sym, sym + n);
    }

    void merge_large(std::string_view piece, std::vector<std::int32_t>& out) const {
        const std::size_t n = piece.size();
        std::vector<std::int32_t> sym(n);
        std::vector<std::int32_t> prev(n), next(n);
        for (std::size_t i = 0; i < n; ++i) {
            sym[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
            prev[i] = std::int32_t(i) - 1;
            next[i] = i + 1 < n ? std::int32_t(i + 1) : -1;
        }
        // (rank, left position, merged id); the smallest rank, then the leftmost, pops first.
        using item = std::tuple<std::uint32_t, std::int32_t, std::int32_t>;
        std::priority_queue<item, std::vector<item>, std::greater<item>> heap;
        auto push = [&](std::int32_t i) {
            if (i < 0 || next[i] < 0) return;
            if (const slot* s = find(sym[i], sym[next[i]])) heap.emplace(s->rank, i, s->merged);
        };
        for (std::size_t i = 0; i + 1 < n; ++i) push(std::int32_t(i));
        while (!heap.empty()) {
            auto [r, i, m] = heap.top();
            heap.pop();
            if (sym[i] < 0 || next[i] < 0) continue;  // merged away since
            const slot* s = find(sym[i], sym[next[i]]);
            if (!s || s->rank != r || s->merged != m) continue;  // a stale entry
            std::int32_t j = next[i];
            sym[i] = m;
            sym[j] = -1;
            next[i] = next[j];
            if (next[j] >= 0) prev[next[j]] = i;
            push(prev[i]);
            push(i);
        }
        for (std::int32_t i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
    }

    // The per-thread memo of piece -> ids. It belongs to one bpe instance at a time (a thread
    // that switches tokenizers starts afresh) and is dropped when it grows past its budget.
    struct cache {
        std::uint64_t owner = 0;
        struct entry {
            std::uint64_t hash;
            std::uint32_t key_off, key_len, ids_off, ids_len;
        };
        std::vector<std::uint32_t> table;  // index + 1 into entries; 0 is empty
        std::vector<entry> entries;
        std::string keys;
        std::vector<std::int32_t> ids;

        void reset(std::uint64_t o) {
            owner = o;
            table.assign(1 << 16, 0);
            entries.clear();
            keys.clear();
            ids.clear();
        }
        bool find(std::uint64_t h, std::string_view piece, std::vector<std::int32_t>& out) const {
            std::size_t mask = table.size() - 1;
            for (std::size_t i = std::size_t(h) & mask;; i = (i + 1) & mask) {
                std::uint32_t e = table[i];
                if (e == 0) return false;
                const entry& en = entries[e - 1];
                if (en.hash == h && en.key_len == piece.size() &&
                    std::memcmp(keys.data() + en.key_off, piece.data(), piece.size()) == 0) {
                    out.insert(out.end(), ids.begin() + en.ids_off, ids.begin() + en.ids_off + en.ids_len);
                    return true;
                }
            }
        }
        void insert(std::uint64_t h, std::string_view piece, const std::int32_t* v, std::size_t nv) {
            if (entries.size() >= max_entries || keys.size() + piece.size() > max_key_bytes) reset(owner);
            if ((entries.size() + 1) * 2 > table.size()) grow();
            entries.push_back({h, std::uint32_t(keys.size()), std::uint32_t(piece.size()),
                               std::uint32_t(ids.size()), std::uint32_t(nv)});
            keys.append(piece);
            ids.insert(ids.end(), v, v + nv);
            place(entries.size() - 1);
        }
        void place(std::size_t e) {
            std::size_t mask = table.size() - 1;
            std::size_t i = std::size_t(entries[e].hash) & mask;
            while (table[i] != 0) i = (i + 1) & mask;
            table[i] = std::uint32_t(e + 1);
        }
        void grow() {
            table.assign(table.size() * 2, 0);
            for (std::size_t e = 0; e < entries.size(); ++e) place(e);
        }
        static constexpr std::size_t max_entries = 1u << 18, max_key_bytes = 16u << 20;
    };
    static cache& thread_cache() {
        thread_local cache c;
        return c;
    }
    static std::uint64_t next_instance() {
        static std::atomic<std::uint64_t> counter{0};
        return ++counter;
    }

    std::uint64_t instance_ = 0;
    std::int32_t byte_ids_[256] = {};
    struct pair_rank {
        std::uint32_t rank = none;
        std::int32_t merged = -1;
    };
    std::vector<pair_rank> byte_pairs_;  // [a * 256 + b]: merging the tokens of bytes a and b
    std::vector<slot> slots_;
    std::size_t mask_ = 0;
};

}  // namespace clover::tok
