// bench_q8_0_repack: a probe of a weight layout the engine does not use yet — Q8_0 weights
// repacked once (at load) into groups of 16 rows, each block's codes already transposed into the
// lanes and its 16 scales side by side — against the two forms the engine runs today, on the
// streaming shape of a decode step (one thread, 0.5 GB of weights, K = 2048, C = 1…8 tokens):
//   row tiles  — gemm_block in exact mode (one row per register; C = 1 is the gemv2 decode path)
//   lanes      — lanes_small_batch: the 16-row form, which transposes each block as it reads it
//                (16 loads + 24 shuffles per block and 16 rows) and prefetches the next 16 rows
//   repacked   — the same arithmetic on the repacked group: 8 loads and one scale load per
//                block, one sequential stream; "+pf" prefetches the group --pf groups ahead.
// The repacked kernel's sums are those of the lanes form (each block's exact int32 dot, then
// fma block by block: q8_0_blockwise_ref's order), checked bit for bit here (exit 1 otherwise).
// What it is for: the row tiles and the lanes form sum in different orders, so the engine uses
// the lanes form only where a batch need not be row-exact and from 6 tokens on (below, the
// transposes cost more than they save). A layout in which the 16-row form is as fast as the
// row tiles at one token would let every product use one order — fast and row-exact at once.
//
//   bench_q8_0_repack [-r 5] [-t 1] [--pf 2] [--json]
// -t N: N threads stream together over interleaved 512-row chunks (wall time; one thread: thread
// CPU time), which is what a decode step does with the memory bus shared.
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <clover/backend/cpu/cpu.hpp>
#include <clover/core/error.hpp>
#include <clover/core/rng.hpp>
#include <clover/io/huge_pages.hpp>
#include <clover/quant/rows.hpp>

using namespace clover;
namespace cd = clover::backend::cpu_detail;

#if CLOVER_CPU_AVX512_VNNI
namespace {

double now_s() {  // thread CPU time: a time slice lost to another process does not count
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Anonymous memory on a 2 MiB boundary, advised for huge pages (as the engine places weights).
struct huge_buffer {
    std::byte* p = nullptr;
    std::size_t n = 0;
    explicit huge_buffer(std::size_t bytes) {
        const std::size_t page = io::huge_page_bytes;
        n = (bytes + page - 1) / page * page;
        void* raw = mmap(nullptr, n + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) fail("bench_q8_0_repack: cannot map ", n, " bytes");
        auto* base = static_cast<std::byte*>(raw);
        const std::size_t lead = (page - reinterpret_cast<std::uintptr_t>(base) % page) % page;
        if (lead) munmap(base, lead);
        munmap(base + lead + n, page - lead);
        p = base + lead;
        madvise(p, n, MADV_HUGEPAGE);
    }
    ~huge_buffer() { munmap(p, n); }
    huge_buffer(const huge_buffer&) = delete;
    huge_buffer& operator=(const huge_buffer&) = delete;
};

// The library's repacked form at every token count (k512::q8_0_x16_tile), tokens packed per block.
template <int C>
void repacked_tile(const std::byte* g, const cd::a8_lane* a, std::int64_t nb, float* y, std::int64_t ldy, const std::byte* pf) {
    cd::k512::q8_0_x16_tile<C>(g, cd::k512::lanes_packed{a, C}, nb, y, ldy, pf);
}
using repacked_fn = void (*)(const std::byte*, const cd::a8_lane*, std::int64_t, float*, std::int64_t, const std::byte*);
constexpr repacked_fn repacked_tiles[8] = {repacked_tile<1>, repacked_tile<2>, repacked_tile<3>, repacked_tile<4>,
                                           repacked_tile<5>, repacked_tile<6>, repacked_tile<7>, repacked_tile<8>};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 5, pf_groups = 2, threads = 1;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-r" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--pf" && i + 1 < argc) pf_groups = std::max(1, std::atoi(argv[++i]));
        else if (a == "-t" && i + 1 < argc) threads = std::clamp(std::atoi(argv[++i]), 1, 64);
        else if (a == "--json") json = true;
        else { std::fprintf(stderr, "usage: bench_q8_0_repack [-r 5] [-t 1] [--pf 2] [--json]\n"); return 2; }
    }
    const std::int64_t K = 2048, nb = K / 32, rows = 240000, groups = rows / 16;  // 0.52 GB: well past any cache
    const std::size_t ws = sizeof(quant::block_q8_0) * std::size_t(nb);
    huge_buffer file(ws * std::size_t(rows)), packed_w(ws * std::size_t(rows));
    rng r(5);
    std::vector<float> x(static_cast<std::size_t>(K));
    for (std::int64_t i = 0; i < rows; ++i) {
        for (auto& v : x) v = r.uniform(-1.f, 1.f);
        quant::quantize_row(dtype::q8_0, x.data(), file.p + std::size_t(i) * ws, K);
    }
    weight w;
    w.data = file.p; w.type = dtype::q8_0; w.cols = K; w.rows = rows; w.row_bytes = ws; w.name = "probe";
    for (std::int64_t g = 0; g < groups; ++g) cd::k512::repack_q8_0_x16(file.p + std::size_t(g) * 16 * ws, ws, nb, packed_w.p + std::size_t(g) * 16 * ws);

    const cd::kernel_set& ks = cd::kernels_for(dtype::q8_0);
    const std::size_t as = cd::act_row_bytes(ks.act, K);
    auto* act = static_cast<std::byte*>(std::aligned_alloc(64, 8 * as));
    auto* lanes = static_cast<cd::a8_lane*>(std::aligned_alloc(64, 8 * std::size_t(nb) * sizeof(cd::a8_lane)));
    std::unique_ptr<void, void (*)(void*)> free_act(act, std::free), free_lanes(lanes, std::free);
    cd::prep_scratch ps;
    std::vector<float> xt(std::size_t(8 * K));
    for (auto& v : xt) v = r.uniform(-1.f, 1.f);
    for (int c = 0; c < 8; ++c) cd::prepare_row(ks.act, xt.data() + c * K, act + std::size_t(c) * as, K, ps);
    const cd::act_view av{act, as, 8};
    std::vector<float> y_rows(std::size_t(8 * rows)), y_lanes(y_rows.size()), y_pack(y_rows.size());

    if (!json)
        std::printf("bench_q8_0_repack: %d thread(s), Q8_0 %lld x %lld streaming (%.2f GB), GMAC/s (medians of %d), prefetch %d groups ahead\n"
                    "| tokens | row tiles | lanes (transposing) | repacked | repacked+pf | repacked+pf / row tiles | repacked+pf / lanes |\n"
                    "|---|---|---|---|---|---|---|\n",
                    threads, (long long)rows, (long long)K, double(ws) * double(rows) * 1e-9, reps, pf_groups);
    bool all_same = true;
    for (int C = 1; C <= 8; ++C) {
        cd::pack_a8_lanes(act, as, C, nb, lanes);
        // Form f over 512-row chunks k ≡ tid (mod threads), as the engine's pool hands out chunks.
        auto form = [&](int f, int tid) {
            for (std::int64_t r0 = 512 * tid; r0 < rows; r0 += 512 * threads) {
                const std::int64_t r1 = std::min(rows, r0 + 512);
                if (f == 0) cd::gemm_block(ks, w, r0, r1, av, 0, C, y_rows.data(), rows, true);
                else if (f == 1) cd::lanes_small_batch(ks, w, r0, r1, av, 0, C, y_lanes.data(), rows);
                else
                    for (std::int64_t g = r0 / 16; g < r1 / 16; ++g) {
                        const std::int64_t next = g + 1 < r1 / 16 ? g + 1 : g + 1 + 32 * (threads - 1);  // this thread's next chunk
                        const std::int64_t ahead = f == 3 ? next + pf_groups - 1 : -1;
                        repacked_tiles[C - 1](packed_w.p + std::size_t(g) * 16 * ws, lanes, nb, y_pack.data() + g * 16, rows,
                                              ahead >= 0 && ahead < groups ? packed_w.p + std::size_t(ahead) * 16 * ws : nullptr);
                    }
            }
        };
        std::vector<double> t[4];
        for (int rep = 0; rep < reps; ++rep)  // the four forms alternate within every repetition
            for (int f = 0; f < 4; ++f) {
                if (threads == 1) {
                    const double t0 = now_s();
                    form(f, 0);
                    t[f].push_back(now_s() - t0);
                } else {  // wall time: both threads must stream at once
                    const auto t0 = std::chrono::steady_clock::now();
                    std::vector<std::thread> pool;
                    for (int i = 0; i < threads; ++i) pool.emplace_back(form, f, i);
                    for (auto& th : pool) th.join();
                    t[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                }
            }
        const bool same = std::memcmp(y_lanes.data(), y_pack.data(), sizeof(float) * std::size_t(C * rows)) == 0;
        all_same = all_same && same;
        const double macs = double(rows) * double(K) * C * 1e-9;
        const double g0 = macs / median(t[0]), g1 = macs / median(t[1]), g2 = macs / median(t[2]), g3 = macs / median(t[3]);
        if (json)
            std::printf("{\"bench\":\"q8_0_repack\",\"threads\":%d,\"tokens\":%d,\"rows\":%lld,\"K\":%lld,\"pf_groups\":%d,\"row_tiles_gmacs\":%.2f,"
                        "\"lanes_gmacs\":%.2f,\"repacked_gmacs\":%.2f,\"repacked_pf_gmacs\":%.2f,\"same_as_lanes\":%s}\n",
                        threads, C, (long long)rows, (long long)K, pf_groups, g0, g1, g2, g3, same ? "true" : "false");
        else
            std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx |%s\n", C, g0, g1, g2, g3, g3 / g0, g3 / g1,
                        same ? "" : " (NOT the lanes form's bits)");
        std::fflush(stdout);
    }
    return all_same ? 0 : 1;
}
#else
int main() {
    std::printf("bench_q8_0_repack: needs a build with AVX-512 VNNI (this one has %s)\n", clover::backend::cpu_detail::isa_name());
    return 0;
}
#endif
