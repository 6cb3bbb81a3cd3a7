// clover_cuda_logits: runs one model file through backend::cuda (and, unless --no-cpu, through
// backend::cpu on the same prompt), prints the largest logit difference and prefill/decode
// timings. The smallest program that embeds the CUDA backend, and the benchmark of
// tools/cuda/device_check.sh.
//
//   clover_cuda_logits MODEL.gguf [--prompt N] [--decode N] [--n-cpu-moe N] [--threads N] [--no-cpu]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <clover/backend/cuda/cuda.hpp>
#include <clover/backend/offload.hpp>
#include <clover/clover.hpp>

using namespace clover;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prefill `prompt`, then `decode` single-token steps (greedy); returns the prefill logits (all rows).
template <class M>
std::vector<float> run(M& m, const std::vector<token>& prompt, int decode, const char* label) {
    auto s = m.new_session({.ctx = std::int64_t(prompt.size()) + decode + 1});
    std::vector<float> logits, step;
    auto t0 = std::chrono::steady_clock::now();
    m.commit(s, prompt, logits_rows::all, logits);
    const double tp = seconds_since(t0);
    const std::int64_t V = m.n_vocab();
    token next = 0;
    for (std::int64_t i = 0; i < V; ++i)
        if (logits[std::size_t((prompt.size() - 1) * V + i)] > logits[std::size_t((prompt.size() - 1) * V + next)]) next = token(i);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < decode; ++i) {
        std::vector<token> one = {next};
        m.commit(s, one, logits_rows::last, step);
        next = 0;
        for (std::int64_t j = 1; j < V; ++j)
            if (step[std::size_t(j)] > step[std::size_t(next)]) next = token(j);
    }
    const double td = seconds_since(t0);
    std::printf("%-5s prefill %zu tokens: %8.3f s (%8.1f tok/s)   decode %d tokens: %8.3f s (%7.2f tok/s)\n", label,
                prompt.size(), tp, double(prompt.size()) / tp, decode, td, decode > 0 ? decode / td : 0.0);
    return logits;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf [--prompt N] [--decode N] [--n-cpu-moe N] [--threads N] [--no-cpu]\n", argv[0]);
        return 2;
    }
    int n_prompt = 64, n_decode = 16, n_cpu_moe = 0, threads = 0;
    bool with_cpu = true;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        auto num = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
        if (a == "--prompt") n_prompt = num();
        else if (a == "--decode") n_decode = num();
        else if (a == "--n-cpu-moe") n_cpu_moe = num();
        else if (a == "--threads") threads = num();
        else if (a == "--no-cpu") with_cpu = false;
        else {
            std::fprintf(stderr, "unknown option %s\n", a.c_str());
            return 2;
        }
    }
    if (backend::cuda_detail::device_count() == 0) {
        std::printf("no CUDA device: nothing to run\n");
        return 0;
    }
    try {
        auto file = load(argv[1]);
        // --n-cpu-moe: backend::cuda composed with backend::cpu (nothing made on the host without it).
        model<variants::from_file, backend::offload<backend::cuda, backend::cpu>> g(
            file, {.host = {.threads = threads}, .host_moe_layers = n_cpu_moe});
        std::vector<token> prompt;
        for (int i = 0; i < n_prompt; ++i) prompt.push_back(token((i * 7919 + 13) % g.n_vocab()));
        auto lg = run(g, prompt, n_decode, "CUDA");
        std::printf("weights uploaded: %.2f GiB\n", double(g.backend().device().uploaded_bytes()) / (1024.0 * 1024 * 1024));
        if (with_cpu) {
            model<variants::from_file, backend::cpu> c(file, {threads});
            auto lc = run(c, prompt, n_decode, "CPU");
            float diff = 0, mx = 0;
            for (std::size_t i = 0; i < lc.size(); ++i) {
                diff = std::max(diff, std::abs(lg[i] - lc[i]));
                mx = std::max(mx, std::abs(lc[i]));
            }
            std::printf("max |CUDA - CPU| = %.3g (max |logit| %.3g, relative %.3g)\n", diff, mx, diff / (1 + mx));
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
