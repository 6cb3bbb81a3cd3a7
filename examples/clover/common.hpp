#pragma once
// Shared pieces of the `clover` command: id lists, model opening, output helpers.
#include <cstdio>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <clover/clover.hpp>
#include <clover/io/atomic_file.hpp>
#include <clover/io/hf_model.hpp>
#include <clover/model/file_variants.hpp>

namespace clover::cli {

inline void warn(const std::string& msg) { std::fprintf(stderr, "warning: %s\n", msg.c_str()); }

// "1,2,3" or "1 2 3" (any mix of commas and whitespace).
inline std::vector<token> parse_ids(const std::string& text, const std::string& what) {
    std::vector<token> ids;
    std::string cur;
    auto flush = [&] {
        if (cur.empty()) return;
        std::size_t pos = 0;
        long long v = 0;
        try {
            v = std::stoll(cur, &pos);
        } catch (...) {
            pos = 0;
        }
        if (pos != cur.size() || v < 0 || v > 0x7fffffff) fail(what, ": '", cur, "' is not a token id");
        ids.push_back(token(v));
        cur.clear();
    };
    for (char c : text) {
        if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') flush();
        else cur += c;
    }
    flush();
    return ids;
}

inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(path, ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The files that reading `paths` touches (a model file, every file an HF folder is read from,
// an ids file; empty paths skipped): what an output must never replace.
inline std::vector<io::file_identity> input_identities(std::initializer_list<std::string> paths) {
    std::vector<io::file_identity> ids;
    for (const auto& p : paths) {
        if (p.empty()) continue;
        if (std::filesystem::is_directory(p)) {
            for (auto& id : hf::input_files(p)) ids.push_back(std::move(id));
        } else if (auto id = io::identity_of(p)) {
            ids.push_back(std::move(*id));
        }
    }
    return ids;
}

// Writes a whole output file, all or nothing (io/atomic_file.hpp: a temporary file, fsync,
// rename), refusing an output that is one of `inputs` (paths as given on the command line).
inline void write_output_file(const std::string& out, std::span<const std::byte> bytes, std::initializer_list<std::string> inputs) {
    io::write_file_atomically(out, bytes, input_identities(inputs));
}

inline std::string join_ids(const std::vector<token>& ids) {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ',';  // not `"," + std::to_string(...)`: GCC 12 -Wrestrict false positive
        s += std::to_string(ids[i]);
    }
    return s;
}

using runtime_model = model<variants::from_file, backend::cpu>;

// A GGUF file (known vendor variants made canonical in memory, with a warning) or an HF folder.
inline std::shared_ptr<const io::gguf_file> open_weights(const std::string& path) {
    return clover::open(path, &warn);
}

inline std::unique_ptr<runtime_model> open_model(const std::string& path, int threads) {
    return std::make_unique<runtime_model>(open_weights(path), backend::cpu_options{threads}, &warn);
}

}  // namespace clover::cli
