// Every kernel against its plain scalar twin on random data with odd sizes: the conversions,
// the quantizers, every (R rows × C tokens) tile of every weight type, the backend's products
// (threads, multi-product calls, exact rows) and the thread pool.
#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include <clover/backend/cpu/cpu.hpp>
#include <clover/quant/rows.hpp>

#include "../common/test_util.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace clover;
namespace cd = clover::backend::cpu_detail;

namespace {

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_k, dtype::q5_k, dtype::q6_k};

// A weight matrix of `rows` × `cols` random values quantized to t (owning its bytes).
struct test_matrix {
    std::vector<std::byte> bytes;
    weight w;
    test_matrix(dtype t, std::int64_t rows, std::int64_t cols, std::uint64_t seed, float scale = 1.f) {
        auto wf = testutil::random_vec(std::size_t(rows * cols), seed, -scale, scale);
        const std::size_t rb = quant::row_bytes(t, cols);
        bytes.resize(rb * std::size_t(rows));
        for (std::int64_t r = 0; r < rows; ++r) quant::quantize_row(t, wf.data() + r * cols, bytes.data() + r * rb, cols);
        w.data = bytes.data();
        w.type = t;
        w.cols = cols;
        w.rows = rows;
        w.row_bytes = rb;
        w.name = "test";
    }
};

std::vector<std::int64_t> sizes_for(dtype t) {
    switch (quant::row_granule(t)) {
        case 32: return {32, 96, 160, 352, 2080};
        case 256: return {256, 768, 1280, 2304};
        default: return {1, 7, 31, 33, 100, 255, 1000, 2049};
    }
}

}  // namespace

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

TEST_CASE("Q8_K follows ggml's rule: the largest magnitude maps to -127, sums of 16") {
    std::vector<float> x(256);
    for (int i = 0; i < 256; ++i) x[i] = float(i % 17) - 8.f;
    x[37] = 20.f;   // largest magnitude, positive: maps to -127 (iscale = -127/20)
    x[99] = -20.f;  // same magnitude later: the first one wins
    quant::block_q8_k q;
    quant::quantize_row_q8_k(x.data(), &q, 256);
    CHECK(q.qs[37] == -127);
    CHECK(q.qs[99] == 127);
    CHECK(q.d == doctest::Approx(-20.f / 127.f));
    for (int j = 0; j < 16; ++j) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += q.qs[16 * j + i];
        CHECK(q.bsums[j] == s);
    }
    for (int i = 0; i < 256; ++i) CHECK(q.qs[i] == std::min(127, int(std::nearbyint(x[i] * (-127.f / 20.f)))));
    std::vector<float> z(256, 0.f);
    quant::quantize_row_q8_k(z.data(), &q, 256);
    CHECK(q.d == 0.f);
    CHECK(q.bsums[3] == 0);
}

TEST_CASE("K-quant round trips: error within half a quantization step") {
    for (dtype t : {dtype::q4_k, dtype::q5_k, dtype::q6_k}) {
        CAPTURE(dtype_name(t));
        const std::int64_t n = 768;
        auto x = testutil::random_vec(std::size_t(n), 5, -2.f, 2.f);
        std::vector<std::byte> q(quant::row_bytes(t, n));
        quant::quantize_row(t, x.data(), q.data(), n);
        std::vector<float> y(static_cast<std::size_t>(n));
        quant::dequantize_row(t, q.data(), y.data(), n);
        // steps: range 4 over 15 / 31 levels, or 2·2/63 for the symmetric Q6_K, plus scale coding
        const float step = t == dtype::q4_k ? 4.f / 15.f : t == dtype::q5_k ? 4.f / 31.f : 4.f / 62.f;
        CHECK(testutil::max_abs_diff(x.data(), y.data(), std::size_t(n)) < 0.75f * step);
    }
}

TEST_CASE("K-quant block layouts: codes sit where GGUF puts them") {
    // Q4_K: element 64c + l (l < 32) is the low nibble of qs[32c + l]; 64c + 32 + l the high one.
    quant::block_q4_k b4{};
    b4.qs[32 * 2 + 5] = 0xA3;
    CHECK(quant::q4_k_code(b4, 64 * 2 + 5) == 0x3);
    CHECK(quant::q4_k_code(b4, 64 * 2 + 32 + 5) == 0xA);
    // scale field: j >= 4 takes its top two bits from byte j-4 (scales) / j (mins)
    std::uint8_t sc[8] = {1, 2, 3, 4, 63, 33, 17, 48}, mn[8] = {5, 6, 7, 8, 62, 31, 16, 47}, b[12], sc2[8], mn2[8];
    quant::pack_scales_k4(sc, mn, b);
    quant::unpack_scales_k4(b, sc2, mn2);
    for (int j = 0; j < 8; ++j) {
        CHECK(sc2[j] == sc[j]);
        CHECK(mn2[j] == mn[j]);
    }
    CHECK((b[0] >> 6) == (63 >> 4));
    // Q5_K: bit 4 of element l of sub-block j is bit j of qh[l]
    quant::block_q5_k b5{};
    b5.qh[7] = std::uint8_t(1 << 5);
    CHECK(quant::q5_k_code(b5, 32 * 5 + 7) == 16);
    CHECK(quant::q5_k_code(b5, 32 * 4 + 7) == 0);
    // Q6_K: element 128h + 32k + l: low nibble from ql[64h + 32(k&1) + l] (k<2 low, else high),
    // top bits from bits 2k..2k+1 of qh[32h + l]
    quant::block_q6_k b6{};
    b6.ql[64 + 32 + 9] = 0x5C;
    b6.qh[32 + 9] = std::uint8_t(0b10 << 6);
    CHECK(quant::q6_k_code(b6, 128 + 96 + 9) == (0x5 | (0b10 << 4)));
    CHECK(quant::q6_k_code(b6, 128 + 32 + 9) == 0xC);
}

TEST_CASE("every SIMD tile (R rows x C tokens) equals the scalar twin, every weight type, odd sizes") {
    for (dtype t : all_types) {
        const auto& fast = cd::kernels_for(t);
        for (std::int64_t K : sizes_for(t)) {
            CAPTURE(dtype_name(t)); CAPTURE(K);
            test_matrix m(t, 4, K, std::uint64_t(K) * 3 + 1);
            const auto x = testutil::random_vec(std::size_t(4 * K), std::uint64_t(K) * 7 + 2, -2.f, 2.f);
            // reference: standard partner-type rows and quant::vec_dot_ref
            const dtype at = quant::activation_type(t);
            const std::size_t arb = quant::row_bytes(at, K);
            std::vector<std::byte> xa(arb * 4);
            for (int c = 0; c < 4; ++c) quant::quantize_row(at, x.data() + c * K, xa.data() + c * arb, K);
            float ref[4][4];
            for (int c = 0; c < 4; ++c)
                for (int r = 0; r < 4; ++r) ref[c][r] = quant::vec_dot_ref(t, m.w.row(r), xa.data() + c * arb, K);
            // fast: prepared rows
            const std::size_t stride = cd::act_row_bytes(fast.act, K);
            cd::aligned_buffer buf;
            std::byte* ap = buf.get(stride * 4);
            cd::prep_scratch ps;
            for (int c = 0; c < 4; ++c) cd::prepare_row(fast.act, x.data() + c * K, ap + c * stride, K, ps);
            for (int R : {1, 2, 4})
                for (int C = 1; C <= 4; ++C) {
                    CAPTURE(R); CAPTURE(C);
                    float y[4 * 4];
                    fast.tile(R, C)(m.w.data, m.w.row_bytes, ap, stride, K, y, 4);
                    for (int c = 0; c < C; ++c)
                        for (int r = 0; r < R; ++r)
                            CHECK(y[c * 4 + r] == doctest::Approx(ref[c][r]).epsilon(1e-4).scale(std::sqrt(double(K))));
                }
        }
    }
}

TEST_CASE("a tile's (row, token) result does not depend on the tile shape (bitwise)") {
    // This is what makes multi-row passes reproduce one-row passes exactly (exact_rows_scope).
    for (dtype t : all_types) {
        CAPTURE(dtype_name(t));
        const std::int64_t K = quant::row_granule(t) == 256 ? 1280 : 352;
        const auto& ks = cd::kernels_for(t);
        test_matrix m(t, 4, K, 11);
        const auto x = testutil::random_vec(std::size_t(4 * K), 12);
        const std::size_t stride = cd::act_row_bytes(ks.act, K);
        cd::aligned_buffer buf;
        std::byte* ap = buf.get(stride * 4);
        cd::prep_scratch ps;
        for (int c = 0; c < 4; ++c) cd::prepare_row(ks.act, x.data() + c * K, ap + c * stride, K, ps);
        float one[4][4], y[16];
        for (int c = 0; c < 4; ++c)
            for (int r = 0; r < 4; ++r) ks.tile(1, 1)(m.w.row(r), m.w.row_bytes, ap + c * stride, stride, K, &one[c][r], 1);
        for (int R : {2, 4})
            for (int C = 2; C <= 4; ++C) {
                ks.tile(R, C)(m.w.data, m.w.row_bytes, ap, stride, K, y, 4);
                for (int c = 0; c < C; ++c)
                    for (int r = 0; r < R; ++r) CHECK(std::bit_cast<std::uint32_t>(y[c * 4 + r]) == std::bit_cast<std::uint32_t>(one[c][r]));
            }
    }
}

TEST_CASE("the wide small-batch tiles (2 rows x 5..8 tokens) equal one-row tiles bitwise and the twin, odd sizes") {
    int tested = 0;
    for (dtype t : all_types) {
        const auto& ks = cd::kernels_for(t);
        for (std::int64_t K : sizes_for(t)) {
            if (!ks.wide_tile(8)) continue;
            CAPTURE(dtype_name(t)); CAPTURE(K);
            // two weight rows 3 rows apart: the tile takes the distance as its row stride
            test_matrix m(t, 4, K, std::uint64_t(K) * 5 + 3);
            const std::size_t ws = 3 * m.w.row_bytes;
            const auto x = testutil::random_vec(std::size_t(8 * K), std::uint64_t(K) * 11 + 4, -2.f, 2.f);
            const dtype at = quant::activation_type(t);
            const std::size_t arb = quant::row_bytes(at, K), stride = cd::act_row_bytes(ks.act, K);
            std::vector<std::byte> xa(arb * 8);
            cd::aligned_buffer buf;
            std::byte* ap = buf.get(stride * 8);
            cd::prep_scratch ps;
            for (int c = 0; c < 8; ++c) {
                quant::quantize_row(at, x.data() + c * K, xa.data() + c * arb, K);
                cd::prepare_row(ks.act, x.data() + c * K, ap + c * stride, K, ps);
            }
            for (int C = 5; C <= 8; ++C) {
                CAPTURE(C);
                float y[2 * 8];
                ks.wide_tile(C)(m.w.row(0), ws, ap, stride, K, y, 2);
                for (int c = 0; c < C; ++c)
                    for (int r = 0; r < 2; ++r) {
                        float one = 0.f;
                        ks.tile(1, 1)(m.w.row(3 * r), m.w.row_bytes, ap + c * stride, stride, K, &one, 1);
                        CHECK(std::bit_cast<std::uint32_t>(y[2 * c + r]) == std::bit_cast<std::uint32_t>(one));
                        const float ref = quant::vec_dot_ref(t, m.w.row(3 * r), xa.data() + c * arb, K);
                        CHECK(y[2 * c + r] == doctest::Approx(ref).epsilon(1e-4).scale(std::sqrt(double(K))));
                    }
                ++tested;
            }
        }
    }
#if CLOVER_CPU_AVX512
    CHECK(tested > 0);  // Q8_0 has them with AVX-512
#endif
}

TEST_CASE("the streaming tiles (2 rows x 1..8 tokens, prefetching the next pair) equal one-row tiles bitwise, odd sizes") {
    int tested = 0;
    for (dtype t : all_types) {
        const auto& ks = cd::kernels_for(t);
        for (std::int64_t K : sizes_for(t)) {
            CAPTURE(dtype_name(t)); CAPTURE(K);
            test_matrix m(t, 7, K, std::uint64_t(K) * 13 + 5);  // rows 0 and 3, prefetching 1 and 4 (or 3 and 6)
            const std::size_t ws = 3 * m.w.row_bytes;
            const auto x = testutil::random_vec(std::size_t(8 * K), std::uint64_t(K) * 17 + 6, -2.f, 2.f);
            const std::size_t stride = cd::act_row_bytes(ks.act, K);
            cd::aligned_buffer buf;
            std::byte* ap = buf.get(stride * 8);
            cd::prep_scratch ps;
            for (int c = 0; c < 8; ++c) cd::prepare_row(ks.act, x.data() + c * K, ap + c * stride, K, ps);
            for (int C = 1; C <= 8; ++C)
                for (const std::ptrdiff_t pfd : {std::ptrdiff_t(0), std::ptrdiff_t(m.w.row_bytes), std::ptrdiff_t(ws)}) {
                    if (!ks.stream_tile(C)) continue;
                    CAPTURE(C); CAPTURE(pfd);
                    float y[2 * 8];
                    ks.stream_tile(C)(m.w.row(0), ws, ap, stride, K, y, 2, pfd);
                    for (int c = 0; c < C; ++c)
                        for (int r = 0; r < 2; ++r) {
                            float one = 0.f;
                            ks.tile(1, 1)(m.w.row(3 * r), m.w.row_bytes, ap + c * stride, stride, K, &one, 1);
                            CHECK(std::bit_cast<std::uint32_t>(y[2 * c + r]) == std::bit_cast<std::uint32_t>(one));
                        }
                    ++tested;
                }
        }
    }
#if CLOVER_CPU_AVX512
    CHECK(tested > 0);  // the quantized types have them with AVX-512
#endif
}

// f(std::integral_constant<int, C>{}) for C = 1 … 8 (the repacked tiles take C as a template argument).
template <class F>
void for_tokens_1_to_8(F f) {
    [&]<int... Cs>(std::integer_sequence<int, Cs...>) { (f(std::integral_constant<int, Cs + 1>{}), ...); }(std::make_integer_sequence<int, 8>{});
}

// Shared by the fast-form tests: 35 weight rows of type t (two groups of 16 and 3 left over)
// and T = 13 activation rows, as the twins read them (xa: the partner type's standard rows) and
// as the kernels do (ap: the prepared rows).
struct lanes_fixture {
    const cd::kernel_set& ks;
    std::int64_t K, T = 13;
    test_matrix m;
    std::size_t arb, stride;
    std::vector<std::byte> xa;
    cd::aligned_buffer buf;
    std::byte* ap;
    lanes_fixture(dtype t, std::int64_t K_, std::uint64_t w_seed, std::uint64_t x_seed)
        : ks(cd::kernels_for(t)), K(K_), m(t, 35, K_, w_seed, 3.f), arb(quant::row_bytes(quant::activation_type(t), K_)),
          stride(cd::act_row_bytes(ks.act, K_)), xa(arb * std::size_t(T)), ap(buf.get(stride * std::size_t(T))) {
        const auto x = testutil::random_vec(std::size_t(T * K), x_seed, -4.f, 4.f);
        cd::prep_scratch ps;
        for (std::int64_t c = 0; c < T; ++c) {
            quant::quantize_row(quant::activation_type(t), x.data() + c * K, xa.data() + std::size_t(c) * arb, K);
            cd::prepare_row(ks.act, x.data() + c * K, ap + c * stride, K, ps);
        }
    }
    static bool same(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }
    const std::byte* xrow(std::int64_t c) const { return xa.data() + std::size_t(c) * arb; }
    float one_row(std::int64_t r, std::int64_t c) const {  // the row-exact tiles
        float v = 0.f;
        ks.tile(1, 1)(m.w.row(r), m.w.row_bytes, ap + c * stride, stride, K, &v, 1);
        return v;
    }
    // The (row, token) results of a 16-row tile at rows r0 … r0 + 15 (y[c·16 + r], C tokens)
    // that differ from the twin.
    template <class Twin>
    static int tile_mismatches(const float* y, int C, std::int64_t r0, Twin twin) {
        int bad = 0;
        for (int c = 0; c < C; ++c)
            for (int r = 0; r < 16; ++r) bad += !same(y[c * 16 + r], twin(r0 + r, c));
        return bad;
    }
#if CLOVER_CPU_AVX512_VNNI
    // Rows r0 … r0 + 15 repacked by repack (k512::repack_*_x16, nb blocks of block_bytes per
    // group), and rows 16 … 31, the group a prefetch reads.
    template <class Repack>
    std::pair<std::vector<std::byte>, std::vector<std::byte>> repacked(Repack repack, std::int64_t nb, std::size_t block_bytes,
                                                                       std::int64_t r0) const {
        std::pair<std::vector<std::byte>, std::vector<std::byte>> g{std::vector<std::byte>(std::size_t(nb) * block_bytes),
                                                                     std::vector<std::byte>(std::size_t(nb) * block_bytes)};
        repack(m.w.row(r0), m.w.row_bytes, nb, g.first.data());
        repack(m.w.row(16), m.w.row_bytes, nb, g.second.data());
        return g;
    }
#endif
    // gemm_block at n tokens: where `fast`, groups of 16 rows equal the twin and the 3 rows left
    // equal the row tiles; otherwise every row equals the row tiles. Returns the rows that differ.
    template <class Twin>
    int gemm_block_mismatches(std::int64_t n, bool exact, bool fast, Twin twin) const {
        std::vector<float> y(std::size_t(n * 35), -1.f);
        cd::gemm_block(ks, m.w, 0, 35, {ap, stride, T}, 0, n, y.data(), 35, exact);
        int bad = 0;
        for (std::int64_t c = 0; c < n; ++c)
            for (std::int64_t r = 0; r < 35; ++r) bad += !same(y[std::size_t(c * 35 + r)], fast && r < 32 ? twin(r, c) : one_row(r, c));
        return bad;
    }
};

TEST_CASE("the fast Q8_0 lanes tiles (16 rows x 1..8 tokens, packed or a8_pair rows) and gemm_block's fast path equal q8_0_blockwise_ref bitwise, odd sizes") {
    const auto& ks = cd::kernels_for(dtype::q8_0);
    int tested = 0;
    for (std::int64_t K : {32, 96, 160, 352, 2080, 4128}) {  // odd block counts; the last one over lanes_max_k
        if (!ks.lanes_tile(1)) break;
        CAPTURE(K);
        const lanes_fixture f(dtype::q8_0, K, std::uint64_t(K) * 19 + 7, std::uint64_t(K) * 23 + 8);
        const test_matrix& m = f.m;
        const std::byte* ap = f.ap;
        const std::size_t stride = f.stride;
        auto twin = [&](std::int64_t r, std::int64_t c) { return cd::q8_0_blockwise_ref(m.w.row(r), f.xrow(c), K); };
        auto one_row = [&](std::int64_t r, std::int64_t c) { return f.one_row(r, c); };
        // the tiles: rows 0–15 and 19–34, with and without prefetching the next rows
        for (const std::int64_t r0 : {0, 19})
            for (int C = 1; C <= 8; ++C)
                for (const bool pf : {false, true}) {
                    CAPTURE(r0); CAPTURE(C); CAPTURE(pf);
                    float y[8 * 16];
                    std::vector<cd::a8_lane> packed(std::size_t(C * K / 32));
                    cd::pack_a8_lanes(ap, stride, C, K / 32, packed.data());
                    ks.lanes_tile(C)(m.w.row(r0), m.w.row_bytes, packed.data(), K, y, 16, pf ? m.w.row(16) : nullptr);
                    float yr[8 * 16];  // the prefill form, on the a8_pair rows
                    ks.lanes_rows_tile(C)(m.w.row(r0), m.w.row_bytes, ap, stride, K, yr, 16, pf ? m.w.row(16) : nullptr);
                    CHECK(f.tile_mismatches(y, C, r0, twin) + f.tile_mismatches(yr, C, r0, twin) == 0);
                    ++tested;
                }
#if CLOVER_CPU_AVX512_VNNI
        // the same rows repacked into a 16-row group (k512::repack_q8_0_x16): the same bits
        for (const std::int64_t r0 : {0, 19}) {
            const auto groups = f.repacked(cd::k512::repack_q8_0_x16, K / 32, cd::k512::q8_0_x16_block_bytes, r0);
            for_tokens_1_to_8([&](auto tokens) {
                constexpr int C = decltype(tokens)::value;
                std::vector<cd::a8_lane> packed(std::size_t(C * K / 32));
                cd::pack_a8_lanes(ap, stride, C, K / 32, packed.data());
                for (const bool pf : {false, true}) {
                    CAPTURE(r0); CAPTURE(C); CAPTURE(pf);
                    const std::byte* next = pf ? groups.second.data() : nullptr;
                    float y[8 * 16], yr[8 * 16];
                    cd::k512::q8_0_x16_tile<C>(groups.first.data(), cd::k512::lanes_packed{packed.data(), C}, K / 32, y, 16, next);
                    cd::k512::q8_0_x16_tile<C>(groups.first.data(), cd::k512::lanes_rows{ap, stride}, K / 32, yr, 16, next);
                    CHECK(f.tile_mismatches(y, C, r0, twin) + f.tile_mismatches(yr, C, r0, twin) == 0);
                    ++tested;
                }
            });
        }
#endif
        // gemm_block: not row-exact, from lanes_from tokens on (decode-sized and prefill-sized
        // token ranges): groups of 16 rows equal the twin, the 3 rows left equal the row tiles;
        // row-exact or below lanes_from: every row equals the row tiles
        for (const std::int64_t n : {std::int64_t(ks.lanes_from) - 1, std::int64_t(ks.lanes_from), std::int64_t(8), f.T})
            for (const bool exact : {false, true}) {
                CAPTURE(n); CAPTURE(exact);
                const bool fast = !exact && n >= ks.lanes_from && (n > cd::small_batch_tokens || K <= cd::lanes_max_k);
                CHECK(f.gemm_block_mismatches(n, exact, fast, twin) == 0);
            }
        // the fast form stays within rounding of the row-exact one
        float y[16];
        std::vector<cd::a8_lane> packed(std::size_t(K / 32));
        cd::pack_a8_lanes(ap, stride, 1, K / 32, packed.data());
        ks.lanes_tile(1)(m.w.row(0), m.w.row_bytes, packed.data(), K, y, 16, nullptr);
        for (int r = 0; r < 16; ++r) CHECK(y[r] == doctest::Approx(one_row(r, 0)).epsilon(1e-4).scale(std::sqrt(double(K))));
    }
#if CLOVER_CPU_AVX512_VNNI
    CHECK(tested > 0);
#endif
}

TEST_CASE("the fast K-quant lanes tiles (Q4_K, Q6_K: 16 rows x 1..8 tokens on a8k_block rows) and gemm_block's fast path equal their blockwise twins bitwise, odd sizes") {
    using twin_fn = float (*)(const std::byte*, const std::byte*, std::int64_t);
    for (const auto& form : {std::pair<dtype, twin_fn>{dtype::q4_k, cd::q4_k_blockwise_ref},
                             std::pair<dtype, twin_fn>{dtype::q6_k, cd::q6_k_blockwise_ref}}) {
        const dtype t = form.first;
        const twin_fn blockwise = form.second;
        CAPTURE(dtype_name(t));
        const auto& ks = cd::kernels_for(t);
        int tested = 0;
        for (std::int64_t K : {256, 768, 2304, 4352}) {  // odd super-block counts: 1, 3, 9, 17
            if (!ks.lanes_rows_tile(1)) break;
            CAPTURE(K);
            const lanes_fixture f(t, K, std::uint64_t(K) * 17 + 5, std::uint64_t(K) * 29 + 4);
            const test_matrix& m = f.m;
            const std::byte* ap = f.ap;
            const std::size_t stride = f.stride;
            auto twin = [&](std::int64_t r, std::int64_t c) { return blockwise(m.w.row(r), f.xrow(c), K); };
            auto one_row = [&](std::int64_t r, std::int64_t c) { return f.one_row(r, c); };
            for (const std::int64_t r0 : {0, 19})
                for (int C = 1; C <= 8; ++C)
                    for (const bool pf : {false, true}) {
                        CAPTURE(r0); CAPTURE(C); CAPTURE(pf);
                        float y[8 * 16];
                        ks.lanes_rows_tile(C)(m.w.row(r0), m.w.row_bytes, ap, stride, K, y, 16, pf ? m.w.row(16) : nullptr);
                        CHECK(f.tile_mismatches(y, C, r0, twin) == 0);
                        ++tested;
                    }
#if CLOVER_CPU_AVX512_VNNI
            // Q4_K rows repacked into a 16-row group (k512::repack_q4_k_x16): the same bits
            if (t == dtype::q4_k)
                for (const std::int64_t r0 : {0, 19}) {
                    const auto groups = f.repacked(cd::k512::repack_q4_k_x16, K / 256, cd::k512::q4_k_x16_block_bytes, r0);
                    for_tokens_1_to_8([&](auto tokens) {
                        constexpr int C = decltype(tokens)::value;
                        for (const bool pf : {false, true}) {
                            CAPTURE(r0); CAPTURE(C); CAPTURE(pf);
                            float y[8 * 16];
                            cd::k512::q4_k_x16_tile<C>(groups.first.data(), ap, stride, K, y, 16, pf ? groups.second.data() : nullptr);
                            CHECK(f.tile_mismatches(y, C, r0, twin) == 0);
                            ++tested;
                        }
                    });
                }
#endif
            // gemm_block: as for Q8_0 (no packing here, so no limit on K)
            for (const std::int64_t n : {std::int64_t(ks.lanes_from) - 1, std::int64_t(ks.lanes_from), std::int64_t(8), f.T})
                for (const bool exact : {false, true}) {
                    CAPTURE(n); CAPTURE(exact);
                    CHECK(f.gemm_block_mismatches(n, exact, !exact && n >= ks.lanes_from, twin) == 0);
                }
            // the fast form stays within rounding of the row-exact one and of the reference dot
            float y[16];
            ks.lanes_rows_tile(1)(m.w.row(0), m.w.row_bytes, ap, stride, K, y, 16, nullptr);
            for (int r = 0; r < 16; ++r) {
                CHECK(y[r] == doctest::Approx(one_row(r, 0)).epsilon(1e-4).scale(std::sqrt(double(K))));
                CHECK(y[r] == doctest::Approx(quant::vec_dot_ref(t, m.w.row(r), f.xrow(0), K)).epsilon(1e-4).scale(std::sqrt(double(K))));
            }
        }
#if CLOVER_CPU_AVX512_VNNI
        CHECK(tested > 0);
#endif
    }
}

TEST_CASE("backend matmul equals matmul_ref (threads, token chunks, Eigen path, odd shapes)") {
    backend::cpu be({2});
    for (dtype t : all_types) {
        const std::int64_t g = quant::row_granule(t);
        for (auto [rows, cols, n] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1}, {17, 2, 3}, {65, 3, 5},
                                     {33, 5, 1}, {7, 1, 40}, {130, 2, 131}, {6, 9, 2},
                                     // the small-batch path (2–8 tokens, distant row pairs, odd rows)
                                     {41, 2, 4}, {9, 3, 7}, {101, 2, 8}, {3, 1, 9}}) {
            cols *= g == 1 ? 37 : g;
            CAPTURE(dtype_name(t)); CAPTURE(rows); CAPTURE(cols); CAPTURE(n);
            test_matrix m(t, rows, cols, 7);
            auto x = testutil::random_vec(std::size_t(n * cols), 8);
            std::vector<float> y1(std::size_t(n * rows)), y2(std::size_t(n * rows));
            be.matmul(m.w, x.data(), y1.data(), n);
            backend::cpu::matmul_ref(m.w, x.data(), y2.data(), n);
            CHECK(testutil::max_abs_diff(y1.data(), y2.data(), y1.size()) < 1e-4f * (1 + testutil::max_abs(y2)) * std::sqrt(float(cols) / 32));
        }
    }
}

TEST_CASE("exact rows: an n-row product equals n one-row products bit for bit; matmul_many equals matmul") {
    backend::cpu be({2});
    backend::cpu::exact_rows_scope exact(be);
    for (dtype t : all_types) {
        CAPTURE(dtype_name(t));
        const std::int64_t K = quant::row_granule(t) == 256 ? 512 : 160;
        test_matrix a(t, 45, K, 21), b(t, 19, K, 22);
        for (const std::int64_t n : {2, 5, 8, 70}) {  // small-batch path and prefill tiles
        CAPTURE(n);
        auto x = testutil::random_vec(std::size_t(n * K), 23);
        std::vector<float> ya(std::size_t(n * 45)), yb(std::size_t(n * 19)), one(45);
        const backend::matmul_job jobs[2] = {{&a.w, ya.data()}, {&b.w, yb.data()}};
        be.matmul_many(jobs, x.data(), n);
        std::vector<float> yb2(yb.size());
        be.matmul(b.w, x.data(), yb2.data(), n);
        CHECK(std::memcmp(yb.data(), yb2.data(), yb.size() * 4) == 0);
        for (std::int64_t i = 0; i < n; ++i) {
            be.matmul(a.w, x.data() + i * K, one.data(), 1);
            CHECK(std::memcmp(one.data(), ya.data() + i * 45, 45 * 4) == 0);
        }
        }
    }
}

TEST_CASE("thread pool: every index visited once (contiguous and dynamic chunks), many region sizes") {
    backend::cpu be({3});
    for (std::int64_t n : {1, 2, 3, 5, 100, 1001}) {
        std::vector<int> hits(std::size_t(n), 0);
        be.parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) ++hits[i];
        });
        for (int h : hits) CHECK(h == 1);
        for (std::int64_t chunk : {1, 3, 64}) {
            std::vector<std::atomic<int>> h2(static_cast<std::size_t>(n));
            std::atomic<int> bad_thread{0};
            be.run_chunks(n, chunk, [&](std::int64_t b, std::int64_t e, int t) {
                if (t < 0 || t >= 3) ++bad_thread;
                for (std::int64_t i = b; i < e; ++i) ++h2[i];
            });
            for (auto& h : h2) CHECK(h.load() == 1);
            CHECK(bad_thread.load() == 0);
        }
    }
    // Many tiny regions back to back (the decode pattern) complete and do not lose wake-ups.
    std::atomic<long> sum{0};
    for (int rep = 0; rep < 20000; ++rep)
        be.run_chunks(4, 1, [&](std::int64_t b, std::int64_t e, int) { sum += e - b; });
    CHECK(sum.load() == 80000);
}

TEST_CASE("the CPU check accepts this machine (the build targets it)") {
    CHECK(cd::missing_cpu_features().empty());
    CHECK(std::string(backend::cpu::isa_name()).size() > 0);
}
