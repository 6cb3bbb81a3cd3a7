// Hostile tokenizer.json files (issue 18): nesting that would overflow the stack (a normalizer
// Sequence inside a Sequence, 100,000 levels of arrays in pre_tokenizer), one huge token id
// that would make a 65 KB file cost gigabytes, a FIFO instead of the file. Each gives one
// clover::error naming the file and the problem, quickly.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>

#include "../io/hostile_util.hpp"
#include "clover/tokenizer/byte_level.hpp"
#include "clover/tokenizer/tokenizer.hpp"
#include "../common/test_util.hpp"
#include "tokenizer_test_util.hpp"

using namespace clover;

namespace {

std::string write(const std::string& name, const std::string& body) {
    auto p = toktest::tmp(name);
    std::ofstream(p, std::ios::binary) << body;
    return p;
}

using testutil::error_of;

// The 256 byte tokens as a model.vocab body, ids 0..255.
std::string byte_vocab() {
    std::string v;
    for (unsigned b = 0; b < 256; ++b) {
        std::string t = tok::byte_level::encode(std::string(1, char(b)));
        if (t == "\"" || t == "\\") t = "\\" + t;
        v += (b ? ", \"" : "\"") + t + "\": " + std::to_string(b);
    }
    return v;
}

std::string model_with(const std::string& extra_vocab = "") {
    return R"("model": {"type": "BPE", "vocab": {)" + byte_vocab() + extra_vocab + R"(}, "merges": []})";
}

const std::string byte_level_pre = R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": false})";

void expect_error(const std::string& name, const std::string& body, const std::string& needle, double max_seconds = 5.0) {
    const auto path = write(name, body);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { tokenizer::from_tokenizer_json(path); });
    CAPTURE(name);
    CAPTURE(msg);
    CHECK(hostile::seconds_since(t0) < max_seconds);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("tokenizer.json: a normalizer Sequence nested 100,000 deep is one error, not a stack overflow") {
    std::string n;
    for (int i = 0; i < 100'000; ++i) n += R"({"type": "Sequence", "normalizers": [)";
    n += R"({"type": "NFC"})";
    for (int i = 0; i < 100'000; ++i) n += "]}";
    expect_error("deep_normalizer.json", "{" + model_with() + ", " + byte_level_pre + R"(, "normalizer": )" + n + "}", "nest");
    // 100 levels fit the JSON bound but not the normalizer one.
    std::string m;
    for (int i = 0; i < 100; ++i) m += R"({"type": "Sequence", "normalizers": [)";
    m += R"({"type": "NFC"})";
    for (int i = 0; i < 100; ++i) m += "]}";
    expect_error("nested_normalizer.json", "{" + model_with() + ", " + byte_level_pre + R"(, "normalizer": )" + m + "}",
                 "normalizer Sequence nested deeper than 64 levels");
    // A few levels are fine.
    std::string ok = R"({"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": [{"type": "NFC"}]}]})";
    const auto path = write("nested_ok.json", "{" + model_with() + ", " + byte_level_pre + R"(, "normalizer": )" + ok + "}");
    CHECK_NOTHROW(tokenizer::from_tokenizer_json(path));
}

TEST_CASE("tokenizer.json: 100,000 levels of arrays anywhere (pre_tokenizer, unknown keys) are one error") {
    const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
    expect_error("deep_pre.json", "{" + model_with() + R"(, "pre_tokenizer": )" + deep + "}", "nested deeper than 512 levels");
    expect_error("deep_other.json", "{" + model_with() + ", " + byte_level_pre + R"(, "x": )" + deep + "}",
                 "nested deeper than 512 levels");
    // tokenizer_config.json next to it: the same bound.
    const std::string dir = toktest::tmp("deep_cfg");
    std::filesystem::create_directories(dir);
    write("deep_cfg/tokenizer.json", "{" + model_with() + ", " + byte_level_pre + "}");
    write("deep_cfg/tokenizer_config.json", R"({"chat_template": )" + deep + "}");
    const std::string msg = error_of([&] { tokenizer::from_tokenizer_json(dir); });
    CAPTURE(msg);
    CHECK(msg.find("tokenizer_config.json") != std::string::npos);
    CHECK(msg.find("nested deeper than 512 levels") != std::string::npos);
}

TEST_CASE("tokenizer.json: an id far beyond the entries present is refused, naming it (not gigabytes of padding)") {
    expect_error("huge_id.json", "{" + model_with(R"(, "zz": 15999999)") + ", " + byte_level_pre + "}", "15999999", 2.0);
    const std::string added = R"("added_tokens": [{"id": 15999999, "content": "<x>", "special": true}])";
    expect_error("huge_added_id.json", "{" + added + ", " + model_with() + ", " + byte_level_pre + "}", "15999999", 2.0);
    expect_error("negative_added_id.json",
                 "{" + std::string(R"("added_tokens": [{"id": -3, "content": "<x>", "special": true}])") + ", " + model_with() + ", " +
                     byte_level_pre + "}",
                 "negative id");
    // A few holes (ids with no token) stay allowed: they become unused [PADn] entries.
    const auto path = write("few_holes.json", "{" + model_with(R"(, "zz": 300)") + ", " + byte_level_pre + "}");
    const tok::tokenizer_spec s = tok::read_tokenizer_json_spec(path);
    CHECK(s.tokens.size() == 301);
    CHECK(s.tokens[299] == "[PAD299]");
}

TEST_CASE("tokenizer.json: an added token id that is not a JSON integer is one error (not a float cast to int)") {
    // Found by fuzz_tokenizer_json in CI: 18446744073709551616 (2^64) parses as a double, and
    // converting it to an integer was undefined behaviour.
    for (const std::string id : {"18446744073709551616", "1.8e19", "-1e300", "2.5", "\"3\"", "null", "[1]"}) {
        CAPTURE(id);
        const std::string added = R"("added_tokens": [{"id": )" + id + R"(, "content": "<x>", "special": true}])";
        expect_error("float_added_id.json", "{" + added + ", " + model_with() + ", " + byte_level_pre + "}", "has no integer 'id'");
    }
    expect_error("unsigned_added_id.json",
                 "{" + std::string(R"("added_tokens": [{"id": 18446744073709551615, "content": "<x>"}])") + ", " + model_with() + ", " +
                     byte_level_pre + "}",
                 "too large");
    expect_error("scalar_added.json", "{" + std::string(R"("added_tokens": [7])") + ", " + model_with() + ", " + byte_level_pre + "}",
                 "not an object");
}

TEST_CASE("tokenizer.json as a FIFO: refused at once") {
    const std::string fifo = toktest::tmp("tokenizer.fifo");
    hostile::make_fifo(fifo);
    for (int how = 0; how < 2; ++how) {
        hostile::fifo_release release(fifo);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string msg = error_of([&] {
            if (how == 0) tokenizer::from_tokenizer_json(fifo);
            else tokenizer::from_file(fifo);
        });
        CAPTURE(msg);
        CHECK(hostile::seconds_since(t0) < 2.0);
        CHECK(msg.find("not a regular file") != std::string::npos);
    }
    std::filesystem::remove(fifo);
}
