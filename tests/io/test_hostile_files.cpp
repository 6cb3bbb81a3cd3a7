// Hostile inputs for the io readers (issue 18): GGUF shapes whose sizes overflow, tensors that
// share bytes, metadata arrays that cost far more memory than file bytes, FIFOs and folders
// given as files, JSON nested beyond any sane depth. Each must give one clover::error, quickly,
// with bounded memory — never a crash, a hang or a silently accepted file.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>

#include <clover/io/gguf.hpp>
#include <clover/io/json.hpp>
#include <clover/io/mapped_file.hpp>

#include "../common/test_util.hpp"
#include "hostile_util.hpp"

using namespace clover;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool asan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool asan = true;
#else
constexpr bool asan = false;
#endif
#else
constexpr bool asan = false;
#endif

// A hand-rolled GGUF encoder, so tests can write any (broken) header.
struct gguf_bytes {
    std::vector<char> b{'G', 'G', 'U', 'F'};
    gguf_bytes(std::uint64_t n_tensors, std::uint64_t n_kv) { put<std::uint32_t>(3).put(n_tensors).put(n_kv); }
    template <class T> gguf_bytes& put(T v) {
        const char* p = reinterpret_cast<const char*>(&v);
        b.insert(b.end(), p, p + sizeof v);
        return *this;
    }
    gguf_bytes& str(const std::string& s) {
        put<std::uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    gguf_bytes& tensor(const std::string& name, std::vector<std::uint64_t> ne, std::uint64_t offset, std::uint32_t type = 0) {
        str(name).put<std::uint32_t>(std::uint32_t(ne.size()));
        for (auto d : ne) put(d);
        return put(type).put(offset);
    }
    gguf_bytes& pad(std::size_t a = 32) {
        while (b.size() % a) b.push_back(0);
        return *this;
    }
    gguf_bytes& zeros(std::size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
    std::string save(const std::string& name) const {
        auto path = testutil::tmp(name);
        std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(b.size()));
        return path;
    }
};

using testutil::error_of;

void expect_gguf_error(const std::string& path, const std::string& needle) {
    CAPTURE(path);
    const std::string msg = error_of([&] { io::gguf_file f(path); });
    CAPTURE(msg);
    CHECK(msg.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("GGUF: a shape whose element count overflows 64 bits is refused, not taken as 0 bytes") {
    const std::uint64_t big = std::uint64_t(1) << 40;  // the largest dimension the reader allows
    expect_gguf_error(gguf_bytes(1, 0).tensor("t", {big, big, big, big}, 0).pad().save("overflow4d.gguf"), "larger than the file");
    expect_gguf_error(gguf_bytes(1, 0).tensor("t", {32, big, big, big}, 0, 8).pad().save("overflow4d_q8.gguf"),
                      "larger than the file");
    // Fits in 64 bits but not in the file.
    expect_gguf_error(gguf_bytes(1, 0).tensor("t", {big, 2, 2, 2}, 0).pad().save("big4d.gguf"), "larger than the file");
}

TEST_CASE("GGUF: tensors whose data ranges overlap are refused") {
    // a: 8 F32 (32 bytes) at 0; b at 0 (the same bytes); c at 32 overlapping the 64-byte d at 0.
    expect_gguf_error(gguf_bytes(2, 0).tensor("a", {8}, 0).tensor("b", {8}, 0).pad().zeros(64).save("overlap_same.gguf"), "overlap");
    expect_gguf_error(gguf_bytes(2, 0).tensor("d", {16}, 0).tensor("c", {8}, 32).pad().zeros(64).save("overlap_part.gguf"), "overlap");
    // Back to back is fine, in any order in the header.
    const auto ok = gguf_bytes(2, 0).tensor("y", {8}, 32).tensor("x", {8}, 0).pad().zeros(64).save("adjacent.gguf");
    CHECK(io::gguf_file(ok).tensors().size() == 2);
}

TEST_CASE("GGUF: 24 MB of empty nested arrays is refused (not 400+ MB of memory)") {
    const std::uint64_t n = 2'000'000;
    gguf_bytes f(0, 1);
    f.str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put(n);
    for (std::uint64_t i = 0; i < n; ++i) f.put<std::uint32_t>(0).put<std::uint64_t>(0);  // u8[0]
    expect_gguf_error(f.save("nested_arrays.gguf"), "nested arrays");
    // A few nested arrays stay readable.
    gguf_bytes g(0, 1);
    g.str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint64_t>(2);
    g.put<std::uint32_t>(4).put<std::uint64_t>(1).put<std::uint32_t>(7);
    g.put<std::uint32_t>(0).put<std::uint64_t>(0);
    const io::gguf_file ok(g.save("nested_ok.gguf"));
    REQUIRE(ok.find("k") != nullptr);
    CHECK(ok.find("k")->arrays.size() == 2);
    CHECK(ok.find("k")->arrays[0].ints == std::vector<std::int64_t>{7});
}

TEST_CASE("GGUF: an array count is not reserved beyond what the file bytes can hold") {
    // 512 MB (sparse): one string array whose count fills the file (8 bytes a string length),
    // its second string running past the end. Reserving the count up front costs 64 M strings
    // (2 GB) before the error; the bound keeps it to the file's size.
    const std::string path = testutil::tmp("reserve_strings.gguf");
    const std::uint64_t size = std::uint64_t(512) << 20;
    {
        gguf_bytes f(0, 1);
        f.str("k").put<std::uint32_t>(9).put<std::uint32_t>(8);
        const std::uint64_t n = (size - f.b.size() - 8) / 8;
        f.put(n).put<std::uint64_t>(0).put<std::uint64_t>(std::uint64_t(1) << 40);
        std::ofstream(path, std::ios::binary).write(f.b.data(), std::streamsize(f.b.size()));
        std::filesystem::resize_file(path, size);
    }
    if (asan) {  // the address-space limit below does not mix with ASan's shadow memory
        expect_gguf_error(path, "runs past the end");
        return;
    }
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        long pages = 0;
        std::ifstream("/proc/self/statm") >> pages;
        const rlim_t now = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE));
        const rlimit lim{now + size + (rlim_t(1) << 30), now + size + (rlim_t(1) << 30)};
        ::setrlimit(RLIMIT_AS, &lim);
        try {
            io::gguf_file f(path);
            ::_exit(2);  // accepted
        } catch (const error& e) {
            ::_exit(std::strstr(e.what(), "runs past the end") ? 0 : 3);
        } catch (...) {
            ::_exit(4);  // std::bad_alloc: the reserve did not fit
        }
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    REQUIRE(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    std::filesystem::remove(path);
}

TEST_CASE("a FIFO, a folder or a device given as a file: refused at once, never waited on") {
    const std::string fifo = testutil::tmp("hostile.fifo");
    hostile::make_fifo(fifo);
    {
        hostile::fifo_release release(fifo);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string msg = error_of([&] { io::mapped_file m(fifo); });
        CAPTURE(msg);
        CHECK(hostile::seconds_since(t0) < 2.0);
        CHECK(msg.find("not a regular file") != std::string::npos);
        CHECK(msg.find(fifo) != std::string::npos);
    }
    {
        hostile::fifo_release release(fifo);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string msg = error_of([&] { io::gguf_file g(fifo); });
        CHECK(hostile::seconds_since(t0) < 2.0);
        CHECK(msg.find("not a regular file") != std::string::npos);
    }
    CHECK(error_of([] { io::mapped_file m(CLOVER_TEST_TMP); }).find("not a regular file") != std::string::npos);
    CHECK(error_of([] { io::mapped_file m("/dev/zero"); }).find("not a regular file") != std::string::npos);
    CHECK(error_of([] { io::mapped_file m(testutil::tmp("no-such-file")); }).find("cannot open") != std::string::npos);
    std::filesystem::remove(fifo);
}

TEST_CASE("io::json: nesting is bounded whatever depth the caller asks for") {
    const std::string deep(1'000'000, '[');
    std::string msg = error_of([&] { io::json::parse(deep, "deep.json", std::size_t(1) << 30); });
    CHECK(msg.find("deep.json: invalid JSON at byte") != std::string::npos);
    CHECK(msg.find("nesting too deep") != std::string::npos);
    std::string objects;
    for (int i = 0; i < 100'000; ++i) objects += "{\"a\":";
    msg = error_of([&] { io::json::parse(objects, "objects.json"); });
    CHECK(msg.find("nesting too deep") != std::string::npos);
    // Within the bound: fine.
    std::string ok;
    for (int i = 0; i < 60; ++i) ok += '[';
    for (int i = 0; i < 60; ++i) ok += ']';
    CHECK(io::json::parse(ok, "ok.json").is_array());
}
