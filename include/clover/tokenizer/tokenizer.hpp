#pragma once
// clover::tokenizer — the entry point: byte-level BPE for the Qwen2/Qwen3/Qwen3.5 families,
// loaded from a GGUF file or an HF tokenizer.json.
//
//   auto tok = clover::tokenizer::from_file(path);          // GGUF (by magic) or tokenizer.json
//   std::vector<std::int32_t> ids = tok.encode("Hello<|im_end|>");
//   std::string bytes = tok.decode(ids);                     // raw bytes; see streaming_decoder
//
// encode(): added tokens are cut out of the raw text first (longest match at the leftmost
// position; control tokens only when parse_special is on, user-defined ones always, as HF and
// llama.cpp do), then each stretch between them is NFC-normalised (when the file declares it),
// pre-tokenised and BPE-encoded. Any bytes are accepted: ill-formed UTF-8 is encoded byte by
// byte and decodes back to the same bytes.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/io/regular_file.hpp"
#include "clover/tokenizer/bpe.hpp"
#include "clover/tokenizer/byte_level.hpp"
#include "clover/tokenizer/nfc.hpp"
#include "clover/tokenizer/pretokenizer.hpp"
#include "clover/tokenizer/tokenizer_json.hpp"
#include "clover/tokenizer/vocab.hpp"

namespace clover {

struct encode_options {
    bool parse_special = true;  // control tokens written in the text are tokens; false: plain text
    bool add_special = false;   // prepend BOS / append EOS where the file asks for it
};

class tokenizer {
public:
    using token_type = tok::token_type;

    explicit tokenizer(const tok::tokenizer_spec& spec) { build(spec); }

    static tokenizer from_gguf(const io::gguf_file& f, std::string source = "gguf") {
        return tokenizer(tok::read_gguf_spec(f, std::move(source)));
    }
    static tokenizer from_gguf(const std::filesystem::path& p) { return from_gguf(io::gguf_file(p), p.string()); }
    static tokenizer from_tokenizer_json(const std::filesystem::path& p) {
        return tokenizer(tok::read_tokenizer_json_spec(p));
    }
    // A GGUF model (recognised by its magic) or a tokenizer.json (or a folder holding one).
    static tokenizer from_file(const std::filesystem::path& p) {
        if (std::filesystem::is_directory(p)) return from_tokenizer_json(p);
        struct stat st{};
        const int fd = io::open_regular(p, &st);  // a FIFO is refused, not waited on
        char magic[4] = {};
        const ssize_t n = ::read(fd, magic, 4);
        ::close(fd);
        if (n == 4 && std::string_view(magic, 4) == "GGUF") return from_gguf(p);
        return from_tokenizer_json(p);
    }

    std::vector<std::int32_t> encode(std::string_view text, const encode_options& o = {}) const {
        const std::size_t everywhere[2] = {0, o.parse_special ? text.size() : 0};
        return encode_marked(text, std::span<const std::size_t>(everywhere, o.parse_special ? 2 : 0), o.add_special);
    }
    // encode() with control tokens parsed only inside the byte ranges [bounds[2k], bounds[2k+1])
    // of `text` (sorted, not overlapping) and read as plain text everywhere else. A chat prompt
    // marks its template's own text this way, so that a user who types "<|im_end|>" in a message
    // cannot end the turn (user-defined added tokens match everywhere, as with parse_special off).
    std::vector<std::int32_t> encode_marked(std::string_view text, std::span<const std::size_t> bounds, bool add_special = false) const {
        if (bounds.size() % 2) fail("tokenizer: special ranges come in [begin, end) pairs");
        std::vector<std::int32_t> out;
        out.reserve(text.size() / 3 + 4);
        if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
        std::size_t section = 0, i = 0, r = 0;
        while (i < text.size()) {
            if (!starts_added_[static_cast<unsigned char>(text[i])]) { ++i; continue; }
            while (r < bounds.size() && bounds[r + 1] <= i) r += 2;
            const std::size_t special_end = r < bounds.size() && bounds[r] <= i ? std::min(bounds[r + 1], text.size()) : 0;
            auto [index, len] = match_added(text, i, special_end);
            if (index < 0) { ++i; continue; }
            const tok::added_token& a = added_[std::size_t(index)];
            std::string_view before = text.substr(section, i - section);
            if (a.lstrip) before = trim_end(before);
            encode_section(before, out);
            out.push_back(a.id);
            i += len;
            if (a.rstrip) i = skip_space(text, i);
            section = i;
        }
        encode_section(text.substr(section), out);
        if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
        return out;
    }

    // The bytes of the ids, concatenated (not necessarily valid UTF-8 when cut mid-character;
    // tok::utf8::sanitize gives printable text). skip_special drops control tokens.
    std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const {
        std::string out;
        out.reserve(ids.size() * 4);
        for (auto id : ids) {
            check_id(id);
            if (skip_special && types_[std::size_t(id)] == token_type::control) continue;
            out.append(arena_.data() + offs_[std::size_t(id)], offs_[std::size_t(id) + 1] - offs_[std::size_t(id)]);
        }
        return out;
    }
    std::string decode(std::initializer_list<std::int32_t> ids, bool skip_special = false) const {
        return decode(std::span<const std::int32_t>(ids.begin(), ids.size()), skip_special);
    }

    std::string_view token_bytes(std::int32_t id) const {
        check_id(id);
        return {arena_.data() + offs_[std::size_t(id)], offs_[std::size_t(id) + 1] - offs_[std::size_t(id)]};
    }
    token_type type(std::int32_t id) const { check_id(id); return types_[std::size_t(id)]; }
    bool is_control(std::int32_t id) const { return type(id) == token_type::control; }
    // The id of a token given its exact bytes: an added token's text or a normal token's bytes.
    std::optional<std::int32_t> find_token(std::string_view bytes) const {
        for (const auto& a : added_)
            if (a.content == bytes) return a.id;
        if (auto p = by_bytes_.find(bytes)) return *p;
        return std::nullopt;
    }

    std::size_t n_vocab() const { return types_.size(); }
    std::int32_t bos_id() const { return bos_; }
    std::int32_t eos_id() const { return eos_; }
    std::int32_t pad_id() const { return pad_; }
    bool add_bos() const { return add_bos_; }
    bool is_eog(std::int32_t id) const {
        for (auto e : eog_) if (e == id) return true;
        return false;
    }
    const std::vector<std::int32_t>& eog_ids() const { return eog_; }
    const std::string& chat_template() const { return chat_template_; }
    const std::string& pre_name() const { return pre_name_; }
    bool normalizes_nfc() const { return nfc_; }
    const std::vector<tok::added_token>& added_tokens() const { return added_; }
    const tok::pretokenizer& pretokenizer() const { return pre_; }

    // The file-form description again (byte-level token strings, merges as "a b"), e.g. to
    // write the tokenizer into a GGUF with tok::write_gguf_spec.
    tok::tokenizer_spec spec() const {
        tok::tokenizer_spec s;
        s.source = source_;
        s.tokens.resize(n_vocab());
        for (std::size_t i = 0; i < n_vocab(); ++i) s.tokens[i] = file_form(std::int32_t(i));
        s.types = types_;
        s.merges.reserve(merges_.size());
        for (auto& m : merges_) s.merges.push_back(file_form(m[0]) + " " + file_form(m[1]));
        s.added = added_;
        s.pre = pre_name_;
        s.pre_regex = pre_name_ == "regex" ? pre_.pattern() : std::string();
        s.nfc = nfc_;
        s.ignore_merges = ignore_merges_;
        s.bos = bos_; s.eos = eos_; s.pad = pad_;
        s.add_bos = add_bos_; s.add_eos = add_eos_;
        s.chat_template = chat_template_;
        return s;
    }

private:
    struct trie_node {
        std::vector<std::pair<unsigned char, std::int32_t>> next;  // byte -> node
        std::int32_t added = -1;                                    // index in added_ of the token ending here
        bool special = false;
    };

    void build(const tok::tokenizer_spec& s) {
        source_ = s.source;
        const std::size_t n = s.tokens.size();
        if (n == 0) fail(s.source, ": the vocabulary is empty");
        if (n > 0x7FFFFFFF) fail(s.source, ": the vocabulary is too large");
        if (s.types.size() != n) fail(s.source, ": ", s.types.size(), " token types for ", n, " tokens");
        types_ = s.types;
        std::vector<std::string> bytes(n);
        literal_.assign(n, false);
        tok::string_index by_text;  // file form -> id, to resolve the merges
        by_text.reserve(n);
        by_bytes_ = {};
        by_bytes_.reserve(n);
        auto is_added = [&](std::size_t i) { return types_[i] == token_type::control || types_[i] == token_type::user_defined; };
        for (const auto& a : s.added)
            if (a.id >= 0 && std::size_t(a.id) < n && types_[std::size_t(a.id)] != token_type::control)
                types_[std::size_t(a.id)] = a.special ? token_type::control : token_type::user_defined;
        for (std::size_t i = 0; i < n; ++i) {
            if (is_added(i)) { bytes[i] = s.tokens[i]; continue; }
            auto raw = tok::byte_level::decode(s.tokens[i]);
            bytes[i] = raw ? std::move(*raw) : s.tokens[i];
            literal_[i] = !raw;  // not in the byte-level alphabet: kept as its text
            by_text.insert(s.tokens[i], std::int32_t(i));
            if (types_[i] == token_type::normal || types_[i] == token_type::byte) by_bytes_.insert(bytes[i], std::int32_t(i));
        }
        std::int32_t byte_ids[256];
        for (unsigned b = 0; b < 256; ++b) {
            char c = char(b);
            auto p = by_bytes_.find(std::string_view(&c, 1));
            if (!p)
                fail(s.source, ": the vocabulary has no token for byte 0x", "0123456789ABCDEF"[b >> 4],
                     "0123456789ABCDEF"[b & 15], " (not a byte-level BPE vocabulary?)");
            byte_ids[b] = *p;
        }
        merges_.clear();
        merges_.reserve(s.merges.size());
        std::string joined;
        for (std::size_t r = 0; r < s.merges.size(); ++r) {
            const std::string& m = s.merges[r];
            auto sp = m.find(' ', 1);
            if (sp == std::string::npos) fail(s.source, ": merge ", r, " '", m, "' is not \"left right\"");
            std::string_view a(m.data(), sp), b(m.data() + sp + 1, m.size() - sp - 1);
            joined.assign(a);
            joined.append(b);
            auto ia = by_text.find(a), ib = by_text.find(b), im = by_text.find(joined);
            if (!ia || !ib || !im)
                fail(s.source, ": merge ", r, " '", m, "' names a token that is not in the vocabulary");
            merges_.push_back({*ia, *ib, *im});
        }
        bpe_ = tok::bpe(byte_ids, merges_);

        added_.clear();
        trie_.assign(1, trie_node{});
        starts_added_.fill(false);
        std::vector<bool> seen(n, false);
        for (const auto& a : s.added) {
            if (a.id < 0 || std::size_t(a.id) >= n) fail(s.source, ": added token id ", a.id, " is outside the vocabulary");
            if (a.content.empty() || seen[std::size_t(a.id)]) continue;
            seen[std::size_t(a.id)] = true;
            bytes[std::size_t(a.id)] = a.content;
            std::int32_t node = 0;
            for (unsigned char c : a.content) {
                std::int32_t child = -1;
                for (auto& [k, v] : trie_[std::size_t(node)].next)
                    if (k == c) child = v;
                if (child < 0) {
                    child = std::int32_t(trie_.size());
                    trie_[std::size_t(node)].next.emplace_back(c, child);
                    trie_.emplace_back();
                }
                node = child;
            }
            if (trie_[std::size_t(node)].added >= 0) continue;  // the same text twice: the first id wins
            trie_[std::size_t(node)].added = std::int32_t(added_.size());
            trie_[std::size_t(node)].special = types_[std::size_t(a.id)] == token_type::control;
            starts_added_[static_cast<unsigned char>(a.content[0])] = true;
            added_.push_back(a);
        }
        arena_.clear();
        offs_.assign(n + 1, 0);
        std::size_t total = 0;
        for (auto& b : bytes) total += b.size();
        if (total > 0xFFFFFFFFu) fail(s.source, ": the vocabulary's text is too large");
        arena_.reserve(total);
        for (std::size_t i = 0; i < n; ++i) {
            arena_ += bytes[i];
            offs_[i + 1] = std::uint32_t(arena_.size());
        }

        pre_name_ = s.pre;
        try {
            if (s.pre == "qwen2") pre_ = tok::pretokenizer::qwen2();
            else if (s.pre == "qwen35") pre_ = tok::pretokenizer::qwen35();
            else if (s.pre == "gpt2") pre_ = tok::pretokenizer::regex(tok::gpt2_pattern);
            else if (s.pre == "regex") pre_ = s.pre_regex.empty() ? tok::pretokenizer::whole() : tok::pretokenizer::regex(s.pre_regex);
            else fail("unknown pre-tokenizer '", s.pre, "'");
        } catch (const clover::error& e) {
            fail(s.source, ": ", e.what());
        }
        nfc_ = s.nfc;
        ignore_merges_ = s.ignore_merges;
        auto checked = [&](std::int32_t id, const char* what) {
            if (id >= std::int32_t(n)) fail(s.source, ": ", what, " id ", id, " is outside the vocabulary");
            return id;
        };
        bos_ = checked(s.bos, "BOS");
        eos_ = checked(s.eos, "EOS");
        pad_ = checked(s.pad, "padding");
        add_bos_ = s.add_bos;
        add_eos_ = s.add_eos;
        chat_template_ = s.chat_template;
        // End-of-generation: EOS plus the turn/document enders llama.cpp also stops on.
        eog_.clear();
        if (eos_ >= 0) eog_.push_back(eos_);
        for (std::string_view t : {"<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                                   "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>"})
            for (const auto& a : added_)
                if (a.content == t && !is_eog(a.id)) eog_.push_back(a.id);
    }

    // Longest added token at i: (index in added_, length), or (-1, 0). A control token counts
    // only when it ends by special_end (0: nowhere).
    std::pair<std::int32_t, std::size_t> match_added(std::string_view text, std::size_t i, std::size_t special_end) const {
        std::int32_t node = 0, best = -1;
        std::size_t best_len = 0;
        for (std::size_t j = i; j < text.size(); ++j) {
            std::int32_t child = -1;
            for (auto& [k, v] : trie_[std::size_t(node)].next)
                if (k == static_cast<unsigned char>(text[j])) { child = v; break; }
            if (child < 0) break;
            node = child;
            const trie_node& t = trie_[std::size_t(node)];
            if (t.added >= 0 && (!t.special || j + 1 <= special_end)) { best = t.added; best_len = j + 1 - i; }
        }
        return {best, best_len};
    }

    void encode_section(std::string_view s, std::vector<std::int32_t>& out) const {
        if (s.empty()) return;
        std::string normalized;
        if (nfc_ && tok::nfc_append(s, normalized)) s = normalized;
        pre_.split(s, [&](std::string_view piece) {
            if (ignore_merges_) {
                if (auto p = by_bytes_.find(piece)) { out.push_back(*p); return; }
            }
            bpe_.encode(piece, out);
        });
    }

    static bool is_space_at(std::string_view s, std::size_t i, std::size_t& len) {
        char32_t cp;
        len = std::size_t(tok::utf8::decode(s, i, cp));
        return cp != tok::utf8::invalid && (tok::unicode::flags(cp) & tok::unicode::space);
    }
    static std::string_view trim_end(std::string_view s) {
        // Walk forward so that multi-byte spaces are seen whole; remember where trailing space starts.
        std::size_t i = 0, keep = 0, len = 0;
        while (i < s.size()) {
            bool sp = is_space_at(s, i, len);
            i += len;
            if (!sp) keep = i;
        }
        return s.substr(0, keep);
    }
    static std::size_t skip_space(std::string_view s, std::size_t i) {
        std::size_t len = 0;
        while (i < s.size() && is_space_at(s, i, len)) i += len;
        return i;
    }

    void check_id(std::int32_t id) const {
        if (id < 0 || std::size_t(id) >= types_.size())
            fail("token id ", id, " is outside the vocabulary (", types_.size(), " tokens)");
    }
    std::string file_form(std::int32_t id) const {
        auto t = types_[std::size_t(id)];
        if (t == token_type::control || t == token_type::user_defined || literal_[std::size_t(id)])
            return std::string(token_bytes(id));
        return tok::byte_level::encode(token_bytes(id));
    }

    std::string source_;
    std::string arena_;                // the bytes of all tokens, back to back
    std::vector<std::uint32_t> offs_;  // token i is arena_[offs_[i], offs_[i + 1])
    std::vector<token_type> types_;
    std::vector<bool> literal_;
    tok::string_index by_bytes_;       // normal tokens' bytes -> id
    std::vector<std::array<std::int32_t, 3>> merges_;
    tok::bpe bpe_;
    std::vector<tok::added_token> added_;
    std::vector<trie_node> trie_;
    std::array<bool, 256> starts_added_{};
    tok::pretokenizer pre_ = tok::pretokenizer::whole();
    std::string pre_name_;
    bool nfc_ = false, ignore_merges_ = false;
    std::int32_t bos_ = -1, eos_ = -1, pad_ = -1;
    bool add_bos_ = false, add_eos_ = false;
    std::string chat_template_;
    std::vector<std::int32_t> eog_;
};

}  // namespace clover
