// The strict JSON reader and the safetensors header parser: round trips, every malformation
// the issue names (bad JSON header, overlapping or out-of-range offsets, dtype/shape mismatch),
// and a fuzz run — each input either parses into tensors that lie inside the file or gives one
// clover::error; never another exception, a crash or a hang.
#include <doctest/doctest.h>

#include <clover/core/rng.hpp>
#include <clover/io/json.hpp>
#include <clover/io/safetensors.hpp>

#include "../common/test_util.hpp"
#include "hf_fixture.hpp"

using namespace clover;

namespace {

void expect_json_error(std::string_view text, const std::string& needle) {
    CAPTURE(text);
    try {
        io::json::parse(text, "doc");
        FAIL("expected an error containing: " << needle);
    } catch (const error& e) {
        CAPTURE(e.what());
        CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
}

std::vector<hftest::st_entry> two_tensors() {
    std::vector<hftest::st_entry> es;
    es.push_back({"a.weight", "F32", {2, 3}, hftest::encode({1, 2, 3, 4, 5, 6}, dtype::f32)});
    es.push_back({"b", "BF16", {4}, hftest::encode({1.5f, -2, 0.25f, 8}, dtype::bf16)});
    return es;
}

// A file image with a hand-written header (data: `data_bytes` zero bytes).
std::vector<std::byte> with_header(const std::string& header, std::size_t data_bytes) {
    std::vector<std::byte> out(8);
    const std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    for (char c : header) out.push_back(std::byte(c));
    out.resize(out.size() + data_bytes);
    return out;
}

void expect_st_error(const std::vector<std::byte>& file, const std::string& needle) {
    try {
        io::parse_safetensors(file, "x.safetensors");
        FAIL("expected an error containing: " << needle);
    } catch (const error& e) {
        CAPTURE(e.what());
        CHECK(std::string(e.what()).find(needle) != std::string::npos);
        CHECK(std::string(e.what()).find("x.safetensors") != std::string::npos);
    }
}

}  // namespace

TEST_CASE("json: values, escapes, integers and the structure kept in file order") {
    auto v = io::json::parse(R"( {"a": [1, -2, 3.5, 1e3, true, false, null], "s": "x\"\\\/\b\f\n\r\tq\u00e9\ud83d\ude00",
                                  "big": 9223372036854775807, "huge": 18446744073709551616, "o": {}} )",
                             "doc");
    REQUIRE(v.is_object());
    REQUIRE(v.size() == 5);
    CHECK(v.keys[0] == "a");
    const auto& a = *v.find("a");
    REQUIRE(a.items.size() == 7);
    CHECK((a.items[0].integral && a.items[0].i == 1));
    CHECK((a.items[1].integral && a.items[1].i == -2));
    CHECK((!a.items[2].integral && a.items[2].num == 3.5));
    CHECK((!a.items[3].integral && a.items[3].num == 1000.0));
    CHECK((a.items[4].is_bool() && a.items[4].b));
    CHECK(a.items[6].is_null());
    CHECK(v.find("s")->s == "x\"\\/\b\f\n\r\tq\xC3\xA9\xF0\x9F\x98\x80");
    CHECK(v.find("big")->i == 9223372036854775807LL);
    CHECK(!v.find("huge")->integral);  // above int64: a double, never a wrapped integer
    CHECK(v.find("o")->is_object());
}

TEST_CASE("json: malformed documents give one error with the byte offset") {
    expect_json_error("", "unexpected end of input");
    expect_json_error("{", "expected a string key");
    expect_json_error("{\"a\" 1}", "expected ':'");
    expect_json_error("{\"a\":1,}", "expected a string key");
    expect_json_error("[1 2]", "expected ',' or ']'");
    expect_json_error("[01]", "leading zero");
    expect_json_error("[1.]", "digits after '.'");
    expect_json_error("[1e]", "exponent");
    expect_json_error("[-]", "expected a value");
    expect_json_error("\"abc", "unterminated string");
    expect_json_error("\"a\x01\"", "control character");
    expect_json_error("\"\\x\"", "bad escape");
    expect_json_error("\"\\u12\"", "\\u escape");
    expect_json_error("\"\\u12zz\"", "bad hex digit");
    expect_json_error("\"\\ud800\"", "surrogate");
    expect_json_error("\"\\udc00\"", "surrogate");
    expect_json_error("tru", "expected a value");
    expect_json_error("{} x", "trailing characters");
    expect_json_error("{\"k\":1,\"k\":2}", "duplicate key \"k\"");
    std::string many = "{";
    for (int i = 0; i < 40; ++i) many += "\"k" + std::to_string(i) + "\":0,";
    expect_json_error(many + "\"k7\":1}", "duplicate key \"k7\"");
    expect_json_error(std::string(100, '[') + std::string(100, ']'), "nesting too deep");
    try {
        io::json::parse("[0,0,0,0,0,0]", "doc", 64, 4);
        FAIL("expected a value-count error");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("too many values") != std::string::npos);
    }
    try {
        io::json::parse("[1, 2, x]", "cfg.json");
        FAIL("expected an error");
    } catch (const error& e) {
        CHECK(std::string(e.what()) == "cfg.json: invalid JSON at byte 7: expected a value");
    }
}

TEST_CASE("safetensors: round trip, metadata, padding and file order") {
    auto es = two_tensors();
    auto file = hftest::safetensors_bytes(es);
    std::vector<std::pair<std::string, std::string>> meta;
    auto ts = io::parse_safetensors(file, "x.safetensors", &meta);
    REQUIRE(ts.size() == 2);
    REQUIRE(meta.size() == 1);
    CHECK(meta[0].second == "pt");
    CHECK(ts[0].name == "a.weight");
    CHECK(ts[0].type == dtype::f32);
    CHECK(ts[0].shape == std::vector<std::int64_t>{2, 3});
    CHECK(ts[0].nbytes() == 24);
    float x[6];
    std::memcpy(x, ts[0].data, 24);
    CHECK(x[5] == 6.f);
    CHECK(ts[1].type == dtype::bf16);
    CHECK(ts[1].nelements() == 4);
    // Written to disk and mapped.
    const auto path = testutil::tmp("st_roundtrip.safetensors");
    hftest::write_safetensors(path, es);
    io::safetensors_file f(path);
    REQUIRE(f.find("b"));
    CHECK(f.find("b")->data > f.map().data());
    CHECK(f.find("b")->data + 8 == f.map().data() + f.map().size());
    CHECK(f.find("nope") == nullptr);
    // Zero-element tensors and a header padded with NULs are fine.
    auto z = with_header(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}})" + std::string(3, '\0'), 0);
    CHECK(io::parse_safetensors(z, "z").size() == 1);
}

TEST_CASE("safetensors: malformed headers give one error naming the file and tensor") {
    expect_st_error(std::vector<std::byte>(5), "no header length");
    {
        std::vector<std::byte> f(16);
        const std::uint64_t n = 1000;
        std::memcpy(f.data(), &n, 8);
        expect_st_error(f, "runs past the end of the file");
        const std::uint64_t huge = 200'000'000;
        std::memcpy(f.data(), &huge, 8);
        expect_st_error(f, "exceeds the 100 MB limit");
    }
    expect_st_error(with_header("{\"a\": ", 0), "invalid JSON");
    expect_st_error(with_header("[1,2]", 0), "header is a JSON array");
    expect_st_error(with_header(R"({"t": 3})", 0), "tensor 't': entry is a JSON number");
    expect_st_error(with_header(R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", 4), "missing or non-string 'dtype'");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), "'shape'");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [1]}})", 4), "'data_offsets' must be");
    expect_st_error(with_header(R"({"t": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4), "unknown dtype 'F33'");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4), "shape entry");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4), "shape entry");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4), "end before begin");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, -4]}})", 4), "non-negative integer");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4), "run past the data section");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24),
                    "dtype F32 shape [2, 3] needs 24 bytes but data_offsets span 20");
    expect_st_error(with_header(R"({"t": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 4]}})", 8), "needs 8 bytes");
    expect_st_error(with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                12),
                    "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
    expect_st_error(with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                8),
                    "duplicate key \"a\"");
    expect_st_error(with_header(R"({"__metadata__": {"k": 1}})", 0), "__metadata__['k'] is not a string");
    expect_st_error(with_header(R"({"t": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 4]}})", 4),
                    "needs");
    // A file on disk that is not there, or empty.
    CHECK_THROWS_AS(io::safetensors_file(testutil::tmp("st_absent.safetensors")), error);
    hftest::write_text(testutil::tmp("st_empty.safetensors"), "");
    CHECK_THROWS_WITH_AS(io::safetensors_file(testutil::tmp("st_empty.safetensors")), doctest::Contains("no header length"), error);
}

TEST_CASE("safetensors: fuzzed headers either parse into in-range tensors or give a clover::error") {
    auto es = two_tensors();
    es.push_back({"c.weight", "F16", {3, 1, 2}, hftest::encode({1, 2, 3, 4, 5, 6}, dtype::f16)});
    const auto good = hftest::safetensors_bytes(es);
    std::uint64_t hlen = 0;
    std::memcpy(&hlen, good.data(), 8);
    const std::string alphabet = "{}[]\",:0123456789-.eE \\uabcdefFIBUL_tn";
    rng r(2024);
    int parsed = 0, rejected = 0;
    for (int it = 0; it < 30000; ++it) {
        std::vector<std::byte> f = good;
        const int kind = int(r.next() % 6);
        const int edits = 1 + int(r.next() % 4);
        for (int e = 0; e < edits; ++e) {
            const std::size_t pos = 8 + std::size_t(r.next() % hlen);
            switch (kind) {
                case 0: f[pos] = std::byte(r.next() & 0xff); break;                                  // any byte
                case 1: f[pos] = std::byte(alphabet[r.next() % alphabet.size()]); break;             // a JSON-ish byte
                case 2: f.resize(std::size_t(r.next() % f.size())); break;                           // truncation
                case 3: { std::uint64_t n = r.next() % (hlen * 2 + 16); std::memcpy(f.data(), &n, 8); } break;  // header length
                case 4: f.insert(f.begin() + std::ptrdiff_t(std::min(pos, f.size())), std::byte(alphabet[r.next() % alphabet.size()])); break;
                default: if (pos < f.size()) f.erase(f.begin() + std::ptrdiff_t(pos)); break;
            }
            if (f.size() < 8 + hlen) break;
        }
        try {
            auto ts = io::parse_safetensors(f, "fuzz.safetensors");
            for (const auto& t : ts) {
                REQUIRE(t.data >= f.data());
                REQUIRE(t.data + t.nbytes() <= f.data() + f.size());
                REQUIRE(std::uint64_t(t.nelements()) * t.elem_size == t.nbytes());
            }
            ++parsed;
        } catch (const error&) {
            ++rejected;
        }
    }
    MESSAGE("fuzz: " << parsed << " parsed, " << rejected << " rejected");
    CHECK(rejected > 0);
}

TEST_CASE("virtual gguf_file: built from parts, checked like a parsed file") {
    std::vector<float> data = {1, 2, 3, 4, 5, 6};
    auto keep = std::make_shared<std::vector<float>>(data);
    auto tensor = [&](std::string name, std::int64_t ne0, std::int64_t ne1) {
        io::gguf_tensor t;
        t.name = std::move(name);
        t.type = dtype::f32;
        t.n_dims = 2;
        t.ne = {ne0, ne1, 1, 1};
        t.data = reinterpret_cast<const std::byte*>(keep->data());
        return t;
    };
    std::vector<std::pair<std::string, io::gguf_value>> kv;
    io::gguf_value arch;
    arch.type = io::gguf_type::string;
    arch.s = "test";
    kv.emplace_back("general.architecture", arch);
    io::gguf_file f("mem", kv, {tensor("a", 3, 2)}, keep);
    CHECK(f.is_virtual());
    CHECK(f.path() == "mem");
    CHECK(f.get_string("general.architecture") == "test");
    CHECK(f.tensor("a").nbytes == 24);
    CHECK(f.tensor("a").data == reinterpret_cast<const std::byte*>(keep->data()));
    CHECK_THROWS_WITH_AS(io::gguf_file("mem", kv, {tensor("a", 3, 2), tensor("a", 6, 1)}, keep), doctest::Contains("duplicate tensor 'a'"),
                         error);
    auto bad = tensor("b", 3, 2);
    bad.nbytes = 20;
    CHECK_THROWS_WITH_AS(io::gguf_file("mem", kv, {bad}, keep), doctest::Contains("'b': no data or 20 bytes for 24"), error);
    auto none = tensor("c", 0, 2);
    CHECK_THROWS_WITH_AS(io::gguf_file("mem", kv, {none}, keep), doctest::Contains("bad shape"), error);
    auto q = tensor("d", 3, 2);
    q.type = dtype::q8_0;
    CHECK_THROWS_WITH_AS(io::gguf_file("mem", kv, {q}, keep), doctest::Contains("not a whole number of Q8_0 blocks"), error);
    CHECK_THROWS_WITH_AS(io::gguf_file("mem", {kv[0], kv[0]}, {}, keep), doctest::Contains("duplicate metadata key"), error);
}
