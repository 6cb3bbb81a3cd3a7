#pragma once
// A read-only memory map of a whole file. Weights are used in place from the map: loading a
// model copies nothing, and pages the OS has not touched cost nothing — unless a backend asks
// for the bytes in huge pages (move_to_huge_pages: a private copy at the same addresses).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clover/core/error.hpp"
#include "clover/io/huge_pages.hpp"
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
            fd_ = fd;  // kept for move_to_huge_pages: it reads the very file that is mapped
            return;
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

    // Replaces the map's pages by a private copy in transparent huge pages at the same
    // addresses (io/huge_pages.hpp: why, and when it is refused). The bytes and every pointer
    // into the map stay the same, so it is safe while other threads read the map. "" when the
    // bytes are in huge pages (now or by an earlier call), else why not (the map is unchanged).
    std::string move_to_huge_pages() const {
        std::lock_guard lk(load_mutex());
        if (in_huge_pages_) return "";
        if (!data_) return "nothing is mapped";
        const memory_outlook mem = read_memory_outlook();
        if (std::string why = huge_page_plan(size_, mem); !why.empty()) return why;
        if (std::string why = copy_map_to_huge_pages(data_, size_, fd_, huge_copy_drops_cache(size_, mem)); !why.empty()) return why;
        in_huge_pages_ = true;
        return "";
    }
    bool in_huge_pages() const { return in_huge_pages_; }

    // "" when the mapped bytes are resident for good (the private copy) or fit in the memory
    // available beside huge_page_reserve; else how much of them the page cache cannot hold, which
    // demand paging reads from disk again on every pass.
    std::string memory_shortfall() const {
        if (in_huge_pages_ || !data_) return "";
        return residency_shortfall(size_, read_memory_outlook());
    }

    // Lets the first model of this map rewrite its bytes in place (a backend's own weight
    // layout: weight_memory::rewrite_once), and tells every later one what it did. The first
    // call decides: when `rewrite` is set and the bytes are the private copy in huge pages, it
    // runs with them writable and returns the addresses it rewrote; otherwise nothing is
    // rewritten, ever (a model reading the file's layout may already be running). Every call
    // returns that record, sorted. Call it before any model of this map runs a pass.
    template <class Rewrite>
    std::vector<const std::byte*> rewrite_once(const Rewrite& rewrite) const {
        std::lock_guard lk(load_mutex());
        if (!rewrite_decided_) {
            rewrite_decided_ = true;
            if (rewrite && in_huge_pages_ && data_) {
                auto* p = const_cast<std::byte*>(data_);
                if (::mprotect(p, size_, PROT_READ | PROT_WRITE) != 0) return {};
                try {
                    rewritten_ = rewrite();
                } catch (...) {
                    ::mprotect(p, size_, PROT_READ);
                    throw;
                }
                ::mprotect(p, size_, PROT_READ);
                std::sort(rewritten_.begin(), rewritten_.end());
            }
        }
        return rewritten_;
    }

private:
    void reset() {
        if (data_) ::munmap(const_cast<std::byte*>(data_), size_);  // the copy, after move_to_huge_pages
        if (fd_ >= 0) ::close(fd_);
        data_ = nullptr;
        size_ = 0;
        fd_ = -1;
        in_huge_pages_ = false;
        rewrite_decided_ = false;
        rewritten_.clear();
    }
    void swap(mapped_file& o) noexcept {
        std::swap(path_, o.path_);
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(identity_, o.identity_);
        std::swap(fd_, o.fd_);
        in_huge_pages_.store(o.in_huge_pages_.exchange(in_huge_pages_.load()));
        std::swap(rewrite_decided_, o.rewrite_decided_);
        std::swap(rewritten_, o.rewritten_);
    }
    std::string path_;
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    file_identity identity_;
    int fd_ = -1;
    mutable std::atomic<bool> in_huge_pages_ = false;  // read without the mutex (in_huge_pages)
    mutable bool rewrite_decided_ = false;
    mutable std::vector<const std::byte*> rewritten_;
    // Rare (model loads); serialises two models sharing one file.
    static std::mutex& load_mutex() {
        static std::mutex mu;
        return mu;
    }
};

}  // namespace clover::io
