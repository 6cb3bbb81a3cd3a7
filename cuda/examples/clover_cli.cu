// The clover command of a CUDA build (CLOVER_CUDA=ON): examples/clover/main.cpp compiled by nvcc
// with backend::cuda visible, so every command that runs a model takes --device auto|cpu|cuda[:N]
// and --n-cpu-moe N (examples/clover/common.hpp: on_device). One source for both builds: the CPU
// build compiles main.cpp itself and refuses --device cuda with a clear error.
#include <clover/backend/cuda/cuda.hpp>

#define CLOVER_CLI_CUDA 1
#include "../../examples/clover/main.cpp"
