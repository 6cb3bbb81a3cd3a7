// membw: this machine's memory read bandwidth, the roofline of batch-1 generation (every token
// streams the active weights once). Each thread sums its own slice of a buffer much larger than
// the caches (default 2 GiB) with wide vector loads (256-bit on AVX2: the portable 64-bit loop
// read 11.7 GB/s on one thread of this Zen 3 VM, the AVX2 loop 16.4), reading S distant
// sequential streams of the slice interleaved (S = 1, 2, 4: --streams), the way the decode
// products read the weights (matmul.hpp: on a Zen 4 thread two distant streams read 32-35 GB/s,
// one 27-28; on this Zen 3 VM one stream was as good or best). The best of -r repetitions and of
// the stream counts is reported per thread count, as GB/s (1e9 bytes); the JSON also has the
// best per stream count. The machine is shared, so bench_cpu_vs_llama.sh runs this every round
// and takes the best.
//
//   membw [-t 1,2] [-r 5] [--mib 2048] [--streams 1,2,4] [--json]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_s() {  // this thread's CPU time
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Sum of S streams of n bytes each (n % 256 == 0), stream k starting at p + k·n, read 256 bytes
// of each in turn; the result is used so the loads stay.
std::uint64_t read_sum(const std::uint8_t* p, std::size_t n, int S) {
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (std::size_t i = 0; i < n; i += 256)
        for (int k = 0; k < S; ++k) {
            const std::uint8_t* q = p + std::size_t(k) * n + i;
            a0 = _mm512_add_epi64(a0, _mm512_load_si512(q));
            a1 = _mm512_add_epi64(a1, _mm512_load_si512(q + 64));
            a2 = _mm512_add_epi64(a2, _mm512_load_si512(q + 128));
            a3 = _mm512_add_epi64(a3, _mm512_load_si512(q + 192));
        }
    return std::uint64_t(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3))));
#elif defined(__AVX2__)
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (std::size_t i = 0; i < n; i += 256)
        for (int k = 0; k < S; ++k) {
            const auto* q = reinterpret_cast<const __m256i*>(p + std::size_t(k) * n + i);
            for (int j = 0; j < 8; ++j) a[j & 3] = _mm256_add_epi64(a[j & 3], _mm256_load_si256(q + j));
        }
    alignas(32) std::uint64_t w[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(w),
                       _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3])));
    return w[0] + w[1] + w[2] + w[3];
#else
    std::uint64_t s[4] = {0, 0, 0, 0};
    for (std::size_t i = 0; i < n; i += 32)
        for (int k = 0; k < S; ++k) {
            std::uint64_t w[4];
            std::memcpy(w, p + std::size_t(k) * n + i, 32);
            for (int j = 0; j < 4; ++j) s[j] += w[j];
        }
    return s[0] + s[1] + s[2] + s[3];
#endif
}

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> v;
    for (std::size_t p = 0; p <= s.size();) {
        const std::size_t c = std::min(s.find(',', p), s.size());
        v.push_back(std::max(1, std::atoi(s.substr(p, c - p).c_str())));
        p = c + 1;
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> threads = {1, 2}, streams = {1, 2, 4};
    int reps = 5;
    std::size_t mib = 2048;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { std::fprintf(stderr, "membw: missing value after %s\n", a.c_str()); std::exit(1); }
            return argv[++i];
        };
        if (a == "-t") threads = parse_list(next());
        else if (a == "--streams") streams = parse_list(next());
        else if (a == "-r") reps = std::max(1, std::atoi(next().c_str()));
        else if (a == "--mib") mib = std::size_t(std::max(64, std::atoi(next().c_str())));
        else if (a == "--json") json = true;
        else {
            std::fprintf(stderr, "membw: unknown argument %s (usage: membw [-t 1,2] [-r 5] [--mib 2048] [--streams 1,2,4] [--json])\n", a.c_str());
            return 1;
        }
    }
    const std::size_t bytes = mib << 20;
    auto* buf = static_cast<std::uint8_t*>(std::aligned_alloc(4096, bytes));
    if (!buf) { std::fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib); return 1; }
    for (std::size_t i = 0; i < bytes; i += 4096) std::memset(buf + i, int(i >> 12), 4096);  // fault every page in
    std::atomic<std::uint64_t> sink{0};
    for (int nt : threads) {
        double best = 0, best_cpu = 0;
        int best_s = 0;
        std::vector<double> all;
        std::string per_s;
        for (int S : streams) {
            double best_here = 0;
            // each thread's slice holds S streams of `len` bytes
            const std::size_t len = bytes / std::size_t(nt) / std::size_t(S) / 256 * 256;
            const std::size_t slice = len * std::size_t(S);
            for (int r = 0; r < reps; ++r) {
                std::vector<std::thread> ts;
                std::atomic<int> ready{0};
                std::atomic<bool> go{false};
                std::vector<double> cpu(std::size_t(nt), 0.0);
                for (int t = 0; t < nt; ++t)
                    ts.emplace_back([&, t] {
                        ++ready;
                        while (!go.load()) {}
                        const double c0 = cpu_s();
                        sink += read_sum(buf + std::size_t(t) * slice, len, S);
                        cpu[std::size_t(t)] = cpu_s() - c0;
                    });
                while (ready.load() < nt) {}
                const double t0 = now_s();
                go = true;
                for (auto& t : ts) t.join();
                const double gbs = double(slice * std::size_t(nt)) / (now_s() - t0) / 1e9;
                all.push_back(gbs);
                best_here = std::max(best_here, gbs);
                if (gbs > best) best = gbs, best_s = S;
                double c = 0;
                for (double x : cpu) c = std::max(c, x);
                best_cpu = std::max(best_cpu, double(slice * std::size_t(nt)) / c / 1e9);
            }
            char b[64];
            std::snprintf(b, sizeof b, "%s\"%d\":%.2f", per_s.empty() ? "" : ",", S, best_here);
            per_s += b;
        }
        std::sort(all.begin(), all.end());
        const double median = all[all.size() / 2];
        if (json)
            std::printf("{\"test\":\"membw_read\",\"threads\":%d,\"best_gbs\":%.2f,\"median_gbs\":%.2f,\"best_cpu_gbs\":%.2f,"
                        "\"best_streams\":%d,\"best_gbs_by_streams\":{%s},\"mib\":%zu}\n",
                        nt, best, median, best_cpu, best_s, per_s.c_str(), mib);
        else
            std::printf("read bandwidth, %d thread(s): best %.2f GB/s (%d stream(s) per thread), median %.2f GB/s (wall); "
                        "%.2f GB/s per CPU-second; best by streams per thread {%s} (%zu MiB, %d reps)\n",
                        nt, best, best_s, median, best_cpu, per_s.c_str(), mib, reps);
    }
    std::free(buf);
    return sink.load() == 42 ? 2 : 0;
}
