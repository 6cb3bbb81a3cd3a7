#pragma once
// Reading input files safely, and telling files apart by identity.
//
// Only regular files are read. A FIFO given as a model, a config or a shard would block open()
// until some writer appears (forever), a device would stream endlessly, a folder cannot be read:
// each is refused with one error, before anything is opened in blocking mode. The file is first
// stat()ed (no open at all for what is not regular: opening some devices has side effects),
// then opened with O_NONBLOCK and fstat()ed again, so a file swapped in between is caught too.
//
// A file's identity is its device and inode: the same file under another name, through a hard
// link or a symlink, has the same identity. Writers (io/atomic_file.hpp) compare identities to
// refuse an output that is one of their inputs.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clover/core/error.hpp"

namespace clover::io {

struct file_identity {
    dev_t dev = 0;
    ino_t ino = 0;
    std::string path;  // the name it was found under, for messages
    bool same_file(const file_identity& o) const { return dev == o.dev && ino == o.ino; }
};

// The identity of what `p` names (symlinks followed), or nullopt when nothing is there.
inline std::optional<file_identity> identity_of(const std::filesystem::path& p) {
    struct stat st{};
    if (::stat(p.c_str(), &st) != 0) return std::nullopt;
    return file_identity{st.st_dev, st.st_ino, p.string()};
}

// "a FIFO", "a folder", ... for a mode that is not a regular file.
inline const char* file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a folder";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
}

// Opens p for reading; refuses, without blocking, anything that is not a regular file.
// Returns the descriptor (the caller closes it) and its stat in *st.
inline int open_regular(const std::filesystem::path& p, struct stat* st) {
    const std::string name = p.string();
    if (::stat(p.c_str(), st) != 0) fail(name, ": cannot open: ", std::strerror(errno));
    if (!S_ISREG(st->st_mode)) fail(name, ": not a regular file (", file_kind(st->st_mode), ")");
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) fail(name, ": cannot open: ", std::strerror(errno));
    if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        const int e = errno;
        const mode_t m = st->st_mode;
        ::close(fd);
        if (!S_ISREG(m)) fail(name, ": not a regular file (", file_kind(m), ")");
        fail(name, ": cannot stat: ", std::strerror(e));
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

// The whole contents of a regular file of at most max_bytes (more is an error naming the file:
// a config or tokenizer that large is not one). `identity`, when given, receives the file's.
inline std::string read_regular_file(const std::filesystem::path& p, std::size_t max_bytes, file_identity* identity = nullptr) {
    struct stat st{};
    const int fd = open_regular(p, &st);
    if (identity) *identity = {st.st_dev, st.st_ino, p.string()};
    std::string out;
    try {
        if (std::uint64_t(st.st_size) > max_bytes)
            fail(p.string(), ": ", std::uint64_t(st.st_size), " bytes; more than the ", max_bytes, " this file may have");
        out.resize(std::size_t(st.st_size));
        std::size_t got = 0;
        for (;;) {
            if (got == out.size()) {  // the file may have grown since fstat: read on, within the bound
                if (out.size() >= max_bytes + 1) break;
                out.resize(std::min(max_bytes + 1, out.size() + 4096));
            }
            const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) fail(p.string(), ": read failed: ", std::strerror(errno));
            if (r == 0) break;
            got += std::size_t(r);
        }
        out.resize(got);
        if (got > max_bytes) fail(p.string(), ": more than the ", max_bytes, " bytes this file may have");
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return out;
}

// Whether `p`, every symlink resolved, names something inside the folder `root` (resolved too).
// A path that does not exist yet is resolved as far as it exists.
inline bool resolves_inside(const std::filesystem::path& p, const std::filesystem::path& root) {
    std::error_code ec;
    const auto r = std::filesystem::canonical(root, ec);
    if (ec) return false;
    const auto q = std::filesystem::weakly_canonical(p, ec);
    if (ec) return false;
    auto a = r.begin(), b = q.begin();
    for (; a != r.end(); ++a, ++b)
        if (b == q.end() || *a != *b) return false;
    return b != q.end();  // strictly inside, not the folder itself
}

}  // namespace clover::io
