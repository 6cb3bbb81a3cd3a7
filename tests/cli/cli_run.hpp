#pragma once
// Runs the built `clover` command (CLOVER_CLI) with a time limit and the given stdin (none by
// default); captures stdout, stderr and the exit status (-signal when killed). Shared by the CLI
// test files and test_server's `clover run` / `serve` tests.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/test_util.hpp"

namespace clitest {

struct result {
    int status = -1;  // exit code, or -signal
    std::string out, err;
};

inline result run(const std::string& args, int timeout_s = 60, const std::string& err_name = "cli_err.txt",
                  const std::string& input = {}) {
    const std::string err_path = testutil::tmp(err_name);
    std::string in = "/dev/null";
    if (!input.empty()) {
        in = testutil::tmp(err_name + ".in");
        std::ofstream(in) << input;
    }
    const std::string cmd =
        "timeout " + std::to_string(timeout_s) + " " + std::string(CLOVER_CLI) + " " + args + " 2>" + err_path + " <" + in;
    result r;
    std::FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    std::ifstream e(err_path);
    std::stringstream ss;
    ss << e.rdbuf();
    r.err = ss.str();
    return r;
}

}  // namespace clitest
