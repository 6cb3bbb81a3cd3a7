// config.json (io/hf_config.hpp) on arbitrary bytes, then what `clover convert` and load_hf do
// with an accepted config: the canonical GGUF metadata keys, written as a GGUF header and read
// back by the GGUF reader (every key must survive). Bad input must be one clover::error.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <clover/core/error.hpp>
#include <clover/io/gguf.hpp>
#include <clover/io/gguf_writer.hpp>
#include <clover/io/hf_config.hpp>

#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const fuzz::fs::path dir = [] {
        auto d = fuzz::scratch_dir() / "config";
        fuzz::fs::create_directories(d);
        return d;
    }();
    fuzz::write_file(dir / "config.json", data, size);
    clover::io::hf_config c;
    try {
        c = clover::io::read_hf_config(dir);  // the folder form, as open_hf calls it
    } catch (const clover::error&) {
        return 0;
    }
    if (c.recurrent.size() != std::size_t(c.n_layer)) fuzz::die("layer pattern of " + std::to_string(c.recurrent.size()) + " for " +
                                                                std::to_string(c.n_layer) + " layers");
    clover::io::gguf_writer w;
    clover::io::put_gguf_metadata(c, c.clover ? "clover_moe" : "qwen35moe", w);
    const std::vector<std::byte> header = w.header();
    const auto gguf = dir / "metadata.gguf";
    fuzz::write_file(gguf, reinterpret_cast<const std::uint8_t*>(header.data()), header.size());
    try {
        clover::io::gguf_file g(gguf);
        for (const auto& [key, v] : w.metadata())
            if (!g.has(key)) fuzz::die("key '" + key + "' lost in the GGUF round trip");
    } catch (const clover::error& e) {
        fuzz::die(std::string("the metadata of an accepted config.json is not a readable GGUF: ") + e.what());
    }
    return 0;
}
