// Tokenizer pieces that need no peers: UTF-8, the byte map, NFC on known cases, the Qwen
// splitter against PCRE2 running the pattern itself, BPE against the textbook algorithm,
// added tokens, the streaming decoder, and malformed files (one clover::error each).
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <set>

#include "clover/io/gguf_writer.hpp"
#include "clover/tokenizer/streaming_decoder.hpp"
#include "clover/tokenizer/tokenizer.hpp"
#include "../common/test_util.hpp"
#include "tokenizer_test_util.hpp"

using namespace clover;
using toktest::show;

TEST_CASE("utf8: decode, maximal subparts, incomplete tails") {
    namespace u = tok::utf8;
    CHECK(u::is_valid("h\xC3\xA9llo \xE4\xB8\xAD \xF0\x9F\x98\x80"));
    CHECK_FALSE(u::is_valid("\xC0\x80"));          // overlong
    CHECK_FALSE(u::is_valid("\xED\xA0\x80"));      // surrogate
    CHECK_FALSE(u::is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
    CHECK_FALSE(u::is_valid("\xE2\x82"));          // truncated
    // One U+FFFD per maximal subpart (Unicode §3.9 / WHATWG), as TextDecoder gives.
    const std::string R = "\xEF\xBF\xBD";
    CHECK(u::sanitize("a\x80" "b") == "a" + R + "b");
    CHECK(u::sanitize("\xE2\x82" "A") == R + "A");
    CHECK(u::sanitize("\xF0\x9F\x98" "A") == R + "A");
    CHECK(u::sanitize("\xE0\x80\x80") == R + R + R);
    CHECK(u::sanitize("\xED\xA0\x80") == R + R + R);
    CHECK(u::sanitize("\xF0\x80\x80\x80") == R + R + R + R);
    CHECK(u::sanitize("\xC2\x41") == R + "A");
    CHECK(u::sanitize("\xFF\xFE") == R + R);
    CHECK(u::incomplete_tail("ab\xF0\x9F\x98") == 3);
    CHECK(u::incomplete_tail("ab\xF0\x9F") == 2);
    CHECK(u::incomplete_tail("ab\xE4") == 1);
    CHECK(u::incomplete_tail("ab\xE4\xB8\xAD") == 0);
    CHECK(u::incomplete_tail("ab\x80") == 0);
    CHECK(u::incomplete_tail("\xE0\x80") == 0);  // already ill-formed: nothing to wait for
    std::string s;
    for (char32_t cp : {U'a', U'\u00e9', U'\u4e2d', U'\U0001F600', U'\U0010FFFF'}) u::append(s, cp);
    std::vector<char32_t> back;
    for (std::size_t i = 0; i < s.size();) {
        char32_t cp;
        i += std::size_t(u::decode(s, i, cp));
        back.push_back(cp);
    }
    CHECK(back == std::vector<char32_t>{U'a', U'\u00e9', U'\u4e2d', U'\U0001F600', U'\U0010FFFF'});
}

TEST_CASE("byte-level alphabet: 256 distinct printable code points, round trip") {
    std::set<char32_t> seen;
    for (unsigned b = 0; b < 256; ++b) seen.insert(tok::byte_level::code_point_of(static_cast<unsigned char>(b)));
    CHECK(seen.size() == 256);
    CHECK(tok::byte_level::code_point_of(' ') == U'\u0120');   // 'Ġ'
    CHECK(tok::byte_level::code_point_of('\n') == U'\u010A');  // 'Ċ'
    CHECK(tok::byte_level::code_point_of('A') == U'A');
    std::string all;
    for (unsigned b = 0; b < 256; ++b) all += char(b);
    CHECK(tok::byte_level::decode(tok::byte_level::encode(all)) == all);
    CHECK_FALSE(tok::byte_level::decode("\xE4\xB8\xAD").has_value());  // 中 is not in the alphabet
}

TEST_CASE("NFC: composition, ordering, exclusions, Hangul, ill-formed bytes") {
    CHECK(tok::nfc("e\xCC\x81") == "\xC3\xA9");                               // e + acute -> é
    CHECK(tok::nfc("\xE2\x84\xAB") == "\xC3\x85");                            // Angstrom sign -> Å
    CHECK(tok::nfc("s\xCC\x87\xCC\xA3") == "\xE1\xB9\xA9");                   // s + dot above + dot below -> ṩ
    CHECK(tok::nfc("\xE0\xA5\x98") == "\xE0\xA4\x95\xE0\xA4\xBC");            // क़ is excluded: stays decomposed
    CHECK(tok::nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // jamo -> 각
    CHECK(tok::nfc("\xEA\xB0\x80\xE1\x86\xA8") == "\xEA\xB0\x81");            // 가 + jamo T -> 각
    CHECK(tok::nfc("a\xCC\x81\xCC\xB8") == "\xC3\xA1\xCC\xB8");               // reordering keeps the composable mark
    CHECK(tok::nfc("hello, world") == "hello, world");
    CHECK(tok::nfc("\xFF" "e\xCC\x81\x80") == "\xFF\xC3\xA9\x80");            // ill-formed bytes pass through
    std::string s;
    CHECK_FALSE(tok::nfc_append("already NFC: \xC3\xA9 \xE4\xB8\xAD", s));
    CHECK(s.empty());
    // A hostile run of marks in reverse class order is sorted in n log n, not n².
    std::string marks = "a";
    for (int i = 0; i < 100000; ++i) marks += (i % 2) ? "\xCC\x81" : "\xCC\xA3";  // 230, 220 alternating
    auto t0 = std::chrono::steady_clock::now();
    std::string n = tok::nfc(marks);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0);
    CHECK(tok::nfc(n) == n);
}

namespace {

// What PCRE2 says about each class for each code point: bit 0 L, 1 M, 2 N, 3 JS-space, 4 unassigned.
std::vector<std::uint8_t> pcre2_classes() {
    auto compile = [](const std::string& p) {
        int err;
        PCRE2_SIZE off;
        auto* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
        REQUIRE(c != nullptr);
        pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
        return c;
    };
    pcre2_code* re[5] = {compile(R"(^\p{L}$)"), compile(R"(^\p{M}$)"), compile(R"(^\p{N}$)"),
                         compile("^[" + toktest::js_space + "]$"), compile(R"(^\p{Cn}$)")};
    auto* md = pcre2_match_data_create(4, nullptr);
    std::vector<std::uint8_t> out(0x110000, 0);
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        std::string s;
        tok::utf8::append(s, cp);
        for (int k = 0; k < 5; ++k)
            if (pcre2_match(re[k], reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr) > 0) out[cp] |= std::uint8_t(1 << k);
    }
    pcre2_match_data_free(md);
    for (auto* c : re) pcre2_code_free(c);
    return out;
}

}  // namespace

TEST_CASE("pre-tokenizer: the hand-written Qwen splitters equal PCRE2 running the patterns") {
    using namespace tok;
    auto classes = pcre2_classes();
    // Where PCRE2's Unicode (14.0 in Debian 12) knows a code point, it must agree with our
    // tables (node's ICU); the only differences allowed are code points PCRE2 calls unassigned.
    std::vector<char32_t> agree;
    std::size_t newer = 0;
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        unsigned ours = unicode::flags(cp) & (unicode::letter | unicode::mark | unicode::number | unicode::space);
        unsigned theirs = classes[cp] & 15u;
        if (ours == theirs) { agree.push_back(cp); continue; }
        INFO("U+", std::hex, std::uint32_t(cp), ": ours ", ours, ", PCRE2 ", theirs);
        CHECK((classes[cp] & 16u) != 0);
        ++newer;
    }
    MESSAGE("PCRE2 ", PCRE2_MAJOR, ".", PCRE2_MINOR, " and the tables (Unicode ", std::string(unicode_data::unicode_version),
            ") differ on ", newer, " code points, all unassigned in PCRE2's Unicode");

    for (bool marks : {false, true}) {
        auto hand = marks ? pretokenizer::qwen35() : pretokenizer::qwen2();
        auto ref = pretokenizer::regex(toktest::js_semantics(std::string(marks ? qwen35_pattern : qwen2_pattern)), true);
        REQUIRE(ref.type() == pretokenizer::kind::regex);
        std::size_t checked = 0, failures = 0;
        auto compare = [&](const std::string& s) {
            ++checked;
            auto a = hand.split(s), b = ref.split(s);
            if (a != b && failures++ < 10) {
                std::string as, bs;
                for (auto p : a) as += show(p) + " ";
                for (auto p : b) bs += show(p) + " ";
                FAIL_CHECK(show(s), "\n  hand:  ", as, "\n  pcre2: ", bs);
            }
        };
        // Every agreeing code point in the contexts that exercise each alternative.
        for (std::size_t i = 0; i < agree.size(); i += 1) {
            std::string c;
            utf8::append(c, agree[i]);
            compare("x" + c + " " + c + c + "'s " + c + "1\n" + c + "! \r\n" + c + "  " + c);
        }
        // Random strings over the tricky classes.
        std::mt19937 rng(marks ? 2 : 1);
        const std::vector<std::string> atoms = {"a", "Z", "\xC3\xA9", "\xE4\xB8\xAD", "1", "\xD9\xA3", " ", "  ", "\t", "\n", "\r",
                                                "\r\n", "\xC2\xA0", "\xE3\x80\x80", "\xEF\xBB\xBF", "\xC2\x85", "'", "'s", "'LL",
                                                "'re", "!", ".", "\xCC\x81", "\xE0\xA4\xBC", "\xE0\xA5\x8D", "\xF0\x9F\x98\x80",
                                                "\xE2\x80\x8D", "\xEF\xB8\x8F", "\xE2\x80\x8B", "<", "|", ">"};
        for (int t = 0; t < 20000; ++t) {
            std::string s;
            int n = 1 + int(rng() % 24);
            for (int k = 0; k < n; ++k) {
                if (rng() % 8 == 0) utf8::append(s, agree[rng() % agree.size()]);
                else s += atoms[rng() % atoms.size()];
            }
            compare(s);
        }
        MESSAGE(std::string(marks ? "qwen35" : "qwen2"), ": ", checked, " strings split identically");
        CHECK(failures == 0);
    }
}

TEST_CASE("pre-tokenizer: pieces tile any input, including ill-formed UTF-8") {
    std::mt19937 rng(7);
    for (auto pre : {tok::pretokenizer::qwen2(), tok::pretokenizer::qwen35(), tok::pretokenizer::regex(tok::gpt2_pattern)}) {
        for (int t = 0; t < 3000; ++t) {
            std::string s(rng() % 64, '\0');
            for (auto& c : s) c = char(rng());
            std::string joined;
            bool nonempty = true;
            pre.split(s, [&](std::string_view p) { joined += p; nonempty = nonempty && !p.empty(); });
            REQUIRE(joined == s);
            REQUIRE(nonempty);
        }
    }
}

TEST_CASE("BPE: equals the textbook algorithm, short and long pieces") {
    toktest::mini_vocab v;
    std::mt19937 rng(11);
    // Random merges over a 4-letter alphabet, built bottom-up so every merge is well formed.
    std::vector<std::string> pool = {"a", "b", "c", "d"};
    for (int m = 0; m < 60; ++m) {
        std::string x = pool[rng() % pool.size()], y = pool[rng() % pool.size()];
        if (x.size() + y.size() > 12) continue;
        bool dup = false;
        for (auto& [p, q] : v.merges) dup = dup || (p == x && q == y);
        if (dup) continue;
        v.merge(x, y);
        pool.push_back(x + y);
    }
    v.spec.pre = "regex";  // no split: a piece is the whole text
    tokenizer t(v.spec);
    for (int k = 0; k < 2000; ++k) {
        std::size_t n = 1 + rng() % (k % 10 == 0 ? 600 : 40);  // some above the 128-byte array path
        std::string s;
        for (std::size_t i = 0; i < n; ++i) s += char('a' + rng() % 4);
        auto got = t.encode(s);
        auto want = v.reference_bpe(s);
        REQUIRE_MESSAGE(std::vector<std::int32_t>(got.begin(), got.end()) == want, show(s));
        REQUIRE(t.decode(got) == s);
    }
    // Ties go to the leftmost pair.
    toktest::mini_vocab w;
    w.merge("a", "a");
    w.spec.pre = "regex";
    tokenizer tw(w.spec);
    CHECK(tw.encode("aaa") == std::vector<std::int32_t>{w.id("aa"), w.id("a")});
}

TEST_CASE("added tokens: longest match first, control vs user-defined, strip flags") {
    toktest::mini_vocab v;
    v.merge("h", "i");
    auto ctl = v.add_special("<|ctl|>", true);
    auto ctl2 = v.add_special("<|ctl|>x", true);
    auto usr = v.add_special("<usr>", false);
    auto ls = v.add_special("<ls>", true, true, false);
    auto rs = v.add_special("<rs>", true, false, true);
    tokenizer t(v.spec);
    auto hi = v.id("hi");
    CHECK(t.encode("hi<|ctl|>hi") == std::vector<std::int32_t>{hi, ctl, hi});
    CHECK(t.encode("<|ctl|>xhi") == std::vector<std::int32_t>{ctl2, hi});  // the longer token wins
    CHECK(t.encode("<usr><|ctl|>") == std::vector<std::int32_t>{usr, ctl});
    // parse_special off: control tokens are text, user-defined ones still match.
    auto plain = t.encode("<|ctl|><usr>", {.parse_special = false});
    CHECK(plain.back() == usr);
    CHECK(t.decode(plain) == "<|ctl|><usr>");
    CHECK(std::find(plain.begin(), plain.end(), ctl) == plain.end());
    CHECK(t.encode("hi  <ls>") == std::vector<std::int32_t>{hi, ls});
    CHECK(t.encode("<rs>  hi") == std::vector<std::int32_t>{rs, hi});
    CHECK(t.decode({hi, ctl, hi}) == "hi<|ctl|>hi");
    CHECK(t.decode({hi, ctl, hi}, true) == "hihi");
    CHECK(t.find_token("<usr>") == usr);
    CHECK(t.find_token("hi") == hi);
    CHECK_FALSE(t.find_token("nope").has_value());
    CHECK_THROWS_AS(t.decode({std::int32_t(t.n_vocab())}), clover::error);
    CHECK_THROWS_AS(t.decode({-1}), clover::error);
    // The spec round trip rebuilds the same tokenizer.
    tokenizer t2(t.spec());
    CHECK(t2.encode("hi<|ctl|>x<usr> hi") == t.encode("hi<|ctl|>x<usr> hi"));
}

TEST_CASE("streaming decoder: never emits half a character") {
    toktest::mini_vocab v;
    v.spec.pre = "regex";
    tokenizer t(v.spec);
    streaming_decoder d(t);
    const std::string smile = "\xF0\x9F\x98\x80";
    CHECK(d.push(v.id("\xF0")).empty());
    CHECK(d.push(v.id("\x9F")).empty());
    CHECK(d.push(v.id("\x98")).empty());
    CHECK(d.push(v.id("\x80")) == smile);
    CHECK(d.push(v.id("\xE2")).empty());
    CHECK(d.push(v.id("A")) == "\xEF\xBF\xBD" "A");  // the lead byte never got its tail
    CHECK(d.push(v.id("\xE4")).empty());
    CHECK(d.finish() == "\xEF\xBF\xBD");
    // Pieces of any split concatenate to sanitize(decode(all)).
    std::mt19937 rng(3);
    for (int k = 0; k < 500; ++k) {
        std::vector<std::int32_t> ids;
        for (int i = 0; i < 20; ++i) ids.push_back(std::int32_t(rng() % 256));
        streaming_decoder s(t);
        std::string out;
        for (auto id : ids) {
            std::string piece = s.push(id);
            CHECK(tok::utf8::is_valid(piece));
            out += piece;
        }
        out += s.finish();
        CHECK(out == tok::utf8::sanitize(t.decode(ids)));
    }
}

namespace {

std::string write(const std::string& name, const std::string& body) {
    auto p = toktest::tmp(name);
    std::ofstream(p, std::ios::binary) << body;
    return p;
}

using testutil::error_of;

}  // namespace

TEST_CASE("malformed tokenizer.json: one clover::error naming the problem") {
    // A model with all 256 byte tokens, so that checks after the byte check are reached.
    std::string byte_vocab;
    for (unsigned b = 0; b < 256; ++b) {
        std::string t = tok::byte_level::encode(std::string(1, char(b)));
        if (t == "\"" || t == "\\") t = "\\" + t;
        byte_vocab += (b ? ", \"" : "\"") + t + "\": " + std::to_string(b);
    }
    const std::string good_model = R"("model": {"type": "BPE", "vocab": {)" + byte_vocab + R"(}, "merges": ["a b"]})";
    struct bad {
        std::string body, expect;
    } cases[] = {
        {"{not json", "not a valid tokenizer.json"},
        {"[1, 2]", "no 'model'"},
        {R"({"model": {"type": "WordPiece", "vocab": {}, "merges": []}})", "model.type 'WordPiece'"},
        {R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "not a valid tokenizer.json"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "model.merges is missing"},
        {"{" + good_model + R"(, "pre_tokenizer": {"type": "ByteLevel", "use_regex": false}})", "merge 0 'a b' names a token"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})", "no token for byte 0x00"},
        {"{" + good_model + R"(, "normalizer": {"type": "NFKC"}})", "normalizer 'NFKC'"},
        {"{" + good_model + R"(, "pre_tokenizer": {"type": "Metaspace"}})", "pre_tokenizer 'Metaspace'"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}})", "not a valid tokenizer.json"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": true}})", "byte_fallback"},
        {R"({"model": {"type": "BPE", "vocab": {)" + byte_vocab + R"(}, "merges": []}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}})", "pre-tokenizer regex"},
    };
    int i = 0;
    for (auto& c : cases) {
        auto path = write("bad_tokenizer_" + std::to_string(i++) + ".json", c.body);
        std::string msg = error_of([&] { tokenizer::from_tokenizer_json(path); });
        INFO(c.body, " -> ", msg);
        CHECK(msg.find(c.expect) != std::string::npos);
        CHECK(msg.find(path) != std::string::npos);
    }
    CHECK(error_of([] { tokenizer::from_file(toktest::tmp("does_not_exist.json")); }).find("cannot open") != std::string::npos);
}

TEST_CASE("malformed GGUF tokenizer metadata: one clover::error naming the key") {
    auto base = [] {
        io::gguf_writer w;
        toktest::mini_vocab v;
        v.merge("a", "b");
        tok::write_gguf_spec(v.spec, w);
        return w;
    };
    struct bad {
        std::function<void(io::gguf_writer&)> edit;
        std::string expect;
    } cases[] = {
        {[](io::gguf_writer& w) { w.remove("tokenizer.ggml.model"); }, "tokenizer.ggml.model' is missing"},
        {[](io::gguf_writer& w) { w.set_string("tokenizer.ggml.model", "llama"); }, "only byte-level BPE"},
        {[](io::gguf_writer& w) { w.remove("tokenizer.ggml.tokens"); }, "tokenizer.ggml.tokens is missing"},
        {[](io::gguf_writer& w) { w.set_int_array("tokenizer.ggml.token_type", io::gguf_type::i32, {1, 1}); }, "token_type has 2 entries"},
        {[](io::gguf_writer& w) { w.remove("tokenizer.ggml.merges"); }, "merges is missing"},
        {[](io::gguf_writer& w) { w.set_string("tokenizer.ggml.pre", "llama-bpe"); }, "tokenizer.ggml.pre 'llama-bpe'"},
        {[](io::gguf_writer& w) { w.set_u32("tokenizer.ggml.eos_token_id", 999999); }, "eos_token_id = 999999"},
        {[](io::gguf_writer& w) { w.set_string_array("tokenizer.ggml.merges", {"a zz"}); }, "merge 0 'a zz'"},
    };
    int i = 0;
    for (auto& c : cases) {
        auto w = base();
        c.edit(w);
        auto path = toktest::tmp("bad_tok_" + std::to_string(i++) + ".gguf");
        w.write(path);
        std::string msg = error_of([&] { tokenizer::from_file(path); });
        INFO(c.expect, " -> ", msg);
        CHECK(msg.find(c.expect) != std::string::npos);
    }
    auto w = base();
    auto path = toktest::tmp("good_tok.gguf");
    w.write(path);
    auto t = tokenizer::from_file(path);
    CHECK(t.decode(t.encode("abcab")) == "abcab");
}
