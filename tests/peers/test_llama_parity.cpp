// The real peer: llama.cpp v0.5.0 (prebuilt, tools/peers/setup.sh) and `clover` run the same
// synthesized qwen35moe files; logits of every position must agree within 1e-4 of max |logit|
// and 32 greedy tokens must be identical. Both engines are driven through their command lines,
// exactly as a user would (clover logits / clover generate vs llama_peer).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

std::string run(const std::string& cmd) {
    std::string out;
    std::FILE* p = popen((cmd + " 2>" + testutil::tmp("peer_stderr.txt")).c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int rc = pclose(p);
    if (rc != 0) {
        std::ifstream e(testutil::tmp("peer_stderr.txt"));
        std::stringstream ss;
        ss << e.rdbuf();
        FAIL("command failed (" << rc << "): " << cmd << "\n" << ss.str());
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
}

std::vector<float> read_f32(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> b((std::istreambuf_iterator<char>(f)), {});
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

std::string ids_string(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
    rng r(seed);
    std::string s;
    for (std::int64_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(r.next() % std::uint64_t(vocab));
    return s;
}

void compare(const std::string& name, const synth::spec& spec, std::int64_t n_prompt) {
    CAPTURE(name);
    const std::string model = testutil::synth_file("peer_" + name + ".gguf", spec);
    const std::string ids = ids_string(n_prompt, spec.n_vocab - 7, std::hash<std::string>{}(name));
    const std::string ours = testutil::tmp("peer_" + name + "_clover.f32");
    const std::string theirs = testutil::tmp("peer_" + name + "_llama.f32");
    run(std::string(CLOVER_CLI) + " logits -m " + model + " --ids " + ids + " -o " + ours);
    const std::string peer_gen = run(std::string(CLOVER_LLAMA_PEER) + " -m " + model + " --ids " + ids + " -o " + theirs + " --gen 32");
    const auto a = read_f32(ours), b = read_f32(theirs);
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() == std::size_t(n_prompt * spec.n_vocab));
    const float rel = testutil::max_abs_diff(a.data(), b.data(), a.size()) / testutil::max_abs(b);
    MESSAGE(name << ": max |logit diff| / max |logit| = " << rel);
    CHECK(rel < 1e-4f);
    const std::string our_gen = run(std::string(CLOVER_CLI) + " generate -m " + model + " --ids " + ids + " -n 32 --greedy --ignore-eos");
    CHECK(our_gen == peer_gen);
}

}  // namespace

TEST_CASE("llama.cpp parity: logits at every position and 32 greedy tokens (F32 weights)") {
    {  // the tiny preset with a small rope base, so every rotary frequency visibly turns
        auto s = synth::preset("tiny");
        s.rope_theta = 100.f;
        compare("tiny", s, 40);
    }
    {  // odd widths, 3 V heads per QK head, conv 3, attention every 3rd layer, tied LM head,
       // and rope sections that leave one frequency unrotated (llama.cpp's 4th stream)
        synth::spec s;
        s.preset = "odd";
        s.n_vocab = 333; s.n_embd = 96; s.n_layer = 7; s.interval = 3;
        s.n_head = 6; s.n_head_kv = 3; s.head_dim = 16; s.n_rot = 12; s.sections = {2, 2, 1, 0};
        s.rope_theta = 500.f;
        s.ssm_conv = 3; s.ssm_d_state = 8; s.ssm_n_group = 2; s.ssm_dt_rank = 6; s.ssm_d_inner = 48;
        s.n_expert = 6; s.n_expert_used = 3; s.n_ff_exp = 24; s.n_ff_shexp = 40;
        s.tie_embeddings = true;
        s.seed = 11;
        compare("odd", s, 77);
    }
    {  // a prompt longer than one GDN chunk (64) and the real head layout (16 QK / 32 V heads)
        synth::spec s;
        s.preset = "wide";
        s.n_vocab = 1000; s.n_embd = 128; s.n_layer = 4; s.interval = 4;
        s.n_head = 8; s.n_head_kv = 2; s.head_dim = 32; s.n_rot = 8; s.sections = {2, 1, 1, 0};
        s.rope_theta = 10000.f;
        s.ssm_conv = 4; s.ssm_d_state = 8; s.ssm_n_group = 16; s.ssm_dt_rank = 32; s.ssm_d_inner = 256;
        s.n_expert = 16; s.n_expert_used = 4; s.n_ff_exp = 32; s.n_ff_shexp = 32;
        s.seed = 3;
        compare("wide", s, 150);
    }
}
