#pragma once
// A session is one sequence's handle: its id in the model's state pool (KV pages, GDN state
// and conv ring, the record of its last verify segment, all owned by the backend) and the
// tokens it has committed. Closing the session (destruction) frees its pages.
#include <cstdint>
#include <utility>
#include <vector>

#include "clover/core/pass.hpp"

namespace clover {

/// How a session is opened (model::new_session).
struct session_options {
    std::int64_t ctx = 4096;   ///< maximum tokens (prompt + output): the KV pages reserved for it
    std::int64_t batch = 512;  ///< rows per commit pass chunk (bounds scratch memory)
    /// KV pages in F16 (llama.cpp's default too: half the memory, K and V rounded once); F32
    /// for the parity checks, which compare with F32 references (clover logits --ctk f32).
    bool kv_f16 = true;
};

namespace detail {
// What a session needs from the model that owns its sequence (type-erased so `session` is one
// type for every model).
struct sequence_owner {
    virtual void close_sequence(int pool, seq_id id) noexcept = 0;
    virtual ~sequence_owner() = default;
};
}  // namespace detail

/// One sequence: a handle to its state in the model's state pool (KV pages, GDN state and conv
/// ring, the record of its last verify segment) and the tokens it has committed. Move-only;
/// destroying it frees its pages.
class session {
public:
    session() = default;  ///< A closed session (open() is false).
    /// Takes o's sequence; o is left closed.
    session(session&& o) noexcept { *this = std::move(o); }
    /// Closes this session's sequence, then takes o's; o is left closed.
    session& operator=(session&& o) noexcept {
        if (this != &o) {
            release();
            owner_ = std::exchange(o.owner_, nullptr);
            pool_ = o.pool_;
            id_ = o.id_;
            opt_ = o.opt_;
            tokens_ = std::move(o.tokens_);
        }
        return *this;
    }
    session(const session&) = delete;
    session& operator=(const session&) = delete;
    ~session() { release(); }

    std::int64_t n_past() const { return std::int64_t(tokens_.size()); }  ///< tokens committed so far
    std::int64_t n_ctx() const { return opt_.ctx; }                       ///< most tokens it can hold
    std::int64_t batch() const { return opt_.batch; }                     ///< rows per commit chunk
    const std::vector<token>& tokens() const { return tokens_; }          ///< the committed tokens
    const session_options& options() const { return opt_; }               ///< as opened
    seq_id id() const { return id_; }                                     ///< its id in the state pool
    int pool() const { return pool_; }  ///< its state pool: 0 for F32 KV pages, 1 for F16
    bool open() const { return owner_ != nullptr; }  ///< false once moved from (or default-made)
    /// Whether `o` (a model) opened it: a session's id means nothing in another model's pool.
    bool opened_by(const detail::sequence_owner* o) const { return owner_ == o; }

    /// Used by the model that opened it.
    session(detail::sequence_owner* owner, int pool, seq_id id, session_options o)
        : owner_(owner), pool_(pool), id_(id), opt_(o) {}
    /// The committed tokens, for the model that owns the sequence (it keeps them in step with the
    /// state; changing them elsewhere desynchronises the two).
    std::vector<token>& mutable_tokens() { return tokens_; }

private:
    void release() noexcept {
        if (owner_) owner_->close_sequence(pool_, id_);
        owner_ = nullptr;
    }
    detail::sequence_owner* owner_ = nullptr;
    int pool_ = 0;
    seq_id id_ = -1;
    session_options opt_;
    std::vector<token> tokens_;
};

}  // namespace clover
