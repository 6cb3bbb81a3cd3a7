#pragma once
// Incremental detokenisation for streamed generation. A byte-level token can end in the middle
// of a UTF-8 character (emoji and CJK are often split over two or three tokens), so the bytes
// of an unfinished character are held back until the token that completes them arrives.
// Ill-formed bytes come out as U+FFFD, one per maximal ill-formed unit; the concatenation of
// everything push() and finish() return equals utf8::sanitize(tok.decode(all ids)).
#include <cstdint>
#include <string>
#include <string_view>

#include "clover/tokenizer/tokenizer.hpp"
#include "clover/tokenizer/utf8.hpp"

namespace clover {

class streaming_decoder {
public:
    explicit streaming_decoder(const tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_special_(skip_special) {}

    // Text that became complete with this token (possibly empty).
    std::string push(std::int32_t id) {
        if (skip_special_ && tok_->is_control(id)) return {};
        pending_ += tok_->token_bytes(id);
        return take(false);
    }
    std::string push(std::string_view bytes) {
        pending_ += bytes;
        return take(false);
    }
    // Whatever is still held back (an unfinished character becomes U+FFFD).
    std::string finish() { return take(true); }
    void reset() { pending_.clear(); }
    bool has_pending() const { return !pending_.empty(); }

private:
    std::string take(bool all) {
        std::size_t keep = all ? 0 : tok::utf8::incomplete_tail(pending_);
        std::string_view ready(pending_.data(), pending_.size() - keep);
        std::string out = tok::utf8::is_valid(ready) ? std::string(ready) : tok::utf8::sanitize(ready);
        pending_.erase(0, pending_.size() - keep);
        return out;
    }

    const tokenizer* tok_;
    bool skip_special_;
    std::string pending_;
};

}  // namespace clover
