// The tensor-core product (mma.cuh) on the host, without a GPU: the warp body mma_tile runs for
// all 32 lanes in turn over an emulated warp whose mma.sync is built from the fragment layout
// functions alone (gather every lane's A and B registers into the matrices, multiply as the PTX
// ISA defines D = A·B + C in int32, scatter D to the lanes' C registers). Everything else is the
// code the device runs: staging, fragment loads, the float steps, the class order and the tree.
// Each result must equal, bit for bit, mm_kernel's canonical order computed with quant_dot's
// plain twin (item_dot_ref per lane, then warp_sum's butterfly) and with its packed form.
// Also the expert-grouped tile lists (moe.cuh) built on the host with the kernels' own functions.
// What this cannot see: whether the layout functions are the hardware's (they are the PTX ISA's
// tables, read; tests_cuda's test_mma.cu checks on a GPU) and the barrier's placement.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <clover/backend/cuda/mma.cuh>
#include <clover/backend/cuda/moe.cuh>
#include <clover/core/rng.hpp>
#include <clover/quant/q4_k.hpp>
#include <clover/quant/q5_k.hpp>
#include <clover/quant/q6_k.hpp>
#include <clover/quant/rows.hpp>

#include "../../../tests/common/test_util.hpp"
#include "../quant_test_rows.hpp"

using namespace clover;
namespace cd = clover::backend::cuda_detail;

namespace {

// One warp on the host: each() runs the lanes one after another, so a phase of the body ends for
// every lane before the next begins (what the device's __syncwarp provides).
struct emu_warp {
    cd::mma_lane lanes[32];
    cd::mma_stage_buf s{};
    int mmas = 0;
    template <class F>
    void each(F&& f) {
        for (int l = 0; l < 32; ++l) f(l, lanes[l]);
    }
    cd::mma_stage_buf& buf() { return s; }
    void sync() {}
    template <dtype T>
    void mma() {
        constexpr int KK = cd::mma_k<T>();
        int A[16][KK], B[KK][8], hitA[16][KK] = {}, hitB[KK][8] = {};
        for (int l = 0; l < 32; ++l) {
            for (int r = 0; r < cd::mma_a_regs<T>(); ++r)
                for (int b = 0; b < 4; ++b) {
                    const int m = cd::frag_a_row(l, r), k = cd::frag_a_k(l, r, b);
                    A[m][k] = std::int8_t(lanes[l].a[r] >> (8 * b));
                    ++hitA[m][k];
                }
            for (int r = 0; r < cd::mma_b_regs<T>(); ++r)
                for (int b = 0; b < 4; ++b) {
                    const int k = cd::frag_b_k(l, r, b), n = cd::frag_b_col(l);
                    B[k][n] = std::int8_t(lanes[l].b[r] >> (8 * b));
                    ++hitB[k][n];
                }
        }
        // Every element of A and B comes from exactly one (lane, register, byte).
        for (int m = 0; m < 16; ++m)
            for (int k = 0; k < KK; ++k) REQUIRE(hitA[m][k] == 1);
        for (int k = 0; k < KK; ++k)
            for (int n = 0; n < 8; ++n) REQUIRE(hitB[k][n] == 1);
        for (int l = 0; l < 32; ++l)
            for (int r = 0; r < 4; ++r) {
                const int m = cd::frag_c_row(l, r), n = cd::frag_c_col(l, r);
                int d = 0;  // C = 0 (the kernel's accumulator input)
                for (int k = 0; k < KK; ++k) d += A[m][k] * B[k][n];
                lanes[l].c[r] = d;
            }
        ++mmas;
    }
};

using cudatest::rows_of;

// mm_kernel's order for one (output, row), with the plain twin (packed = false) or the packed
// form: lane l's partial over items l, l+32, ..., then warp_sum's butterfly, lane 0's value.
template <dtype T>
float canonical(const std::uint8_t* w, const std::uint8_t* x, std::int64_t n_items, bool packed) {
    float v[32];
    for (int l = 0; l < 32; ++l) {
        float acc[1] = {0.f};
        const std::uint8_t* xr[1] = {x};
        for (std::int64_t it = l; it < n_items; it += 32) {
            if (packed) cd::item_dot<T, 1>(w, xr, it, acc, 1);
            else cd::item_dot_ref<T, 1>(w, xr, it, acc, 1);
        }
        v[l] = acc[0];
    }
    for (int off = 16; off > 0; off >>= 1) {
        float nv[32];
        for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ off];
        std::memcpy(v, nv, sizeof v);
    }
    return v[0];
}

std::uint32_t bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// y [n, ldy] = x · wᵀ for N outputs through the emulated warp tiles (16 outputs × 8 rows), the
// tiles laid out as mma_kernel does (dense rows [8t, 8t+8) of rows p, reading x row xmap[p]).
template <dtype T>
int run_tiles(const std::vector<std::uint8_t>& w, std::size_t wrb, std::int64_t N, const std::vector<std::uint8_t>& x,
              std::size_t xrb, const int* xmap, std::int64_t n, std::int64_t K, std::vector<float>& y, std::int64_t ldy) {
    int mmas = 0;
    for (std::int64_t o0 = 0; o0 < N; o0 += cd::mma_m)
        for (std::int64_t p0 = 0; p0 < n; p0 += cd::mma_n) {
            cd::mma_job j{};
            j.w = w.data();
            j.row_bytes = wrb;
            j.o0 = o0;
            j.N = N;
            j.x = x.data();
            j.x_row_bytes = xrb;
            j.xmap = xmap;
            j.p0 = int(p0);
            j.nr = int(std::min<std::int64_t>(cd::mma_n, n - p0));
            j.y = y.data();
            j.ldy = ldy;
            j.n_items = cd::items<T>(K);
            emu_warp warp;
            cd::mma_tile<T>(j, warp);
            mmas += warp.mmas;
        }
    return mmas;
}

template <dtype T>
void check_format(std::int64_t K, std::int64_t N, std::int64_t n, bool raw, bool gather) {
    CAPTURE(dtype_name(T));
    CAPTURE(K);
    CAPTURE(N);
    CAPTURE(n);
    CAPTURE(raw);
    CAPTURE(gather);
    const dtype at = quant::activation_type(T);
    const std::size_t wrb = quant::row_bytes(T, K), xrb = quant::row_bytes(at, K);
    const auto w = rows_of(T, N, K, 101 + K + N, raw);
    // A gather reads n output rows from n_x activation rows in a scrambled order (the LM head's
    // and the MoE's xmap); activations come from real quantization (finite scales).
    const std::int64_t n_x = gather ? n + 3 : n;
    const auto x = rows_of(at, n_x, K, 203 + K + n, false);
    std::vector<int> xmap;
    if (gather)
        for (std::int64_t p = 0; p < n; ++p) xmap.push_back(int((p * 5 + 2) % n_x));
    const std::int64_t ldy = N + 3;  // padding columns must stay untouched
    const float sentinel = -12345.5f;
    std::vector<float> y(std::size_t(n * ldy), sentinel);
    const int mmas = run_tiles<T>(w, wrb, N, x, xrb, gather ? xmap.data() : nullptr, n, K, y, ldy);
    const std::int64_t tiles = (N + 15) / 16 * ((n + 7) / 8);
    CHECK(mmas == tiles * cd::items<T>(K));  // one mma per item and tile

    int mismatches = 0;
    for (std::int64_t p = 0; p < n; ++p) {
        const std::uint8_t* xr = x.data() + std::size_t(gather ? xmap[std::size_t(p)] : p) * xrb;
        for (std::int64_t o = 0; o < ldy; ++o) {
            const float got = y[std::size_t(p * ldy + o)];
            if (o >= N) {
                if (bits(got) != bits(sentinel)) ++mismatches;
                continue;
            }
            const std::uint8_t* wr = w.data() + std::size_t(o) * wrb;
            const float ref = canonical<T>(wr, xr, cd::items<T>(K), false);
            const float packed = canonical<T>(wr, xr, cd::items<T>(K), true);
            if (bits(got) != bits(ref) || bits(packed) != bits(ref)) {
                if (++mismatches <= 3) MESSAGE("row ", p, " output ", o, ": mma ", got, " canonical ", ref, " packed ", packed);
            }
        }
    }
    CHECK(mismatches == 0);
}

// The integer code of element e of item `it`, from the CPU's own decoders (quant/*.hpp).
template <dtype T>
int cpu_w_code(const std::uint8_t* w, std::int64_t it, int e) {
    if constexpr (T == dtype::q8_0) return std::int8_t(w[it * 34 + 2 + e]);
    else if constexpr (T == dtype::q4_k) return quant::q4_k_code(reinterpret_cast<const quant::block_q4_k*>(w)[it / 8], int(it % 8) * 32 + e);
    else if constexpr (T == dtype::q5_k) return quant::q5_k_code(reinterpret_cast<const quant::block_q5_k*>(w)[it / 8], int(it % 8) * 32 + e);
    else return quant::q6_k_code(reinterpret_cast<const quant::block_q6_k*>(w)[it / 16], int(it % 16) * 16 + e) - 32;
}
template <dtype T>
int cpu_x_code(const std::uint8_t* x, std::int64_t it, int e) {
    if constexpr (T == dtype::q8_0) return std::int8_t(x[it * 34 + 2 + e]);
    else return std::int8_t(x[(it * cd::item_elems<T>()) / 256 * 292 + 4 + (it * cd::item_elems<T>()) % 256 + e]);
}

template <dtype T>
void check_words(std::int64_t K) {
    CAPTURE(dtype_name(T));
    const dtype at = quant::activation_type(T);
    for (bool raw : {false, true}) {
        const auto w = rows_of(T, 1, K, 7 + K, raw);
        const auto x = rows_of(at, 1, K, 9 + K, false);
        for (std::int64_t it = 0; it < cd::items<T>(K); ++it) {
            int dot = 0;
            for (int e = 0; e < cd::item_elems<T>(); ++e) {
                const int wc = std::int8_t(cd::item_w_word<T>(w.data(), it, e / 4) >> (8 * (e % 4)));
                const int xc = std::int8_t(cd::item_x_word<T>(x.data(), it, e / 4) >> (8 * (e % 4)));
                REQUIRE(wc == cpu_w_code<T>(w.data(), it, e));
                REQUIRE(xc == cpu_x_code<T>(x.data(), it, e));
                dot += wc * xc;
            }
            REQUIRE(cd::item_int_dot<T>(w.data(), x.data(), it) == dot);
        }
    }
}

}  // namespace

TEST_CASE("mma fragment layouts: every element of A, B and C held by exactly one lane register") {
    for (int KK : {16, 32}) {
        std::vector<int> a(16 * KK), b(KK * 8), c(16 * 8);
        for (int l = 0; l < 32; ++l) {
            for (int r = 0; r < KK / 8; ++r)
                for (int by = 0; by < 4; ++by) {
                    const int m = cd::frag_a_row(l, r), k = cd::frag_a_k(l, r, by);
                    REQUIRE((m >= 0 && m < 16 && k >= 0 && k < KK));
                    ++a[std::size_t(m * KK + k)];
                }
            for (int r = 0; r < KK / 16; ++r)
                for (int by = 0; by < 4; ++by) {
                    const int k = cd::frag_b_k(l, r, by), n = cd::frag_b_col(l);
                    REQUIRE((k >= 0 && k < KK && n >= 0 && n < 8));
                    ++b[std::size_t(k * 8 + n)];
                }
            for (int r = 0; r < 4; ++r) ++c[std::size_t(cd::frag_c_row(l, r) * 8 + cd::frag_c_col(l, r))];
        }
        for (int v : a) CHECK(v == 1);
        for (int v : b) CHECK(v == 1);
        for (int v : c) CHECK(v == 1);
    }
    // Spot values from the PTX ISA's tables (m16n8k32 .s8): lane 6 is group 1, thread 2.
    CHECK(cd::frag_a_row(6, 0) == 1);
    CHECK(cd::frag_a_k(6, 0, 0) == 8);
    CHECK(cd::frag_a_row(6, 1) == 9);
    CHECK(cd::frag_a_k(6, 2, 3) == 27);
    CHECK(cd::frag_a_row(6, 3) == 9);
    CHECK(cd::frag_b_k(6, 1, 1) == 25);
    CHECK(cd::frag_b_col(6) == 1);
    CHECK(cd::frag_c_row(6, 2) == 9);
    CHECK(cd::frag_c_col(6, 1) == 5);
}

TEST_CASE("mma class order: brev5 visits every lane once, and the tree equals warp_sum's butterfly") {
    bool seen[32] = {};
    for (int i = 0; i < 32; ++i) {
        REQUIRE((cd::brev5(i) >= 0 && cd::brev5(i) < 32));
        seen[cd::brev5(i)] = true;
    }
    for (bool s : seen) CHECK(s);
    // Values whose sums round differently in every other order.
    rng r(5);
    for (int trial = 0; trial < 200; ++trial) {
        float v[32];
        for (float& f : v) f = std::ldexp(r.uniform(-1.f, 1.f), int(r.next() % 40) - 20);
        float b[32];
        std::memcpy(b, v, sizeof v);
        for (int off = 16; off > 0; off >>= 1) {
            float nb[32];
            for (int l = 0; l < 32; ++l) nb[l] = b[l] + b[l ^ off];
            std::memcpy(b, nb, sizeof b);
        }
        cd::mma_lane L;
        for (int i = 0; i < 32; ++i) {
            for (float& a : L.acc) a = v[cd::brev5(i)];
            cd::mma_tree_push(L, i);
        }
        for (float a : L.acc) CHECK(bits(a) == bits(b[0]));
    }
}

TEST_CASE("mma code words: every staged code equals the CPU decoder's, integer dots exact") {
    for (std::int64_t K : {256, 768}) {
        check_words<dtype::q8_0>(K);
        check_words<dtype::q4_k>(K);
        check_words<dtype::q5_k>(K);
        check_words<dtype::q6_k>(K);
    }
}

TEST_CASE("mma tiles on an emulated warp equal mm_kernel's canonical order bit for bit") {
    // K = 768: fewer items than lanes for Q8_0/Q4_K/Q5_K (empty classes); K = 2304: classes of
    // 2-5 items. Odd output counts (a partial last 16) and row counts (a partial last 8).
    for (bool raw : {false, true}) {
        for (std::int64_t K : {768, 2304}) {
            check_format<dtype::q8_0>(K, 37, 13, raw, false);
            check_format<dtype::q4_k>(K, 37, 13, raw, false);
            check_format<dtype::q5_k>(K, 21, 11, raw, false);
            check_format<dtype::q6_k>(K, 37, 13, raw, false);
        }
        check_format<dtype::q8_0>(96, 17, 9, raw, false);  // 3 items: 29 empty classes
    }
    // Gathered rows (xmap) and the 8-row minimum tile alone.
    check_format<dtype::q4_k>(768, 19, 8, false, true);
    check_format<dtype::q6_k>(768, 19, 21, true, true);
    check_format<dtype::q8_0>(768, 33, 15, true, true);
}

TEST_CASE("expert tiles: every grouped row in exactly one tile of its expert, mm_kernel or mma_kernel sized, within the launch bounds") {
    rng r(17);
    for (int trial = 0; trial < 300; ++trial) {
        const std::int64_t X = 1 + std::int64_t(r.next() % 40), n = 1 + std::int64_t(r.next() % 70);
        const int k = int(1 + r.next() % std::uint64_t(std::min<std::int64_t>(X, 8)));
        CAPTURE(X);
        CAPTURE(n);
        CAPTURE(k);
        // Each row picks k distinct experts (the router's top k), skewed toward low ids so some
        // experts get many rows.
        std::vector<int> counts(static_cast<std::size_t>(X));
        for (std::int64_t row = 0; row < n; ++row) {
            std::vector<bool> used(static_cast<std::size_t>(X));
            for (int j = 0; j < k;) {
                const std::uint64_t a = r.next() % std::uint64_t(X), b = r.next() % std::uint64_t(X);
                const std::size_t e = std::size_t(std::min(a, b));
                if (used[e]) continue;
                used[e] = true;
                ++counts[e];
                ++j;
            }
        }
        const std::int64_t nk = n * k;
        std::vector<int> offsets(std::size_t(X + 1));
        for (std::int64_t e = 0; e < X; ++e) offsets[std::size_t(e + 1)] = offsets[std::size_t(e)] + counts[std::size_t(e)];
        for (bool split : {false, true}) {
            if (split && n < cd::mma_min_rows) continue;  // moe_experts splits only then
            CAPTURE(split);
            const int big = split ? int(cd::mma_min_rows) : 0;
            // tile_count_kernel + the two exclusive scans.
            std::vector<int> toff(std::size_t(2 * (X + 1)));
            for (int list = 0; list < 2; ++list)
                for (std::int64_t e = 0; e < X; ++e) {
                    const std::size_t at = std::size_t(list * (X + 1) + e);
                    toff[at + 1] = toff[at] + cd::expert_tile_count(counts[std::size_t(e)], big, list == 1);
                }
            const std::int64_t max_tiles = nk / cd::mm_rows + X, max_tiles8 = split ? nk / cd::mma_n + X : 0;
            const int n4 = toff[std::size_t(X)], n8 = toff[std::size_t(2 * X + 1)];
            REQUIRE(n4 <= max_tiles);
            REQUIRE(n8 <= max_tiles8);
            std::vector<cd::mm_tile> tiles(std::size_t(max_tiles), cd::mm_tile{-1, -1, -1}), tiles8(std::size_t(max_tiles8), cd::mm_tile{-1, -1, -1});
            for (std::int64_t e = 0; e < X; ++e)
                cd::expert_tiles(int(e), offsets[std::size_t(e)], offsets[std::size_t(e + 1)], big, toff.data(), X, tiles.data(), tiles8.data());
            std::vector<int> hit(static_cast<std::size_t>(nk));
            const auto take = [&](const cd::mm_tile& t, int max_rows, bool mma) {
                REQUIRE((t.mat >= 0 && t.mat < X));
                CHECK(cd::expert_to_mma(counts[std::size_t(t.mat)], big) == mma);
                CHECK((t.p0 < t.p1 && t.p1 - t.p0 <= max_rows));
                CHECK((t.p0 >= offsets[std::size_t(t.mat)] && t.p1 <= offsets[std::size_t(t.mat + 1)]));
                for (int p = t.p0; p < t.p1; ++p) ++hit[std::size_t(p)];
            };
            for (int t = 0; t < n4; ++t) take(tiles[std::size_t(t)], cd::mm_rows, false);
            for (int t = 0; t < n8; ++t) take(tiles8[std::size_t(t)], cd::mma_n, true);
            for (int h : hit) CHECK(h == 1);
            if (!split) CHECK(n8 == 0);
        }
    }
}

TEST_CASE("launch_mm: tiles of 8 rows only for grouped products in an integer format, refused before any launch") {
    alignas(16) static std::uint8_t buf[4096];
    cd::mm_args a{};
    a.N = 8;
    a.K = 256;
    a.n = 8;
    a.w = buf;
    a.row_bytes = 144;
    a.mat_bytes = 8 * 144;
    a.x = buf;
    a.x_row_bytes = 292;
    CHECK_THROWS_WITH_AS(cd::launch_mm(dtype::q4_k, a, 1, nullptr, true), doctest::Contains("no tile list"), error);
    const cd::mm_tile tile{0, 0, 8};
    a.tiles = &tile;
    a.row_bytes = 1024;
    a.mat_bytes = 8 * 1024;
    a.x_row_bytes = 1024;
    CHECK_THROWS_WITH_AS(cd::launch_mm(dtype::f32, a, 1, nullptr, true), doctest::Contains("integer format (got F32)"), error);
}
