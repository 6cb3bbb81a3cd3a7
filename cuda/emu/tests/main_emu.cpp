// tests_cuda_emu's main: cuda/tests' GPU tests on the emulated device. Options beside doctest's:
// --kernels-file=F writes the kernels launched (one name a line) for cuda_emu_kernels' summary.
// Any error the emulator found and no test took (a race, a barrier mismatch, ...) fails the run,
// even where the test's own comparison passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include "cuda_test_count.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <clover/backend/cuda/runtime.cuh>

int main(int argc, char** argv) {
    std::string kernels_file;
    for (int i = 1; i < argc; ++i)
        if (std::strncmp(argv[i], "--kernels-file=", 15) == 0) kernels_file = argv[i] + 15;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::printf("CUDA device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    doctest::Context ctx(argc, argv);
    int rc = ctx.run();
    const auto ran = clover_emu::kernels_launched();
    if (!kernels_file.empty()) {
        std::ofstream f(kernels_file);
        for (const auto& k : ran) f << k << "\n";
    }
    std::printf("kernels launched in this run: %zu\n", ran.size());
    if (const int n = clover_emu::error_count(); n > 0) {
        std::printf("the emulator reported %d error(s) that no test expected (see 'emu:' lines above)\n", n);
        rc = rc ? rc : 1;
    }
    return rc;
}
