#pragma once
// Pre-tokenisation: the split of text into pieces before BPE ("Split(Regex, Isolated)").
//
// The Qwen2/Qwen3 and Qwen3.5 patterns (architecture.md §5.2) run through a hand-written
// splitter: it is several times faster than a regex engine and uses the same Unicode tables as
// the JavaScript oracle. Its equality with PCRE2 running the pattern itself is a test
// (tests/tokenizer/test_pretokenizer.cpp). Any other pattern from a tokenizer.json runs through
// PCRE2 (UTF + UCP, JIT), with PCRE2's own Unicode semantics.
//
// White space (\s) means the ECMAScript set, which is what the JavaScript oracle uses; it
// differs from Unicode White_Space (HF's Rust tokenizers, llama.cpp) only in U+0085 (not space
// here) and U+FEFF (space here). The contractions match ASCII letters only, as the oracle's
// rewrite of `(?i:'s|...)` and llama.cpp's spelled-out pattern both do. Ill-formed UTF-8 is one
// piece of "other" per maximal ill-formed unit, never an error.
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/tokenizer/unicode.hpp"
#include "clover/tokenizer/utf8.hpp"

namespace clover::tok {

// The patterns as tokenizer.json spells them; llama.cpp spells the contractions out.
inline constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen35_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen2_pattern_llama =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen35_pattern_llama =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-2's own pattern (ByteLevel with use_regex = true, GGUF pre "gpt2"/"default").
inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace pretok_detail {

struct unit {
    char32_t cp;
    std::size_t len;
    unsigned f;
};

inline unit unit_at(std::string_view s, std::size_t i) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) return {b, 1, unicode::detail::ascii_flags[b]};
    char32_t cp;
    auto len = std::size_t(utf8::decode(s, i, cp));
    return {cp, len, cp == utf8::invalid ? 0u : unicode::flags(cp)};
}

inline char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

// Length of the piece that the Qwen pattern matches at i (i < s.size()). `marks` selects the
// Qwen3.5 variant (\p{M} joins letters and leaves the punctuation class).
inline std::size_t qwen_piece(std::string_view s, std::size_t i, bool marks) {
    using namespace unicode;
    const std::size_t n = s.size();
    const unsigned word = marks ? (letter | mark) : letter;
    const unsigned not_punct = space | letter | number | (marks ? mark : 0u);
    unit u = unit_at(s, i);

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (u.cp == '\'' && i + 1 < n) {
        char c1 = ascii_lower(s[i + 1]);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
        if (i + 2 < n) {
            char c2 = ascii_lower(s[i + 2]);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
        }
    }
    auto run = [&](std::size_t j, auto&& in_class) {
        while (j < n) {
            unit v = unit_at(s, j);
            if (!in_class(v)) break;
            j += v.len;
        }
        return j;
    };
    auto is_word = [&](const unit& v) { return (v.f & word) != 0; };
    // [^\r\n\p{L}\p{N}]?\p{L}+   (Qwen3.5: [\p{L}\p{M}]+)
    if (u.f & word) return run(i + u.len, is_word) - i;
    if (!(u.f & (letter | number)) && u.cp != '\r' && u.cp != '\n' && i + u.len < n &&
        (unit_at(s, i + u.len).f & word))
        return run(i + u.len, is_word) - i;
    // \p{N}
    if (u.f & number) return u.len;
    //  ?[^\s\p{L}\p{N}]+[\r\n]*   (Qwen3.5: also not \p{M})
    auto is_punct = [&](const unit& v) { return (v.f & not_punct) == 0; };
    std::size_t j = i;
    if (u.cp == ' ' && i + 1 < n && is_punct(unit_at(s, i + 1))) j = i + 1;
    else if (!is_punct(u)) j = std::size_t(-1);
    if (j != std::size_t(-1)) {
        j = run(j, is_punct);
        while (j < n && (s[j] == '\r' || s[j] == '\n')) ++j;
        return j - i;
    }
    // \s*[\r\n]+ | \s+(?!\S) | \s+   (u is white space here: every other case returned above)
    std::size_t end = i, last_start = i, last_newline = std::size_t(-1);
    while (end < n) {
        unit v = unit_at(s, end);
        if (!(v.f & space)) break;
        if (v.cp == '\r' || v.cp == '\n') last_newline = end;
        last_start = end;
        end += v.len;
    }
    if (end == i) return u.len;  // not reached for these patterns; never loop without progress
    if (last_newline != std::size_t(-1)) return last_newline + 1 - i;  // the last \r or \n ends it
    if (end == n || last_start == i) return end - i;                  // \s+ at the end, or one unit
    return last_start - i;  // \s+(?!\S): leave the last white space unit to the next piece
}

struct pcre2_state {
    pcre2_code* code = nullptr;
    ~pcre2_state() {
        if (code) pcre2_code_free(code);
    }
};

}  // namespace pretok_detail

class pretokenizer {
public:
    enum class kind { qwen2, qwen35, regex, whole };

    static pretokenizer qwen2() { return pretokenizer(kind::qwen2); }
    static pretokenizer qwen35() { return pretokenizer(kind::qwen35); }
    static pretokenizer whole() { return pretokenizer(kind::whole); }  // no split at all

    // A Split(Regex) pattern. The Qwen patterns get the hand-written splitter unless
    // `force_regex` asks for PCRE2 (the tests compare the two).
    static pretokenizer regex(std::string_view pattern, bool force_regex = false) {
        if (!force_regex) {
            if (pattern == qwen2_pattern || pattern == qwen2_pattern_llama) return qwen2();
            if (pattern == qwen35_pattern || pattern == qwen35_pattern_llama) return qwen35();
        }
        pretokenizer p(kind::regex);
        p.pattern_ = std::string(pattern);
        int err = 0;
        PCRE2_SIZE off = 0;
        auto st = std::make_shared<pretok_detail::pcre2_state>();
        st->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
        if (!st->code) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(err, buf, sizeof buf);
            fail("pre-tokenizer regex: ", reinterpret_cast<const char*>(buf), " at offset ", std::size_t(off),
                 " in '", std::string(pattern), "'");
        }
        pcre2_jit_compile(st->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
        p.re_ = std::move(st);
        return p;
    }

    kind type() const { return kind_; }
    const std::string& pattern() const { return pattern_; }

    // Calls emit(std::string_view piece) for each piece, in order; the pieces tile the text.
    template <class Emit>
    void split(std::string_view text, Emit&& emit) const {
        if (text.empty()) return;
        switch (kind_) {
        case kind::whole: emit(text); return;
        case kind::qwen2:
        case kind::qwen35: {
            const bool marks = kind_ == kind::qwen35;
            for (std::size_t i = 0; i < text.size();) {
                std::size_t len = pretok_detail::qwen_piece(text, i, marks);
                emit(text.substr(i, len));
                i += len;
            }
            return;
        }
        case kind::regex: split_pcre2(text, emit); return;
        }
    }

    std::vector<std::string_view> split(std::string_view text) const {
        std::vector<std::string_view> out;
        split(text, [&](std::string_view p) { out.push_back(p); });
        return out;
    }

private:
    explicit pretokenizer(kind k) : kind_(k) {
        if (k == kind::qwen2) pattern_ = qwen2_pattern;
        if (k == kind::qwen35) pattern_ = qwen35_pattern;
    }

    // HF "Isolated" behaviour: matches and the text between them are all pieces.
    template <class Emit>
    void split_pcre2(std::string_view text, Emit& emit) const {
        // Match data and the JIT stack (an 8 MiB mapping) are made once per thread, not per call.
        struct scratch {
            pcre2_match_data* md = pcre2_match_data_create(1, nullptr);  // only the whole match is read
            pcre2_match_context* mc = pcre2_match_context_create(nullptr);
            pcre2_jit_stack* js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
            scratch() {
                if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
            }
            ~scratch() {
                pcre2_match_data_free(md);
                pcre2_match_context_free(mc);
                if (js) pcre2_jit_stack_free(js);
            }
        };
        thread_local scratch g;
        if (!g.md || !g.mc) fail("pre-tokenizer regex: out of memory");
        auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        std::size_t prev = 0, pos = 0;
        while (pos <= text.size()) {
            int rc = pcre2_match(re_->code, subject, text.size(), pos, 0, g.md, g.mc);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR buf[256];
                pcre2_get_error_message(rc, buf, sizeof buf);
                fail("pre-tokenizer regex failed at byte ", pos, ": ", reinterpret_cast<const char*>(buf));
            }
            PCRE2_SIZE* ov = pcre2_get_ovector_pointer(g.md);
            std::size_t a = ov[0], b = ov[1];
            if (a > prev) emit(text.substr(prev, a - prev));
            if (b > a) {
                emit(text.substr(a, b - a));
                pos = prev = b;
            } else {  // an empty match: step over one unit so the scan always progresses
                prev = a;
                if (a >= text.size()) break;
                char32_t cp;
                pos = a + std::size_t(utf8::decode(text, a, cp));
            }
        }
        if (prev < text.size()) emit(text.substr(prev));
    }

    kind kind_;
    std::string pattern_;
    std::shared_ptr<pretok_detail::pcre2_state> re_;
};

}  // namespace clover::tok
