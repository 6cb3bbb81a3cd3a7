// Hostile HF folders (issue 18): FIFOs as config.json / index / shard / tokenizer.json (a reader
// must refuse them at once, not wait for a writer), shards and indexes that resolve outside the
// folder through symlinks, JSON nested beyond any sane depth, and `convert` told to write over
// one of the files it reads (refused by inode: names, hard links and symlinks alike; the input
// untouched, nothing left behind).
#include <doctest/doctest.h>

#include <clover/io/hf_convert.hpp>
#include <clover/io/hf_model.hpp>
#include <clover/model/open.hpp>

#include "../common/test_util.hpp"
#include "../io/hostile_util.hpp"
#include "hf_fixture.hpp"

using namespace clover;
namespace fs = std::filesystem;

namespace {

const std::string shard1 = "model-00001-of-00002.safetensors";
const std::string shard2 = "model-00002-of-00002.safetensors";

// A fresh copy of a good two-shard folder (with tokenizer) under `name`.
fs::path fresh(const std::string& name) {
    static const fs::path good = [] {
        const auto gguf = testutil::synth_file("hostile_hf.gguf", testutil::hf_odd_spec("clover_moe"));
        const fs::path d = testutil::tmp("hostile_hf_good");
        hftest::make_hf_folder(gguf, d, {.shards = 2});
        return d;
    }();
    const fs::path dir = testutil::tmp(name);
    fs::remove_all(dir);
    fs::copy(good, dir, fs::copy_options::recursive);
    return dir;
}

using testutil::error_of;

std::string nested(std::size_t depth) {
    std::string s;
    for (std::size_t i = 0; i < depth; ++i) s += "{\"a\": [";
    return s;
}

}  // namespace

TEST_CASE("config.json and the index nested 100,000 deep: one error, no stack overflow") {
    {
        const fs::path dir = fresh("hostile_deep_cfg");
        hostile::write_text(dir / "config.json", nested(100'000));
        const std::string msg = error_of([&] { load_hf(dir); });
        CAPTURE(msg);
        CHECK(msg.find("config.json") != std::string::npos);
        CHECK(msg.find("nesting too deep") != std::string::npos);
    }
    {
        const fs::path dir = fresh("hostile_deep_index");
        hostile::write_text(dir / "model.safetensors.index.json", "{\"weight_map\": " + nested(100'000));
        const std::string msg = error_of([&] { load_hf(dir); });
        CAPTURE(msg);
        CHECK(msg.find("model.safetensors.index.json") != std::string::npos);
        CHECK(msg.find("nesting too deep") != std::string::npos);
    }
}

TEST_CASE("a FIFO as config.json, index, shard or tokenizer.json is refused at once") {
    for (const std::string& name : {std::string("config.json"), std::string("model.safetensors.index.json"), shard2}) {
        CAPTURE(name);
        const fs::path dir = fresh("hostile_fifo");
        hostile::make_fifo(dir / name);
        hostile::fifo_release release(dir / name);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string msg = error_of([&] { load_hf(dir); });
        CAPTURE(msg);
        CHECK(hostile::seconds_since(t0) < 2.0);
        CHECK(msg.find((dir / name).string() + ": not a regular file") != std::string::npos);
    }
    {  // tokenizer.json: the folder loads without a tokenizer, with a warning that says why
        const fs::path dir = fresh("hostile_fifo");
        hostile::make_fifo(dir / "tokenizer.json");
        hostile::fifo_release release(dir / "tokenizer.json");
        static std::string warned;
        warned.clear();
        const auto t0 = std::chrono::steady_clock::now();
        auto f = hf::open_hf(dir, {.warn = [](const std::string& m) { warned += m; }, .extra_keys = tokenizer_keys()});
        CHECK(hostile::seconds_since(t0) < 2.0);
        CHECK(!f->has_tokenizer);
        CHECK(warned.find("tokenizer.json: not a regular file") != std::string::npos);
    }
}

TEST_CASE("shards and the index must resolve inside the folder (or the HF cache's blobs)") {
    {  // a shard symlinked to a file outside the folder
        const fs::path dir = fresh("hostile_link_out");
        const fs::path outside = testutil::tmp("hostile_outside.safetensors");
        fs::remove(outside);
        fs::rename(dir / shard2, outside);
        fs::create_symlink(outside, dir / shard2);
        const std::string msg = error_of([&] { load_hf(dir); });
        CAPTURE(msg);
        CHECK(msg.find(shard2) != std::string::npos);
        CHECK(msg.find("outside the folder") != std::string::npos);
    }
    {  // a relative symlink climbing out
        const fs::path dir = fresh("hostile_link_rel");
        fs::rename(dir / shard1, testutil::tmp("hostile_outside1.safetensors"));
        fs::create_symlink("../hostile_outside1.safetensors", dir / shard1);
        CHECK(error_of([&] { load_hf(dir); }).find("outside the folder") != std::string::npos);
    }
    {  // the index symlinked out
        const fs::path dir = fresh("hostile_link_index");
        const fs::path outside = testutil::tmp("hostile_outside_index.json");
        fs::remove(outside);
        fs::rename(dir / "model.safetensors.index.json", outside);
        fs::create_symlink(outside, dir / "model.safetensors.index.json");
        CHECK(error_of([&] { load_hf(dir); }).find("outside the folder") != std::string::npos);
    }
    {  // symlinks that stay inside are fine
        const fs::path dir = fresh("hostile_link_in");
        fs::create_directories(dir / "real");
        fs::rename(dir / shard2, dir / "real" / shard2);
        fs::create_symlink("real/" + shard2, dir / shard2);
        CHECK_NOTHROW(load_hf(dir));
    }
    {  // the HF hub cache: snapshots/REV/* are symlinks to ../../blobs/*
        const fs::path repo = testutil::tmp("hostile_hub/models--x--y");
        fs::remove_all(repo.parent_path());
        const fs::path snap = repo / "snapshots" / "0123abcd";
        fs::create_directories(snap);
        fs::create_directories(repo / "blobs");
        const fs::path src = fresh("hostile_hub_src");
        int k = 0;
        for (const auto& e : fs::directory_iterator(src)) {
            const std::string blob = "blob" + std::to_string(k++);
            fs::copy_file(e.path(), repo / "blobs" / blob);
            fs::create_symlink("../../blobs/" + blob, snap / e.path().filename());
        }
        CHECK_NOTHROW(load_hf(snap));
    }
}

TEST_CASE("convert refuses to write over any file it reads; the input stays as it was") {
    const fs::path dir = fresh("hostile_convert");
    fs::remove(testutil::tmp("hostile_tok_link.json"));
    fs::create_hard_link(dir / "tokenizer.json", testutil::tmp("hostile_tok_link.json"));
    fs::remove(testutil::tmp("hostile_shard_link.gguf"));
    fs::create_symlink(dir / shard1, testutil::tmp("hostile_shard_link.gguf"));
    const auto before = hostile::listing(dir);
    std::map<std::string, std::string> bytes;
    for (const auto& n : before) bytes[n] = hostile::slurp(dir / n);
    for (const fs::path& out : {dir / "config.json", dir / shard1, dir / shard2, dir / "model.safetensors.index.json",
                               dir / "tokenizer.json", dir / "tokenizer_config.json", fs::path(testutil::tmp("hostile_tok_link.json")),
                               fs::path(testutil::tmp("hostile_shard_link.gguf"))}) {
        CAPTURE(out);
        const std::string msg = error_of([&] { hf::convert(dir, out); });
        CAPTURE(msg);
        CHECK(msg.find(out.string()) != std::string::npos);
        CHECK(msg.find("is one of the input files") != std::string::npos);
        CHECK(hostile::listing(dir) == before);
        for (const auto& n : before) CHECK(hostile::slurp(dir / n) == bytes[n]);
    }
    CHECK(fs::is_symlink(testutil::tmp("hostile_shard_link.gguf")));
    // A new file inside the folder is fine, and only that file appears.
    hf::convert(dir, dir / "out.gguf");
    auto after = hostile::listing(dir);
    after.erase("out.gguf");
    CHECK(after == before);
    CHECK(io::gguf_file(dir / "out.gguf").tensors().size() > 0);
}
