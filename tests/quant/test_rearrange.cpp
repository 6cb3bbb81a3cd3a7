// backend::cpu's rearranged matrices (weight_layout::rows16; cpu.hpp: rearrange_products,
// matmul.hpp: x16_block): every (row, token) of a product equals the blockwise twin of the
// file's row (full 16-row groups) or the row tiles' one-row product (rows past the last group),
// at every token count, row-exact and fast alike; a slice on a group reads the same rows; a
// slice that splits a group is refused; the first model of a file rearranges it and a second
// model of the same file reads it the same way.
#include <doctest/doctest.h>

#include <cstring>
#include <optional>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;
namespace cd = clover::backend::cpu_detail;

namespace rearrange_test {

// n_mat stacked matrices of `rows` random rows, the file's layout.
struct stack {
    std::vector<std::byte> bytes;
    weight w;
    stack(dtype t, std::int64_t rows, std::int64_t cols, std::int64_t n_mat, std::uint64_t seed) {
        auto wf = testutil::random_vec(std::size_t(rows * cols * n_mat), seed);
        const std::size_t rb = quant::row_bytes(t, cols);
        bytes.resize(rb * std::size_t(rows * n_mat));
        for (std::int64_t r = 0; r < rows * n_mat; ++r) quant::quantize_row(t, wf.data() + r * cols, bytes.data() + r * rb, cols);
        w = weight{bytes.data(), t, cols, rows, n_mat, rb, weight_layout::file, "blk.0.test.weight"};
    }
};

// The blockwise twin of one file row against one activation row.
float blockwise(dtype t, const std::byte* row, const float* x, std::int64_t K) {
    const dtype at = quant::activation_type(t);
    std::vector<std::byte> a(quant::row_bytes(at, K));
    quant::quantize_row(at, x, a.data(), K);
    return t == dtype::q8_0 ? cd::q8_0_blockwise_ref(row, a.data(), K)
         : t == dtype::q4_k ? cd::q4_k_blockwise_ref(row, a.data(), K)
                            : cd::q6_k_blockwise_ref(row, a.data(), K);
}

// Hands `be` the matrices of `s` as the products of a writable private copy.
void rearrange(backend::cpu& be, std::vector<weight*> products) {
    weight_memory m;
    m.products = std::move(products);
    m.rewrite_once = [](const weight_memory::rearrange_fn& fn) { return fn ? fn() : std::vector<const std::byte*>{}; };
    be.map_weights(m);
}

}  // namespace rearrange_test
using namespace rearrange_test;

TEST_CASE("rearranged Q8_0 / Q4_K / Q6_K matrices: blockwise twins in the groups, row tiles past them, every token count") {
    for (dtype t : {dtype::q8_0, dtype::q4_k, dtype::q6_k}) {
        if (!cd::kernels_for(t).repack) {
            MESSAGE("this build has no 16-row layout for " << dtype_name(t) << " (needs AVX-512 VNNI)");
            continue;
        }
        // K past lanes_max_k takes the prepared rows instead of packed tokens in small batches
        for (const std::int64_t K : t == dtype::q8_0 ? std::vector<std::int64_t>{160, 4160} : std::vector<std::int64_t>{512, 2304}) {
            CAPTURE(dtype_name(t)); CAPTURE(K);
            const std::int64_t rows = 53;  // 3 groups and 5 rows in the file's layout
            const stack file(t, rows, K, 2, 31);
            stack s(t, rows, K, 2, 31);
            backend::cpu be({2});
            rearrange(be, {&s.w});
            REQUIRE(s.w.layout == weight_layout::rows16);
            CHECK(std::memcmp(s.bytes.data(), file.bytes.data(), s.bytes.size()) != 0);
            // the rows past the last group kept the file's bytes
            for (std::int64_t e = 0; e < 2; ++e)
                CHECK(std::memcmp(s.w.expert(e).row(48), file.w.expert(e).row(48), 5 * s.w.row_bytes) == 0);
            backend::cpu ref_be({2});
            backend::cpu::exact_rows_scope ref_exact(ref_be);
            for (const std::int64_t n : {1, 2, 3, 5, 8, 9, 20, 70}) {
                CAPTURE(n);
                auto x = testutil::random_vec(std::size_t(n * K), 40 + std::uint64_t(n));
                for (const bool exact : {true, false}) {
                    CAPTURE(exact);
                    std::optional<backend::cpu::exact_rows_scope> scope;
                    if (exact) scope.emplace(be);
                    const weight we = s.w.expert(1), fe = file.w.expert(1);
                    std::vector<float> y(std::size_t(n * rows)), tail(rows);
                    be.matmul(we, x.data(), y.data(), n);
                    std::int64_t bad = 0;
                    for (std::int64_t i = 0; i < n; ++i) {
                        ref_be.matmul(fe, x.data() + i * K, tail.data(), 1);
                        for (std::int64_t r = 0; r < rows; ++r) {
                            const float want = r < 48 ? blockwise(t, fe.row(r), x.data() + i * K, K) : tail[std::size_t(r)];
                            bad += std::memcmp(&want, &y[std::size_t(i * rows + r)], 4) != 0;
                        }
                    }
                    CHECK(bad == 0);
                    // a slice on a group: rows 16..52 of the same product
                    std::vector<float> ys(std::size_t(n * 37));
                    be.matmul(we.row_slice(16, 37), x.data(), ys.data(), n);
                    std::int64_t bad_slice = 0;
                    for (std::int64_t i = 0; i < n; ++i)
                        bad_slice += std::memcmp(&ys[std::size_t(i * 37)], &y[std::size_t(i * rows + 16)], 37 * 4) != 0;
                    CHECK(bad_slice == 0);
                }
            }
            CHECK_THROWS_WITH_AS(s.w.row_slice(8, 16), doctest::Contains("split the 16-row groups"), clover::error);
            CHECK_THROWS_AS(s.w.row_slice(16, 20), clover::error);  // ends inside a group, not at the last row
        }
    }
}

TEST_CASE("rearranging: matrices of other types, too few rows or overlapping views stay as filed; a second backend only marks") {
    if (!cd::kernels_for(dtype::q8_0).repack) {
        MESSAGE("this build has no 16-row layout (needs AVX-512 VNNI)");
        return;
    }
    stack q8(dtype::q8_0, 32, 64, 1, 1), few(dtype::q8_0, 15, 64, 1, 2), q5(dtype::q5_k, 32, 256, 1, 3), shared(dtype::q8_0, 48, 64, 1, 4);
    weight a = shared.w, b = shared.w.row_slice(16, 16);  // b overlaps a with another shape
    const std::vector<std::byte> q5_before = q5.bytes, shared_before = shared.bytes;
    backend::cpu be({2});
    std::vector<const std::byte*> record;
    bool decided = false;
    weight_memory m;
    m.products = {&q8.w, &few.w, &q5.w, &a, &b};
    m.rewrite_once = [&](const weight_memory::rearrange_fn& fn) {
        if (!decided) {
            decided = true;
            if (fn) record = fn();
        }
        return record;
    };
    be.map_weights(m);
    CHECK(q8.w.layout == weight_layout::rows16);
    CHECK(few.w.layout == weight_layout::file);
    CHECK(q5.w.layout == weight_layout::file);
    CHECK(q5.bytes == q5_before);
    CHECK(a.layout == weight_layout::file);
    CHECK(b.layout == weight_layout::file);
    CHECK(shared.bytes == shared_before);
    CHECK(be.weights_placement().find("1 matrices in 16-row groups") != std::string::npos);
    {  // a chain of overlaps: rows [0, 16) and [8, 40) clash, so [32, 48), which only the second overlaps, stays too
        stack chain(dtype::q8_0, 48, 64, 1, 6);
        const std::vector<std::byte> chain_before = chain.bytes;
        weight first = chain.w.row_slice(0, 16), middle = chain.w.row_slice(8, 32), last = chain.w.row_slice(32, 16);
        std::vector<const std::byte*> rec;
        weight_memory mc;
        mc.products = {&first, &middle, &last};
        mc.rewrite_once = [&](const weight_memory::rearrange_fn& fn) { return fn ? (rec = fn()) : rec; };
        backend::cpu chain_be({2});
        chain_be.map_weights(mc);
        CHECK(last.layout == weight_layout::file);
        CHECK(chain.bytes == chain_before);
    }
    // a second model of the same bytes: marks the same matrix, rewrites nothing again
    const std::vector<std::byte> after = q8.bytes;
    weight q8_again = q8.w;
    q8_again.layout = weight_layout::file;
    backend::cpu be2({2});
    weight_memory m2 = m;
    m2.products = {&q8_again};
    be2.map_weights(m2);
    CHECK(q8_again.layout == weight_layout::rows16);
    CHECK(q8.bytes == after);
    // a backend told not to rearrange, first on fresh bytes: nothing changes, and nothing later may
    stack fresh(dtype::q8_0, 32, 64, 1, 5);
    const std::vector<std::byte> fresh_before = fresh.bytes;
    decided = false;
    record.clear();
    backend::cpu off({.threads = 2, .rearrange = false});
    weight_memory m3 = m;
    m3.products = {&fresh.w};
    off.map_weights(m3);
    CHECK(fresh.w.layout == weight_layout::file);
    backend::cpu later({2});
    later.map_weights(m3);
    CHECK(fresh.w.layout == weight_layout::file);
    CHECK(fresh.bytes == fresh_before);
}
