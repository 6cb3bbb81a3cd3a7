// tests_cuda_emu_core's main: the emulator's own checks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
