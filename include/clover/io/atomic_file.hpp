#pragma once
// Writing an output file so that no failure destroys anything:
//
//   io::atomic_output out(path, inputs);   // refuses an output that is one of the inputs
//   out.write(bytes, n); ...                // or out.pwrite / out.fd() for copy_file_range
//   out.commit();                           // fsync, rename over `path`, fsync the folder
//
// The bytes go to a fresh temporary file in the output's folder ("NAME.XXXXXXXX.partial",
// created with O_EXCL, so it is never an existing file — not even an input named NAME.partial),
// which is renamed over the output only once it is complete and on disk. Until commit() the
// output is untouched; an exception, an early return or a failed write removes the temporary
// file (the destructor), so a failure leaves the folder as it was.
//
// Inputs are compared by identity (device + inode, io/regular_file.hpp): the same file under
// another name, a hard link or a symlink to an input is refused, before anything is created and
// again just before the rename. An existing output that is not a regular file (a folder, a FIFO,
// a device) is refused too: renaming over it would replace it, not write into it. An output
// name that is a symlink (to a file that is no input) is replaced by the new file; the file it
// pointed to is left as it was. A temporary file survives only a kill (SIGKILL, power loss):
// "NAME.XXXXXXXX.partial" next to the output says what it is.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clover/core/error.hpp"
#include "clover/io/regular_file.hpp"

namespace clover::io {

class atomic_output {
public:
    explicit atomic_output(const std::filesystem::path& out, std::vector<file_identity> inputs = {})
        : out_(out), inputs_(std::move(inputs)) {
        if (out_.empty()) fail("output: empty file name");
        if (out_.filename().empty()) fail(out_.string(), ": is a folder, not a file name");
        check_target();
        dir_ = out_.parent_path().empty() ? std::filesystem::path(".") : out_.parent_path();
        static std::atomic<std::uint64_t> counter{0};
        int err = 0;
        for (int attempt = 0; attempt < 100; ++attempt) {
            // Unique enough to rarely collide; O_EXCL makes a collision a retry, never a reuse.
            std::uint64_t x = std::uint64_t(::getpid()) * 0x9E3779B97F4A7C15ull ^
                              std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^ (++counter << 40);
            x ^= x >> 29;
            x *= 0xBF58476D1CE4E5B9ull;
            x ^= x >> 32;
            char suffix[9];
            for (int i = 0; i < 8; ++i) suffix[i] = "0123456789abcdefghijklmnopqrstuv"[(x >> (5 * i)) & 31];
            suffix[8] = 0;
            tmp_ = dir_ / (out_.filename().string() + "." + suffix + ".partial");
            fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
            if (fd_ >= 0) return;
            err = errno;
            if (err != EEXIST) break;
        }
        fail(out_.string(), ": cannot create a temporary file in ", dir_.string(), ": ", std::strerror(err));
    }
    atomic_output(const atomic_output&) = delete;
    atomic_output& operator=(const atomic_output&) = delete;
    ~atomic_output() { discard(); }

    const std::filesystem::path& path() const { return out_; }
    int fd() const { return fd_; }

    // Appends n bytes.
    void write(const void* p, std::size_t n) {
        pwrite(p, n, end_);
    }
    // Writes n bytes at offset off.
    void pwrite(const void* p, std::size_t n, std::uint64_t off) {
        require_open();
        auto* c = static_cast<const std::byte*>(p);
        while (n > 0) {
            const ssize_t w = ::pwrite(fd_, c, n, off_t(off));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) fail(out_.string(), ": write failed: ", std::strerror(w < 0 ? errno : ENOSPC));
            c += w;
            n -= std::size_t(w);
            off += std::uint64_t(w);
        }
        end_ = std::max(end_, off);
    }
    void resize(std::uint64_t size) {
        require_open();
        if (::ftruncate(fd_, off_t(size)) != 0) fail(out_.string(), ": cannot set the file size: ", std::strerror(errno));
        end_ = size;
    }

    // The file is complete: flush it to disk and put it in place of the output.
    void commit() {
        require_open();
        if (::fsync(fd_) != 0) fail(out_.string(), ": write failed (fsync): ", std::strerror(errno));
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) fail(out_.string(), ": write failed (close): ", std::strerror(errno));
        check_target();  // an input may have been linked to the output's name meanwhile
        if (::rename(tmp_.c_str(), out_.c_str()) != 0) fail(out_.string(), ": cannot rename the finished file into place: ", std::strerror(errno));
        committed_ = true;
        // The rename itself is durable once the folder is flushed. Some file systems cannot
        // fsync a folder (EINVAL): nothing more can be done there.
        const int d = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d >= 0) {
            const int r = ::fsync(d);
            const int e = errno;
            ::close(d);
            if (r != 0 && e != EINVAL && e != EROFS) fail(out_.string(), ": cannot flush its folder to disk: ", std::strerror(e));
        }
    }

    // Gives up: the temporary file is removed, the output stays as it was. Never throws.
    void discard() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
        tmp_.clear();
    }

private:
    void require_open() const {
        if (fd_ < 0) fail(out_.string(), ": the output was already committed or discarded");
    }
    void check_target() const {
        struct stat st{};
        if (::stat(out_.c_str(), &st) != 0) return;  // nothing there yet (or a dangling symlink: replaced)
        if (S_ISDIR(st.st_mode)) fail(out_.string(), ": is a folder; give a file name");
        if (!S_ISREG(st.st_mode)) fail(out_.string(), ": is ", file_kind(st.st_mode), ", not a regular file; give a file name");
        const file_identity id{st.st_dev, st.st_ino, out_.string()};
        for (const auto& in : inputs_)
            if (in.same_file(id))
                fail(out_.string(), ": is one of the input files (", in.path, "); write the output elsewhere");
    }

    std::filesystem::path out_, dir_, tmp_;
    std::vector<file_identity> inputs_;
    int fd_ = -1;
    std::uint64_t end_ = 0;
    bool committed_ = false;
};

// Writes `bytes` to `out` through an atomic_output (all or nothing).
inline void write_file_atomically(const std::filesystem::path& out, std::span<const std::byte> bytes,
                                  std::vector<file_identity> inputs = {}) {
    atomic_output f(out, std::move(inputs));
    f.write(bytes.data(), bytes.size());
    f.commit();
}

}  // namespace clover::io
