// The GGUF reader (io/gguf.hpp) on arbitrary bytes, then what every loader does next with a
// file it accepted: typed metadata lookups, the tensor views, and the tokenizer built from the
// file's tokenizer.* keys (tokenizer/vocab.hpp). Bad input must be one clover::error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <clover/core/error.hpp>
#include <clover/io/gguf.hpp>
#include <clover/tokenizer/tokenizer.hpp>

#include "fuzz_util.hpp"

namespace {

void read_metadata(const clover::io::gguf_file& g) {
    using clover::io::gguf_type;
    for (const auto& [key, v] : g.metadata()) {
        try {
            if (v.type == gguf_type::string) (void)g.get_string(key);
            else if (v.type == gguf_type::boolean) (void)g.get_bool(key);
            else if (clover::io::gguf_is_integer(v.type)) (void)g.get_int(key);
            else if (clover::io::gguf_is_float(v.type)) (void)g.get_float(key);
            else if (v.elem == gguf_type::string) (void)g.get_string_array(key);
            else if (clover::io::gguf_is_float(v.elem)) (void)g.get_float_array(key);
            else if (v.elem != gguf_type::array) (void)g.get_int_array(key);
            (void)v.array_size();
        } catch (const clover::error&) {  // a u64 above INT64_MAX, say
        }
    }
}

void read_tensors(const clover::io::gguf_file& g) {
    for (const auto& t : g.tensors()) {
        if (g.find_tensor(t.name) != &t) fuzz::die("find_tensor('" + t.name + "') does not find the tensor");
        if (t.nelements() <= 0 || t.row_bytes() * std::size_t(t.nrows()) != t.nbytes)
            fuzz::die("tensor '" + t.name + "': nbytes " + std::to_string(t.nbytes) + " disagrees with its shape " + t.shape_string());
        const std::byte* end = g.map().data() + g.map().size();
        if (t.data < g.map().data() || t.data > end || t.nbytes > std::size_t(end - t.data))
            fuzz::die("tensor '" + t.name + "': data outside the file");
        fuzz::touch(t.data, t.nbytes);
    }
    // Two tensors sharing bytes: a crafted file aliasing weights (issue 18; safetensors refuses it).
    std::vector<const clover::io::gguf_tensor*> order;
    for (const auto& t : g.tensors()) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < order.size(); ++i)
        if (order[i - 1]->nbytes > 0 && order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
            fuzz::die("tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const fuzz::fs::path path = fuzz::scratch_dir() / "input.gguf";
    fuzz::write_file(path, data, size);
    try {
        clover::io::gguf_file g(path);
        read_metadata(g);
        read_tensors(g);
        if (g.has("tokenizer.ggml.tokens")) {
            clover::tokenizer tok = clover::tokenizer::from_gguf(g, path.string());
            const auto ids = tok.encode("Hello, world! <|im_end|> 123 \xC3\xA9\xF0\x9F\x99\x82");
            (void)tok.decode(ids);
        }
    } catch (const clover::error&) {
    }
    return 0;
}
