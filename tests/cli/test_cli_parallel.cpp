// `clover generate --parallel N` and `clover bench --parallel N / --trace` (the execution-core
// surface added to cli.md): outputs in input order, equal to one sequence at a time; the trace
// prints one JSON line per pass kind with one read-back each.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "../common/test_util.hpp"
#include "cli_run.hpp"

namespace {

clitest::result run_par(const std::string& args) { return clitest::run(args, 120, "cli_par_err.txt"); }

std::vector<std::string> lines(const std::string& s) {
    std::vector<std::string> v;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
}

const std::string model = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";

}  // namespace

TEST_CASE("generate --parallel: one line per prompt in input order, equal to each prompt alone") {
    const std::vector<std::string> prompts = {"10,20,30", "5", "7,8,9,10,11,12,13,14,15", "100,200", "42,43,44"};
    const std::string file = testutil::tmp("par_prompts.txt");
    {
        std::ofstream f(file);
        for (const auto& p : prompts) f << p << "\n";
    }
    for (const char* dec : {"ar", "diffusion", "speculative"}) {
        CAPTURE(dec);
        const std::string common = " -m " + model + " -n 12 --greedy --ignore-eos -t 2 --decoder " + dec;
        auto par = run_par("generate --ids-file " + file + " --parallel 3" + common);
        REQUIRE(par.status == 0);
        const auto got = lines(par.out);
        REQUIRE(got.size() == prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i) {
            CAPTURE(i);
            auto one = run_par("generate --ids " + prompts[i] + common);
            REQUIRE(one.status == 0);
            CHECK(lines(one.out).at(0) == got[i]);
        }
        CHECK(par.err.find("\"parallel\": 3") != std::string::npos);
    }
    auto bad = run_par("generate --ids 1,2 --parallel 2 -m " + model);
    CHECK(bad.status != 0);
    CHECK(bad.err.find("--ids-file") != std::string::npos);
}

TEST_CASE("ids files: a blank line is refused naming it; a file past the model's context fails at once, clearly") {
    const std::string common = " -m " + model + " -n 4 --greedy -t 2";
    // Output line k answers input line k: a blank line (which used to be skipped, shifting every
    // answer after it) is an error naming the line. Only the end of the file may follow the
    // last newline.
    const std::string blank = testutil::tmp("par_blank.txt");
    std::ofstream(blank) << "10,20\n5\n\n7,8\n";
    auto b = run_par("generate --parallel 2 --ids-file " + blank + common);
    CHECK(b.status == 1);
    CHECK(b.out.empty());
    CHECK(b.err.find("line 3 is blank") != std::string::npos);
    std::ofstream(blank) << "10,20\n5\n  \t\r\n7,8\n";  // white space only is blank too
    CHECK(run_par("generate --parallel 2 --ids-file " + blank + common).err.find("line 3 is blank") != std::string::npos);
    std::ofstream(blank) << "10,20\n5";  // no newline at the end: fine
    auto fine = run_par("generate --parallel 2 --ids-file " + blank + common);
    CHECK(fine.status == 0);
    CHECK(lines(fine.out).size() == 2);

    // A million lines of 3 ids (3M ids; the bundled model's context is 4,096): refused at once
    // with one line naming the limit, instead of a 3M-token session growing to gigabytes.
    const std::string huge = testutil::tmp("ids_million.txt");
    {
        std::ofstream f(huge);
        for (int i = 0; i < 1'000'000; ++i) f << "1,2,3\n";
    }
    struct want {
        std::string cmd, says;
    };
    const std::string out = testutil::tmp("ids_million.f32");
    for (const want& w : {want{"generate --ids-file " + huge + common, "context holds 4096"},
                          want{"logits --ids-file " + huge + " -o " + out + " -t 2 -m " + model, "context of 4096"},
                          want{"generate --parallel 4 --ids-file " + huge + common, "at most 65536"}}) {
        CAPTURE(w.cmd);
        clitest::result r;
        const auto t0 = std::chrono::steady_clock::now();
        r = clitest::run(w.cmd, 60, "cli_par_err.txt");
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(r.status == 1);
        CHECK(r.out.empty());
        CHECK(r.err.find(w.says) != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK(secs < 20);
    }
    // One line past the context: named.
    {
        std::ofstream f(blank);
        f << "1\n";
        for (int i = 0; i < 5000; ++i) f << "1,";
        f << "1\n";
    }
    auto past = run_par("generate --parallel 2 --ids-file " + blank + common);
    CHECK(past.status == 1);
    CHECK(past.err.find("line 2: 5001 ids") != std::string::npos);
}

TEST_CASE("bench --trace: one JSON line per pass kind, one read-back each; bench --parallel names tg<n>x<N>") {
    auto t = run_par("bench --trace --parallel 2 -t 2 -m " + model);
    REQUIRE(t.status == 0);
    const auto l = lines(t.out);
    REQUIRE(l.size() == 4);
    const char* kinds[] = {"prefill", "decode", "preview", "verify"};
    for (int i = 0; i < 4; ++i) {
        CAPTURE(l[std::size_t(i)]);
        CHECK(l[std::size_t(i)].find(std::string("\"pass\":\"") + kinds[i] + "\"") != std::string::npos);
        CHECK(l[std::size_t(i)].find("\"readbacks\":1") != std::string::npos);
        CHECK(l[std::size_t(i)].find("\"passes\":1") != std::string::npos);
        CHECK(l[std::size_t(i)].find("\"primitives_per_layer\":") != std::string::npos);
    }
    auto b = run_par("bench -p 0 -n 4 -r 1 --parallel 3 --json -t 2 -m " + model);
    REQUIRE(b.status == 0);
    CHECK(b.out.find("\"test\":\"tg4x3\"") != std::string::npos);
    CHECK(b.out.find("\"parallel\":3") != std::string::npos);
}
