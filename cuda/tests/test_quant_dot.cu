// The matrix product's packed item dot products (quant_dot.cuh: codes in 32-bit words, dp4a)
// against their plain twin, and against the split into an integer dot plus item_combine (the
// tensor-core kernel's form), bit for bit, on the host: both forms are __host__ __device__, so this
// runs in CI without a GPU. Rows from quantized random data and rows of random bytes (every code
// and high-bit pattern, odd scales), weight rows at 2-byte-aligned offsets (Q8_0, Q6_K), 1..4
// activation rows. And the alignment check launch_mm makes before any launch.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <clover/backend/cuda/matmul.cuh>
#include <clover/core/rng.hpp>
#include <clover/quant/rows.hpp>

#include "../../tests/common/test_util.hpp"
#include "quant_test_rows.hpp"

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_quant_dot {

using namespace clover;
namespace cd = clover::backend::cuda_detail;

namespace {

using cudatest::rows_of;

template <dtype T>
void check_format(std::int64_t K, bool raw) {
    CAPTURE(dtype_name(T));
    CAPTURE(K);
    CAPTURE(raw);
    constexpr int R = 4;
    const dtype at = quant::activation_type(T);
    const std::int64_t n_w = 3;  // row 1 of a Q8_0 / Q6_K matrix may start 2 bytes off a word
    const auto w = rows_of(T, n_w, K, 11 + K, raw);
    // Activations from real quantization (their scales are finite; raw bytes test the weights).
    const auto x = rows_of(at, R, K, 29 + K, false);
    const std::size_t wrb = quant::row_bytes(T, K), xrb = quant::row_bytes(at, K);
    const std::uint8_t* xr[R];
    for (int r = 0; r < R; ++r) xr[r] = x.data() + std::size_t(r) * xrb;
    for (std::int64_t o = 0; o < n_w; ++o) {
        const std::uint8_t* wr = w.data() + std::size_t(o) * wrb;
        for (int nr = 1; nr <= R; ++nr) {
            float a[R] = {0.25f, -1.5f, 3.f, 0.f}, b[R] = {0.25f, -1.5f, 3.f, 0.f}, c[R] = {0.25f, -1.5f, 3.f, 0.f};
            for (std::int64_t it = 0; it < cd::items<T>(K); ++it) {
                cd::item_dot<T, R>(wr, xr, it, a, nr);
                cd::item_dot_ref<T, R>(wr, xr, it, b, nr);
                // The split the tensor-core kernel relies on (mma.cuh): the exact integer dot of
                // the item, then the shared float step.
                if constexpr (cd::int_item_format<T>())
                    for (int r = 0; r < nr; ++r)
                        c[r] = cd::item_combine<T>(c[r], cd::item_int_dot<T>(wr, xr[r], it), cd::item_wscale_of<T>(wr, it),
                                                   cd::item_xscale_of<T>(xr[r], it));
            }
            CAPTURE(o);
            CAPTURE(nr);
            CHECK(std::memcmp(a, b, sizeof a) == 0);
            if constexpr (cd::int_item_format<T>()) CHECK(std::memcmp(a, c, sizeof a) == 0);
        }
    }
}

}  // namespace

TEST_CASE("packed item dot products (dp4a) equal the plain twin bit for bit, on the host") {
    for (bool raw : {false, true}) {
        for (std::int64_t K : {32, 96, 544}) check_format<dtype::q8_0>(K, raw);
        for (std::int64_t K : {256, 768}) {
            check_format<dtype::q4_k>(K, raw);
            check_format<dtype::q5_k>(K, raw);
            check_format<dtype::q6_k>(K, raw);
        }
        check_format<dtype::f32>(37, raw);
        check_format<dtype::f16>(37, raw);
        check_format<dtype::bf16>(37, raw);
    }
}

TEST_CASE("dp4a on the host: four signed byte products") {
    CHECK(cd::dp4a(0x01020304u, 0x01010101u, 5) == 15);
    CHECK(cd::dp4a(0xff7f80ffu, 0x7f7f7f7fu, 0) == 127 * (-1 + 127 - 128 - 1));
}

TEST_CASE("launch_mm refuses rows its word loads cannot read, before any launch") {
    alignas(16) static std::uint8_t buf[4096];
    cd::mm_args a{};
    a.N = 8;
    a.K = 256;
    a.n = 1;
    a.w = buf + 2;  // Q4_K rows must start on a word
    a.row_bytes = 144;
    a.mat_bytes = 8 * 144;
    a.x = buf;
    a.x_row_bytes = 292;
    CHECK_THROWS_WITH_AS(cd::launch_mm(dtype::q4_k, a, 1, nullptr), doctest::Contains("aligned to 4 bytes"), error);
    a.w = buf;
    a.x = buf + 2;  // Q8_K activations too
    CHECK_THROWS_WITH_AS(cd::launch_mm(dtype::q6_k, a, 1, nullptr), doctest::Contains("activation rows to 4"), error);
    a.x = buf;
    a.w = buf + 1;  // Q8_0 needs halves
    a.row_bytes = 34 * 8;
    a.mat_bytes = 8 * a.row_bytes;
    a.x_row_bytes = 34 * 8;
    CHECK_THROWS_WITH_AS(cd::launch_mm(dtype::q8_0, a, 1, nullptr), doctest::Contains("aligned to 2 bytes"), error);
}

}  // namespace cuda_test_quant_dot
