// The other half of tests_cuda's test files (why: unity_a.cu).
#include "test_launch.cu"
#include "test_pass.cu"
#include "test_graphs.cu"
#include "test_split_attention.cu"
#include "test_fused_epilogue.cu"
#include "test_conformance.cu"
