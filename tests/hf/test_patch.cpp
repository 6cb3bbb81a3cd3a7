// `clover gguf patch` and the in-memory canonicalisation of vendor-file variants
// (clover-diffusion.md §6). Each variant is made from a canonical synthesized clover_moe file;
// patched back it must give logits bit-identical to the canonical file, rewrite exactly the
// tensors the variant touched (to the canonical bytes) and copy every other tensor byte for
// byte, record what it did, and leave nothing behind when it fails.
#include <doctest/doctest.h>

#include <clover/clover.hpp>
#include <clover/model/file_variants.hpp>

#include "../common/test_util.hpp"
#include "hf_fixture.hpp"

using namespace clover;
namespace fs = std::filesystem;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;

std::vector<float> logits_of(std::shared_ptr<const io::gguf_file> f, std::int64_t vocab) {
    rng r(77);
    std::vector<token> ids;
    for (int i = 0; i < 24; ++i) ids.push_back(token(r.next() % std::uint64_t(vocab)));
    rt_model m(std::move(f), {2});
    auto s = m.new_session({.ctx = 32});
    std::vector<float> l;
    m.commit(s, ids, logits_rows::all, l);
    return l;
}

// No temporary file of `out` ("NAME.XXXXXXXX.partial", io/atomic_file.hpp) is left in its folder.
bool no_temp_left(const std::string& out) {
    const fs::path p(out);
    if (!fs::is_directory(p.parent_path())) return true;
    for (const auto& e : fs::directory_iterator(p.parent_path())) {
        const std::string n = e.path().filename().string();
        if (n.starts_with(p.filename().string() + ".") && n.ends_with(".partial")) return false;
    }
    return true;
}

bool same_bytes(const io::gguf_tensor& a, const io::gguf_tensor& b) {
    return a.type == b.type && a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
}

std::vector<std::string> applied_of(const io::gguf_file& f) {
    return f.get_string_array("clover.patch.applied").value_or(std::vector<std::string>{"<no key>"});
}

struct variant_case {
    const char* name;
    hftest::rewrite_options make;
    patch_options opt;
    std::vector<std::string> applied;
};

// The canonical ("settled") file and a spec per test shape.
struct base {
    std::string synth, settled;
    std::int64_t vocab;
};

base make_base(const std::string& tag, synth::spec s) {
    s.arch = "clover_moe";
    base b;
    b.synth = testutil::synth_file("patch_" + tag + ".gguf", s);
    b.settled = testutil::tmp("patch_" + tag + "_canonical.gguf");
    hftest::rewrite_gguf(b.synth, b.settled, {.settle_a = true});
    b.vocab = s.n_vocab;
    return b;
}

std::vector<variant_case> cases() {
    return {
        {"expert_shared_count missing", {.drop_shared_count = true}, {}, {"expert_shared_count"}},
        {"norms without +1", {.norms_minus_one = true}, {}, {"norm_plus_one"}},
        {"ssm_a as A_log", {.a_log = true}, {}, {"ssm_a_from_a_log"}},
        {"grouped V heads, said by the user", {.grouped = true}, {.v_heads = v_heads_choice::grouped}, {"v_heads_tiled"}},
        {"grouped V heads, said by the file", {.grouped = true, .v_key = "grouped"}, {}, {"v_heads_tiled"}},
        {"all four", {.drop_shared_count = true, .norms_minus_one = true, .a_log = true, .grouped = true}, {.v_heads = v_heads_choice::grouped},
         {"expert_shared_count", "norm_plus_one", "ssm_a_from_a_log", "v_heads_tiled"}},
    };
}

}  // namespace

TEST_CASE("gguf patch: every variant patched back is the canonical file (bit-identical logits and bytes)") {
    synth::spec q8 = synth::preset("tiny");
    q8.type = dtype::q8_0;
    q8.ssm_d_inner = 128;  // V heads of 32 columns: ssm_out's heads are whole Q8_0 blocks
    for (auto [tag, spec] : {std::pair{std::string("odd"), testutil::odd_spec()}, std::pair{std::string("tiny_q8"), q8}}) {
        const base b = make_base(tag, spec);
        const io::gguf_file canon(b.settled);
        const auto want = logits_of(load(b.settled), b.vocab);
        for (const auto& c : cases()) {
            CAPTURE(tag);
            CAPTURE(std::string(c.name));
            const auto var = testutil::tmp("patch_var.gguf"), out = testutil::tmp("patch_out.gguf");
            hftest::rewrite_gguf(b.settled, var, c.make);
            const patch_result r = patch_file(var, out, c.opt);
            CHECK(r.applied == c.applied);
            const io::gguf_file v(var), p(out);
            CHECK(applied_of(p) == c.applied);
            CHECK(p.get_int("clover_moe.expert_shared_count") == 1);
            CHECK(r.bytes == fs::file_size(out));
            CHECK(no_temp_left(out));
            // Tensors: rewritten ones equal the canonical bytes; the rest are the variant's bytes.
            std::size_t changed = 0;
            for (const auto& t : v.tensors()) {
                CAPTURE(t.name);
                const auto& pt = p.tensor(t.name);
                REQUIRE(same_bytes(pt, canon.tensor(t.name)));
                if (!same_bytes(pt, t)) ++changed;
            }
            CHECK(changed <= r.n_changed);
            CHECK(r.n_changed + r.n_copied == v.tensors().size());
            // Metadata: the canonical file's keys with the same values, plus what patch writes.
            for (const auto& [k, val] : canon.metadata()) {
                CAPTURE(k);
                REQUIRE(p.find(k));
                CHECK(p.find(k)->type == val.type);
            }
            CHECK(logits_of(load(out), b.vocab) == want);
            // In memory: the same logits without writing a file.
            std::vector<std::string> applied;
            auto mem = canonicalize(std::make_shared<const io::gguf_file>(var), c.opt, &applied);
            // A file that states its grouped order needs nothing in memory (the key already says it).
            CHECK(applied.empty() == (c.make.v_key == "grouped"));
            const auto got = logits_of(mem, b.vocab);
            if (c.make.grouped) {
                // The heads stay grouped in memory (the layers pair them the HF way): the same math
                // with ssm_out's columns summed in another order.
                CHECK(testutil::max_abs_diff(got.data(), want.data(), want.size()) / testutil::max_abs(want) < 1e-5f);
            } else {
                CHECK(got == want);
            }
        }
    }
}

TEST_CASE("gguf patch: detection says what it found and what it cannot tell") {
    const base b = make_base("odd", testutil::odd_spec());
    const auto r0 = detect_variant(io::gguf_file(b.settled));
    CHECK(!r0.needs_patch());
    CHECK(r0.norm_median_mean > 0.9);
    CHECK(r0.describe().find("variant: canonical") != std::string::npos);
    CHECK(r0.describe().find("values cannot tell tiled from grouped") != std::string::npos);
    const auto var = testutil::tmp("patch_detect.gguf");
    hftest::rewrite_gguf(b.settled, var, {.drop_shared_count = true, .norms_minus_one = true, .a_log = true, .grouped = true});
    const auto r = detect_variant(io::gguf_file(var));
    CHECK(r.needs_patch());
    CHECK(r.missing_shared_count);
    CHECK(r.norms_zero_centred);
    CHECK(r.norm_median_mean < 0.1);
    CHECK(r.ssm_a_is_a_log);
    CHECK(r.n_ssm_a_nonneg > 0);
    CHECK(!r.v_order_stated);  // grouped without the key: invisible
    const std::string d = r.describe();
    CHECK(d.find("zero-centred: the +1 was not folded") != std::string::npos);
    CHECK(d.find("holds A_log") != std::string::npos);
    CHECK(d.find("expert_shared_count is missing") != std::string::npos);
    // Norms that disagree are not decided by the heuristic: reported as mixed, left alone.
    const auto mixed = testutil::tmp("patch_mixed.gguf");
    hftest::rewrite_gguf(b.settled, mixed, {.attn_norms_minus_one = true});
    const auto rm = detect_variant(io::gguf_file(mixed));
    CHECK(rm.norms_mixed);
    CHECK(!rm.norms_zero_centred);
    CHECK(rm.describe().find("mixed, cannot tell") != std::string::npos);
    // Overrides win over detection.
    const auto out = testutil::tmp("patch_override.gguf");
    auto res = patch_file(var, out, {.norms_add_one = false, .ssm_a_from_a_log = false});
    CHECK(res.applied == std::vector<std::string>{"expert_shared_count"});
    CHECK(res.v_order_assumed);  // said on the command line: tiled was assumed
    CHECK(!patch_file(var, out, {.v_heads = v_heads_choice::tiled}).v_order_assumed);
}

TEST_CASE("gguf patch: a patched file needs nothing more; a canonical file is copied as it is") {
    const base b = make_base("odd", testutil::odd_spec());
    const auto var = testutil::tmp("patch_twice_var.gguf"), once = testutil::tmp("patch_once.gguf"), twice = testutil::tmp("patch_twice.gguf");
    hftest::rewrite_gguf(b.settled, var, {.norms_minus_one = true, .a_log = true, .grouped = true, .v_key = "grouped"});
    patch_file(var, once);
    const auto r = patch_file(once, twice);
    CHECK(r.applied.empty());
    CHECK(r.n_changed == 0);
    const io::gguf_file a(once), c(twice);
    CHECK(a.get_string("clover_moe.gdn.v_head_order") == "tiled");
    CHECK(applied_of(c) == std::vector<std::string>{"norm_plus_one", "ssm_a_from_a_log", "v_heads_tiled"});
    for (const auto& t : a.tensors()) CHECK(same_bytes(t, c.tensor(t.name)));
    // The data section is byte-identical to the input's when the layout is the same.
    const auto plain = testutil::tmp("patch_plain.gguf");
    const auto rp = patch_file(b.settled, plain);
    CHECK(rp.applied.empty());
    const io::gguf_file s(b.settled), q(plain);
    CHECK(fs::file_size(plain) - q.data_offset() == fs::file_size(b.settled) - s.data_offset());
    CHECK(q.data_offset() % 4096 == s.data_offset() % 4096);  // same page offset: whole pages copied
    CHECK(std::memcmp(q.map().data() + q.data_offset(), s.map().data() + s.data_offset(), fs::file_size(b.settled) - s.data_offset()) == 0);
}

TEST_CASE("gguf patch: failures leave nothing behind") {
    const base b = make_base("odd", testutil::odd_spec());
    // Output in a folder that does not exist.
    const auto bad_out = testutil::tmp("no_such_dir/out.gguf");
    CHECK_THROWS_WITH_AS(patch_file(b.settled, bad_out), doctest::Contains("cannot create"), error);
    CHECK(no_temp_left(bad_out));
    // The input as its own output.
    CHECK_THROWS_WITH_AS(patch_file(b.settled, b.settled), doctest::Contains("is one of the input files"), error);
    // A truncated input: the reader refuses it before anything is written.
    const auto cut = testutil::tmp("patch_cut.gguf"), out = testutil::tmp("patch_cut_out.gguf");
    fs::copy_file(b.settled, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, fs::file_size(cut) - 100);
    fs::remove(out);
    CHECK_THROWS_AS(patch_file(cut, out), error);
    CHECK(!fs::exists(out));
    CHECK(no_temp_left(out));
    // A norm stored block-quantised cannot be given its +1 losslessly: named, nothing written.
    synth::spec t = synth::preset("tiny");
    t.arch = "clover_moe";
    const auto tiny = testutil::synth_file("patch_tiny_f32.gguf", t);
    const auto q = testutil::tmp("patch_q8norm.gguf");
    {
        io::gguf_file g(tiny);
        io::gguf_writer w;
        for (const auto& [k, v] : g.metadata()) w.set(k, v);
        const auto qb = hftest::encode(hftest::decode(g.tensor("blk.2.attn_norm.weight")), dtype::q8_0);  // outlives write()
        for (const auto& x : g.tensors()) {
            std::vector<std::int64_t> ne(x.ne.begin(), x.ne.begin() + x.n_dims);
            if (x.name == "blk.2.attn_norm.weight") w.add_tensor_bytes(x.name, dtype::q8_0, ne, qb);
            else w.add_tensor_bytes(x.name, x.type, ne, {x.data, x.nbytes});
        }
        w.write(q);
    }
    CHECK_THROWS_WITH_AS(patch_file(q, out, {.norms_add_one = true}), doctest::Contains("'blk.2.attn_norm.weight' is stored as Q8_0"), error);
    CHECK(!fs::exists(out));
    CHECK(no_temp_left(out));
}

TEST_CASE("gguf info: the command reports the variant (when build/clover exists)") {
    const std::string bin = std::string(CLOVER_BINARY_DIR) + "/clover";
    if (!fs::exists(bin)) {
        MESSAGE("build/clover not built: skipping");
        return;
    }
    const base b = make_base("odd", testutil::odd_spec());
    const auto var = testutil::tmp("patch_cli_var.gguf"), out = testutil::tmp("patch_cli_out.gguf"), log = testutil::tmp("patch_cli.log");
    hftest::rewrite_gguf(b.settled, var, {.drop_shared_count = true, .norms_minus_one = true, .a_log = true});
    auto run = [&](const std::string& args) { return WEXITSTATUS(std::system((bin + " " + args + " > " + log + " 2>&1").c_str())); };
    auto text = [&] {
        std::ifstream in(log);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    CHECK(run("gguf info " + var) == 0);
    CHECK(text().find("vendor file with known differences") != std::string::npos);
    CHECK(run("gguf patch " + var + " " + out) == 0);
    CHECK(text().find("expert_shared_count, norm_plus_one, ssm_a_from_a_log") != std::string::npos);
    CHECK(run("gguf info " + out) == 0);
    CHECK(text().find("variant: canonical") != std::string::npos);
    CHECK(text().find("patched before: expert_shared_count norm_plus_one ssm_a_from_a_log") != std::string::npos);
    // The command runs the vendor file directly after fixing it in memory (with a warning).
    const auto a = testutil::tmp("patch_cli_a.f32"), c = testutil::tmp("patch_cli_c.f32");
    CHECK(run("logits -m " + var + " --ids 1,2,3 -o " + a) == 0);
    CHECK(text().find("made canonical in memory") != std::string::npos);
    CHECK(run("logits -m " + b.settled + " --ids 1,2,3 -o " + c) == 0);
    std::ifstream fa(a, std::ios::binary), fc(c, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(fa), {}) == std::string(std::istreambuf_iterator<char>(fc), {}));
    CHECK(run("gguf patch " + var + " " + out + " --v-heads diagonal") != 0);
    CHECK(run("gguf patch " + testutil::tmp("absent.gguf") + " " + out) == 1);
}
