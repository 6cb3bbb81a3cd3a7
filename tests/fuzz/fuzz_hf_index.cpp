// model.safetensors.index.json (io/hf_model.hpp): the input is the index of an HF folder whose
// config.json and shards are the fixed tiny model in tests/fuzz/data/hf_tiny/, loaded the way
// `clover run -m DIR` loads it (load_hf: index → shards → tensor plan → virtual GGUF).
// Bad input must be one clover::error; what loads must be whole tensors inside the shards.
#include <cstddef>
#include <cstdint>

#include <clover/core/error.hpp>
#include <clover/io/hf_model.hpp>

#include "fuzz_util.hpp"

namespace {

const fuzz::fs::path& folder() {
    static const fuzz::fs::path dir = [] {
        const fuzz::fs::path src = fuzz::source_dir() / "tests/fuzz/data/hf_tiny";
        const fuzz::fs::path d = fuzz::scratch_dir() / "hf";
        fuzz::fs::create_directories(d);
        int shards = 0;
        for (const auto& e : fuzz::fs::directory_iterator(src)) {
            const auto name = e.path().filename().string();
            if (name == "model.safetensors.index.json") continue;  // that is the input
            fuzz::fs::copy_file(e.path(), d / name);
            shards += e.path().extension() == ".safetensors";
        }
        if (shards == 0) fuzz::die("no shards in " + src.string());
        return d;
    }();
    return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const fuzz::fs::path& dir = folder();
    fuzz::write_file(dir / "model.safetensors.index.json", data, size);
    try {
        auto g = clover::hf::load_hf(dir);
        for (const auto& t : g->tensors()) fuzz::touch(t.data, t.nbytes);
    } catch (const clover::error&) {
    }
    return 0;
}
