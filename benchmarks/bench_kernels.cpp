// bench_kernels: the matmul kernels of backend::cpu one by one, per weight type, single thread:
//   gemv — one activation row against a matrix larger than the caches (decode): weight GB/s;
//   gemm — 64 activation rows against a matrix that fits L2 (prefill tiles): GMAC/s;
//   batch8 — 8 activation rows (8 sequences decoding together) against the big matrix: the
//            small-batch path, which streams the weights once and is compute-bound: GMAC/s;
//   gemm fast, batch8 fast — the same where the batch need not be row-exact (the fast forms,
//            kernel_set::lanes16; where a type has none they run the row-exact tiles);
// for the scalar twin, the AVX2 tiles and the AVX-512 tiles (whichever this build compiled).
// Then attention (--attention: only that): one GQA group of query heads over an F16 KV cache in
// pages of 32 (attend_group, the CPU backend's kernel, against attend_group_ref, its plain twin,
// which gives the same bits): microseconds per query row and the ratio.
// Times are the thread's CPU time (see bench::thread_cpu_s).
// The kernel figures of docs/performance.md come from this program. Medians of -r repetitions.
//
//   bench_kernels [-r 5] [--types q8_0,q4_k,...] [--attention] [--json]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <clover/backend/cpu/cpu.hpp>
#include <clover/core/rng.hpp>
#include <clover/quant/rows.hpp>

#include "kernel_bench_util.hpp"

using namespace clover;
namespace cd = clover::backend::cpu_detail;
using bench::median;

namespace {

struct variant_k {
    std::string isa;
    cd::kernel_set ks;
};

// The tile sets compiled into this binary for weight type t.
std::vector<variant_k> variants_of(dtype t) {
    std::vector<variant_k> v;
    v.push_back({"scalar", cd::kernels_for(t, true)});
#if CLOVER_CPU_AVX2
    {
        cd::kernel_set ks = cd::kernels_for(t, true);
        bool ok = true;
        switch (t) {
            case dtype::q8_0: cd::fill_tiles<cd::q8_0_256>(ks); ks.act = cd::kernel_set::prep::q8_0_std; break;
            case dtype::q4_k: cd::fill_tiles<cd::q4_k_256>(ks); ks.act = cd::kernel_set::prep::q8_k_ext; break;
            case dtype::q5_k: cd::fill_tiles<cd::q5_k_256>(ks); ks.act = cd::kernel_set::prep::q8_k_ext; break;
            case dtype::q6_k: cd::fill_tiles<cd::q6_k_256>(ks); ks.act = cd::kernel_set::prep::q8_k_ext; break;
            case dtype::f32: cd::fill_tiles<cd::float_k_isa<cd::avx2, cd::wfloat::f32>::k>(ks); ks.act = cd::kernel_set::prep::f32_exact; break;
            case dtype::f16: cd::fill_tiles<cd::float_k_isa<cd::avx2, cd::wfloat::f16>::k>(ks); ks.act = cd::kernel_set::prep::f16_round; break;
            case dtype::bf16: cd::fill_tiles<cd::float_k_isa<cd::avx2, cd::wfloat::bf16>::k>(ks); ks.act = cd::kernel_set::prep::bf16_round; break;
            default: ok = false;
        }
        if (ok) v.push_back({"AVX2", ks});
    }
#endif
#if CLOVER_CPU_AVX512
    v.push_back({cd::isa_name(), cd::kernels_for(t)});
#endif
    return v;
}

// attend_group vs its twin for the bundled model's shape (2 query heads per KV head, head size
// 64) and Clover-35B-A3B's (8 per KV head, 256), at several context lengths.
void bench_attention(int reps, bool json) {
    if (!json)
        std::printf("\n| heads per KV head | head size | keys | plain twin us | attend_group us | speed-up | 4 rows: 4 x attend_group us | attend_rows us | speed-up |\n"
                    "|---|---|---|---|---|---|---|---|---|\n");
    struct shape { std::int64_t G, hd; };
    for (const shape sh : {shape{2, 64}, shape{8, 256}}) {
        for (const std::int64_t n : {512, 2048, 8192}) {
            // Two KV heads side by side per row, as in the cache; this group reads the second.
            const std::int64_t stride = 2 * sh.hd;
            rng r(11);
            std::vector<quant::f16_bits> k(std::size_t(n * stride)), v(k.size());
            for (auto& x : k) x = quant::f32_to_f16(r.uniform(-2.f, 2.f));
            for (auto& x : v) x = quant::f32_to_f16(r.uniform(-1.f, 1.f));
            std::vector<cd::kv_run> runs;
            for (std::int64_t j = 0; j < n; j += 32)
                runs.push_back({k.data() + j * stride + sh.hd, v.data() + j * stride + sh.hd, stride, std::min<std::int64_t>(32, n - j), true});
            std::vector<float> q(std::size_t(sh.G * sh.hd)), out(q.size()), p;
            for (auto& x : q) x = r.uniform(-1.f, 1.f);
            const int inner = int(std::max<std::int64_t>(1, 200000 / n));
            // Four consecutive rows of a prefill chunk (causal: n-3 .. n keys), one at a time or
            // together (attend_rows reads each key block once for the four).
            constexpr int R = 4;
            std::vector<float> q4(std::size_t(R * sh.G * sh.hd)), out4(q4.size());
            for (auto& x : q4) x = r.uniform(-1.f, 1.f);
            const float* qp[R];
            float* op[R];
            std::int64_t nk[R];
            std::vector<std::vector<cd::kv_run>> alone(R);
            for (int i = 0; i < R; ++i) {
                qp[i] = q4.data() + i * sh.G * sh.hd;
                op[i] = out4.data() + i * sh.G * sh.hd;
                nk[i] = n - (R - 1) + i;
                cd::first_keys(runs, nk[i], alone[std::size_t(i)]);
            }
            std::vector<cd::kv_run> cut;
            std::vector<double> plain, fast, one_by_one, rows;
            for (int rep = 0; rep < reps; ++rep) {
                double t0 = bench::thread_cpu_s();
                for (int i = 0; i < inner; ++i) cd::attend_group_ref(q.data(), sh.G, runs, sh.hd, 0.125f, out.data(), p);
                plain.push_back((bench::thread_cpu_s() - t0) / inner * 1e6);
                t0 = bench::thread_cpu_s();
                for (int i = 0; i < inner; ++i) cd::attend_group(q.data(), sh.G, runs, sh.hd, 0.125f, out.data(), p);
                fast.push_back((bench::thread_cpu_s() - t0) / inner * 1e6);
                const int inner4 = std::max(1, inner / R);
                t0 = bench::thread_cpu_s();
                for (int i = 0; i < inner4; ++i)
                    for (int x = 0; x < R; ++x) cd::attend_group(qp[x], sh.G, alone[std::size_t(x)], sh.hd, 0.125f, op[x], p);
                one_by_one.push_back((bench::thread_cpu_s() - t0) / inner4 * 1e6);
                t0 = bench::thread_cpu_s();
                for (int i = 0; i < inner4; ++i) cd::attend_rows(qp, nk, R, sh.G, runs, sh.hd, 0.125f, op, p, cut);
                rows.push_back((bench::thread_cpu_s() - t0) / inner4 * 1e6);
            }
            const double a = median(plain), b = median(fast), c = median(one_by_one), d = median(rows);
            if (json)
                std::printf("{\"kernel\":\"attend_group\",\"isa\":\"%s\",\"heads_per_kv\":%lld,\"head_dim\":%lld,\"keys\":%lld,\"plain_us\":%.2f,\"fast_us\":%.2f,\"speedup\":%.3f,"
                            "\"rows\":%d,\"rows_alone_us\":%.2f,\"attend_rows_us\":%.2f,\"rows_speedup\":%.3f}\n",
                            cd::isa_name(), (long long)sh.G, (long long)sh.hd, (long long)n, a, b, a / b, R, c, d, c / d);
            else
                std::printf("| %lld | %lld | %lld | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx |\n", (long long)sh.G, (long long)sh.hd,
                            (long long)n, a, b, a / b, c, d, c / d);
            std::fflush(stdout);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 5;
    bool json = false, attention_only = false;
    std::vector<dtype> types = {dtype::q8_0, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::bf16, dtype::f16, dtype::f32};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-r" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--json") json = true;
        else if (a == "--attention") attention_only = true;
        else if (a == "--types" && i + 1 < argc) {
            types.clear();
            std::string s = argv[++i];
            for (std::size_t p = 0; p <= s.size();) {
                const std::size_t c = std::min(s.find(',', p), s.size());
                if (auto t = dtype_from_name(s.substr(p, c - p))) types.push_back(*t);
                p = c + 1;
            }
        } else { std::fprintf(stderr, "usage: bench_kernels [-r 5] [--types q8_0,q4_k,...] [--attention] [--json]\n"); return 1; }
    }
    if (attention_only) {
        bench_attention(reps, json);
        return 0;
    }
    const std::int64_t K = 2048;
    if (!json)
        std::printf("| type | ISA | gemv GB/s (1 row) | gemm GMAC/s (64 rows) | batch8 GMAC/s (8 rows, streaming) | gemm fast | batch8 fast |\n"
                    "|---|---|---|---|---|---|---|\n");
    for (dtype t : types) {
        // decode: ~512 MiB of weights (far beyond the caches); prefill: 256 rows (fits L2)
        const std::int64_t rows_big = std::int64_t((512ull << 20) / quant::row_bytes(t, K)) / 4 * 4;
        rng rb(5), rs(5);  // each matrix draws its values from seed 5
        bench::random_matrix big(t, rows_big, K, rb), small(t, 256, K, rs);
        rng r(9);
        std::vector<float> x(std::size_t(64 * K));
        for (auto& v : x) v = r.uniform(-1.f, 1.f);
        for (const auto& var : variants_of(t)) {
            const bool scalar = var.isa == "scalar";
            const std::size_t stride = cd::act_row_bytes(var.ks.act, K);
            cd::aligned_buffer ab;
            std::byte* a = ab.get(stride * 64);
            cd::prep_scratch ps;
            for (int c = 0; c < 64; ++c) cd::prepare_row(var.ks.act, x.data() + c * K, a + c * stride, K, ps);
            const cd::act_view av{a, stride, 64};
            std::vector<float> y(std::size_t(std::max<std::int64_t>(rows_big, 256) * 64));
            // gemv over the big matrix (the scalar twin over a slice: it is slow)
            const std::int64_t gemv_rows = scalar ? rows_big / 16 : rows_big;
            std::vector<double> gbs, gmacs, b8, gmacs_fast, b8_fast;
            for (int rep = 0; rep < reps; ++rep) {
                const double t0 = bench::thread_cpu_s();
                cd::gemm_block(var.ks, big.w, 0, gemv_rows, av, 0, 1, y.data(), big.w.rows, true);
                gbs.push_back(double(gemv_rows) * double(big.w.row_bytes) / (bench::thread_cpu_s() - t0) / 1e9);
                const int inner = scalar ? 1 : 8;
                const double t1 = bench::thread_cpu_s();
                for (int k = 0; k < inner; ++k) cd::gemm_block(var.ks, small.w, 0, 256, av, 0, 64, y.data(), 256, true);
                gmacs.push_back(double(inner) * 256.0 * 64.0 * double(K) / (bench::thread_cpu_s() - t1) / 1e9);
                const double t3 = bench::thread_cpu_s();
                for (int k = 0; k < inner; ++k) cd::gemm_block(var.ks, small.w, 0, 256, av, 0, 64, y.data(), 256, false);
                gmacs_fast.push_back(double(inner) * 256.0 * 64.0 * double(K) / (bench::thread_cpu_s() - t3) / 1e9);
                const std::int64_t b8_rows = scalar ? rows_big / 128 / 4 * 4 : rows_big;
                const double t2 = bench::thread_cpu_s();
                cd::gemm_block(var.ks, big.w, 0, b8_rows, av, 0, 8, y.data(), big.w.rows, true);
                b8.push_back(double(b8_rows) * 8.0 * double(K) / (bench::thread_cpu_s() - t2) / 1e9);
                const double t4 = bench::thread_cpu_s();
                cd::gemm_block(var.ks, big.w, 0, b8_rows, av, 0, 8, y.data(), big.w.rows, false);
                b8_fast.push_back(double(b8_rows) * 8.0 * double(K) / (bench::thread_cpu_s() - t4) / 1e9);
            }
            if (json)
                std::printf("{\"type\":\"%s\",\"isa\":\"%s\",\"gemv_gbs\":%.2f,\"gemm_gmacs\":%.2f,\"batch8_gmacs\":%.2f,"
                            "\"gemm_fast_gmacs\":%.2f,\"batch8_fast_gmacs\":%.2f}\n",
                            std::string(dtype_name(t)).c_str(), var.isa.c_str(), median(gbs), median(gmacs), median(b8),
                            median(gmacs_fast), median(b8_fast));
            else
                std::printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", std::string(dtype_name(t)).c_str(), var.isa.c_str(),
                            median(gbs), median(gmacs), median(b8), median(gmacs_fast), median(b8_fast));
            std::fflush(stdout);
        }
    }
    bench_attention(reps, json);
    return 0;
}
