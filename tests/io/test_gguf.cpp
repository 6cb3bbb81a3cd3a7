// GGUF reader: round trip of every metadata type, and malformed files — each must give one
// clover::error naming the problem, never a crash or a hang.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>

#include <clover/clover.hpp>
#include <clover/io/gguf_writer.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

// A hand-rolled encoder, so tests can write any (broken) header.
struct bytes {
    std::vector<char> b;
    template <class T> bytes& put(T v) { const char* p = reinterpret_cast<const char*>(&v); b.insert(b.end(), p, p + sizeof v); return *this; }
    bytes& str(const std::string& s) { put<std::uint64_t>(s.size()); b.insert(b.end(), s.begin(), s.end()); return *this; }
    bytes& pad(std::size_t a) { while (b.size() % a) b.push_back(0); return *this; }
    std::string save(const std::string& name) const {
        auto path = testutil::tmp(name);
        std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(b.size()));
        return path;
    }
};

// One F32 tensor "t" of shape {ne0, ne1}, one u32 key.
bytes one_tensor_file(std::uint64_t ne0 = 8, std::uint64_t ne1 = 2, std::uint32_t type = 0, std::uint64_t offset = 0,
                      std::uint32_t n_dims = 2, std::uint32_t version = 3) {
    bytes f;
    f.b = {'G', 'G', 'U', 'F'};
    f.put<std::uint32_t>(version).put<std::uint64_t>(1).put<std::uint64_t>(1);
    f.str("general.architecture").put<std::uint32_t>(8).str("test");
    f.str("t").put<std::uint32_t>(n_dims).put<std::uint64_t>(ne0);
    if (n_dims > 1) f.put<std::uint64_t>(ne1);
    for (std::uint32_t d = 2; d < n_dims; ++d) f.put<std::uint64_t>(1);
    f.put<std::uint32_t>(type).put<std::uint64_t>(offset);
    f.pad(32);
    for (std::uint64_t i = 0; i < ne0 * ne1; ++i) f.put<float>(float(i));
    return f;
}

void expect_error(const std::string& path, const std::string& needle) {
    CAPTURE(path);
    try {
        io::gguf_file f(path);
        FAIL("expected an error containing: " << needle);
    } catch (const error& e) {
        CAPTURE(e.what());
        CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("writer/reader round trip of every metadata type and tensor data") {
    io::gguf_writer w;
    auto scalar = [](io::gguf_type t, std::int64_t i) { io::gguf_value v; v.type = t; v.i = i; return v; };
    w.set("u8", scalar(io::gguf_type::u8, 200));
    w.set("i8", scalar(io::gguf_type::i8, -100));
    w.set("u16", scalar(io::gguf_type::u16, 60000));
    w.set("i16", scalar(io::gguf_type::i16, -30000));
    w.set_u32("u32", 4000000000u);
    w.set_i32("i32", -2000000000);
    w.set_u64("u64", 1ull << 40);
    w.set("i64", scalar(io::gguf_type::i64, -(1ll << 40)));
    w.set_f32("f32", 1.5f);
    io::gguf_value f64; f64.type = io::gguf_type::f64; f64.f = 2.25; w.set("f64", f64);
    w.set_bool("b", true);
    w.set_string("s", "héllo");
    w.set_string_array("as", {"a", "", "ccc"});
    w.set_int_array("ai", io::gguf_type::i32, {1, -2, 3});
    w.set_f32_array("af", {0.5, -1.0});
    io::gguf_value nested; nested.type = io::gguf_type::array; nested.elem = io::gguf_type::array;
    io::gguf_value inner; inner.type = io::gguf_type::array; inner.elem = io::gguf_type::u8; inner.ints = {1, 2};
    nested.arrays = {inner, inner};
    w.set("nested", nested);
    w.add_tensor("x", dtype::f32, {3, 2}, [](std::span<std::byte> d) { for (int i = 0; i < 6; ++i) reinterpret_cast<float*>(d.data())[i] = float(i) * 0.5f; });
    w.add_tensor("y", dtype::q8_0, {64}, [](std::span<std::byte> d) { std::memset(d.data(), 1, d.size()); });
    auto path = testutil::tmp("roundtrip.gguf");
    w.write(path);
    io::gguf_file f(path);
    CHECK(*f.get_int("u8") == 200);
    CHECK(*f.get_int("i8") == -100);
    CHECK(*f.get_int("u16") == 60000);
    CHECK(*f.get_int("i16") == -30000);
    CHECK(*f.get_int("u32") == 4000000000ll);
    CHECK(*f.get_int("i32") == -2000000000);
    CHECK(*f.get_int("u64") == (1ll << 40));
    CHECK(*f.get_int("i64") == -(1ll << 40));
    CHECK(*f.get_float("f32") == 1.5);
    CHECK(*f.get_float("f64") == 2.25);
    CHECK(*f.get_bool("b") == true);
    CHECK(*f.get_string("s") == "héllo");
    CHECK(*f.get_string_array("as") == std::vector<std::string>{"a", "", "ccc"});
    CHECK(*f.get_int_array("ai") == std::vector<std::int64_t>{1, -2, 3});
    CHECK(*f.get_float_array("af") == std::vector<double>{0.5, -1.0});
    CHECK(f.find("nested")->arrays.size() == 2);
    CHECK(f.find("nested")->arrays[1].ints == std::vector<std::int64_t>{1, 2});
    CHECK(!f.get_string("absent"));
    CHECK_THROWS_AS(f.get_string("u32"), error);  // wrong type names the key
    const auto& x = f.tensor("x");
    CHECK(x.ne[0] == 3);
    CHECK(x.ne[1] == 2);
    CHECK(reinterpret_cast<const float*>(x.data)[5] == 2.5f);
    CHECK(f.tensor("y").nbytes == 68);
    CHECK(std::size_t(f.tensor("y").data - f.map().data()) % f.alignment() == 0);
    CHECK_THROWS_AS(f.tensor("z"), error);
}

TEST_CASE("malformed headers give clear errors") {
    CHECK_NOTHROW(io::gguf_file(one_tensor_file().save("ok.gguf")));
    auto bad_magic = one_tensor_file();
    bad_magic.b[0] = 'X';
    expect_error(bad_magic.save("magic.gguf"), "bad magic");
    expect_error(one_tensor_file(8, 2, 0, 0, 2, 1).save("v1.gguf"), "unsupported GGUF version 1");
    expect_error(one_tensor_file(8, 2, 0, 0, 2, 4).save("v4.gguf"), "unsupported GGUF version 4");
    expect_error(one_tensor_file(8, 2, 99).save("type.gguf"), "unknown tensor type 99");
    expect_error(one_tensor_file(8, 2, 0, 32).save("range.gguf"), "out of range");
    expect_error(one_tensor_file(8, 2, 0, 4).save("align.gguf"), "not aligned");
    expect_error(one_tensor_file(8, 2, 0, 0, 5).save("dims.gguf"), "dimensions");
    expect_error(one_tensor_file(0, 2).save("zero.gguf"), "dimension 0 is 0");
    expect_error(one_tensor_file(1ull << 39, 1ull << 39).save("huge.gguf"), "larger than the file");
    expect_error(one_tensor_file(33, 1, 8).save("block.gguf"), "not a multiple");
    {
        bytes f;
        f.b = {'G', 'G', 'U', 'F'};
        f.put<std::uint32_t>(3).put<std::uint64_t>(1ull << 60).put<std::uint64_t>(0);
        expect_error(f.save("ntensors.gguf"), "tensor count");
    }
    {
        bytes f;
        f.b = {'G', 'G', 'U', 'F'};
        f.put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(~0ull);
        expect_error(f.save("nkv.gguf"), "metadata count");
    }
    {
        bytes f;
        f.b = {'G', 'G', 'U', 'F'};
        f.put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(1);
        f.put<std::uint64_t>(1ull << 50);  // key length
        for (int i = 0; i < 8; ++i) f.put<std::uint32_t>(0);
        expect_error(f.save("keylen.gguf"), "runs past the end");
    }
    {
        bytes f;
        f.b = {'G', 'G', 'U', 'F'};
        f.put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(1);
        f.str("arr").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(1ull << 40);
        expect_error(f.save("arrlen.gguf"), "exceeds the file size");
    }
    {
        bytes f;
        f.b = {'G', 'G', 'U', 'F'};
        f.put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(2);
        f.str("k").put<std::uint32_t>(4).put<std::uint32_t>(1);
        f.str("k").put<std::uint32_t>(4).put<std::uint32_t>(2);
        expect_error(f.save("dup.gguf"), "duplicate metadata key 'k'");
    }
    {
        bytes f;
        f.b = {'G', 'G', 'U', 'F'};
        f.put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(1);
        f.str("k").put<std::uint32_t>(77);
        expect_error(f.save("vtype.gguf"), "unknown value type 77");
    }
    expect_error(testutil::tmp("does-not-exist.gguf"), "cannot open");
}

TEST_CASE("every truncation of a real model file is an error, never a crash") {
    auto path = testutil::synth_file("trunc_src.gguf", synth::preset("tiny"));
    std::ifstream in(path, std::ios::binary);
    std::vector<char> all((std::istreambuf_iterator<char>(in)), {});
    const auto hdr = io::gguf_file(path).data_offset();
    std::vector<std::size_t> cuts;
    for (std::size_t c = 0; c < hdr; c += (c < 512 ? 1 : 97)) cuts.push_back(c);
    cuts.push_back(hdr);
    cuts.push_back(all.size() - 1);
    for (std::size_t c : cuts) {
        bytes f;
        f.b.assign(all.begin(), all.begin() + std::ptrdiff_t(c));
        auto p = f.save("trunc.gguf");
        CAPTURE(c);
        CHECK_THROWS_AS(io::gguf_file{p}, error);
    }
}

TEST_CASE("random byte flips in the header never crash the reader or the loader") {
    auto path = testutil::synth_file("flip_src.gguf", synth::preset("tiny"));
    std::ifstream in(path, std::ios::binary);
    std::vector<char> all((std::istreambuf_iterator<char>(in)), {});
    const auto hdr = io::gguf_file(path).data_offset();
    rng r(99);
    int errors = 0;
    for (int it = 0; it < 300; ++it) {
        bytes f;
        f.b = all;
        for (int k = 0; k < 3; ++k) f.b[r.next() % hdr] = char(r.next());
        auto p = f.save("flip.gguf");
        try {
            auto file = load(p);
            hparams h = read_hparams(*file);
            bind_weights(file, h);
        } catch (const error&) {
            ++errors;
        }
    }
    CHECK(errors > 0);
}

TEST_CASE("missing tensors, wrong shapes and unsupported types are named at load") {
    auto src = testutil::synth_file("bind_src.gguf", synth::preset("tiny"));
    io::gguf_file f(src);
    auto rewrite = [&](const std::string& name, auto&& edit) {
        io::gguf_writer w;
        for (const auto& [k, v] : f.metadata()) if (k != "general.alignment") w.set(k, v);
        for (const auto& t : f.tensors()) {
            std::vector<std::int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
            dtype type = t.type;
            if (!edit(t.name, ne, type)) continue;
            if (type == t.type && ne == std::vector<std::int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims))
                w.add_tensor_bytes(t.name, t.type, ne, {t.data, t.nbytes});
            else
                w.add_tensor(t.name, type, ne, [](std::span<std::byte> d) { std::memset(d.data(), 0, d.size()); });
        }
        auto p = testutil::tmp(name);
        w.write(p);
        return p;
    };
    auto expect_bind_error = [](const std::string& p, const std::string& needle) {
        try {
            model<variants::from_file> m(load(p), {1});
            FAIL("expected: " << needle);
        } catch (const error& e) {
            CAPTURE(e.what());
            CHECK(std::string(e.what()).find(needle) != std::string::npos);
        }
    };
    expect_bind_error(rewrite("missing.gguf", [](const std::string& n, auto&, auto&) { return n != "blk.1.ssm_a"; }),
                      "missing tensor 'blk.1.ssm_a'");
    expect_bind_error(rewrite("shape.gguf", [](const std::string& n, auto& ne, auto&) {
                          if (n == "blk.3.attn_k.weight") ne[1] = 32;
                          return true;
                      }),
                      "tensor 'blk.3.attn_k.weight' has shape {64, 32}, expected {64, 64}");
    expect_bind_error(rewrite("qtype.gguf", [](const std::string& n, auto&, auto& t) {
                          if (n == "blk.0.ffn_up_exps.weight") t = dtype::q4_0;
                          return true;
                      }),
                      "has type Q4_0");
    {
        io::gguf_writer w;
        for (const auto& [k, v] : f.metadata()) if (k != "qwen35moe.ssm.conv_kernel" && k != "general.alignment") w.set(k, v);
        for (const auto& t : f.tensors())
            w.add_tensor_bytes(t.name, t.type, std::vector<std::int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), {t.data, t.nbytes});
        auto p = testutil::tmp("nokey.gguf");
        w.write(p);
        expect_bind_error(p, "key not found: qwen35moe.ssm.conv_kernel");
    }
}
