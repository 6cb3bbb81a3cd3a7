// Weights in huge pages (io/huge_pages.hpp): when a copy is allowed, and the copy itself — the
// same bytes at the same addresses, now anonymous memory instead of the file's pages.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <clover/io/huge_pages.hpp>
#include <clover/io/mapped_file.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

std::vector<char> random_file(const std::string& path, std::size_t n) {
    std::vector<char> b(n);
    std::mt19937 g(7);
    for (auto& c : b) c = char(g());
    std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(n));
    return b;
}

// The "Anonymous:" kB of the mapping that holds address p (/proc/self/smaps), -1 if none.
long anonymous_kb_at(const void* p) {
    std::ifstream f("/proc/self/smaps");
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    bool in = false;
    for (std::string line; std::getline(f, line);) {
        unsigned long lo = 0, hi = 0;
        char dash = 0;
        std::istringstream s(line);
        if (line.find('-') != std::string::npos && (s >> std::hex >> lo >> dash >> hi) && dash == '-' && line.find(':') > line.find(' ')) {
            in = lo <= a && a < hi;
            continue;
        }
        if (in && line.rfind("Anonymous:", 0) == 0) return std::stol(line.substr(10));
    }
    return -1;
}

constexpr std::size_t MiB = std::size_t(1) << 20;

// A file of n random bytes, open and mapped read-only and private (as mapped_file maps).
struct mapped_random_file {
    std::vector<char> bytes;
    int fd = -1;
    void* p = MAP_FAILED;
    std::size_t n;
    mapped_random_file(const std::string& name, std::size_t size) : n(size) {
        const std::string path = testutil::tmp(name);
        bytes = random_file(path, n);
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
        REQUIRE(p != MAP_FAILED);
    }
    ~mapped_random_file() {
        if (p != MAP_FAILED) ::munmap(p, n);
        if (fd >= 0) ::close(fd);
    }
    const std::byte* map() const { return static_cast<const std::byte*>(p); }
};

}  // namespace

TEST_CASE("huge_page_plan: refuses small files, THP off, and copies that would not fit") {
    const io::memory_outlook roomy{"madvise", 64 * 1024 * MiB};
    CHECK(io::huge_page_plan(100 * MiB, roomy) == "");
    CHECK(io::huge_page_plan(100 * MiB, {"always", 64 * 1024 * MiB}) == "");
    CHECK(io::huge_page_plan(MiB, roomy).find("smaller than one huge page") != std::string::npos);
    CHECK(io::huge_page_plan(100 * MiB, {"never", 64 * 1024 * MiB}).find("off") != std::string::npos);
    CHECK(io::huge_page_plan(100 * MiB, {"", 64 * 1024 * MiB}).find("no transparent huge pages") != std::string::npos);
    // The weights plus a reserve (1 GiB, or 1/16 of the weights) within what is available: the
    // full 40-layer Q4_K_M file (18.2 GiB) fits beside 22 GiB available (the 80 % rule before
    // issue 41 refused it); 23 GiB of weights with 24 GiB available do not, and the reason names
    // the sizes.
    CHECK(io::huge_page_plan(std::size_t(18.2 * 1024) * MiB, {"madvise", 22 * 1024 * MiB}) == "");
    const std::string why = io::huge_page_plan(23 * 1024 * MiB, {"madvise", 24 * 1024 * MiB});
    CHECK(why.find("23.00 GiB") != std::string::npos);
    CHECK(why.find("24.00 GiB") != std::string::npos);
    CHECK(why.find("1.44 GiB") != std::string::npos);  // the reserve: 23 GiB / 16
    CHECK(io::huge_page_plan(2 * 1024 * MiB, {"madvise", 3 * 1024 * MiB}) == "");
    CHECK(io::huge_page_plan(2 * 1024 * MiB + 1, {"madvise", 3 * 1024 * MiB}) != "");  // 1 GiB reserve floor
}

TEST_CASE("residency_shortfall and huge_copy_drops_cache: what fits, and the page cache's twin") {
    CHECK(io::residency_shortfall(10 * 1024 * MiB, {"madvise", 22 * 1024 * MiB}) == "");
    CHECK(io::residency_shortfall(10 * 1024 * MiB, {"madvise", 0}) == "");  // unknown: say nothing
    const std::string s = io::residency_shortfall(32 * 1024 * MiB, {"madvise", 22 * 1024 * MiB});
    CHECK(s.find("32.00 GiB of weights") != std::string::npos);
    CHECK(s.find("12.00 GiB") != std::string::npos);  // 32 + 2 (reserve) - 22
    CHECK(s.find("read from disk") != std::string::npos);
    CHECK_FALSE(io::huge_copy_drops_cache(4 * 1024 * MiB, {"madvise", 22 * 1024 * MiB}));
    CHECK(io::huge_copy_drops_cache(18 * 1024 * MiB, {"madvise", 22 * 1024 * MiB}));
}

TEST_CASE("read_memory_outlook: this machine's THP mode and a plausible amount of memory") {
    const io::memory_outlook m = io::read_memory_outlook();
    CHECK(m.available > 16 * MiB);
    CHECK((m.thp_mode == "" || m.thp_mode == "always" || m.thp_mode == "madvise" || m.thp_mode == "never"));
}

TEST_CASE("copy_map_to_huge_pages: the same bytes at the same addresses, in anonymous memory") {
    // Odd size and an odd offset inside: the tail page and the 2 MiB phase are exercised.
    const std::size_t n = 5 * MiB + 12345;
    const mapped_random_file f("huge_pages_copy.bin", n);
    const std::byte* map = f.map();
    CHECK(anonymous_kb_at(map) == 0);  // the file's own pages
    CHECK(io::copy_map_to_huge_pages(map, n, f.fd) == "");
    CHECK(std::memcmp(map, f.bytes.data(), n) == 0);
    CHECK(anonymous_kb_at(map) >= long(n / 1024) - 4);  // every page is the copy now
    CHECK(anonymous_kb_at(map + n - 1) >= 0);            // the tail is still mapped
}

TEST_CASE("copy_map_to_huge_pages: dropping the page cache behind the reads keeps the bytes") {
    // What a file that fills most of memory takes (huge_copy_drops_cache): the page cache's pages
    // are dropped as the copy reads them; the copy must still hold every byte, tail included.
    const std::size_t n = 4 * MiB + 777;
    const mapped_random_file f("huge_pages_drop.bin", n);
    const std::byte* map = f.map();
    CHECK(io::copy_map_to_huge_pages(map, n, f.fd, /*drop_cache=*/true) == "");
    CHECK(std::memcmp(map, f.bytes.data(), n) == 0);
    CHECK(anonymous_kb_at(map) >= long(n / 1024) - 4);
}

TEST_CASE("copy_map_to_huge_pages: a file shorter than the map is an error and the map is untouched") {
    const std::size_t n = 3 * MiB;
    const mapped_random_file f("huge_pages_short.bin", n);
    const std::byte* map = f.map();
    // Ask for more bytes than the file has (as if it had been truncated): the read comes short.
    const std::string why = io::copy_map_to_huge_pages(map, n + MiB, f.fd);
    CHECK(why.find("shorter") != std::string::npos);
    CHECK(std::memcmp(map, f.bytes.data(), n) == 0);
    CHECK(anonymous_kb_at(map) == 0);
}

TEST_CASE("mapped_file::move_to_huge_pages: as the plan says; pointers and bytes stay; once only") {
    const std::size_t n = 6 * MiB + 7;
    const std::string path = testutil::tmp("huge_pages_mapped.bin");
    const auto want = random_file(path, n);
    io::mapped_file m(path);
    const std::byte* before = m.data();
    const std::string plan = io::huge_page_plan(n, io::read_memory_outlook());
    const std::string why = m.move_to_huge_pages();
    CHECK(why == plan);  // on a machine without THP both give the same reason
    CHECK(m.data() == before);
    CHECK(std::memcmp(m.data(), want.data(), n) == 0);
    CHECK(m.in_huge_pages() == why.empty());
    if (why.empty()) {
        CHECK(anonymous_kb_at(m.data()) >= long(n / 1024) - 4);
        CHECK(m.move_to_huge_pages() == "");  // the second call has nothing to do
        CHECK(std::memcmp(m.data(), want.data(), n) == 0);
    } else {
        MESSAGE("this machine keeps the file map: " << why);
    }
    // A moved map survives a move of the object and unmaps cleanly.
    io::mapped_file other = std::move(m);
    CHECK(other.data() == before);
    CHECK(std::memcmp(other.data(), want.data(), n) == 0);
}

TEST_CASE("mapped_file::move_to_huge_pages: a file smaller than one huge page stays mapped") {
    const std::string path = testutil::tmp("huge_pages_small.bin");
    random_file(path, 4096);
    io::mapped_file m(path);
    CHECK(m.move_to_huge_pages().find("smaller than one huge page") != std::string::npos);
    CHECK(!m.in_huge_pages());
}
