// Block diffusion: the preview pass against the independent reference, its read-only contract,
// the coreset rule, the verify/rollback machinery, and the decoders' invariants.
#include <doctest/doctest.h>

#include <clover/clover.hpp>
#include <clover/io/gguf_writer.hpp>

#include "../common/test_util.hpp"
#include "../reference/reference_model.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;

synth::spec clover_tiny() {
    auto s = synth::preset("tiny");
    s.arch = "clover_moe";
    s.rope_theta = 100.f;
    return s;
}
synth::spec clover_odd() { return testutil::clover_odd_spec(); }

std::vector<token> ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) { return testutil::random_ids(n, vocab, seed); }

}  // namespace

TEST_CASE("preview pass equals the independent reference (prefix lengths 0..5+, mask rows, coresets)") {
    for (auto spec : {clover_tiny(), clover_odd()}) {
        auto path = testutil::synth_file("d_" + spec.preset + ".gguf", spec);
        rt_model m(load(path), {2});
        const token mask = token(m.hp().mask_token_id);
        for (std::int64_t prefix : {1, 2, 5, 40}) {
            for (std::int64_t C : {0, 1, 3, 100}) {
                CAPTURE(spec.preset); CAPTURE(prefix); CAPTURE(C);
                auto pre = ids(prefix, spec.n_vocab - 7, 10 + prefix);
                std::vector<token> block = ids(9, spec.n_vocab - 7, 20 + C);
                block[1] = block[4] = block[8] = mask;
                auto s = m.new_session({.ctx = 64, .kv_f16 = false});  // the reference keeps K/V in full precision
                std::vector<float> tmp, ours;
                m.commit(s, pre, logits_rows::none, tmp);
                m.preview(s, block, C, ours);
                ref::model r(path);
                for (token t : pre) r.step(t);
                auto theirs = r.preview(block, C);
                std::vector<float> flat;
                for (auto& row : theirs) flat.insert(flat.end(), row.begin(), row.end());
                REQUIRE(flat.size() == ours.size());
                CHECK(testutil::max_abs_diff(ours.data(), flat.data(), flat.size()) / testutil::max_abs(flat) < 1e-5f);
            }
        }
    }
}

TEST_CASE("the preview pass leaves the session bit-identical; C >= E equals plain routing") {
    auto path = testutil::synth_file("d_odd.gguf", clover_odd());
    rt_model m(load(path), {2});
    auto s = m.new_session({.ctx = 64});
    std::vector<float> tmp, a, b, c;
    m.commit(s, ids(17, 290, 3), logits_rows::none, tmp);
    auto before = m.new_session({.ctx = 64});
    m.copy_state(before, s);
    std::vector<token> block(12, token(m.hp().mask_token_id));
    block[0] = 5;
    m.preview(s, block, 0, a);
    CHECK(m.same_state(s, before));
    m.preview(s, block, m.hp().n_expert, b);
    m.preview(s, block, m.hp().n_expert + 7, c);
    CHECK(a == b);
    CHECK(a == c);
    CHECK(m.same_state(s, before));
    // And a commit after previews continues exactly as one without them.
    auto fresh = m.new_session({.ctx = 64});
    m.copy_state(fresh, before);
    std::vector<float> l1, l2;
    std::vector<token> next = {7, 8, 9};
    m.commit(s, next, logits_rows::all, l1);
    m.commit(fresh, next, logits_rows::all, l2);
    CHECK(l1 == l2);
}

TEST_CASE("verify + rollback leaves exactly the state a commit of the kept rows would") {
    auto path = testutil::synth_file("d_odd.gguf", clover_odd());
    rt_model m(load(path), {2});
    auto prefix = ids(9, 290, 4), drafted = ids(7, 290, 5);
    for (std::int64_t keep : {0, 1, 4, 7}) {
        CAPTURE(keep);
        auto s = m.new_session({.ctx = 32});
        auto t = m.new_session({.ctx = 32});
        std::vector<float> tmp, vl;
        m.commit(s, prefix, logits_rows::none, tmp);
        m.commit(t, prefix, logits_rows::none, tmp);
        m.verify(s, drafted, vl);
        m.rollback(s, keep);
        for (std::int64_t i = 0; i < keep; ++i) {  // AR: one commit per row
            std::vector<token> one = {drafted[i]};
            m.commit(t, one, logits_rows::last, tmp);
            // Verify rows are computed exactly as single-row AR steps.
            CHECK(std::equal(tmp.begin(), tmp.end(), vl.begin() + i * m.n_vocab()));
        }
        CHECK(s.n_past() == t.n_past());
        CHECK(m.same_state(s, t));
    }
}

TEST_CASE("self-speculative greedy output is identical to AR greedy output on 24 prompts") {
    auto path = testutil::synth_file("d_tiny.gguf", clover_tiny());
    rt_model m(load(path), {2});
    decode::generate_options o;
    o.max_tokens = 40;
    o.ignore_eos = true;
    for (int p = 0; p < 24; ++p) {
        CAPTURE(p);
        auto prompt = ids(1 + p % 7, 500, 100 + p);
        std::vector<token> a, b;
        auto s1 = m.new_session({.ctx = 128});
        decode::generate<decode::ar>(m, s1, prompt, o, [&](token t) { a.push_back(t); return true; });
        auto s2 = m.new_session({.ctx = 128});
        auto st = decode::generate(m, s2, prompt, o, [&](token t) { b.push_back(t); return true; },
                                   decode::self_speculative{.block = 2 + p % 9});
        CHECK(a == b);
        CHECK(st.verify_passes > 0);
    }
}

TEST_CASE("LowConfidence invariants: >=1 token per pass, <= B passes per block, EOG truncates") {
    auto path = testutil::synth_file("d_tiny.gguf", clover_tiny());
    rt_model m(load(path), {2});
    for (float tau : {0.95f, 0.5f, 0.0f}) {
        for (std::int64_t B : {1, 4, 32}) {
            CAPTURE(tau); CAPTURE(B);
            decode::generate_options o;
            o.max_tokens = 50;
            o.ignore_eos = true;
            std::vector<token> out;
            auto s = m.new_session({.ctx = 128});
            auto st = decode::generate(m, s, std::vector<token>{1, 2, 3}, o, [&](token t) { out.push_back(t); return true; },
                                       decode::low_confidence{.block = B, .threshold = tau});
            CHECK(st.tokens == 50);
            CHECK(out.size() == 50);
            CHECK(st.preview_passes <= st.tokens);               // at least one token per pass
            CHECK(st.commit_passes == 1 + (50 + B - 1) / B);     // prompt + one per block
            if (tau == 0.0f) CHECK(st.preview_passes == st.commit_passes - 1);  // everything in one pass
            CHECK(s.n_past() == 3 + 50);
            for (token t : out) CHECK(t != m.hp().mask_token_id);
            // End-of-generation: make the 7th generated token an EOG id; generation ends there.
            decode::generate_options e = o;
            e.ignore_eos = false;
            e.eog = {out[6]};
            std::vector<token> cut;
            auto s2 = m.new_session({.ctx = 128});
            auto st2 = decode::generate(m, s2, std::vector<token>{1, 2, 3}, e, [&](token t) { cut.push_back(t); return true; },
                                        decode::low_confidence{.block = B, .threshold = tau});
            CHECK(st2.stop_reason == "eog");
            REQUIRE(cut.size() <= 6);
            CHECK(std::find(cut.begin(), cut.end(), out[6]) == cut.end());
            CHECK(s2.n_past() <= 3 + 7);  // the block is committed only up to the EOG row
        }
    }
}

TEST_CASE("files without the block-diffusion tensors refuse diffusion, naming what is missing") {
    auto causal = testutil::synth_file("d_causal.gguf", synth::preset("tiny"));
    rt_model a(load(causal), {1});
    CHECK(a.diffusion_unavailable().find("not a clover_moe file") != std::string::npos);
    auto src = testutil::synth_file("d_src.gguf", clover_tiny());
    io::gguf_file f(src);
    io::gguf_writer w;
    for (const auto& [k, v] : f.metadata()) if (k != "general.alignment") w.set(k, v);
    for (const auto& t : f.tensors())
        if (t.name != "blk.1.ssm_bd_history_c")
            w.add_tensor_bytes(t.name, t.type, std::vector<std::int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), {t.data, t.nbytes});
    auto path = testutil::tmp("d_missing.gguf");
    w.write(path);
    rt_model m(load(path), {1});
    auto s = m.new_session({.ctx = 16});
    std::vector<float> lg;
    std::vector<token> p = {1, 2};
    m.commit(s, p, logits_rows::last, lg);  // causal use still works
    try {
        m.preview(s, p, 0, lg);
        FAIL("expected an error");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("blk.1.ssm_bd_history_c") != std::string::npos);
    }
    decode::generate_options o;
    CHECK_THROWS_AS(decode::generate(m, s, p, o, {}, decode::low_confidence{}), error);
}
