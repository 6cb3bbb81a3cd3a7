// Whole-model tests: the commit pass against the independent reference, prefill vs decode at
// every position, chunked batches, variants, dtypes and error paths.
#include <doctest/doctest.h>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"
#include "../reference/reference_model.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;

std::vector<token> prompt_ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    rng r(seed);
    std::vector<token> ids;
    for (std::int64_t i = 0; i < n; ++i) ids.push_back(token(r.next() % std::uint64_t(vocab)));
    return ids;
}

// Our logits for every position of `ids` vs the reference, relative to max |logit|.
float rel_error_vs_reference(const std::string& path, const std::vector<token>& ids, int threads) {
    rt_model m(load(path), {threads});
    auto s = m.new_session({.ctx = 256, .kv_f16 = false});  // the reference keeps K/V in full precision
    std::vector<float> ours;
    m.commit(s, ids, logits_rows::all, ours);
    ref::model r(path);
    std::vector<float> theirs;
    for (token t : ids) {
        auto row = r.step(t);
        theirs.insert(theirs.end(), row.begin(), row.end());
    }
    REQUIRE(ours.size() == theirs.size());
    return testutil::max_abs_diff(ours.data(), theirs.data(), ours.size()) / testutil::max_abs(theirs);
}

}  // namespace

TEST_CASE("commit pass equals the independent reference (f32, tiny and odd shapes)") {
    auto tiny = testutil::synth_file("m_tiny.gguf", synth::preset("tiny"));
    auto odd = testutil::synth_file("m_odd.gguf", testutil::odd_spec());
    for (int threads : {1, 2}) {
        CHECK(rel_error_vs_reference(tiny, prompt_ids(70, 512, 1), threads) < 1e-5f);
        CHECK(rel_error_vs_reference(odd, prompt_ids(67, 300, 2), threads) < 1e-5f);
    }
}

TEST_CASE("commit pass equals the reference for F16, BF16 and Q8_0 weights") {
    // Tolerances are about four units in the last place of the activation type (F16 2^-11,
    // BF16 2^-8): an activation one ulp from a rounding boundary rounds to one side here and to
    // the other there, and whether it does depends on whether the compiler fused a multiply-add
    // in a scalar loop (seen: BF16 6.7e-8 at -O2 but 4.1e-3 at -O1, i.e. one flipped BF16 ulp).
    // A wrong kernel or a misread tensor is off by O(1).
    for (auto [t, tol] : {std::pair{dtype::f16, 2e-3f}, {dtype::bf16, 1.6e-2f}, {dtype::q8_0, 2e-3f}}) {
        auto s = synth::preset("tiny");
        s.type = t;
        auto path = testutil::synth_file("m_tiny_" + std::string(dtype_name(t)) + ".gguf", s);
        CAPTURE(dtype_name(t));
        // Both round activations to the weight's partner type before each product (as llama.cpp
        // does); a value landing on the other side of a rounding boundary explains the tolerance.
        CHECK(rel_error_vs_reference(path, prompt_ids(20, 512, 3), 2) < tol);
    }
}

TEST_CASE("prefill then decode equals one long prefill, at every position") {
    auto path = testutil::synth_file("m_odd.gguf", testutil::odd_spec());
    rt_model m(load(path), {2});
    auto ids = prompt_ids(80, m.n_vocab(), 4);
    // F32 KV: an F16 cache turns 1e-6 differences (Eigen blocking vs one-row tiles) into whole F16
    // rounding steps now and then; test_fused checks the F16 cache with its own tolerance.
    auto whole = m.new_session({.ctx = 128, .kv_f16 = false});
    std::vector<float> all;
    m.commit(whole, ids, logits_rows::all, all);
    const std::int64_t V = m.n_vocab();
    for (std::int64_t split : {1, 7, 64, 79}) {
        auto s = m.new_session({.ctx = 128, .kv_f16 = false});
        std::vector<float> part;
        m.commit(s, std::span<const token>(ids.data(), split), logits_rows::all, part);
        float err = testutil::max_abs_diff(part.data(), all.data(), part.size());
        for (std::int64_t i = split; i < std::int64_t(ids.size()); ++i) {
            std::vector<float> one;
            m.commit(s, std::span<const token>(ids.data() + i, 1), logits_rows::last, one);
            err = std::max(err, testutil::max_abs_diff(one.data(), all.data() + i * V, std::size_t(V)));
        }
        CAPTURE(split);
        CHECK(err / testutil::max_abs(all) < 1e-5f);
    }
}

TEST_CASE("a prefill long enough to split the GDN conv by channels equals its rows one at a time") {
    const auto spec = synth::preset("tiny");
    auto path = testutil::synth_file("m_tiny.gguf", spec);
    rt_model m(load(path), {2});
    // Rows enough that the CPU backend's gdn_conv splits the segment's channels across threads
    // (a row at a time never does): a wrong channel range or ring update shows in every later row.
    const std::int64_t C = m.hp().gdn_conv_channels();
    const std::int64_t n = backend::cpu_detail::gdn_conv_split_min / C + 3;
    REQUIRE(n * C >= backend::cpu_detail::gdn_conv_split_min);
    // Then a few rows more in both sessions: they read the conv ring that the split pass left.
    const std::int64_t more = 4;
    auto ids = prompt_ids(n + more, m.n_vocab(), 11);
    auto whole = m.new_session({.ctx = n + more, .batch = n, .kv_f16 = false});
    auto rows = m.new_session({.ctx = n + more, .kv_f16 = false});
    std::vector<float> all, one, next;
    m.commit(whole, std::span<const token>(ids.data(), std::size_t(n)), logits_rows::all, all);
    const std::int64_t V = m.n_vocab();
    float err = 0.f;
    for (std::int64_t i = 0; i < n; ++i) {
        m.commit(rows, std::span<const token>(ids.data() + i, 1), logits_rows::last, one);
        err = std::max(err, testutil::max_abs_diff(one.data(), all.data() + i * V, std::size_t(V)));
    }
    CHECK(err / testutil::max_abs(all) < 1e-5f);
    for (std::int64_t i = n; i < n + more; ++i) {
        m.commit(whole, std::span<const token>(ids.data() + i, 1), logits_rows::last, next);
        m.commit(rows, std::span<const token>(ids.data() + i, 1), logits_rows::last, one);
        CAPTURE(i);
        CHECK(testutil::max_abs_diff(one.data(), next.data(), std::size_t(V)) / testutil::max_abs(next) < 1e-5f);
    }
}

TEST_CASE("chunked commit (small batch) equals one pass; last-row logits equal the last of all") {
    auto path = testutil::synth_file("m_tiny.gguf", synth::preset("tiny"));
    rt_model m(load(path), {2});
    auto ids = prompt_ids(50, m.n_vocab(), 5);
    auto a = m.new_session({.ctx = 64, .batch = 512});
    auto b = m.new_session({.ctx = 64, .batch = 3});
    std::vector<float> la, lb, last;
    m.commit(a, ids, logits_rows::all, la);
    m.commit(b, ids, logits_rows::all, lb);
    CHECK(testutil::max_abs_diff(la.data(), lb.data(), la.size()) / testutil::max_abs(la) < 1e-5f);
    auto c = m.new_session({.ctx = 64, .batch = 7});
    m.commit(c, ids, logits_rows::last, last);
    REQUIRE(last.size() == std::size_t(m.n_vocab()));
    CHECK(testutil::max_abs_diff(last.data(), la.data() + (ids.size() - 1) * m.n_vocab(), last.size()) < 1e-4f);
}

TEST_CASE("static variant equals from_file; a file that does not fit names the dimension") {
    auto path = testutil::synth_file("m_tiny.gguf", synth::preset("tiny"));
    auto f = load(path);
    model<variants::tiny> st(f, {1});
    rt_model dy(f, {1});
    auto ids = prompt_ids(12, 512, 6);
    auto s1 = st.new_session({.ctx = 16});
    auto s2 = dy.new_session({.ctx = 16});
    std::vector<float> l1, l2;
    st.commit(s1, ids, logits_rows::all, l1);
    dy.commit(s2, ids, logits_rows::all, l2);
    // Not bit-equal: with constexpr sizes the compiler contracts and unrolls differently.
    CHECK(testutil::max_abs_diff(l1.data(), l2.data(), l1.size()) / testutil::max_abs(l2) < 1e-6f);
    try {
        model<variants::clover_35b_a3b> big(f, {1});
        FAIL("expected a variant mismatch");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("does not fit variant 'clover-35b-a3b': embedding_length is 64") != std::string::npos);
    }
}

TEST_CASE("bad ids and a full context are rejected before the session changes") {
    auto path = testutil::synth_file("m_tiny.gguf", synth::preset("tiny"));
    rt_model m(load(path), {1});
    auto s = m.new_session({.ctx = 8});
    std::vector<float> lg;
    std::vector<token> ok = {1, 2, 3};
    m.commit(s, ok, logits_rows::last, lg);
    auto snap = m.new_session({.ctx = 8});
    m.copy_state(snap, s);
    std::vector<token> bad = {4, 512};
    CHECK_THROWS_AS(m.commit(s, bad, logits_rows::last, lg), error);
    std::vector<token> neg = {-1};
    CHECK_THROWS_AS(m.commit(s, neg, logits_rows::last, lg), error);
    std::vector<token> many(6, 1);
    CHECK_THROWS_AS(m.commit(s, many, logits_rows::last, lg), error);
    CHECK(s.n_past() == 3);
    CHECK(m.same_state(s, snap));
}

TEST_CASE("snapshot and restore reproduce the same continuation") {
    auto path = testutil::synth_file("m_odd.gguf", testutil::odd_spec());
    rt_model m(load(path), {1});
    auto s = m.new_session({.ctx = 32});
    auto ids = prompt_ids(10, m.n_vocab(), 8);
    std::vector<float> a, b, tmp;
    m.commit(s, ids, logits_rows::last, tmp);
    auto snap = m.new_session({.ctx = 32});
    m.copy_state(snap, s);
    std::vector<token> next = {5, 6, 7};
    m.commit(s, next, logits_rows::all, a);
    m.copy_state(s, snap);
    CHECK(s.n_past() == 10);
    m.commit(s, next, logits_rows::all, b);
    CHECK(a == b);
}

TEST_CASE("greedy AR generation is deterministic and reports passes") {
    auto path = testutil::synth_file("m_tiny.gguf", synth::preset("tiny"));
    rt_model m(load(path), {2});
    std::vector<token> prompt = {10, 20, 30};
    decode::generate_options o;
    o.max_tokens = 16;
    o.ignore_eos = true;
    std::vector<token> out1, out2;
    auto s1 = m.new_session({.ctx = 32});
    auto st = decode::generate<decode::ar>(m, s1, prompt, o, [&](token t) { out1.push_back(t); return true; });
    auto s2 = m.new_session({.ctx = 32});
    decode::generate<decode::ar>(m, s2, prompt, o, [&](token t) { out2.push_back(t); return true; });
    CHECK(out1 == out2);
    CHECK(out1.size() == 16);
    CHECK(st.tokens == 16);
    CHECK(st.commit_passes == 16);
    CHECK(st.tokens_per_pass() == doctest::Approx(1.0));
    // The greedy choice is the argmax of a fresh full forward over prompt + generated prefix.
    auto s3 = m.new_session({.ctx = 32});
    std::vector<token> all = prompt;
    all.insert(all.end(), out1.begin(), out1.end() - 1);
    std::vector<float> lg;
    m.commit(s3, all, logits_rows::all, lg);
    for (std::size_t i = 0; i < out1.size(); ++i)
        CHECK(decode::argmax(lg.data() + (prompt.size() - 1 + i) * m.n_vocab(), m.n_vocab()) == out1[i]);
}
