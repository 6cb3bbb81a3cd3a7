#pragma once
// `clover tokenize` and `clover detokenize` (shared/spec/cli.md):
//
//   clover tokenize --tokenizer PATH [--no-special] [--add-special] (TEXT | --file F)
//       prints the ids as a JSON array, e.g. [9707,11,1879,0]
//   clover detokenize --tokenizer PATH (--ids 1,2,3 | --ids-file F) [--skip-special]
//       prints the text, exactly (no newline added); ill-formed UTF-8 becomes U+FFFD
//
// PATH is a GGUF model (recognised by its magic) or an HF tokenizer.json (or its folder).
// Errors are thrown as clover::error for the front end to print as one line.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "clover/core/error.hpp"
#include "clover/tokenizer/tokenizer.hpp"
#include "clover/tokenizer/utf8.hpp"

namespace clover::cli {

namespace tokenize_detail {

inline std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(path, ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// "1,2,3", "1 2 3", "[1, 2, 3]" (commas, white space and brackets all separate).
inline std::vector<std::int32_t> parse_id_list(const std::string& text, const std::string& what) {
    std::vector<std::int32_t> ids;
    std::string cur;
    auto flush = [&] {
        if (cur.empty()) return;
        std::size_t pos = 0;
        long long v = -1;
        try {
            v = std::stoll(cur, &pos);
        } catch (...) {
            pos = 0;
        }
        if (pos != cur.size() || v < 0 || v > 0x7fffffff) fail(what, ": '", cur, "' is not a token id");
        ids.push_back(std::int32_t(v));
        cur.clear();
    };
    for (char c : text) {
        if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']') flush();
        else cur += c;
    }
    flush();
    return ids;
}

inline void write_stdout(const std::string& s) {
    if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) fail("stdout: write failed");
    std::fflush(stdout);
}

}  // namespace tokenize_detail

inline void add_tokenize_commands(CLI::App& app) {
    {
        struct options {
            std::string tokenizer, text, file;
            bool no_special = false, add_special = false;
        };
        auto o = std::make_shared<options>();
        auto* c = app.add_subcommand("tokenize", "Text -> token ids, printed as a JSON array");
        c->add_option("--tokenizer", o->tokenizer, "GGUF model or HF tokenizer.json")->required();
        auto* text = c->add_option("text", o->text, "the text to tokenize");
        c->add_option("--file", o->file, "read the text from this file (its bytes as they are)");
        c->add_flag("--no-special", o->no_special, "special (control) tokens written in the text are plain text");
        c->add_flag("--add-special", o->add_special, "add BOS/EOS where the tokenizer asks for them");
        c->callback([o, text] {
            bool have_text = text->count() > 0;
            if (have_text && !o->file.empty()) fail("tokenize: give TEXT or --file, not both");
            if (!have_text && o->file.empty()) fail("tokenize: no text (give TEXT or --file F)");
            std::string input = have_text ? o->text : tokenize_detail::slurp(o->file);
            auto tok = tokenizer::from_file(o->tokenizer);
            auto ids = tok.encode(input, {.parse_special = !o->no_special, .add_special = o->add_special});
            std::string out = "[";
            for (std::size_t i = 0; i < ids.size(); ++i) {
                if (i) out += ',';
                out += std::to_string(ids[i]);
            }
            out += "]\n";
            tokenize_detail::write_stdout(out);
        });
    }
    {
        struct options {
            std::string tokenizer, ids, ids_file;
            bool skip_special = false;
        };
        auto o = std::make_shared<options>();
        auto* c = app.add_subcommand("detokenize", "Token ids -> text");
        c->add_option("--tokenizer", o->tokenizer, "GGUF model or HF tokenizer.json")->required();
        auto* ids = c->add_option("--ids", o->ids, "comma-separated ids, e.g. 1,2,3");
        c->add_option("--ids-file", o->ids_file, "read the ids (comma or white space separated) from a file");
        c->add_flag("--skip-special", o->skip_special, "leave out control tokens");
        c->callback([o, ids] {
            bool have_ids = ids->count() > 0;
            if (have_ids && !o->ids_file.empty()) fail("detokenize: give --ids or --ids-file, not both");
            if (!have_ids && o->ids_file.empty()) fail("detokenize: no ids (give --ids 1,2,3 or --ids-file F)");
            auto list = have_ids ? tokenize_detail::parse_id_list(o->ids, "--ids")
                                 : tokenize_detail::parse_id_list(tokenize_detail::slurp(o->ids_file), o->ids_file);
            auto tok = tokenizer::from_file(o->tokenizer);
            for (auto id : list)
                if (std::size_t(id) >= tok.n_vocab())
                    fail("--ids: token id ", id, " is outside the vocabulary (", tok.n_vocab(), " tokens)");
            tokenize_detail::write_stdout(tok::utf8::sanitize(tok.decode(list, o->skip_special)));
        });
    }
}

}  // namespace clover::cli
