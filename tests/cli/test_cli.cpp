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
