// tests_cuda's main: runs the doctest suite when a CUDA device is present; otherwise says how
// many GPU tests it skips and runs only the host-side ones, so CI (no GPU) still checks those.
#define DOCTEST_CONFIG_IMPLEMENT
#include "cuda_test_count.hpp"

#include <cstdio>

#include <clover/backend/cuda/runtime.cuh>

int main(int argc, char** argv) {
    const int n = clover::backend::cuda_detail::device_count();
    doctest::Context ctx(argc, argv);
    if (n == 0) {
        std::printf("no CUDA device: skipping %d CUDA tests\n", cudatest::count());
        ctx.addFilter("test-suite-exclude", "cuda");
        return ctx.run();
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        std::printf("CUDA device 0: %s (sm_%d%d, %.1f GiB)\n", prop.name, prop.major, prop.minor,
                    double(prop.totalGlobalMem) / (1024.0 * 1024 * 1024));
    return ctx.run();
}
