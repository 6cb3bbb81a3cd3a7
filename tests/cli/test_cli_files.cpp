// The clover command never destroys a file it reads (issue 18): `gguf patch`, `convert` and
// `logits -o` refuse an output that is one of their inputs (by inode: the same name, a hard
// link, a symlink, a file inside the HF folder read), leave the input byte for byte as it was
// and nothing behind in the folder; an input named like a temporary file is safe; a FIFO given
// as a model is refused at once. Good runs still replace an existing output.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <clover/io/gguf.hpp>
#include <clover/model/synth.hpp>

#include "../common/test_util.hpp"
#include "../hf/hf_fixture.hpp"
#include "../io/hostile_util.hpp"

namespace fs = std::filesystem;

namespace {

struct files_result {
    int status = -1;  // exit code, or -signal
    std::string err;
};

files_result run_files(const std::string& args, int timeout_s = 60) {
    const std::string err_path = testutil::tmp("cli_files_err.txt");
    const std::string cmd = "timeout " + std::to_string(timeout_s) + " " + std::string(CLOVER_CLI) + " " + args + " >/dev/null 2>" +
                            err_path + " </dev/null";
    const int st = std::system(cmd.c_str());
    files_result r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    r.err = hostile::slurp(err_path);
    return r;
}

// One "error:" line naming `needle`, a non-zero status, no timeout.
void expect_refused(const std::string& args, const std::string& needle, int timeout_s = 60) {
    CAPTURE(args);
    const files_result r = run_files(args, timeout_s);
    CAPTURE(r.err);
    CHECK(r.status > 0);
    CHECK(r.status != 124);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(needle) != std::string::npos);
}

// The files of a folder and their bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
    std::map<std::string, std::string> s;
    for (const auto& n : hostile::listing(dir)) s[n] = fs::is_regular_file(dir / n) ? hostile::slurp(dir / n) : std::string("<not a file>");
    return s;
}

fs::path fresh_dir(const std::string& name) {
    const fs::path d = testutil::tmp(name);
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::string clover_synth(const std::string& name) {
    auto s = clover::synth::preset("tiny");
    s.arch = "clover_moe";
    return testutil::synth_file(name, s);
}

}  // namespace

TEST_CASE("gguf patch: an input named OUT.partial is not truncated; output = input is refused") {
    const fs::path dir = fresh_dir("cli_patch_self");
    fs::copy_file(clover_synth("cli_patch_src.gguf"), dir / "X.gguf.partial");
    const std::string in = (dir / "X.gguf.partial").string(), out = (dir / "X.gguf").string();
    const std::string original = hostile::slurp(in);
    const files_result r = run_files("gguf patch " + in + " " + out);
    CAPTURE(r.err);
    CHECK(r.status == 0);
    CHECK(hostile::slurp(in) == original);
    {  // the copy holds the input's tensors, byte for byte
        const clover::io::gguf_file a(in), b(out);
        REQUIRE(a.tensors().size() == b.tensors().size());
        for (const auto& t : a.tensors()) {
            const auto& u = b.tensor(t.name);
            CHECK((t.nbytes == u.nbytes && std::memcmp(t.data, u.data, t.nbytes) == 0));
        }
    }
    CHECK(hostile::listing(dir) == std::set<std::string>{"X.gguf", "X.gguf.partial"});

    fs::create_hard_link(in, dir / "hard.gguf");
    fs::create_symlink(in, dir / "soft.gguf");
    const auto before = snapshot(dir);
    expect_refused("gguf patch " + in + " " + in, "is one of the input files");
    expect_refused("gguf patch " + in + " " + (dir / "hard.gguf").string(), "is one of the input files");
    expect_refused("gguf patch " + in + " " + (dir / "soft.gguf").string(), "is one of the input files");
    expect_refused("gguf patch " + (dir / "soft.gguf").string() + " " + in, "is one of the input files");
    CHECK(snapshot(dir) == before);
    CHECK(fs::is_symlink(dir / "soft.gguf"));
}

TEST_CASE("convert -o onto a file of the HF folder is refused; the folder is untouched") {
    const fs::path dir = fresh_dir("cli_convert_self");
    const fs::path hf = dir / "hf";
    hftest::make_hf_folder(clover_synth("cli_convert_src.gguf"), hf, {.shards = 2});
    fs::create_symlink(hf / "model-00001-of-00002.safetensors", dir / "shard_link.gguf");
    const auto before = snapshot(hf);
    for (const fs::path& out : {hf / "config.json", hf / "model-00001-of-00002.safetensors", hf / "model-00002-of-00002.safetensors",
                               hf / "model.safetensors.index.json", hf / "tokenizer.json", dir / "shard_link.gguf"})
        expect_refused("convert " + hf.string() + " -o " + out.string(), out.string() + ": is one of the input files");
    expect_refused("convert " + hf.string() + " -o " + hf.string(), "is a folder");
    CHECK(snapshot(hf) == before);
    CHECK(fs::is_symlink(dir / "shard_link.gguf"));
    // Converting into the folder under a new name adds that file only.
    CHECK(run_files("convert " + hf.string() + " -o " + (hf / "out.gguf").string()).status == 0);
    auto after = snapshot(hf);
    CHECK(after.erase("out.gguf") == 1);
    CHECK(after == before);
}

TEST_CASE("logits -o onto the model (or the ids file) is refused; a good run replaces the output atomically") {
    const fs::path dir = fresh_dir("cli_logits_self");
    const fs::path model = dir / "M.gguf";
    fs::copy_file(clover_synth("cli_logits_src.gguf"), model);
    fs::create_hard_link(model, dir / "hard.gguf");
    hostile::write_text(dir / "ids.txt", "1 2 3");
    const fs::path hf = dir / "hf";
    hftest::make_hf_folder(model.string(), hf, {.shards = 2});
    const auto before = snapshot(dir), hf_before = snapshot(hf);
    const std::string m = " -m " + model.string();
    expect_refused("logits" + m + " --ids 1,2 -o " + model.string(), "is one of the input files");
    expect_refused("logits" + m + " --ids 1,2 -o " + (dir / "hard.gguf").string(), "is one of the input files");
    expect_refused("logits" + m + " --ids-file " + (dir / "ids.txt").string() + " -o " + (dir / "ids.txt").string(),
                   "is one of the input files");
    expect_refused("logits -m " + hf.string() + " --ids 1,2 -o " + (hf / "config.json").string(), "is one of the input files");
    expect_refused("logits -m " + hf.string() + " --ids 1,2 -o " + (hf / "model-00002-of-00002.safetensors").string(),
                   "is one of the input files");
    expect_refused("logits" + m + " --ids 1,2 -o " + dir.string(), "is a folder");
    CHECK(snapshot(dir) == before);
    CHECK(snapshot(hf) == hf_before);

    // An existing output is replaced by a new file (a new inode), holding the logits.
    const fs::path out = dir / "out.f32";
    hostile::write_text(out, "old contents");
    const ino_t old_inode = hostile::inode_of(out);
    fs::create_hard_link(out, dir / "old_link.f32");  // keeps the old inode alive, so it cannot be reused
    CHECK(run_files("logits" + m + " --ids 1,2,3 -o " + out.string()).status == 0);
    CHECK(fs::file_size(out) == 3 * 512 * sizeof(float));
    CHECK(hostile::inode_of(out) != old_inode);
    CHECK(hostile::slurp(dir / "old_link.f32") == "old contents");
    auto after = hostile::listing(dir);
    CHECK(after.size() == before.size() + 2);  // out.f32 and old_link.f32, nothing else
}

TEST_CASE("a FIFO as the model, a shard or config.json: one error at once, no hang") {
    const fs::path dir = fresh_dir("cli_fifo");
    const fs::path fifo = dir / "model.gguf";
    hostile::make_fifo(fifo);
    const std::string out = (dir / "out.f32").string();
    expect_refused("gguf info " + fifo.string(), fifo.string() + ": not a regular file", 10);
    expect_refused("logits -m " + fifo.string() + " --ids 1 -o " + out, fifo.string() + ": not a regular file", 10);
    expect_refused("gguf patch " + fifo.string() + " " + (dir / "p.gguf").string(), "not a regular file", 10);
    const fs::path hf = dir / "hf";
    hftest::make_hf_folder(clover_synth("cli_fifo_src.gguf"), hf, {.shards = 2});
    hostile::make_fifo(hf / "model-00002-of-00002.safetensors");
    expect_refused("gguf info " + hf.string(), "model-00002-of-00002.safetensors: not a regular file", 10);
    expect_refused("convert " + hf.string() + " -o " + (dir / "c.gguf").string(), "not a regular file", 10);
    hostile::make_fifo(hf / "config.json");
    expect_refused("logits -m " + hf.string() + " --ids 1 -o " + out, "config.json: not a regular file", 10);
    CHECK(!fs::exists(out));
}
