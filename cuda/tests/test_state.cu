// The state pool on the device against the same pool on the host: one script of pool operations
// (rows written, checkpoints, restore, copy, copy_prefix, shared pages and open_from, truncation
// into a shared prefix) run on both, and after each step every sequence's KV rows, GDN states,
// rings and checkpoint positions compared byte for byte. Odd widths, F16 and F32 pages.
#include "cuda_test.hpp"

#include <cstring>
#include <random>
#include <vector>

#include <clover/backend/cpu/state.hpp>
#include <clover/backend/cuda/state.cuh>

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_state {

using namespace clover;
using namespace clover::backend;
namespace cd = clover::backend::cuda_detail;

namespace {

std::vector<layer_state_spec> pool_spec() {
    layer_state_spec att{layer_state_spec::kind::attention, 5, 0, 0, 0, 0, 0};
    layer_state_spec att2 = att;
    att2.kv_width = 7;
    layer_state_spec gdn{layer_state_spec::kind::gdn, 0, 2, 3, 5, 3, 11};
    return {att, gdn, att2, gdn};
}

// Writes and reads a pool's bytes whichever memory they live in.
struct host_io {
    cpu_detail::state_pool& p;
    void write(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
    void read(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
};
struct device_io {
    cd::device_state_pool& p;
    void write(void* dst, const void* src, std::size_t n) { p.store().write(dst, src, n); }
    void read(void* dst, const void* src, std::size_t n) { p.store().read(dst, src, n); }
};

// Rows [from, to) of every attention layer and every GDN state and ring of `seq`, from `seed`.
template <class IO>
void fill(IO io, seq_id seq, std::int64_t from, std::int64_t to, std::uint64_t seed, bool f16) {
    std::mt19937_64 rng(seed);
    auto bytes = [&](std::size_t n) {
        std::vector<std::uint8_t> v(n);
        for (auto& b : v) b = std::uint8_t(rng());
        return v;
    };
    const auto spec = pool_spec();
    for (std::size_t l = 0; l < spec.size(); ++l) {
        if (spec[l].k == layer_state_spec::kind::attention) {
            const std::size_t rb = std::size_t(spec[l].kv_width) * (f16 ? 2 : 4);
            for (std::int64_t p = from; p < to; ++p)
                for (int kv = 0; kv < 2; ++kv) {
                    const auto v = bytes(rb);
                    io.write(io.p.kv(std::int64_t(l), seq, p, kv), v.data(), rb);
                }
        } else {
            auto& slot = io.p.gdn(std::int64_t(l), seq);
            const auto s = bytes(slot.S.size() * 4), r = bytes(slot.ring.size() * 4);
            io.write(slot.S.data(), s.data(), s.size());
            io.write(slot.ring.data(), r.data(), r.size());
        }
    }
    io.p.set_n_past(seq, to);
}

// Everything observable about a sequence, as bytes.
template <class IO>
std::vector<std::uint8_t> dump(IO io, seq_id seq, bool f16) {
    std::vector<std::uint8_t> out;
    auto put = [&](const void* src, std::size_t n) {
        const std::size_t at = out.size();
        out.resize(at + n);
        io.read(out.data() + at, src, n);
    };
    const std::int64_t n = io.p.n_past(seq);
    out.push_back(std::uint8_t(n));
    for (std::int64_t c : io.p.checkpoints(seq)) out.push_back(std::uint8_t(c));
    const auto spec = pool_spec();
    for (std::size_t l = 0; l < spec.size(); ++l) {
        if (spec[l].k == layer_state_spec::kind::attention) {
            const std::size_t rb = std::size_t(spec[l].kv_width) * (f16 ? 2 : 4);
            for (std::int64_t p = 0; p < n; ++p)
                for (int kv = 0; kv < 2; ++kv) put(io.p.kv(std::int64_t(l), seq, p, kv), rb);
        } else {
            auto& slot = io.p.gdn(std::int64_t(l), seq);
            put(slot.S.data(), slot.S.size() * 4);
            put(slot.ring.data(), slot.ring.size() * 4);
        }
    }
    return out;
}

}  // namespace

CUDA_TEST_CASE("the state pool on the device equals the host pool through every operation (F16 and F32 pages)") {
    cd::stream stream;
    for (bool f16 : {true, false}) {
        CAPTURE(f16);
        state_options o;
        o.page = 4;
        o.kv_f16 = f16;
        o.gdn_checkpoints = 3;
        const auto spec = pool_spec();
        cpu_detail::state_pool hp(spec, o);
        cd::device_state_pool dp(spec, o, cd::device_store{stream.get()});
        host_io h{hp};
        device_io d{dp};
        auto same = [&](seq_id s) { CHECK(dump(h, s, f16) == dump(d, s, f16)); };

        // The same script on both pools; ids come out equal because the pools are used alike.
        const seq_id a = hp.open(20);
        REQUIRE(dp.open(20) == a);
        fill(h, a, 0, 8, 1, f16), fill(d, a, 0, 8, 1, f16);
        hp.checkpoint(a), dp.checkpoint(a);
        fill(h, a, 8, 10, 2, f16), fill(d, a, 8, 10, 2, f16);
        hp.checkpoint(a), dp.checkpoint(a);
        fill(h, a, 10, 13, 3, f16), fill(d, a, 10, 13, 3, f16);
        same(a);

        const seq_id b = hp.open(20);
        REQUIRE(dp.open(20) == b);
        hp.copy(b, a), dp.copy(b, a);
        same(b);
        CHECK(dp.same_state(a, b));

        const seq_id c = hp.open(16);
        REQUIRE(dp.open(16) == c);
        hp.copy_prefix(c, a, 10), dp.copy_prefix(c, a, 10);
        same(c);

        hp.restore(b, 8), dp.restore(b, 8);
        same(b);
        CHECK_FALSE(dp.same_state(a, b));

        // Pages [0, 2) of a shared with a new sequence at position 8, then a goes back into them.
        const auto hpages = hp.hold_pages(a, 0, 2);
        const auto dpages = dp.hold_pages(a, 0, 2);
        REQUIRE(hpages == dpages);
        const seq_id e = hp.open_from(16, hpages, 8, hp.save(a, 8));
        REQUIRE(dp.open_from(16, dpages, 8, dp.save(a, 8)) == e);
        same(e);
        hp.truncate(a, 6), dp.truncate(a, 6);
        fill(h, a, 6, 12, 4, f16), fill(d, a, 6, 12, 4, f16);
        same(a);
        same(e);  // its shared pages kept the old rows
        CHECK(hp.pages_used() == dp.pages_used());

        for (seq_id s : {a, b, c, e}) hp.close(s), dp.close(s);
        hp.drop_pages(hpages), dp.drop_pages(dpages);
        CHECK(dp.pages_used() == 0);
    }
}

}  // namespace cuda_test_state
