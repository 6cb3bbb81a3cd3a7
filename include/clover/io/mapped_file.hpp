#pragma once
// A read-only memory map of a whole file. Weights are used in place from the map: loading a
// model copies nothing, and pages the OS has not touched cost nothing.
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clover/core/error.hpp"
#include "clover/io/regular_file.hpp"

namespace clover::io {

class mapped_file {
public:
    mapped_file() = default;
    // Only a regular file is mapped: a FIFO, device or folder is refused without blocking
    // (io/regular_file.hpp).
    explicit mapped_file(const std::filesystem::path& path) : path_(path.string()) {
        struct stat st{};
        int fd = open_regular(path, &st);
        identity_ = {st.st_dev, st.st_ino, path_};
        size_ = static_cast<std::size_t>(st.st_size);
        if (size_ > 0) {
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                int e = errno;
                ::close(fd);
                fail(path_, ": cannot mmap: ", std::strerror(e));
            }
            data_ = static_cast<const std::byte*>(p);
        }
        ::close(fd);
    }
    mapped_file(const mapped_file&) = delete;
    mapped_file& operator=(const mapped_file&) = delete;
    mapped_file(mapped_file&& o) noexcept { swap(o); }
    mapped_file& operator=(mapped_file&& o) noexcept {
        if (this != &o) { reset(); swap(o); }
        return *this;
    }
    ~mapped_file() { reset(); }

    std::span<const std::byte> bytes() const { return {data_, size_}; }
    const std::byte* data() const { return data_; }
    std::size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // Which file was mapped (device, inode): writers refuse to replace it.
    const file_identity& identity() const { return identity_; }

    // Tells the kernel we will read these pages soon (readahead for sequential loads).
    void advise_willneed(std::size_t offset, std::size_t len) const {
        if (!data_ || offset >= size_) return;
        long page = ::sysconf(_SC_PAGESIZE);
        std::size_t start = offset / page * page;
        ::madvise(const_cast<std::byte*>(data_) + start, std::min(len + (offset - start), size_ - start), MADV_WILLNEED);
    }

private:
    void reset() {
        if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
        data_ = nullptr;
        size_ = 0;
    }
    void swap(mapped_file& o) noexcept {
        std::swap(path_, o.path_);
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(identity_, o.identity_);
    }
    std::string path_;
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    file_identity identity_;
};

}  // namespace clover::io
