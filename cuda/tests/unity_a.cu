// tests_cuda's test files in two unity units. Every file pulls in the whole CUDA backend, and
// nvcc compiles its kernels (cicc, ptxas) and host templates again for each translation unit:
// three files alone took 47 + 102 + 70 s, together 121 s (nvcc 13, one job, this repo's CI VM).
// Two units keep both CI jobs busy. Each file wraps its code in a namespace named after it.
#include "test_model.cu"
#include "test_kernels.cu"
#include "test_mma.cu"
#include "test_state.cu"
#include "test_quant_dot.cu"
#include "test_offload.cu"
#include "test_defects.cu"
