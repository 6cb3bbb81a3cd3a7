// Every kernel against its plain scalar twin on random data with odd sizes.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include <clover/backend/cpu/cpu.hpp>
#include <clover/quant/rows.hpp>

#include "../common/test_util.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace clover;

TEST_CASE("f16 <-> f32 conversions are exact (all 65536 halves; RNE on random floats)") {
    for (std::uint32_t h = 0; h < 65536; ++h) {
        const float f = quant::f16_to_f32(quant::f16_bits(h));
        if (std::isnan(f)) continue;
        CHECK(quant::f32_to_f16(f) == quant::f16_bits(h));  // round trip
#if defined(__F16C__)
        CHECK(std::bit_cast<std::uint32_t>(f) == std::bit_cast<std::uint32_t>(_cvtsh_ss(std::uint16_t(h))));
#endif
    }
#if defined(__F16C__)
    rng r(1);
    for (int i = 0; i < 200000; ++i) {
        const float f = std::bit_cast<float>(std::uint32_t(r.next()));
        if (std::isnan(f)) continue;
        CHECK(quant::f32_to_f16(f) == _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
}

TEST_CASE("bf16 rounding is round-to-nearest-even") {
    CHECK(quant::f32_to_bf16(1.0f) == 0x3f80);
    CHECK(quant::bf16_to_f32(quant::f32_to_bf16(3.140625f)) == 3.140625f);
    // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (1.0).
    CHECK(quant::f32_to_bf16(1.00390625f) == 0x3f80);
    CHECK(quant::f32_to_bf16(1.01171875f) == 0x3f82);  // 1 + 3*2^-8: tie, rounds up to even
}

TEST_CASE("Q8_0 quantize/dequantize stays within half a step (plus the f16 rounding of the scale)") {
    for (int n : {32, 96, 352}) {
        auto x = testutil::random_vec(std::size_t(n), std::uint64_t(n), -3.f, 3.f);
        std::vector<quant::block_q8_0> q(std::size_t(n / 32));
        quant::quantize_row_q8_0(x.data(), q.data(), n);
        std::vector<float> y(static_cast<std::size_t>(n));
        quant::dequantize_row_q8_0(q.data(), y.data(), n);
        for (int b = 0; b < n / 32; ++b) {
            const float d = quant::f16_to_f32(q[b].d);
            for (int i = 0; i < 32; ++i) CHECK(std::fabs(y[b * 32 + i] - x[b * 32 + i]) <= 0.6f * d + 1e-6f);
        }
    }
}

TEST_CASE("SIMD vec_dot equals the scalar reference for every weight type and odd sizes") {
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0}) {
        for (int n : {1, 7, 31, 32, 33, 100, 256, 1000, 4096}) {
            if (t == dtype::q8_0 && n % 32) continue;
            CAPTURE(dtype_name(t)); CAPTURE(n);
            auto a = testutil::random_vec(std::size_t(n), 100 + n), b = testutil::random_vec(std::size_t(n), 200 + n);
            std::vector<std::byte> qa(quant::row_bytes(t, n)), qb(quant::row_bytes(t, n));
            quant::quantize_row(t, a.data(), qa.data(), n);
            quant::quantize_row(quant::activation_type(t), b.data(), qb.data(), n);
            const float ref = quant::vec_dot_ref(t, qa.data(), qb.data(), n);
            const float fast = backend::cpu_detail::vec_dot(t, qa.data(), qb.data(), n);
            CHECK(fast == doctest::Approx(ref).epsilon(1e-4).scale(std::sqrt(double(n))));
        }
    }
}

TEST_CASE("backend matmul equals matmul_ref (threads, Eigen path, odd shapes)") {
    backend::cpu be({2});
    for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0}) {
        for (auto [rows, cols, n] : {std::tuple{1, 32, 1}, {17, 64, 3}, {65, 96, 5}, {33, 160, 1}, {7, 32, 40}}) {
            CAPTURE(dtype_name(t)); CAPTURE(rows); CAPTURE(cols); CAPTURE(n);
            auto wf = testutil::random_vec(std::size_t(rows * cols), 7);
            std::vector<std::byte> wq(quant::row_bytes(t, cols) * std::size_t(rows));
            for (int r = 0; r < rows; ++r)
                quant::quantize_row(t, wf.data() + r * cols, wq.data() + r * quant::row_bytes(t, cols), cols);
            weight w;
            w.data = wq.data();
            w.type = t;
            w.cols = cols;
            w.rows = rows;
            w.row_bytes = quant::row_bytes(t, cols);
            auto x = testutil::random_vec(std::size_t(n * cols), 8);
            std::vector<float> y1(std::size_t(n * rows)), y2(std::size_t(n * rows));
            be.matmul(w, x.data(), y1.data(), n);
            backend::cpu::matmul_ref(w, x.data(), y2.data(), n);
            CHECK(testutil::max_abs_diff(y1.data(), y2.data(), y1.size()) < 1e-4f * (1 + testutil::max_abs(y2)));
        }
    }
}

TEST_CASE("thread pool: every index visited once, for many region sizes") {
    backend::cpu be({3});
    for (std::int64_t n : {1, 2, 3, 5, 100, 1001}) {
        std::vector<int> hits(std::size_t(n), 0);
        be.parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) ++hits[i];
        });
        for (int h : hits) CHECK(h == 1);
    }
}
