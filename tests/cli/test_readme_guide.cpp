// The README and docs/*.md must only show commands the CLI accepts.
// - Every `build/clover …` line in a code block of the README's "Running the real
//   Clover-35B-A3B-Preview" is run, in order, on small stand-ins: a synthesized clover_moe model,
//   the same model rewritten as a vendor-variant GGUF, and the same model written as an HF folder.
//   Paths and sizes (-t, -c, -n, bench's -p, --port) are substituted; every flag is kept, and `run`
//   gets --seed 1 --ignore-eos so its token count is deterministic. `serve` is started on a free
//   port, asked /health and one completion, and stopped. The section's claims about flags the CLI
//   does not have yet are checked against the CLI too, so the README and the CLI cannot drift apart.
// - Every other `build/clover …` code-block line of README.md and docs/*.md is run the same way.
// - Every `clover SUBCOMMAND …` written as inline code (prose and tables, where the arguments are
//   placeholders such as M or FILE) names a subcommand whose --help lists each of its flags.
// - The README's library example is tests/consumer/project/main.cpp (which the consumer tests
//   build and run), its relative links and those of docs/*.md lead to files, and it stays a
//   guide (at most 450 lines; the rest belongs in docs/).
#include <doctest/doctest.h>

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <clover/model/synth.hpp>

#include "../common/test_util.hpp"
#include "../hf/hf_fixture.hpp"
#include "cli_run.hpp"

namespace {

namespace fs = std::filesystem;
const std::string guide_title = "## Running the real Clover-35B-A3B-Preview";

std::string read_text(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The guide section of README.md: from its heading to the next "## " heading.
std::string guide_section() {
    const std::string readme = read_text(fs::path(CLOVER_SOURCE_DIR) / "README.md");
    const auto begin = readme.find(guide_title + "\n");
    REQUIRE_MESSAGE(begin != std::string::npos, "README.md has no section '" << guide_title << "'");
    const auto end = readme.find("\n## ", begin + guide_title.size());
    return readme.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The `build/clover` lines inside the section's code blocks, without "build/clover " and
// without a trailing "  # comment".
std::vector<std::string> guide_commands(const std::string& section) {
    std::vector<std::string> out;
    std::istringstream is(section);
    bool in_code = false;
    for (std::string line; std::getline(is, line);) {
        if (line.starts_with("```")) {
            in_code = !in_code;
            continue;
        }
        if (!in_code || !line.starts_with("build/clover ")) continue;
        line = line.substr(13);
        if (const auto c = line.find("  #"); c != std::string::npos) line.resize(c);
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out.push_back(line);
    }
    return out;
}

struct stand_ins {
    std::string canonical, vendor, hf_dir, out;
};

// The guide's paths become the stand-ins; sizes become small ones. Flags stay as written.
std::string substitute(std::string cmd, const stand_ins& s) {
    const std::pair<std::string, std::string> paths[] = {
        {"models/vendor/Clover-35B-A3B-Preview-Q4_K_M.gguf", s.vendor},
        {"models/clover-35b-a3b-q4_k_m.gguf", s.out},
        {"models/Clover-35B-A3B-Preview", s.hf_dir},
        {"models/clover-small.gguf", s.canonical},
    };
    for (const auto& [from, to] : paths)
        for (std::size_t at = cmd.find(from); at != std::string::npos; at = cmd.find(from, at + to.size()))
            cmd.replace(at, from.size(), to);
    cmd = std::regex_replace(cmd, std::regex(R"((^| )(-t|--threads) [0-9]+)"), "$1$2 2");
    cmd = std::regex_replace(cmd, std::regex(R"((^| )(-c|--ctx-size) [0-9]+)"), "$1$2 256");
    cmd = std::regex_replace(cmd, std::regex(R"((^| )(-n|--n-predict|--n-gen) [0-9]+)"), "$1$2 4");
    cmd = std::regex_replace(cmd, std::regex(R"((^| )(-p|--n-prompt) [0-9]+( |$))"), "$1$2 16$3");
    cmd = std::regex_replace(cmd, std::regex(R"((^| )--port [0-9]+)"), "$1--port 0");
    // The stand-in's weights are random and `run` samples with a random seed by default, so an
    // end-of-generation token may come before -n is reached (CI once stopped at 3 of 4 tokens):
    // a fixed seed and --ignore-eos make the token count the check below reads deterministic.
    if (cmd.starts_with("run ")) cmd += " --seed 1 --ignore-eos";
    return cmd;
}

// Starts `clover serve` (args), waits for its address, asks /health and one completion, stops it.
void check_serve(const std::string& args) {
    const std::string err_path = testutil::tmp("guide_serve_err.txt"), pid_path = testutil::tmp("guide_serve_pid.txt");
    fs::remove(err_path);
    const std::string cmd = "timeout 60 " + std::string(CLOVER_CLI) + " " + args + " 2>" + err_path +
                            " </dev/null >/dev/null & echo $! > " + pid_path;
    REQUIRE(std::system(cmd.c_str()) == 0);
    long pid = 0;
    std::ifstream(pid_path) >> pid;
    REQUIRE(pid > 0);
    int port = 0;
    std::string err;
    for (int i = 0; i < 1000 && port == 0; ++i) {  // up to 20 s
        err = read_text(err_path);
        if (const auto at = err.find("http://127.0.0.1:"); at != std::string::npos) port = std::atoi(err.c_str() + at + 17);
        else if (::kill(pid_t(pid), 0) != 0) break;  // exited: a refused flag, say
        else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CAPTURE(err);
    REQUIRE_MESSAGE(port > 0, "serve did not start");
    httplib::Client cli("127.0.0.1", port);
    auto health = cli.Get("/health");
    CHECK((health && health->status == 200));
    auto done = cli.Post("/v1/completions", R"({"prompt": "def f(x):", "max_tokens": 3})", "application/json");
    CHECK((done && done->status == 200));
    ::kill(pid_t(pid), SIGTERM);  // the `timeout` wrapper passes it on
    for (int i = 0; i < 500 && ::kill(pid_t(pid), 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

bool help_lists(const std::string& command, const std::string& flag) {
    const auto r = clitest::run(command + " --help", 30, "guide_help_err.txt");
    return r.status == 0 && r.out.find(flag) != std::string::npos;
}

stand_ins make_stand_ins(const std::string& tag) {
    auto spec = clover::synth::preset("tiny");
    spec.arch = "clover_moe";
    stand_ins s;
    s.canonical = testutil::synth_file(tag + "_canonical.gguf", spec);
    s.vendor = testutil::tmp(tag + "_vendor.gguf");  // every variant the vendor's file may have
    hftest::rewrite_gguf(s.canonical, s.vendor, {.drop_shared_count = true, .norms_minus_one = true, .a_log = true, .grouped = true});
    s.hf_dir = testutil::tmp(tag + "_hf");
    hftest::make_hf_folder(s.canonical, s.hf_dir);
    s.out = testutil::tmp(tag + "_out.gguf");
    return s;
}

// Runs one `build/clover` line (without "build/clover ") on the stand-ins and checks it succeeded.
void run_command(const std::string& line, const stand_ins& s) {
    const std::string cmd = substitute(line, s);
    CAPTURE(line);
    CAPTURE(cmd);
    CHECK_MESSAGE(cmd.find("models/") == std::string::npos, "a path of the guide has no stand-in in this test");
    if (cmd.starts_with("serve ")) {
        check_serve(cmd);
        return;
    }
    const auto r = clitest::run(cmd, 120, "guide_err.txt", "hello\n");
    CAPTURE(r.err);
    CHECK(r.status == 0);
    if (cmd.starts_with("gguf patch ") || cmd.starts_with("convert ")) CHECK(fs::exists(s.out));
    if (cmd.starts_with("run ") && cmd.find("--chat") == std::string::npos) CHECK(r.err.find("4 tokens") != std::string::npos);
}

// README.md and every docs/*.md, as (path relative to the source tree, text).
std::vector<std::pair<std::string, std::string>> documents() {
    const fs::path root(CLOVER_SOURCE_DIR);
    std::vector<std::pair<std::string, std::string>> out{{"README.md", read_text(root / "README.md")}};
    std::vector<std::string> docs;
    if (fs::is_directory(root / "docs"))
        for (const auto& e : fs::directory_iterator(root / "docs"))
            if (e.path().extension() == ".md") docs.push_back("docs/" + e.path().filename().string());
    std::sort(docs.begin(), docs.end());
    for (const auto& d : docs) out.emplace_back(d, read_text(root / d));
    return out;
}

// The text outside ``` code blocks, lines joined by "\n".
std::string prose(const std::string& text) {
    std::string out;
    std::istringstream is(text);
    bool in_code = false;
    for (std::string line; std::getline(is, line);) {
        if (line.starts_with("```")) in_code = !in_code;
        else if (!in_code) out += line + "\n";
    }
    return out;
}

// Inline code spans that start with "clover " (prose and table cells; `\|` is a table's |).
std::vector<std::string> clover_spans(const std::string& text) {
    std::vector<std::string> out;
    const std::string p = prose(text);
    for (std::size_t a = p.find('`'); a != std::string::npos;) {
        const std::size_t b = p.find('`', a + 1);
        if (b == std::string::npos) break;
        std::string span = p.substr(a + 1, b - a - 1);
        if (span.starts_with("clover ") && span.find('\n') == std::string::npos) {
            for (std::size_t at; (at = span.find("\\|")) != std::string::npos;) span.replace(at, 2, "|");
            out.push_back(span);
        }
        a = p.find('`', b + 1);
    }
    return out;
}

// A span's subcommand ("run", "gguf patch", …; "" when a flag or nothing follows "clover") and
// the flags it names (brackets and trailing punctuation stripped; "--x=v" gives "--x").
std::pair<std::string, std::vector<std::string>> parse_span(const std::string& span) {
    std::istringstream is(span.substr(7));
    std::vector<std::string> words;
    for (std::string w; is >> w;) words.push_back(w);
    std::string sub;
    std::size_t i = 0;
    if (!words.empty() && std::isalpha(static_cast<unsigned char>(words[0][0]))) {
        sub = words[0];
        i = 1;
        if (sub == "gguf" && words.size() > 1 && std::isalpha(static_cast<unsigned char>(words[1][0]))) sub += " " + words[i++];
    }
    std::vector<std::string> flags;
    static const std::regex flag_re(R"(^[\[(]*(--?[A-Za-z][A-Za-z0-9-]*)[\]),;.:=]*.*$)");
    for (; i < words.size(); ++i) {
        std::smatch m;
        if (std::regex_match(words[i], m, flag_re)) flags.push_back(m[1]);
    }
    return {sub, flags};
}

// Whether a --help text lists `flag` as a flag of its own (CLI11 writes "-m,--model TEXT").
bool help_has_flag(const std::string& help, const std::string& flag) {
    for (std::size_t at = help.find(flag); at != std::string::npos; at = help.find(flag, at + 1)) {
        const char before = at == 0 ? ' ' : help[at - 1];
        const char after = at + flag.size() < help.size() ? help[at + flag.size()] : ' ';
        if ((before == ' ' || before == ',' || before == '[') && (after == ' ' || after == ',' || after == '=' ||
                                                                   after == '\n' || after == ']'))
            return true;
    }
    return false;
}

}  // namespace

TEST_CASE("README guide: every clover command of 'Running the real Clover-35B-A3B-Preview' runs") {
    const std::string section = guide_section();
    const auto commands = guide_commands(section);
    // The extraction found the guide's commands (a README edit that hides them fails here).
    for (const char* sub : {"gguf info ", "gguf patch ", "convert ", "run ", "serve ", "bench "}) {
        CAPTURE(sub);
        CHECK(std::count_if(commands.begin(), commands.end(), [&](const std::string& c) { return c.starts_with(sub); }) >= 1);
    }
    // The settings that matter for the real model are shown in a command, not only in prose.
    for (const char* flag : {" -t ", " -c ", " -n ", "--decoder diffusion", "--decoder speculative", "--block ", "--threshold ",
                             "--coreset ", "--parallel ", "--batch-tokens ", "--ctk ", "--type q4_k_m", "--v-heads grouped"}) {
        CAPTURE(flag);
        CHECK(std::any_of(commands.begin(), commands.end(), [&](const std::string& c) { return c.find(flag) != std::string::npos; }));
    }

    const stand_ins s = make_stand_ins("guide");
    fs::remove(s.out);
    for (const auto& line : commands) run_command(line, s);
}

TEST_CASE("README guide: the serving flags that matter are there, and what it says of flags not there yet matches the CLI") {
    const std::string section = guide_section();
    const auto commands = guide_commands(section);
    const auto serve = std::find_if(commands.begin(), commands.end(), [](const std::string& c) { return c.starts_with("serve "); });
    REQUIRE(serve != commands.end());
    // --cache-ram: the prefix cache's budget, a setting that matters for a long conversation.
    CHECK(help_lists("serve", "--cache-ram"));
    CHECK(serve->find("--cache-ram") != std::string::npos);
    // --n-cpu-moe: the guide says it is refused today; when it is accepted, the guide must show it.
    const bool refused_claim = section.find("`clover serve --n-cpu-moe 10` is refused") != std::string::npos;
    const auto r = clitest::run("serve --n-cpu-moe 10 --port 0 -m /nonexistent.gguf", 30, "guide_ncpumoe_err.txt");
    const bool refused = r.status != 0 && r.err.find("not expected") != std::string::npos;
    CAPTURE(r.err);
    CHECK(refused == refused_claim);
    if (!refused)
        CHECK(std::any_of(commands.begin(), commands.end(), [](const std::string& c) { return c.find("--n-cpu-moe") != std::string::npos; }));
}

TEST_CASE("README and docs/: every other `build/clover` line of a code block runs") {
    const std::string guide = guide_section();
    const auto guide_cmds = guide_commands(guide);
    std::set<std::string> seen(guide_cmds.begin(), guide_cmds.end());  // run by the test above
    std::vector<std::pair<std::string, std::string>> todo;             // (file, command)
    std::size_t in_docs = 0;
    for (const auto& [name, text] : documents()) {
        std::string t = text;
        if (name == "README.md") t.replace(t.find(guide), guide.size(), "");
        for (const auto& c : guide_commands(t)) {
            if (name != "README.md") ++in_docs;
            if (seen.insert(c).second) todo.emplace_back(name, c);
        }
    }
    // The extraction sees docs/ (a docs/ page that shows commands but is not read fails here).
    CHECK(in_docs >= 1);
    CHECK(std::any_of(todo.begin(), todo.end(), [](const auto& t) { return t.second.starts_with("serve "); }));
    const stand_ins s = make_stand_ins("docs");
    fs::copy_file(s.canonical, s.out, fs::copy_options::overwrite_existing);  // the guide's converted file
    for (const auto& [name, line] : todo) {
        CAPTURE(name);
        run_command(line, s);
    }
}

TEST_CASE("README and docs/: every `clover SUBCOMMAND ...` in the text is a subcommand whose --help lists its flags") {
    std::map<std::string, std::string> help;  // subcommand -> its --help ("" when refused)
    std::size_t spans = 0, flags = 0;
    for (const auto& [name, text] : documents()) {
        for (const auto& span : clover_spans(text)) {
            const auto [sub, fl] = parse_span(span);
            if (sub.empty()) continue;
            ++spans;
            if (!help.count(sub)) {
                const auto r = clitest::run(sub + " --help", 30, "guide_help_err.txt");
                help[sub] = r.status == 0 ? r.out : "";
            }
            CAPTURE(name);
            CAPTURE(span);
            CHECK_MESSAGE(!help[sub].empty(), "`clover " << sub << " --help` fails: not a subcommand");
            for (const auto& f : fl) {
                CAPTURE(f);
                ++flags;
                CHECK(help_has_flag(help[sub], f));
            }
        }
    }
    // The README's command table alone names a dozen such commands with their flags.
    CHECK(spans >= 12);
    CHECK(flags >= 30);
    // The parsing itself, on the forms the tables use.
    CHECK(parse_span("clover gguf patch IN OUT [--v-heads auto|grouped]") ==
          std::pair<std::string, std::vector<std::string>>{"gguf patch", {"--v-heads"}});
    CHECK(parse_span("clover logits -m M --ids 1,2,3 -o OUT.f32").second == std::vector<std::string>{"-m", "--ids", "-o"});
    CHECK(help_has_flag("  -m,--model TEXT\n  --ctk TEXT", "--ctk"));
    CHECK_FALSE(help_has_flag("  --ctk-x TEXT", "--ctk"));
}

TEST_CASE("README: the library example is the tested consumer program; links resolve; it stays a guide") {
    const fs::path root(CLOVER_SOURCE_DIR);
    const std::string readme = read_text(root / "README.md");
    // The first C++ block of "## Using the library" is tests/consumer/project/main.cpp, word for word.
    const auto lib = readme.find("\n## Using the library\n");
    REQUIRE(lib != std::string::npos);
    const auto c0 = readme.find("```cpp\n", lib);
    REQUIRE(c0 != std::string::npos);
    const auto c1 = readme.find("\n```\n", c0);
    REQUIRE(c1 != std::string::npos);
    const std::string shown = readme.substr(c0 + 7, c1 + 1 - (c0 + 7));
    CHECK(shown == read_text(root / "tests/consumer/project/main.cpp"));
    // Relative links of README.md and docs/*.md lead to files or folders of the source tree.
    static const std::regex link(R"(\]\(([^)\s#]+)(#[^)]*)?\))");
    std::size_t links = 0;
    for (const auto& [name, text] : documents()) {
        const std::string p = prose(text);
        for (auto it = std::sregex_iterator(p.begin(), p.end(), link); it != std::sregex_iterator(); ++it) {
            const std::string target = (*it)[1];
            if (target.find("://") != std::string::npos || target.starts_with("mailto:")) continue;
            ++links;
            CAPTURE(name);
            CAPTURE(target);
            CHECK(fs::exists((root / name).parent_path() / target));
        }
    }
    CHECK(links >= 6);  // the README links each docs/ page
    CHECK(std::count(readme.begin(), readme.end(), '\n') <= 450);
}
