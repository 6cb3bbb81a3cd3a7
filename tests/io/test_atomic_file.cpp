// io::atomic_output, the one way the library and the command write files (issue 18): the output
// appears whole or not at all, an input is never the output (by inode: names, hard links,
// symlinks), the temporary file is fresh (O_EXCL: never an existing file such as an input named
// OUT.partial) and is gone after any failure, exceptions included.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <clover/io/atomic_file.hpp>
#include <clover/io/gguf_writer.hpp>

#include "../common/test_util.hpp"
#include "hostile_util.hpp"

using namespace clover;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
    const fs::path d = testutil::tmp(name);
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

using testutil::error_of;

}  // namespace

TEST_CASE("atomic_output: the output appears whole at commit; the folder holds nothing else") {
    const fs::path dir = fresh_dir("atomic_basic");
    const fs::path out = dir / "out.bin";
    {
        io::atomic_output f(out);
        f.write("hello ", 6);
        CHECK(!fs::exists(out));                 // not before commit
        CHECK(hostile::listing(dir).size() == 1);  // the temporary file
        const std::string name = *hostile::listing(dir).begin();
        CHECK(name.starts_with("out.bin."));
        CHECK(name.ends_with(".partial"));
        f.write("world", 5);
        f.pwrite("W", 1, 6);
        f.commit();
    }
    CHECK(hostile::slurp(out) == "hello World");
    CHECK(hostile::listing(dir) == std::set<std::string>{"out.bin"});
    // Permissions as for any new file: 0666 less the umask.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    struct stat st{};
    REQUIRE(::stat(out.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == (0666 & ~mask));
    // Replacing an existing output: a new file takes its name.
    const ino_t before = hostile::inode_of(out);
    fs::create_hard_link(out, dir / "keep.bin");
    io::write_file_atomically(out, bytes_of("new"));
    CHECK(hostile::slurp(out) == "new");
    CHECK(hostile::inode_of(out) != before);
    CHECK(hostile::slurp(dir / "keep.bin") == "hello World");
    CHECK(error_of([&] {
              io::atomic_output f(dir / "x");
              f.commit();
              f.write("a", 1);
          }).find("already committed") != std::string::npos);
}

TEST_CASE("atomic_output: any failure before commit leaves the output and the folder as they were") {
    const fs::path dir = fresh_dir("atomic_fail");
    const fs::path out = dir / "out.bin";
    hostile::write_text(out, "original");
    const auto before = hostile::listing(dir);
    try {
        io::atomic_output f(out);
        f.write("partial data", 12);
        throw std::runtime_error("fill failed");
    } catch (const std::runtime_error&) {
    }
    CHECK(hostile::slurp(out) == "original");
    CHECK(hostile::listing(dir) == before);
    {
        io::atomic_output f(out);
        f.write("x", 1);
        f.discard();
        CHECK(hostile::listing(dir) == before);
    }
    // The writer of GGUF files: a tensor whose fill throws half way.
    io::gguf_writer w;
    w.add_tensor("a", dtype::f32, {8}, [](std::span<std::byte> d) { std::fill(d.begin(), d.end(), std::byte{1}); });
    w.add_tensor("b", dtype::f32, {8}, [](std::span<std::byte>) { fail("source tensor unreadable"); });
    CHECK(error_of([&] { w.write(out); }).find("source tensor unreadable") != std::string::npos);
    CHECK(hostile::slurp(out) == "original");
    CHECK(hostile::listing(dir) == before);
    // No folder to write in.
    const std::string msg = error_of([&] { io::atomic_output f(dir / "missing" / "x.bin"); });
    CHECK(msg.find("cannot create a temporary file") != std::string::npos);
    CHECK(hostile::listing(dir) == before);
}

TEST_CASE("atomic_output: an input under any name is refused; an input named OUT.partial is safe") {
    const fs::path dir = fresh_dir("atomic_inputs");
    const fs::path in = dir / "model.gguf";
    hostile::write_text(in, "the model");
    fs::create_hard_link(in, dir / "hard.gguf");
    fs::create_symlink(in, dir / "soft.gguf");
    fs::create_symlink("soft.gguf", dir / "soft2.gguf");  // a symlink to a symlink
    const auto inputs = std::vector<io::file_identity>{*io::identity_of(in)};
    const auto before = hostile::listing(dir);
    for (const char* name : {"model.gguf", "hard.gguf", "soft.gguf", "soft2.gguf"}) {
        CAPTURE(name);
        const std::string msg = error_of([&] { io::write_file_atomically(dir / name, bytes_of("garbage"), inputs); });
        CAPTURE(msg);
        CHECK(msg.find((dir / name).string() + ": is one of the input files (" + in.string() + ")") != std::string::npos);
        CHECK(hostile::slurp(in) == "the model");
        CHECK(hostile::listing(dir) == before);
    }
    CHECK(fs::is_symlink(dir / "soft.gguf"));
    // The identity of a path seen through a symlink is the target's.
    CHECK(io::identity_of(dir / "soft2.gguf")->same_file(*io::identity_of(in)));
    // An input named like the old temporary file ("OUT.partial") is never opened for writing.
    const fs::path partial = dir / "out.gguf.partial";
    hostile::write_text(partial, "an input");
    io::write_file_atomically(dir / "out.gguf", bytes_of("output"), {*io::identity_of(partial)});
    CHECK(hostile::slurp(partial) == "an input");
    CHECK(hostile::slurp(dir / "out.gguf") == "output");
    // Two writers of one output at once: separate temporary files, the last commit wins whole.
    io::atomic_output a(dir / "two.bin"), b(dir / "two.bin");
    a.write("aaaa", 4);
    b.write("bb", 2);
    a.commit();
    b.commit();
    CHECK(hostile::slurp(dir / "two.bin") == "bb");
}

TEST_CASE("atomic_output: a folder, a FIFO or a device as the output is refused, without blocking") {
    const fs::path dir = fresh_dir("atomic_special");
    CHECK(error_of([&] { io::atomic_output f(dir); }).find("is a folder") != std::string::npos);
    CHECK(error_of([&] { io::atomic_output f(dir.string() + "/"); }).find("is a folder") != std::string::npos);
    hostile::make_fifo(dir / "pipe");
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(error_of([&] { io::atomic_output f(dir / "pipe"); }).find("is a FIFO, not a regular file") != std::string::npos);
    CHECK(hostile::seconds_since(t0) < 1.0);
    CHECK(error_of([&] { io::atomic_output f("/dev/null"); }).find("is a character device") != std::string::npos);
    CHECK(hostile::listing(dir) == std::set<std::string>{"pipe"});
}
