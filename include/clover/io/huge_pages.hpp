#pragma once
// Whether a file's bytes may be copied into transparent huge pages, and the copy itself.
//
// Why: the decode products stream ~0.7–1.4 GB of weights per step through 4 KB pages of the
// file map, whose TLB misses and page-bounded hardware prefetch cost more than the reads
// themselves. The 8-layer full-width Q4_K_M file on a 2-core Zen 5 VM (2026-12-05, alternating
// runs): `clover bench` tg64x1 30.9 → 41.2 t/s and tg64x8 53–55 → 85–91 t/s with the weights in
// 2 MiB pages (benchmarks/bench_weight_pages.sh has the side-by-side table). The page cache gives
// file maps huge pages only by chance (ext4 large folios: 1.6 of that file's 4.5 GB were
// PMD-mapped in one run, MADV_COLLAPSE refused the file), so the bytes are copied into anonymous
// memory, which MADV_HUGEPAGE backs with 2 MiB pages whenever THP is not "never".
//
// The plan is pure (tested with made-up numbers); the copy reads /proc and /sys.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace clover::io {

inline constexpr std::size_t huge_page_bytes = std::size_t(2) << 20;

// What the machine offers a copy: THP mode ("always", "madvise", "never" or "" when unknown)
// and the memory a new anonymous allocation can take (MemAvailable, capped by a cgroup limit).
struct memory_outlook {
    std::string thp_mode;
    std::size_t available = 0;
};

namespace huge_detail {
// "12.34 GiB", for the load line's sentences.
inline std::string gib(std::size_t b) {
    std::ostringstream s;
    s.precision(2);
    s << std::fixed << double(b) / double(std::size_t(1) << 30) << " GiB";
    return s.str();
}
}  // namespace huge_detail

// Memory the copy leaves to everything else: the state pool, the scratch of a pass, the
// tokenizer and the rest of the process, and the kernel's own needs. 1 GiB, or 1/16 of the
// weights for a very large file.
inline std::size_t huge_page_reserve(std::size_t bytes) { return std::max<std::size_t>(std::size_t(1) << 30, bytes / 16); }

// "" when `bytes` may be copied, else why not (one sentence, for the load line).
// The copy replaces the file's page-cache pages instead of doubling them: the page cache is
// reclaimable (MemAvailable counts it), and copy_map_to_huge_pages drops the pages it has read
// when memory is tight. So the rule is the weights plus a reserve within what is available. The
// earlier rule (80 % of MemAvailable) refused the full 40-layer Q4_K_M file (18.2 GiB) on a
// 24 GiB machine, which then decoded from 4 KB file pages with page faults in the products and
// without the rearranged layouts (issue 41).
inline std::string huge_page_plan(std::size_t bytes, const memory_outlook& m) {
    using huge_detail::gib;
    if (bytes < huge_page_bytes) return "the file is smaller than one huge page";
    if (m.thp_mode == "never") return "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled is never)";
    if (m.thp_mode.empty()) return "this kernel has no transparent huge pages";
    if (bytes + huge_page_reserve(bytes) > m.available)
        return "a private copy needs " + gib(bytes) + " plus " + gib(huge_page_reserve(bytes)) + " to spare, and " + gib(m.available) +
               " of memory is available";
    return "";
}

// "" when `bytes` of a file map fit in memory beside the reserve; else how much will not (for
// the load line: decoding then runs at the disk's speed, not the memory's). MemAvailable counts
// the file's own page cache, so a file already cached reads as fitting when it does.
inline std::string residency_shortfall(std::size_t bytes, const memory_outlook& m) {
    using huge_detail::gib;
    const std::size_t need = bytes + huge_page_reserve(bytes);
    if (m.available == 0 || need <= m.available) return "";
    return gib(bytes) + " of weights with " + gib(m.available) + " of memory available: about " + gib(need - m.available) +
           " of them cannot stay in memory and are read from disk again as passes use them";
}

// Whether the copy should drop the file's page-cache pages behind it: when the weights and
// their page-cache twin would not both fit, keeping the twin only makes the kernel evict it
// under pressure later (or evict something else).
inline bool huge_copy_drops_cache(std::size_t bytes, const memory_outlook& m) { return 2 * bytes + huge_page_reserve(bytes) > m.available; }

namespace huge_detail {
inline std::string first_line(const char* path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}
}  // namespace huge_detail

inline memory_outlook read_memory_outlook() {
    memory_outlook m;
    const std::string thp = huge_detail::first_line("/sys/kernel/mm/transparent_hugepage/enabled");  // "always [madvise] never"
    const auto a = thp.find('['), b = thp.find(']');
    if (a != std::string::npos && b != std::string::npos && b > a) m.thp_mode = thp.substr(a + 1, b - a - 1);
    std::ifstream mi("/proc/meminfo");
    for (std::string key; mi >> key;) {
        std::size_t kb = 0;
        mi >> kb;
        mi.ignore(64, '\n');
        if (key == "MemAvailable:") {
            m.available = kb * 1024;
            break;
        }
    }
    // A container's limit (cgroup v2) binds before the machine's memory does.
    const std::string max = huge_detail::first_line("/sys/fs/cgroup/memory.max");
    const std::string cur = huge_detail::first_line("/sys/fs/cgroup/memory.current");
    if (!max.empty() && max != "max" && !cur.empty()) {
        try {
            const std::size_t lim = std::stoull(max), used = std::stoull(cur);
            m.available = std::min(m.available, lim > used ? lim - used : 0);
        } catch (const std::exception&) {  // unreadable numbers: no copy rather than a failed load
            m.available = 0;
        }
    }
    return m;
}

// Copies [map, map + n), a private read-only file map of descriptor fd, into anonymous memory
// advised for huge pages and moves that memory over the map's own addresses (mremap), so every
// pointer into the map stays valid and sees the same bytes. The new pages are read-only like
// the map's. "" when done, else why not; on failure the file map is untouched.
inline std::string copy_map_to_huge_pages(const std::byte* map, std::size_t n, int fd, bool drop_cache = false) {
    auto sys_error = [](const char* what) { return std::string(what) + ": " + std::strerror(errno); };
    // The huge pages of the copy line up with the map's: the same offset within 2 MiB (mremap
    // keeps a 2 MiB page whole only when source and target share that offset).
    const std::uintptr_t phase = reinterpret_cast<std::uintptr_t>(map) % huge_page_bytes;
    const std::size_t reserve = n + 2 * huge_page_bytes;
    void* r = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return sys_error("mmap of the copy");
    auto* base = static_cast<std::byte*>(r);
    auto* dst = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(base) + huge_page_bytes - 1) / huge_page_bytes *
                                                 huge_page_bytes + phase);
    // Give back the reservation around [dst, dst + n).
    if (dst > base) ::munmap(base, std::size_t(dst - base));
    if (base + reserve > dst + n) {
        const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
        auto* tail = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(dst + n) + page - 1) / page * page);
        if (base + reserve > tail) ::munmap(tail, std::size_t(base + reserve - tail));
    }
    auto give_up = [&](std::string why) {
        ::munmap(dst, n);
        return why;
    };
    ::madvise(dst, n, MADV_HUGEPAGE);  // EINVAL when THP is compiled out: then 4 KB pages, still correct
#ifdef MADV_POPULATE_WRITE
    // Faults the whole copy in now, 2 MiB at a time, and reports running out of memory as an
    // error instead of leaving it to a page fault (measured: populate + pread 1.1 s for the
    // 4.5 GB file, pread alone 1.4 s, memcpy from the map 2.7 s).
    if (::madvise(dst, n, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) return give_up(sys_error("populating the copy"));
#endif
    for (std::size_t off = 0; off < n;) {
        const ssize_t got = ::pread(fd, dst + off, std::min<std::size_t>(n - off, std::size_t(64) << 20), off_t(off));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return give_up(got < 0 ? sys_error("reading the file") : std::string("the file became shorter"));
        // The page cache's copy of what was just read is no longer needed (the map is about to
        // be replaced): dropping it as we go keeps the file from being in memory twice.
        if (drop_cache) ::posix_fadvise(fd, off_t(off), off_t(got), POSIX_FADV_DONTNEED);
        off += std::size_t(got);
    }
    if (::mprotect(dst, n, PROT_READ) != 0) return give_up(sys_error("mprotect"));
    void* moved = ::mremap(dst, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, const_cast<std::byte*>(map));
    if (moved == MAP_FAILED) return give_up(sys_error("mremap over the file map"));
    return "";
}

}  // namespace clover::io
