// Writes the generated seeds of tests/fuzz/corpus/ and the HF folder the hf_index target loads
// (tests/fuzz/data/hf_tiny/), from a random-weight model small enough for seeds (< 100 KB):
//
//   cmake --build build-fuzz --target fuzz_make_corpus && build-fuzz/tests/fuzz/fuzz_make_corpus tests/fuzz
//
// Not built by default and not run by CI: the seeds are committed. The hand-written seeds
// (chat outputs, request bodies, tokenizer texts) are plain files in the corpus folders.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <clover/io/gguf.hpp>
#include <clover/io/gguf_writer.hpp>
#include <clover/model/synth.hpp>

#include "../hf/hf_fixture.hpp"

namespace fs = std::filesystem;
using namespace clover;
using ojson = nlohmann::ordered_json;

namespace {

fs::path out_dir;

std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}
void put(const std::string& rel, const std::string& bytes) {
    const fs::path p = out_dir / rel;
    fs::create_directories(p.parent_path());
    hftest::write_text(p, bytes);
    std::printf("%7zu  %s\n", bytes.size(), rel.c_str());
}
void put(const std::string& rel, const std::vector<std::byte>& b) { put(rel, std::string(reinterpret_cast<const char*>(b.data()), b.size())); }

// The smallest model of every tensor kind: 2 layers (one GDN, one attention), 2 experts.
synth::spec tiny(const std::string& arch, dtype t) {
    synth::spec s;
    s.arch = arch;
    s.preset = "fuzz";
    s.n_vocab = 300; s.n_embd = 32; s.n_layer = 2; s.interval = 2;
    s.n_head = 2; s.n_head_kv = 1; s.head_dim = 16; s.n_rot = 8; s.sections = {2, 1, 1, 0};
    s.ssm_conv = 4; s.ssm_d_state = 8; s.ssm_n_group = 1; s.ssm_dt_rank = 2; s.ssm_d_inner = 16;
    s.n_expert = 2; s.n_expert_used = 1; s.n_ff_exp = 16; s.n_ff_shexp = 16;
    s.type = t;
    s.tie_embeddings = true;
    return s;
}

fs::path scratch() {
    static const fs::path d = fs::temp_directory_path() / ("clover-make-corpus-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
}

void gguf_seeds() {
    for (auto [arch, t, name] : {std::tuple{"qwen35moe", dtype::q8_0, "tiny_q8_0.gguf"}, {"clover_moe", dtype::f16, "tiny_clover_f16.gguf"}}) {
        const fs::path p = scratch() / name;
        synth::write(tiny(arch, t), p);
        put(std::string("corpus/gguf/") + name, read(p));
    }
    // Every metadata type, nested arrays, several tensor types, a non-default alignment.
    io::gguf_writer w(64);
    auto scalar = [&](const char* k, io::gguf_type t, std::int64_t i, double f = 0) {
        io::gguf_value v;
        v.type = t; v.i = i; v.f = f;
        w.set(k, v);
    };
    scalar("t.u8", io::gguf_type::u8, 200);
    scalar("t.i8", io::gguf_type::i8, -5);
    scalar("t.u16", io::gguf_type::u16, 60000);
    scalar("t.i16", io::gguf_type::i16, -30000);
    scalar("t.u32", io::gguf_type::u32, 4000000000);
    scalar("t.i32", io::gguf_type::i32, -2000000000);
    scalar("t.u64", io::gguf_type::u64, -1);
    scalar("t.i64", io::gguf_type::i64, -9000000000);
    scalar("t.f32", io::gguf_type::f32, 0, 1.5);
    scalar("t.f64", io::gguf_type::f64, 0, -2.25);
    w.set_bool("t.bool", true);
    w.set_string("general.architecture", "qwen35moe");
    w.set_string_array("t.strs", {"a", "", "\xC3\xA9"});
    w.set_int_array("t.bools", io::gguf_type::boolean, {0, 1, 1});
    w.set_int_array("t.i16s", io::gguf_type::i16, {-1, 2, 3});
    w.set_f32_array("t.f32s", {0.5, -1.0});
    io::gguf_value inner;
    inner.type = io::gguf_type::array; inner.elem = io::gguf_type::u8; inner.ints = {1, 2};
    io::gguf_value nested;
    nested.type = io::gguf_type::array; nested.elem = io::gguf_type::array; nested.arrays = {inner, inner};
    w.set("t.nested", nested);
    auto add = [&](const char* n, dtype t, std::vector<std::int64_t> ne) {
        w.add_tensor(n, t, ne, [](std::span<std::byte> d) { std::fill(d.begin(), d.end(), std::byte{0x3c}); });
    };
    add("f32.weight", dtype::f32, {8, 2});
    add("f16.weight", dtype::f16, {16, 3});
    add("bf16.weight", dtype::bf16, {4, 2, 2});
    add("q8_0.weight", dtype::q8_0, {64, 2});
    add("q4_k.weight", dtype::q4_k, {256, 1});
    add("q6_k.weight", dtype::q6_k, {256, 1, 1, 2});
    const fs::path p = scratch() / "types.gguf";
    w.write(p);
    put("corpus/gguf/all_types.gguf", read(p));
    io::gguf_writer m;
    m.set_string("general.architecture", "clover_moe");
    m.set_u32("clover_moe.block_count", 2);
    put("corpus/gguf/metadata_only.gguf", m.header());
}

// The HF folder of the tiny model: the index target's fixture, and seeds for the others.
void hf_seeds() {
    const fs::path g = scratch() / "hf_src.gguf";
    synth::write(tiny("clover_moe", dtype::bf16), g);
    const fs::path d = scratch() / "hf";
    hftest::hf_options o;
    o.shards = 2;
    o.extras = false;
    hftest::make_hf_folder(g.string(), d, o);
    for (const auto& e : fs::directory_iterator(d)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".safetensors") || name == "config.json") put("data/hf_tiny/" + name, read(e.path()));
    }
    const std::string index = read(d / "model.safetensors.index.json");
    put("corpus/hf_index/two_shards.json", index);
    ojson j = ojson::parse(index);
    ojson one = {{"weight_map", ojson::object()}};
    for (auto& [k, v] : j["weight_map"].items()) one["weight_map"][k] = v;
    one["weight_map"].erase(std::prev(one["weight_map"].end()).key());  // a missing tensor
    put("corpus/hf_index/missing_tensor.json", one.dump(1));
    put("corpus/hf_index/outside.json", R"({"weight_map": {"model.language_model.embed_tokens.weight": "../x.safetensors"}})");
    put("corpus/hf_index/empty.json", R"({"metadata": {"total_size": 0}, "weight_map": {}})");
    put("corpus/hf_config/clover_wrapped.json", read(d / "config.json"));
    put("corpus/tokenizer_json/clover_tiny.json", read(d / "tokenizer.json"));
    put("corpus/safetensors/shard1.safetensors", read(d / "model-00001-of-00002.safetensors"));

    // Other config layouts.
    io::gguf_file gf(g);
    hparams h = read_hparams(gf);
    h.n_vocab = gf.tensor("token_embd.weight").ne[1];
    auto cfg = [&](const char* name, auto&& edit) {
        hftest::hf_options c;
        edit(c);
        put(std::string("corpus/hf_config/") + name, hftest::config_json(gf, h, c));
    };
    cfg("flat.json", [](hftest::hf_options& c) { c.wrapped = false; });
    cfg("old_rope.json", [](hftest::hf_options& c) { c.old_rope_style = true; });
    ojson c = ojson::parse(hftest::config_json(gf, h, {}));
    c["text_config"].erase("layer_types");
    c["text_config"]["full_attention_interval"] = 2;
    c["text_config"]["diffusion_config"] = {{"block_length", 16}, {"mask_id", 299}, {"confidence_threshold", 0.9}};
    c["eos_token_id"] = {298, 297};
    put("corpus/hf_config/interval_diffusion.json", c.dump(2));

    // tokenizer.json variants: ByteLevel with its own regex, merges as pairs, NFC in a Sequence,
    // added tokens that strip, a BOS post-processor.
    ojson t = ojson::parse(read(d / "tokenizer.json"));
    ojson v = t;
    v["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    v["normalizer"] = {{"type", "Sequence"}, {"normalizers", ojson::array({{{"type", "NFC"}}})}};
    ojson pairs = ojson::array();
    for (const auto& m : v["model"]["merges"]) {
        const std::string s = m.get<std::string>();
        const auto sp = s.find(' ', 1);
        pairs.push_back({s.substr(0, sp), s.substr(sp + 1)});
    }
    v["model"]["merges"] = pairs;
    v["added_tokens"][0]["lstrip"] = true;
    v["added_tokens"][1]["rstrip"] = true;
    v["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", ojson::array({{{"SpecialToken", {{"id", v["added_tokens"][0]["content"]}, {"type_id", 0}}}},
                                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}};
    put("corpus/tokenizer_json/bytelevel_pairs.json", v.dump());
    ojson r = t;
    r["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|[A-Za-z]+|\\d|.";
    r["model"]["ignore_merges"] = true;
    r["normalizer"] = nullptr;
    put("corpus/tokenizer_json/own_regex.json", r.dump());
    put("corpus/tokenizer_json/minimal.json",
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}})");
}

void safetensors_seeds() {
    using hftest::st_entry;
    auto f32 = [](std::vector<float> v) { return hftest::encode(v, dtype::f32); };
    put("corpus/safetensors/small.safetensors",
        hftest::safetensors_bytes({{"a.weight", "F32", {2, 3}, f32({1, 2, 3, 4, 5, 6})},
                                   {"b.bias", "BF16", {4}, hftest::encode({1, 2, 3, 4}, dtype::bf16)},
                                   {"c", "F16", {1, 1, 2}, hftest::encode({0.5f, -0.5f}, dtype::f16)}}));
    put("corpus/safetensors/gap.safetensors",
        hftest::safetensors_bytes({{"x", "F32", {3}, f32({1, 2, 3})}, {"y", "F32", {1}, f32({4})}}, 3));
    std::vector<std::byte> bytes8(8, std::byte{1});
    put("corpus/safetensors/int_types.safetensors",
        hftest::safetensors_bytes({{"i64", "I64", {1}, bytes8}, {"u8", "U8", {2, 2}, std::vector<std::byte>(4)},
                                   {"flag", "BOOL", {2}, std::vector<std::byte>(2)}, {"e", "F8_E4M3", {0}, {}}}));
    put("corpus/safetensors/empty.safetensors", hftest::safetensors_bytes({}));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz_make_corpus TESTS_FUZZ_DIR\n");
        return 2;
    }
    out_dir = argv[1];
    gguf_seeds();
    hf_seeds();
    safetensors_seeds();
    fs::remove_all(scratch());
    return 0;
}
