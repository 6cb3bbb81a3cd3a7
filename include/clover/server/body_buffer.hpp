#pragma once
// A request body's bytes, held where freeing them gives the memory back to the system at once.
//
// Why not a std::string: glibc serves a large allocation with mmap only until the first such
// block is freed; then it raises its mmap threshold to that size (up to 32 MiB), so later 4 MiB
// bodies come from the pool threads' arenas. A freed body then stays resident at the top of its
// thread's arena (glibc trims a thread arena's top only past a threshold raised likewise, and
// malloc_trim trims only the main arena's top): a few wide bodies on each pool thread kept
// ~90 MiB for good beside a 23 MiB idle server (issue 38). Here a body past `mapped_from`
// lives in its own anonymous mapping, unmapped when the request ends; smaller ones stay in a
// std::string (a mapping costs a page and a system call).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

namespace clover::server {

class body_buffer {
public:
    static constexpr std::size_t mapped_from = std::size_t(64) << 10;

    body_buffer() = default;
    body_buffer(const body_buffer&) = delete;
    body_buffer& operator=(const body_buffer&) = delete;
    ~body_buffer() { unmap(); }

    // Room for `n` bytes in one piece (a declared Content-Length: no growth while it is read).
    void reserve(std::size_t n) {
        if (n <= capacity()) return;
        if (n < mapped_from) return small_.reserve(n);
        const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
        const std::size_t bytes = (n + page - 1) / page * page;
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        char* d = static_cast<char*>(p);
        if (map_) std::memcpy(d, map_, size_);
        else if (!small_.empty()) std::memcpy(d, small_.data(), size_);
        unmap();
        std::string().swap(small_);
        map_ = d;
        mapped_ = bytes;
    }
    // Appends; a body of unknown length (chunked) grows by doubling.
    void append(const char* d, std::size_t n) {
        const std::size_t need = size_ + n;
        if (need > capacity()) reserve(std::max(need, 2 * capacity()));
        if (map_) std::memcpy(map_ + size_, d, n);
        else small_.append(d, n);
        size_ += n;
    }

    // Gives the memory back now (the request has been parsed; its generation may run for long).
    void release() {
        unmap();
        std::string().swap(small_);
        size_ = 0;
    }

    std::size_t size() const { return size_; }
    std::string_view view() const { return map_ ? std::string_view(map_, size_) : std::string_view(small_); }
    bool mapped() const { return map_ != nullptr; }

private:
    std::size_t capacity() const { return map_ ? mapped_ : small_.capacity(); }
    void unmap() {
        if (map_) ::munmap(map_, mapped_);
        map_ = nullptr;
        mapped_ = 0;
    }

    std::string small_;
    char* map_ = nullptr;
    std::size_t mapped_ = 0, size_ = 0;
};

}  // namespace clover::server
