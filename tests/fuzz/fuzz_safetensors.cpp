// The safetensors header parser (io/safetensors.hpp) on arbitrary bytes, in memory: the input
// buffer is the whole file, so a tensor view past its end is an ASan report. What it accepts is
// checked against the format's promises: ranges inside the data section, sizes that match
// dtype × shape, no two tensors sharing bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <clover/core/error.hpp>
#include <clover/io/safetensors.hpp>

#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
    std::vector<std::pair<std::string, std::string>> metadata;
    std::vector<clover::io::st_tensor> ts;
    try {
        ts = clover::io::parse_safetensors(file, "input.safetensors", &metadata);
    } catch (const clover::error&) {
        return 0;
    }
    const std::byte* end = file.data() + file.size();
    for (const auto& t : ts) {
        if (t.end < t.begin || t.data < file.data() || t.data > end || t.nbytes() > std::size_t(end - t.data))
            fuzz::die("tensor '" + t.name + "': data outside the file");
        std::uint64_t count = 1;
        for (auto d : t.shape) {
            if (d < 0) fuzz::die("tensor '" + t.name + "': negative dimension");
            count *= std::uint64_t(d);  // fits: the checked byte count is at most the file size
        }
        if (count * t.elem_size != t.nbytes()) fuzz::die("tensor '" + t.name + "': " + t.shape_string() + " disagrees with its byte range");
        fuzz::touch(t.data, t.nbytes());
    }
    std::vector<const clover::io::st_tensor*> order;
    for (const auto& t : ts)
        if (t.nbytes() > 0) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < order.size(); ++i)
        if (order[i]->begin < order[i - 1]->end) fuzz::die("tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap");
    return 0;
}
