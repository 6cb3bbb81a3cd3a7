// bench_repack: the layouts backend::cpu rearranges product matrices into at load — Q8_0, Q4_K or
// Q6_K weights repacked into groups of 16 rows, each block's codes in the lanes and the 16 rows'
// scales side by side (k512::repack_q8_0_x16 / q8_0_x16_tile, repack_q4_k_x16 / q4_k_x16_tile,
// repack_q6_k_x16 / q6_k_x16_tile) — against the two forms for the file's layout, on the
// streaming shape of a decode step (0.5 GB of weights, K = 2048, C = 1…8 tokens):
//   row tiles  — gemm_block in exact mode (one row per register; C = 1 is the gemv2 decode path)
//   lanes      — the 16-row form, which transposes each block of 16 rows as it reads them (Q8_0:
//                16 loads + 24 shuffles per block; Q4_K: 4 transposes and 4 gathers per
//                super-block; Q6_K: an unpack to bytes and 8 transposes) and prefetches the next
//                16 rows (lanes_small_batch for Q8_0, the rows tile per 16-row group otherwise)
//   repacked   — the same arithmetic on the repacked groups: plain loads, one sequential stream;
//                "+pf" prefetches the group --pf groups ahead (Q6_K and Q4_K: their stream --pf
//                super-blocks ahead, as the engine's x16_pf_ahead does with 2).
// The repacked kernels' sums are those of the 16-row forms (the blockwise twins' order), checked
// bit for bit here (exit 1 otherwise). Why the layout: the row tiles and the 16-row forms sum in
// different orders, so for the file's layout the engine uses the 16-row forms only where a batch
// need not be row-exact and from 6 tokens on (below, the transposes cost more than they save); a
// layout in which the 16-row form is as fast as the row tiles at one token lets every product
// use one order — fast and row-exact at once.
//
//   bench_repack [--type q8_0|q4_k|q6_k] [-r 5] [-t 1] [--pf 2] [--json]
// -t N: N threads stream together over interleaved 512-row chunks (wall time; one thread: thread
// CPU time), which is what a decode step does with the memory bus shared.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <clover/backend/cpu/cpu.hpp>
#include <clover/core/rng.hpp>
#include <clover/quant/rows.hpp>

#include "kernel_bench_util.hpp"

using namespace clover;
namespace cd = clover::backend::cpu_detail;

#if CLOVER_CPU_AVX512_VNNI
namespace {

// The library's repacked forms at every token count: Q8_0 with its tokens packed per block
// (a8_lane), Q4_K on the prepared rows (a8k_block).
template <int C>
void repacked_q8_0(const std::byte* g, const cd::a8_lane* a, const cd::act_view&, std::int64_t K, float* y, std::int64_t ldy,
                   const std::byte* pf) {
    cd::k512::q8_0_x16_tile<C>(g, cd::k512::lanes_packed{a, C}, K / 32, y, ldy, pf);
}
template <int C>
void repacked_q4_k(const std::byte* g, const cd::a8_lane*, const cd::act_view& av, std::int64_t K, float* y, std::int64_t ldy,
                   const std::byte* pf) {
    cd::k512::q4_k_x16_tile<C>(g, av.data, av.stride, K, y, ldy, pf);
}
template <int C>
void repacked_q6_k(const std::byte* g, const cd::a8_lane*, const cd::act_view& av, std::int64_t K, float* y, std::int64_t ldy,
                   const std::byte* pf) {
    cd::k512::q6_k_x16_tile<C>(g, av.data, av.stride, K, y, ldy, pf);
}

using repacked_fn = void (*)(const std::byte*, const cd::a8_lane*, const cd::act_view&, std::int64_t, float*, std::int64_t, const std::byte*);
constexpr repacked_fn repacked_q8_0_tiles[8] = {repacked_q8_0<1>, repacked_q8_0<2>, repacked_q8_0<3>, repacked_q8_0<4>,
                                                repacked_q8_0<5>, repacked_q8_0<6>, repacked_q8_0<7>, repacked_q8_0<8>};
constexpr repacked_fn repacked_q6_k_tiles[8] = {repacked_q6_k<1>, repacked_q6_k<2>, repacked_q6_k<3>, repacked_q6_k<4>,
                                                repacked_q6_k<5>, repacked_q6_k<6>, repacked_q6_k<7>, repacked_q6_k<8>};
constexpr repacked_fn repacked_q4_k_tiles[8] = {repacked_q4_k<1>, repacked_q4_k<2>, repacked_q4_k<3>, repacked_q4_k<4>,
                                                repacked_q4_k<5>, repacked_q4_k<6>, repacked_q4_k<7>, repacked_q4_k<8>};

}  // namespace

int main(int argc, char** argv) {
    int reps = 5, pf_groups = 2, threads = 1;
    bool json = false;
    dtype type = dtype::q8_0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-r" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--pf" && i + 1 < argc) pf_groups = std::max(1, std::atoi(argv[++i]));
        else if (a == "-t" && i + 1 < argc) threads = std::clamp(std::atoi(argv[++i]), 1, 64);
        else if (a == "--json") json = true;
        else if (a == "--type" && i + 1 < argc && (std::string(argv[i + 1]) == "q8_0" || std::string(argv[i + 1]) == "q4_k" ||
                                                   std::string(argv[i + 1]) == "q6_k")) {
            const std::string t = argv[++i];
            type = t == "q8_0" ? dtype::q8_0 : t == "q4_k" ? dtype::q4_k : dtype::q6_k;
        } else { std::fprintf(stderr, "usage: bench_repack [--type q8_0|q4_k|q6_k] [-r 5] [-t 1] [--pf 2] [--json]\n"); return 2; }
    }
    const bool q8 = type == dtype::q8_0, q6 = type == dtype::q6_k;
    const std::int64_t K = 2048, nb = K / 32;
    const std::size_t ws = quant::row_bytes(type, K);
    const std::int64_t rows = std::int64_t(520'000'000 / ws) / 512 * 512, groups = rows / 16;  // ~0.52 GB: well past any cache
    rng r(5);
    const bench::random_matrix file(type, rows, K, r);
    const weight& w = file.w;
    const bench::huge_buffer packed_w(ws * std::size_t(rows));
    for (std::int64_t g = 0; g < groups; ++g) {
        const std::byte* src = w.row(16 * g);
        std::byte* dst = packed_w.data() + std::size_t(g) * 16 * ws;
        if (q8) cd::k512::repack_q8_0_x16(src, ws, nb, dst);
        else if (q6) cd::k512::repack_q6_k_x16(src, ws, K / 256, dst);
        else cd::k512::repack_q4_k_x16(src, ws, K / 256, dst);
    }
    const repacked_fn* repacked_tiles = q8 ? repacked_q8_0_tiles : q6 ? repacked_q6_k_tiles : repacked_q4_k_tiles;

    const cd::kernel_set& ks = cd::kernels_for(type);
    const std::size_t as = cd::act_row_bytes(ks.act, K);
    cd::aligned_buffer act_buf, lanes_buf;
    std::byte* act = act_buf.get(8 * as);
    auto* lanes = reinterpret_cast<cd::a8_lane*>(lanes_buf.get(8 * std::size_t(nb) * sizeof(cd::a8_lane)));
    cd::prep_scratch ps;
    std::vector<float> xt(std::size_t(8 * K));
    for (auto& v : xt) v = r.uniform(-1.f, 1.f);
    for (int c = 0; c < 8; ++c) cd::prepare_row(ks.act, xt.data() + c * K, act + std::size_t(c) * as, K, ps);
    const cd::act_view av{act, as, 8};
    std::vector<float> y_rows(std::size_t(8 * rows)), y_lanes(y_rows.size()), y_pack(y_rows.size());

    if (!json)
        std::printf("bench_repack: %d thread(s), %s %lld x %lld streaming (%.2f GB), GMAC/s (medians of %d), prefetch %d %s ahead\n"
                    "| tokens | row tiles | lanes (transposing) | repacked | repacked+pf | repacked+pf / row tiles | repacked+pf / lanes |\n"
                    "|---|---|---|---|---|---|---|\n",
                    threads, q8 ? "Q8_0" : q6 ? "Q6_K" : "Q4_K", (long long)rows, (long long)K, double(ws) * double(rows) * 1e-9, reps, pf_groups, q8 ? "groups" : "super-blocks");
    bool all_same = true;
    for (int C = 1; C <= 8; ++C) {
        if (q8) cd::pack_a8_lanes(act, as, C, nb, lanes);
        // Form f over 512-row chunks k ≡ tid (mod threads), as the engine's pool hands out chunks.
        auto form = [&](int f, int tid) {
            for (std::int64_t r0 = 512 * tid; r0 < rows; r0 += 512 * threads) {
                const std::int64_t r1 = std::min(rows, r0 + 512);
                if (f == 0) cd::gemm_block(ks, w, r0, r1, av, 0, C, y_rows.data(), rows, true);
                else if (f == 1 && q8) cd::lanes_small_batch(ks, w, r0, r1, av, 0, C, y_lanes.data(), rows);
                else if (f == 1)  // as lanes_block's small batch runs Q4_K: each 16-row group prefetching the next
                    for (std::int64_t g = r0; g < r1; g += 16)
                        ks.lanes_rows_tile(C)(w.row(g), ws, act, as, K, y_lanes.data() + g, rows, g + 16 < r1 ? w.row(g + 16) : nullptr);
                else
                    for (std::int64_t g = r0 / 16; g < r1 / 16; ++g) {
                        const std::int64_t next = g + 1 < r1 / 16 ? g + 1 : g + 1 + 32 * (threads - 1);  // this thread's next chunk
                        const std::int64_t ahead = f == 3 ? next + pf_groups - 1 : -1;
                        const std::byte* gp = packed_w.data() + std::size_t(g) * 16 * ws;
                        // Q6_K and Q4_K: --pf super-blocks ahead in the stream (the engine's x16_pf_ahead), not groups
                        const std::size_t sb_bytes = q6 ? cd::k512::q6_k_x16_block_bytes : cd::k512::q4_k_x16_block_bytes;
                        const std::byte* pfp = !q8 ? (f == 3 ? gp + std::size_t(pf_groups) * sb_bytes : nullptr)
                                                   : ahead >= 0 && ahead < groups ? packed_w.data() + std::size_t(ahead) * 16 * ws : nullptr;
                        repacked_tiles[C - 1](gp, lanes, av, K, y_pack.data() + g * 16, rows, pfp);
                    }
            }
        };
        std::vector<double> t[4];
        for (int rep = 0; rep < reps; ++rep)  // the four forms alternate within every repetition
            for (int f = 0; f < 4; ++f) {
                if (threads == 1) {
                    const double t0 = bench::thread_cpu_s();
                    form(f, 0);
                    t[f].push_back(bench::thread_cpu_s() - t0);
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
        const double g0 = macs / bench::median(t[0]), g1 = macs / bench::median(t[1]), g2 = macs / bench::median(t[2]), g3 = macs / bench::median(t[3]);
        if (json)
            std::printf("{\"bench\":\"repack\",\"type\":\"%s\",\"threads\":%d,\"tokens\":%d,\"rows\":%lld,\"K\":%lld,\"pf_groups\":%d,\"row_tiles_gmacs\":%.2f,"
                        "\"lanes_gmacs\":%.2f,\"repacked_gmacs\":%.2f,\"repacked_pf_gmacs\":%.2f,\"same_as_lanes\":%s}\n",
                        q8 ? "q8_0" : q6 ? "q6_k" : "q4_k", threads, C, (long long)rows, (long long)K, pf_groups, g0, g1, g2, g3, same ? "true" : "false");
        else
            std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx |%s\n", C, g0, g1, g2, g3, g3 / g0, g3 / g1,
                        same ? "" : " (NOT the lanes form's bits)");
        std::fflush(stdout);
    }
    return all_same ? 0 : 1;
}
#else
int main() {
    std::printf("bench_repack: needs a build with AVX-512 VNNI (this one has %s)\n", clover::backend::cpu_detail::isa_name());
    return 0;
}
#endif
