#pragma once
// Shared by the libFuzzer targets in tests/fuzz/.
//
// What counts as a finding: a sanitizer report, a crash, a hang, memory past -rss_limit_mb, or
// any exception other than the one the code under test documents for bad input (clover::error
// for the readers). An unexpected exception escapes LLVMFuzzerTestOneInput and libFuzzer reports
// it as a crash with the input that caused it.
//
// The readers that only take a path get the input as a file in a private scratch folder (on
// /dev/shm when there is one, so a run costs a page-cache write, not disk I/O).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

namespace fuzz {

namespace fs = std::filesystem;

// The repository root (models/, tests/fuzz/data/), fixed at compile time like the tests' data.
inline fs::path source_dir() { return CLOVER_SOURCE_DIR; }

[[noreturn]] inline void die(const std::string& what) {
    std::fprintf(stderr, "fuzz: %s\n", what.c_str());
    std::abort();
}

// A folder for this process: clover-fuzz-<pid>-XXXXXX under $CLOVER_FUZZ_TMP, else /dev/shm,
// else the temp folder. Removed at a normal exit; after a crash run.sh removes its $CLOVER_FUZZ_TMP.
inline fs::path* scratch_path = nullptr;  // never freed: the exit handler still needs it
inline const fs::path& scratch_dir() {
    if (!scratch_path) {
        const char* env = std::getenv("CLOVER_FUZZ_TMP");
        fs::path base = env && *env ? fs::path(env) : fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
        std::string tmpl = (base / ("clover-fuzz-" + std::to_string(::getpid()) + "-XXXXXX")).string();
        if (!::mkdtemp(tmpl.data())) die("cannot create a scratch folder under " + base.string());
        scratch_path = new fs::path(tmpl);
        std::atexit([] {
            std::error_code ec;
            fs::remove_all(*scratch_path, ec);
        });
    }
    return *scratch_path;
}

// Replaces the file at p with exactly these bytes.
inline void write_file(const fs::path& p, const std::uint8_t* data, std::size_t size) {
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) die("cannot write " + p.string());
    for (std::size_t done = 0; done < size;) {
        ssize_t n = ::write(fd, data + done, size - done);
        if (n <= 0) die("short write to " + p.string());
        done += std::size_t(n);
    }
    ::close(fd);
}
inline void write_file(const fs::path& p, std::string_view s) {
    write_file(p, reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
}

// Reads one byte of every page-sized step and the last byte of [p, p + n): a view handed out
// past the end of a buffer or a mapping shows up as an ASan report or a SIGSEGV here.
inline void touch(const void* p, std::size_t n) {
    if (!p || n == 0) return;
    const volatile unsigned char* b = static_cast<const unsigned char*>(p);
    unsigned char sink = 0;
    for (std::size_t i = 0; i < n; i += 4096) sink ^= b[i];
    sink ^= b[n - 1];
    (void)sink;
}

// Splits the input: the first byte chooses options, the rest is the payload.
struct flagged {
    std::uint8_t flags = 0;
    std::string_view rest;
    bool bit(int i) const { return (flags >> i) & 1; }
};
inline flagged split_flags(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return {};
    return {data[0], std::string_view(reinterpret_cast<const char*>(data + 1), size - 1)};
}

}  // namespace fuzz
