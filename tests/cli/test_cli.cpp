// The clover command on bad input: one clear line on stderr, a non-zero status, never a crash
// or a hang; --help exits 0. And the stable contract of cli.md on good input.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <clover/model/synth.hpp>

#include "../common/test_util.hpp"
#include "cli_run.hpp"

namespace {

using clitest::result;
using clitest::run;

// Exactly one non-empty stderr line, starting with "error:", containing `needle`.
void expect_clean_error(const std::string& args, const std::string& needle) {
    CAPTURE(args);
    const result r = run(args);
    CAPTURE(r.err);
    CHECK(r.status > 0);
    CHECK(r.status != 124);  // not a timeout
    std::size_t lines = 0;
    std::istringstream is(r.err);
    for (std::string l; std::getline(is, l);)
        if (!l.empty() && l.rfind("warning:", 0) != 0) ++lines;
    CHECK(lines == 1);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(r.err.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("bad flags and bad inputs give one clear error line") {
    auto causal = testutil::synth_file("cli_q.gguf", clover::synth::preset("tiny"));
    auto spec = clover::synth::preset("tiny");
    spec.arch = "clover_moe";
    auto clover_file = testutil::synth_file("cli_c.gguf", spec);
    const std::string out = testutil::tmp("cli_out.f32");
    expect_clean_error("", "subcommand");
    expect_clean_error("frobnicate", "frobnicate");
    expect_clean_error("logits --ids 1 -o " + out, "--model");
    expect_clean_error("logits -m /nonexistent.gguf --ids 1 -o " + out, "/nonexistent.gguf: cannot open");
    expect_clean_error("logits -m " + causal + " --ids 1,x,3 -o " + out, "'x' is not a token id");
    expect_clean_error("logits -m " + causal + " --ids 1,99999 -o " + out, "token id 99999");
    expect_clean_error("logits -m " + causal + " --ids , -o " + out, "no token ids");
    expect_clean_error("logits -m " + causal + " --ids 1 --ids-file /x -o " + out, "exactly one of --ids or --ids-file");
    expect_clean_error("logits -m " + causal + " --ids 1 -o /nonexistent-dir/x.f32", "cannot create");
    expect_clean_error("logits -m " + causal + " --ids 1 --block-ids 2,3 -o " + out, "not a clover_moe file");
    expect_clean_error("generate -m " + causal + " --ids 1 -n 0", "-n");
    expect_clean_error("generate -m " + causal + " --ids 1 --decoder magic", "--decoder");
    expect_clean_error("generate -m " + causal + " --ids 1 --decoder diffusion", "cannot run block diffusion");
    expect_clean_error("generate -m " + clover_file + " --ids 1 --threshold 2", "--threshold");
    expect_clean_error("gguf info /nonexistent.gguf", "cannot open");
    expect_clean_error("gguf synth --preset nope -o " + testutil::tmp("x.gguf"), "unknown preset 'nope'");
    expect_clean_error("gguf synth --type q2_k -o " + testutil::tmp("x.gguf"), "--type");
    {
        std::ofstream(testutil::tmp("cli_garbage.gguf")) << "this is not a model";
        expect_clean_error("logits -m " + testutil::tmp("cli_garbage.gguf") + " --ids 1 -o " + out, "bad magic");
    }
}

TEST_CASE("help exits 0; good input follows the cli.md contract") {
    CHECK(run("--help").status == 0);
    CHECK(run("logits --help").status == 0);
    CHECK(run("gguf synth --help").status == 0);
    auto spec = clover::synth::preset("tiny");
    spec.arch = "clover_moe";
    auto path = testutil::synth_file("cli_ok.gguf", spec);
    const std::string out = testutil::tmp("cli_ok.f32");
    auto r = run("logits -m " + path + " --ids 1,2,3 -o " + out);
    CHECK(r.status == 0);
    std::ifstream f(out, std::ios::binary | std::ios::ate);
    CHECK(std::size_t(f.tellg()) == 3 * 512 * sizeof(float));
    r = run("logits -m " + path + " --ids 1,2,3 --block-ids 7,510,510,510 --coreset 2 -o " + out);
    CHECK(r.status == 0);
    std::ifstream f2(out, std::ios::binary | std::ios::ate);
    CHECK(std::size_t(f2.tellg()) == 4 * 512 * sizeof(float));
    for (const char* dec : {"ar", "diffusion", "speculative"}) {
        CAPTURE(dec);
        r = run("generate -m " + path + " --ids 1,2,3 -n 20 --greedy --ignore-eos --decoder " + std::string(dec));
        CHECK(r.status == 0);
        // stdout: ids on one line, comma-separated, nothing else.
        CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
        CHECK(std::count(r.out.begin(), r.out.end(), ',') == 19);
        // last stderr line: one JSON object with the required keys.
        std::string last = r.err.substr(r.err.rfind('{'));
        for (const char* key : {"\"tokens\"", "\"passes\"", "\"preview_passes\"", "\"commit_passes\"", "\"tokens_per_pass\"", "\"seconds\""})
            CHECK(last.find(key) != std::string::npos);
    }
}

// A CUDA build's clover (CLOVER_CUDA=ON) answers --device cuda itself: cuda/tests/cli_device.sh
// checks that build (ctest label cuda).
TEST_CASE("--device: the CPU build runs on the CPU and refuses CUDA with one clear line" * doctest::skip(CLOVER_CLI_HAS_CUDA != 0)) {
    auto path = testutil::synth_file("cli_dev.gguf", clover::synth::preset("tiny"));
    expect_clean_error("bench -p 0 -n 2 -r 1 --device gpu -m " + path, "--device must be auto, cpu, cuda or cuda:N");
    expect_clean_error("bench -p 0 -n 2 -r 1 --device cuda:x -m " + path, "--device must be auto, cpu, cuda or cuda:N");
    for (const char* cmd : {"bench -p 0 -n 2 -r 1", "generate --ids 1,2 -n 2", "serve --port 0", "run -p hi -n 2"}) {
        CAPTURE(cmd);
        expect_clean_error(std::string(cmd) + " --device cuda -m " + path, "this clover was built without CUDA");
    }
    expect_clean_error("logits --ids 1 -o " + testutil::tmp("cli_dev.f32") + " --device cuda:1 -m " + path,
                       "this clover was built without CUDA");
    // auto and cpu run here; --n-cpu-moe is accepted and has no effect on the CPU (a warning).
    const std::string gen = "generate --ids 1,2,3 -n 6 --greedy --ignore-eos -m " + path;
    const result plain = run(gen);
    REQUIRE(plain.status == 0);
    for (const char* dev : {" --device auto", " --device cpu", " --device cpu --n-cpu-moe 2"}) {
        CAPTURE(dev);
        const result r = run(gen + dev);
        CHECK(r.status == 0);
        CHECK(r.out == plain.out);
    }
    CHECK(run(gen + " --n-cpu-moe 2").err.find("warning: --n-cpu-moe has no effect") != std::string::npos);
    const result b = run("bench -p 0 -n 2 -r 1 --json --device cpu -m " + path);
    CHECK(b.status == 0);
    CHECK(b.out.find("\"backend\":\"CPU\"") != std::string::npos);
}

TEST_CASE("bench --decoder diffusion|speculative and --preview: the decoders' tokens/s and one preview pass timed") {
    auto spec = clover::synth::preset("tiny");
    spec.arch = "clover_moe";
    auto path = testutil::synth_file("cli_bench_dec.gguf", spec);
    auto causal = testutil::synth_file("cli_bench_causal.gguf", clover::synth::preset("tiny"));
    auto number = [](const std::string& json, const std::string& key) {
        const auto at = json.find("\"" + key + "\":");
        REQUIRE(at != std::string::npos);
        return std::stod(json.substr(at + key.size() + 3));
    };
    // Threshold 0 makes the diffusion decoder fill a block in one preview pass (then one commit
    // pass): well above AR's one token per pass, which a decoder that did not run would show.
    for (const std::string dec : {"diffusion --threshold 0", "diffusion", "speculative"}) {
        CAPTURE(dec);
        const result r = run("bench -p 0 -n 24 -r 2 --json --block 8 --gen-prompt 5 --decoder " + dec + " -m " + path);
        CAPTURE(r.err);
        CAPTURE(r.out);
        REQUIRE(r.status == 0);
        CHECK(r.out.find("\"test\":\"tg24\"") != std::string::npos);
        CHECK(r.out.find("\"decoder\":\"" + dec.substr(0, dec.find(' ')) + "\"") != std::string::npos);
        CHECK(r.out.find("\"block\":8") != std::string::npos);
        const double tpp = number(r.out, "tokens_per_pass"), ms = number(r.out, "ms_per_pass"), ts = number(r.out, "avg_ts");
        CHECK(tpp > 0.0);
        CHECK(tpp <= 9.0);  // at most a block (+1: the prompt's pass yields a token too)
        if (dec == "diffusion --threshold 0") CHECK(tpp > 2.5);
        // ms per generation pass: the passes' time, so about tokens-per-pass / t/s (the prompt's
        // pass is left out of the one and counted in the other: within a factor of 2 here).
        CHECK(ms > 0.0);
        CHECK(ms < 2.0 * 1e3 * tpp / ts);
        CHECK(ms > 0.25 * 1e3 * tpp / ts);
    }
    const result pv = run("bench -p 0 -n 0 -r 2 --json --preview 16 --coreset 2 -m " + path);
    CAPTURE(pv.err);
    REQUIRE(pv.status == 0);
    CHECK(pv.out.find("\"test\":\"pv16c2\"") != std::string::npos);
    CHECK(pv.out.find("\"tokens_per_pass\":16") != std::string::npos);
    CHECK(pv.out.find("\"coreset\":2") != std::string::npos);
    CHECK(run("bench -p 0 -n 0 -r 1 --preview 8 -m " + path).out.find("pv8 ") != std::string::npos);
    expect_clean_error("bench -p 0 -n 4 --decoder diffusion -m " + causal, "cannot run block diffusion");
    expect_clean_error("bench -p 0 -n 0 --preview 8 -m " + causal, "cannot run block diffusion");
    expect_clean_error("bench -p 0 -n 4 --parallel 2 --decoder diffusion -m " + path, "clover generate --ids-file F --parallel N");
    // Flags no test uses: one warning naming them; the pp test is AR whatever --decoder says.
    const result w = run("bench -p 8 -n 0 -r 1 --json --block 4 --threshold 0.5 --decoder diffusion -m " + path);
    CHECK(w.status == 0);
    CHECK(w.err.find("warning: bench: --block, --threshold have no effect") != std::string::npos);
    CHECK(w.out.find("\"decoder\":\"ar\"") != std::string::npos);
}
