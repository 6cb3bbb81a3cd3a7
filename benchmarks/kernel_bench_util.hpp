#pragma once
// What the kernel benchmarks (bench_kernels, bench_repack) share: thread CPU time, the median of
// repetitions, and random quantized weights in anonymous memory on a 2 MiB boundary advised for
// huge pages, as clover places a model's weights by default (io/huge_pages.hpp), so that the
// streaming columns measure what a decode step runs on (a plain vector got 4 KB pages under THP
// "madvise"). One thread read about the same either way on a 2-core Zen 5 VM (gemv 20–22 GB/s);
// the pages showed with both cores streaming.
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <vector>

#include <clover/core/error.hpp>
#include <clover/core/rng.hpp>
#include <clover/io/huge_pages.hpp>
#include <clover/quant/rows.hpp>
#include <clover/tensor/weight.hpp>

namespace clover::bench {

// Thread CPU time, not wall time: the machine is shared, and a time slice lost to another
// process must not count against a kernel (memory stalls still do: they are CPU time).
inline double thread_cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// At least `bytes` of zeroed memory starting on a 2 MiB boundary (over-allocated by one page and
// trimmed), advised for huge pages — a hint: without THP the pages stay 4 KB.
class huge_buffer {
public:
    explicit huge_buffer(std::size_t bytes) {
        const std::size_t page = io::huge_page_bytes;
        n_ = (bytes + page - 1) / page * page;
        void* raw = mmap(nullptr, n_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) fail("benchmark: cannot map ", n_, " bytes for the weights");
        auto* base = static_cast<std::byte*>(raw);
        const std::size_t lead = (page - reinterpret_cast<std::uintptr_t>(base) % page) % page;
        if (lead) munmap(base, lead);
        munmap(base + lead + n_, page - lead);
        p_ = base + lead;
        madvise(p_, n_, MADV_HUGEPAGE);
    }
    ~huge_buffer() { munmap(p_, n_); }
    huge_buffer(const huge_buffer&) = delete;
    huge_buffer& operator=(const huge_buffer&) = delete;
    std::byte* data() const { return p_; }

private:
    std::byte* p_ = nullptr;
    std::size_t n_ = 0;
};

// rows × cols weights of type t, each row quantized from uniform(−1, 1) values drawn from r.
struct random_matrix {
    huge_buffer bytes;
    weight w;
    random_matrix(dtype t, std::int64_t rows, std::int64_t cols, rng& r) : bytes(quant::row_bytes(t, cols) * std::size_t(rows)) {
        const std::size_t rb = quant::row_bytes(t, cols);
        std::vector<float> row(std::size_t(cols), 0.f);
        for (std::int64_t i = 0; i < rows; ++i) {
            for (auto& x : row) x = r.uniform(-1.f, 1.f);
            quant::quantize_row(t, row.data(), bytes.data() + std::size_t(i) * rb, cols);
        }
        w.data = bytes.data(); w.type = t; w.cols = cols; w.rows = rows; w.row_bytes = rb; w.name = "bench";
    }
};

}  // namespace clover::bench
