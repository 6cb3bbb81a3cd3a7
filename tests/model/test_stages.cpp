// A model split by layers into stages (issue 40, item 1), chained by hand in one process: each
// stage maps and keeps state for its own layers only, the hidden rows go from stage to stage as
// host memory, and the last stage's logits are the whole model's bit for bit in exact mode — for
// prefill, decode, preview with a coreset, verify + rollback, checkpoints and a batch of four
// sequences with mixed segments — on the bundled model and a synthesized qwen35moe file.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include <clover/backend/trace.hpp>
#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
using traced_model = model<variants::from_file, backend::trace<backend::cpu>>;

const std::string bundled_st = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";

// One sequence on both sides: the whole model's session and one session per stage.
struct staged_seq {
    session whole;
    std::vector<session> parts;
};

struct stage_step {
    staged_seq* s;
    pass_kind kind;
    std::vector<token> ids;
    std::int64_t logits;
    std::int64_t coreset = -1;
};

// The whole model beside the same file split at `cuts` (stage i: layers [cuts[i], cuts[i+1])).
struct stage_pair {
    rt_model whole;
    std::vector<std::unique_ptr<rt_model>> stages;
    stage_pair(const std::shared_ptr<const io::gguf_file>& f, const std::vector<std::int64_t>& cuts)
        : whole(f, backend::cpu_options{.threads = 1}) {
        for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
            stages.push_back(std::make_unique<rt_model>(f, stage_range{cuts[i], cuts[i + 1]}, backend::cpu_options{.threads = 1}));
    }
    staged_seq open(session_options o = {.ctx = 128}) {
        staged_seq s{whole.new_session(o), {}};
        for (auto& m : stages) s.parts.push_back(m->new_session(o));
        return s;
    }
    // One pass on both sides (exact); the logits of each, compared bit for bit by the caller.
    std::pair<std::vector<float>, std::vector<float>> run(const std::vector<stage_step>& steps) {
        std::vector<pass_request> w;
        for (const stage_step& x : steps) w.push_back({&x.s->whole, x.kind, x.ids, x.logits, x.coreset});
        std::vector<float> want, h, out;
        whole.run(w, want, true);
        for (std::size_t k = 0; k < stages.size(); ++k) {
            std::vector<pass_request> r;
            for (const stage_step& x : steps) r.push_back({&x.s->parts[k], x.kind, x.ids, x.logits, x.coreset});
            stages[k]->run_stage(r, k ? h.data() : nullptr, out, true);
            if (k + 1 < stages.size()) {
                std::int64_t rows = 0;
                for (const stage_step& x : steps) rows += std::int64_t(x.ids.size());
                REQUIRE(std::int64_t(out.size()) == rows * whole.hp().n_embd);  // h of every row goes on
            }
            h.swap(out);
        }
        return {want, h};
    }
    void check(const std::vector<stage_step>& steps) {
        auto [want, got] = run(steps);
        REQUIRE(!want.empty());
        CHECK(testutil::same_bits(want, got));
    }
    // A session operation mirrored on every stage.
    void each(staged_seq& s, const std::function<void(rt_model&, session&)>& f) {
        f(whole, s.whole);
        for (std::size_t k = 0; k < stages.size(); ++k) f(*stages[k], s.parts[k]);
    }
};

std::vector<token> st_ids(std::int64_t n, std::int64_t vocab, std::uint64_t seed) { return testutil::random_ids(n, vocab, seed); }

// Every segment kind, session operations between passes, and a batch of four sequences.
void exercise_stages(stage_pair& p, bool diffusion) {
    const std::int64_t V = p.whole.n_vocab();
    staged_seq a = p.open();
    p.check({{&a, pass_kind::commit, st_ids(9, V, 1), 9}});  // prefill, every row's logits
    p.check({{&a, pass_kind::commit, st_ids(1, V, 2), 1}});  // decode
    if (diffusion) {
        auto block = st_ids(4, V, 3);
        block[1] = block[3] = token(p.whole.hp().mask_token_id);
        p.check({{&a, pass_kind::preview, block, 4, 2}});  // preview with an expert coreset
    }
    p.check({{&a, pass_kind::verify, st_ids(4, V, 4), 4}});
    p.each(a, [](rt_model& m, session& s) { m.rollback(s, 2); });  // replays only each stage's GDN layers
    CHECK(a.whole.n_past() == 12);
    for (const session& s : a.parts) CHECK(s.n_past() == 12);
    p.check({{&a, pass_kind::commit, st_ids(1, V, 5), 1}});
    p.check({{&a, pass_kind::commit, st_ids(1, V, 6), 1}});

    // A checkpoint, a turn taken back, and a second session started from the prefix.
    p.each(a, [](rt_model& m, session& s) { m.checkpoint(s); });
    const std::int64_t at = a.whole.n_past();
    p.check({{&a, pass_kind::commit, st_ids(3, V, 7), 3}});
    p.each(a, [at](rt_model& m, session& s) { m.restore(s, at); });
    p.check({{&a, pass_kind::commit, st_ids(2, V, 8), 2}});
    staged_seq b = p.open();
    p.each(b, [&, k = std::size_t(0)](rt_model& m, session& s) mutable {
        const session& src = k == 0 ? a.whole : a.parts[k - 1];
        ++k;
        m.copy_prefix(s, src, at);
    });
    p.check({{&b, pass_kind::commit, st_ids(2, V, 9), 2}});

    // Prefix sharing as a prefix cache does it, on every stage (one without attention layers
    // too): pages held, the GDN states saved at the checkpoint, a new session started from them.
    const std::int64_t P = p.whole.page_size();
    const std::vector<token> prefix(a.whole.tokens().begin(), a.whole.tokens().begin() + at);
    auto from = [&](rt_model& m, session& src) {
        const auto pages = m.hold_pages(src, 0, (at + P - 1) / P);
        session s = m.new_session_from({.ctx = 128}, pages, prefix, m.save_state(src, at));
        m.drop_pages(src.pool(), pages);
        return s;
    };
    staged_seq c{from(p.whole, a.whole), {}};
    for (std::size_t k = 0; k < p.stages.size(); ++k) c.parts.push_back(from(*p.stages[k], a.parts[k]));
    p.check({{&c, pass_kind::commit, st_ids(2, V, 10), 2}});

    // A batch of four sequences, each at its own position: a prefill chunk, a decode row, a
    // preview block (a commit row for a causal file), verify rows; then a rollback and a decode.
    std::vector<staged_seq> four;
    for (int i = 0; i < 4; ++i) four.push_back(p.open());
    for (int i = 0; i < 4; ++i) p.check({{&four[std::size_t(i)], pass_kind::commit, st_ids(2 + 3 * i, V, 20 + std::uint64_t(i)), 1}});
    auto block = st_ids(5, V, 30);
    block[2] = token(p.whole.hp().mask_token_id);
    p.check({{&four[0], pass_kind::commit, st_ids(4, V, 31), 4},
             {&four[1], pass_kind::commit, st_ids(1, V, 32), 1},
             diffusion ? stage_step{&four[2], pass_kind::preview, block, 5, 3} : stage_step{&four[2], pass_kind::commit, st_ids(1, V, 33), 1},
             {&four[3], pass_kind::verify, st_ids(3, V, 34), 3}});
    p.each(four[3], [](rt_model& m, session& s) { m.rollback(s, 1); });
    p.check({{&four[3], pass_kind::commit, st_ids(1, V, 35), 1}, {&four[0], pass_kind::commit, st_ids(1, V, 36), 1}});
}

}  // namespace

TEST_CASE("stages: 2 and 3 stages chained by hand give the whole model's logits bit for bit (exact)") {
    const auto clover_file = load(bundled_st);
    REQUIRE(read_hparams(*clover_file).n_layer == 8);
    const auto qwen_file = load(testutil::synth_file("st_odd.gguf", testutil::odd_spec()));  // qwen35moe, 5 layers
    for (const auto& cuts : std::vector<std::vector<std::int64_t>>{{0, 4, 8}, {0, 3, 5, 8}}) {
        CAPTURE(cuts.size());
        stage_pair p(clover_file, cuts);
        exercise_stages(p, true);
    }
    for (const auto& cuts : std::vector<std::vector<std::int64_t>>{{0, 2, 5}, {0, 1, 3, 5}}) {
        CAPTURE(cuts.size());
        stage_pair p(qwen_file, cuts);
        exercise_stages(p, false);
    }
}

TEST_CASE("stages: a bad range or a misused stage is one clear error") {
    const auto f = load(testutil::synth_file("st_odd.gguf", testutil::odd_spec()));
    for (auto [a, b] : std::vector<std::pair<int, int>>{{0, 0}, {3, 2}, {-1, 2}, {0, 6}, {5, 6}}) {
        CAPTURE(a);
        CAPTURE(b);
        const std::string want = "stage layers [" + std::to_string(a) + ", " + std::to_string(b) +
                                 ") are not a non-empty range within the model's 5 layers";
        CHECK_THROWS_WITH_AS(rt_model(f, stage_range{a, b}, backend::cpu_options{.threads = 1}), doctest::Contains(want.c_str()), error);
    }
    rt_model s0(f, stage_range{0, 2}, backend::cpu_options{.threads = 1});
    rt_model s1(f, stage_range{2, 5}, backend::cpu_options{.threads = 1});
    CHECK(s0.first_stage());
    CHECK(!s0.last_stage());
    CHECK(s1.last_stage());
    auto a = s0.new_session({.ctx = 16});
    auto b = s1.new_session({.ctx = 16});
    const std::vector<token> t = {1, 2, 3};
    std::vector<float> out, h(3 * 40, 0.5f);
    pass_request ra{&a, pass_kind::commit, t, 1}, rb{&b, pass_kind::commit, t, 1};
    CHECK_THROWS_WITH_AS(s0.run(std::span(&ra, 1), out), doctest::Contains("use run_stage"), error);
    CHECK_THROWS_WITH_AS(s0.run_stage(std::span(&ra, 1), h.data(), out), doctest::Contains("takes no input rows"), error);
    CHECK_THROWS_WITH_AS(s1.run_stage(std::span(&rb, 1), nullptr, out), doctest::Contains("needs the previous stage's rows"), error);
    CHECK_THROWS_WITH_AS(s1.run_stage(std::span(&ra, 1), h.data(), out), doctest::Contains("opened by another model"), error);
    CHECK(a.n_past() == 0);
    CHECK(b.n_past() == 0);
}

TEST_CASE("stages: each stage hands its backend only its own tensors and keeps state only for its layers") {
    const auto f = load(testutil::synth_file("st_odd.gguf", testutil::odd_spec()));  // attention: layers 1, 3
    hparams hp = read_hparams(*f);
    model_weights w = bind_weights(f, hp);
    const std::int64_t L = hp.n_layer;
    const std::span<const std::byte> file = f->map().bytes();
    auto named = [](const std::vector<weight*>& v) {
        std::vector<const weight*> out;
        for (const weight* x : v)
            if (x && x->data) out.push_back(x);
        return out;
    };
    const weight_memory all = detail::stage_memory(f, w, stage_range{0, L}, L);
    CHECK(all.parts.empty());  // the whole model: the whole file
    const std::size_t n_all = named(all.products).size();
    REQUIRE(n_all > 0);
    auto inside = [](const weight& x, const std::vector<std::span<const std::byte>>& parts) {
        return std::any_of(parts.begin(), parts.end(), [&](auto p) { return x.data >= p.data() && x.data < p.data() + p.size(); });
    };
    std::size_t n_sum = 0;
    const std::vector<stage_range> split = {{0, 1}, {1, 3}, {3, 5}};
    std::vector<weight_memory> mems;
    for (const stage_range& r : split) mems.push_back(detail::stage_memory(f, w, r, L));
    for (std::size_t k = 0; k < split.size(); ++k) {
        const stage_range r = split[k];
        CAPTURE(r.first);
        const weight_memory& m = mems[k];
        REQUIRE(!m.parts.empty());
        CHECK(!m.to_huge_pages);  // a stage never moves the whole file
        for (const weight* x : named(m.products)) {
            CAPTURE(x->name);
            bool own = x->name == "output.weight" && r.last == L;
            for (std::int64_t il = r.first; il < r.last; ++il) own |= x->name.rfind("blk." + std::to_string(il) + ".", 0) == 0;
            CHECK(own);
            CHECK(inside(*x, m.parts));
            ++n_sum;
        }
        for (const auto& p : m.parts) CHECK((p.data() >= file.data() && p.data() + p.size() <= file.data() + file.size()));
        CHECK(inside(w.tok_embd, m.parts) == (r.first == 0));
        CHECK(inside(w.output, m.parts) == (r.last == L));
        for (std::size_t j = 0; j < split.size(); ++j)  // no byte of another stage's matrices
            if (j != k)
                for (const weight* x : named(mems[j].products)) CHECK(!inside(*x, m.parts));
    }
    CHECK(n_sum == n_all);

    // State: KV pages and GDN slots only for the stage's layers; indices stay the whole model's.
    rt_model whole(f, backend::cpu_options{.threads = 1});
    std::vector<std::unique_ptr<rt_model>> st;
    for (const stage_range& r : split) st.push_back(std::make_unique<rt_model>(f, r, backend::cpu_options{.threads = 1}));
    std::size_t page_sum = 0, ck_sum = 0;
    for (std::size_t k = 0; k < split.size(); ++k) {
        rt_model& m = *st[k];
        REQUIRE(std::int64_t(m.state_specs().size()) == L);
        for (std::int64_t il = 0; il < L; ++il)
            CHECK((m.state_specs()[std::size_t(il)].k == backend::layer_state_spec::kind::none) ==
                  (il < split[k].first || il >= split[k].last));
        page_sum += m.page_bytes(1);
        ck_sum += m.checkpoint_bytes();
    }
    CHECK(st[0]->page_bytes(1) == 0);  // layer 0 is GDN: the first stage keeps no KV at all
    CHECK(st[0]->checkpoint_bytes() == whole.checkpoint_bytes() / 3);
    CHECK(page_sum == whole.page_bytes(1));
    CHECK(ck_sum == whole.checkpoint_bytes());
    auto s = st[0]->new_session({.ctx = 100});
    std::vector<float> out;
    const std::vector<token> t = {4, 5, 6};
    const pass_request r{&s, pass_kind::commit, t, 1};
    st[0]->run_stage(std::span(&r, 1), nullptr, out, true);
    CHECK(st[0]->hold_pages(s, 0, 1).size() == 1);  // page tables all the same, of pages without bytes
    CHECK(out.size() == std::size_t(3 * hp.n_embd));
}

TEST_CASE("stages: a middle stage's pass runs its own layers only: rows in, h out, one read-back") {
    const auto f = load(testutil::synth_file("st_odd.gguf", testutil::odd_spec()));
    traced_model m(f, stage_range{1, 3}, backend::cpu_options{.threads = 1});
    auto s = m.new_session({.ctx = 16});
    const std::vector<token> t = {7, 8, 9, 10};
    std::vector<float> h = testutil::random_vec(std::size_t(4 * m.hp().n_embd), 3), out;
    const pass_request r{&s, pass_kind::commit, t, 0};
    m.backend().clear();
    m.run_stage(std::span(&r, 1), h.data(), out, true);
    const auto calls = m.backend().calls();
    REQUIRE(!calls.empty());
    CHECK(std::string(calls.front().name) == "write_rows");
    CHECK(calls.front().rows == 4);
    CHECK(calls.front().cols == m.hp().n_embd);
    std::int64_t lo = 99, hi = -1;
    for (const auto& c : calls) {
        CHECK(std::string(c.name) != "embed");
        CHECK(std::string(c.name) != "lm_head");
        if (c.layer >= 0) lo = std::min(lo, c.layer), hi = std::max(hi, c.layer);
    }
    CHECK(lo == 1);
    CHECK(hi == 2);
    CHECK(std::string(calls.back().name) == "read_logits");
    CHECK(calls.back().rows == 4);
    CHECK(calls.back().cols == m.hp().n_embd);
    CHECK(m.backend().readbacks() == 1);
    CHECK(out.size() == std::size_t(4 * m.hp().n_embd));
    CHECK(s.n_past() == 4);
}
