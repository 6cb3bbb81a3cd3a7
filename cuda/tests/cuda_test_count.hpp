#pragma once
// The registry count behind CUDA_TEST_CASE: main.cu reports how many tests a machine without a
// GPU skips, and includes only this (not the kernels) to keep its compile cheap.
#include <doctest/doctest.h>

namespace cudatest {

inline int& count() {
    static int n = 0;
    return n;
}
struct counter {
    counter() { ++count(); }
};

}  // namespace cudatest

// CUDA_TEST_CASE needs a GPU (test suite "cuda"); a plain TEST_CASE in these files checks host-
// side logic (launch bounds, argument checks) and runs on every machine.
#define CUDA_TEST_CASE(name) \
    static cudatest::counter DOCTEST_ANONYMOUS(cuda_test_counter_); \
    TEST_CASE(name * doctest::test_suite("cuda"))
