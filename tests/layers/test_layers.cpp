// Kernel-level tests on random data with odd sizes: chunked GDN vs the recurrence, rope vs the
// closed form, norms vs naive formulas, routing ties.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <clover/core/math.hpp>
#include <clover/backend/cpu/gdn_kernels.hpp>
#include <clover/backend/cpu/rope.hpp>
#include <clover/backend/cpu/moe.hpp>

#include "../common/test_util.hpp"

using namespace clover;

TEST_CASE("chunked (WY) gated delta rule equals the token-by-token recurrence") {
    for (auto [n, dk, dv, chunk] : {std::tuple{1, 3, 5, 64}, {5, 7, 5, 64}, {63, 16, 16, 64}, {64, 5, 9, 64},
                                    {65, 8, 3, 64}, {130, 12, 7, 64}, {77, 9, 11, 16}}) {
        CAPTURE(n); CAPTURE(dk); CAPTURE(dv); CAPTURE(chunk);
        auto q = testutil::random_vec(std::size_t(n * dk), 1), k = testutil::random_vec(std::size_t(n * dk), 2);
        auto v = testutil::random_vec(std::size_t(n * dv), 3);
        auto g = testutil::random_vec(std::size_t(n), 4, -2.f, 0.f), beta = testutil::random_vec(std::size_t(n), 5, 0.f, 1.f);
        for (int t = 0; t < n; ++t) {  // as the layer feeds them: unit k, unit q / sqrt(dk)
            math::l2_norm(&k[t * dk], dk, 1e-6f);
            math::l2_norm(&q[t * dk], dk, 1e-6f);
            for (int i = 0; i < dk; ++i) q[t * dk + i] /= std::sqrt(float(dk));
        }
        auto S1 = testutil::random_vec(std::size_t(dk * dv), 6);  // a non-zero initial state
        auto S2 = S1;
        std::vector<float> o1(std::size_t(n * dv)), o2(std::size_t(n * dv)), tmp;
        backend::cpu_detail::gdn_head_io io1{q.data(), k.data(), v.data(), g.data(), beta.data(), o1.data(), dk, dk, dv, 1, dv};
        backend::cpu_detail::gdn_head_io io2 = io1;
        io2.o = o2.data();
        backend::cpu_detail::gdn_recurrent(S1.data(), io1, n, dk, dv, tmp);
        backend::cpu_detail::gdn_chunk_scratch sc;
        backend::cpu_detail::gdn_chunked(S2.data(), io2, n, dk, dv, sc, chunk);
        CHECK(testutil::max_abs_diff(o1.data(), o2.data(), o1.size()) < 2e-5f * (1 + testutil::max_abs(o1)));
        CHECK(testutil::max_abs_diff(S1.data(), S2.data(), S1.size()) < 2e-5f * (1 + testutil::max_abs(S1)));
    }
}

TEST_CASE("rope: recurrence-built angles equal the closed form; unrotated tail untouched") {
    backend::cpu_detail::rope_params rp{8, 10000.f, {0, 0, 0, 0}};
    for (std::int64_t pos : {0, 1, 17, 1000, 4095}) {
        std::vector<float> cs(8);
        backend::cpu_detail::rope_cache(rp, pos, cs.data());
        for (int i = 0; i < 4; ++i) {
            const double a = double(pos) * std::pow(10000.0, -2.0 * i / 8.0);
            CHECK(cs[2 * i] == doctest::Approx(std::cos(a)).epsilon(1e-4));
            CHECK(cs[2 * i + 1] == doctest::Approx(std::sin(a)).epsilon(1e-4));
        }
        auto x = testutil::random_vec(13, 9);
        auto y = x;
        backend::cpu_detail::rope_apply(y.data(), 8, cs.data());
        for (int i = 8; i < 13; ++i) CHECK(y[i] == x[i]);
        for (int i = 0; i < 4; ++i)  // rotation keeps each pair's length
            CHECK(std::hypot(y[i], y[i + 4]) == doctest::Approx(std::hypot(x[i], x[i + 4])).epsilon(1e-5));
    }
    // Interleaved sections: with {1,1,0,1} slot 2 falls on the extra stream and is not rotated.
    backend::cpu_detail::rope_params mr{8, 10000.f, {1, 1, 0, 1}};
    std::vector<float> cs(8);
    backend::cpu_detail::rope_cache(mr, 37, cs.data());
    CHECK(cs[4] == 1.f);
    CHECK(cs[5] == 0.f);
    CHECK(cs[2] != 1.f);
}

TEST_CASE("rms_norm and l2_norm match the naive formulas on odd sizes") {
    for (int n : {1, 3, 31, 257}) {
        auto x = testutil::random_vec(std::size_t(n), 11), w = testutil::random_vec(std::size_t(n), 12);
        std::vector<float> y(static_cast<std::size_t>(n));
        math::rms_norm(x.data(), w.data(), y.data(), n, 1e-6f);
        double ss = 0;
        for (float v : x) ss += double(v) * v;
        for (int i = 0; i < n; ++i) CHECK(y[i] == doctest::Approx(x[i] / std::sqrt(ss / n + 1e-6) * w[i]).epsilon(1e-5));
        auto z = x;
        math::l2_norm(z.data(), n, 1e-6f);
        for (int i = 0; i < n; ++i) CHECK(z[i] == doctest::Approx(x[i] / std::sqrt(ss + 1e-6)).epsilon(1e-5));
    }
}

TEST_CASE("routing: top-k with ties to the lower index, renormalised, restricted to a candidate set") {
    std::vector<float> p = {0.1f, 0.3f, 0.3f, 0.05f, 0.25f};
    std::int32_t ids[3];
    float w[3];
    backend::cpu_detail::route_row(p.data(), 5, 3, {}, ids, w);
    CHECK(ids[0] == 1);
    CHECK(ids[1] == 2);
    CHECK(ids[2] == 4);
    CHECK(w[0] + w[1] + w[2] == doctest::Approx(1.0));
    CHECK(w[0] == doctest::Approx(0.3 / 0.85));
    backend::cpu_detail::route_row(p.data(), 5, 3, {0, 3}, ids, w);  // k' = min(k, |set|) = 2
    CHECK(ids[0] == 0);
    CHECK(ids[1] == 3);
    CHECK(w[0] == doctest::Approx(0.1 / 0.15));
}

// A non-finite router logit (NaN, +-inf: an overflow upstream) counts as -inf; a row with no
// finite logit is uniform, so its top k are the lowest (allowed) ids. Before, NaN probabilities
// reached the top-k comparator (no strict weak order) and the weights. The CUDA routing kernel
// applies the same rule (cuda/tests/test_defects.cu compares the two).
TEST_CASE("routing: non-finite router logits count as -inf; a row without a finite logit is uniform") {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::int64_t X = 6, k = 2;
    std::vector<float> probs = {
        nan, 1.f, nan, 3.f, 0.f, 2.f,       // experts 3, 5
        nan, nan, nan, nan, nan, nan,       // uniform: 0, 1
        inf, 1.f, 2.f, -inf, 0.f, 0.5f,     // +inf is not a winner: 2, 1
        -inf, -inf, -inf, -inf, -inf, -inf, // uniform: 0, 1
        nan, inf, -inf, nan, inf, -inf,     // no finite logit: uniform
        0.f, 1.f, 2.f, 3.f, 4.f, 5.f,       // preview block, coreset 3: {3, 4, 5} (the NaN row adds 1/6 to each)
        nan, nan, nan, nan, nan, nan,       //   uniform: the coreset's lowest, 3 and 4
    };
    batch bt;
    bt.add(0, pass_kind::commit, std::vector<token>(5, 1), 0);
    bt.add(1, pass_kind::preview, std::vector<token>(2, 1), 0, 2, 3);
    std::vector<std::int32_t> ids(std::size_t(7 * k));
    std::vector<float> w(ids.size());
    backend::cpu_detail::moe_route(bt, backend::moe_shape{X, k, 0, 0}, probs.data(), ids.data(), w.data());
    const std::vector<std::int32_t> want = {3, 5, 0, 1, 2, 1, 0, 1, 0, 1, 5, 4, 3, 4};
    CHECK(ids == want);
    for (std::size_t i = 0; i < probs.size(); ++i) CHECK(std::isfinite(probs[i]));
    for (std::int64_t t = 0; t < 7; ++t) {
        double s = 0;
        for (std::int64_t e = 0; e < X; ++e) s += probs[std::size_t(t * X + e)];
        CHECK(s == doctest::Approx(1.0));
        CHECK(w[std::size_t(t * k)] + w[std::size_t(t * k + 1)] == doctest::Approx(1.0));
    }
    CHECK(probs[0] == 0.f);
    CHECK(probs[12] == 0.f);  // the +inf expert
    for (std::int64_t t : {1, 3, 4, 6}) {
        for (std::int64_t e = 0; e < X; ++e) CHECK(probs[std::size_t(t * X + e)] == float(1.0 / 6.0));
        CHECK(w[std::size_t(t * k)] == 0.5f);
    }
}
