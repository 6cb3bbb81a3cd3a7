#pragma once
// safetensors reader over a memory map. Layout: u64 little-endian header length N, N bytes of
// JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the data section; offsets are relative to its start.
// Everything is checked before a tensor is handed out: the header length against the file,
// the JSON (io::json: strict, bounded), known dtypes, shape × element size == end − begin, every
// range inside the data section, and no two tensors overlapping. A hostile file gives one
// clover::error naming the file and the tensor, never a crash or a hang.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clover/core/dtype.hpp"
#include "clover/core/error.hpp"
#include "clover/io/json.hpp"
#include "clover/io/mapped_file.hpp"

namespace clover::io {

struct st_tensor {
    std::string name;
    std::string dtype_name;          // as written ("BF16", "F32", "I64", ...)
    std::optional<dtype> type;       // the GGUF dtype when there is one (F32, F16, BF16, F64, I8..I64)
    std::size_t elem_size = 0;
    std::vector<std::int64_t> shape; // row-major, outermost first (PyTorch order)
    std::uint64_t begin = 0, end = 0;  // in the data section
    const std::byte* data = nullptr;
    std::size_t nbytes() const { return std::size_t(end - begin); }
    std::int64_t nelements() const {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        return n;
    }
    std::string shape_string() const {
        std::string s = "[";
        for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
        return s + "]";
    }
};

namespace st_detail {

struct dtype_info {
    std::string_view name;
    std::size_t size;
    std::optional<dtype> gguf;
};
inline std::optional<dtype_info> lookup(std::string_view n) {
    static const dtype_info table[] = {
        {"F64", 8, dtype::f64}, {"F32", 4, dtype::f32}, {"F16", 2, dtype::f16}, {"BF16", 2, dtype::bf16},
        {"I64", 8, dtype::i64}, {"I32", 4, dtype::i32}, {"I16", 2, dtype::i16}, {"I8", 1, dtype::i8},
        {"U64", 8, std::nullopt}, {"U32", 4, std::nullopt}, {"U16", 2, std::nullopt}, {"U8", 1, std::nullopt},
        {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    };
    for (const auto& d : table)
        if (d.name == n) return d;
    return std::nullopt;
}

}  // namespace st_detail

// The safetensors limit on the header (the reference implementation refuses more).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

// Parses and validates the header of a whole file image. `path` names the file in messages.
// Returns the tensors in header order (data pointers into `file`) and the __metadata__ pairs.
inline std::vector<st_tensor> parse_safetensors(std::span<const std::byte> file, const std::string& path,
                                                std::vector<std::pair<std::string, std::string>>* metadata = nullptr) {
    if (file.size() < 8) fail(path, ": not a safetensors file (", file.size(), " bytes, no header length)");
    std::uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    if (n > safetensors_max_header) fail(path, ": safetensors header length ", n, " exceeds the 100 MB limit (not a safetensors file?)");
    if (n > file.size() - 8) fail(path, ": safetensors header length ", n, " runs past the end of the file (", file.size(), " bytes)");
    if (n < 2) fail(path, ": safetensors header of ", n, " bytes cannot hold a JSON object");
    const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), std::size_t(n));
    // The reference writer pads the header with spaces to a multiple of 8; trailing NULs occur too.
    std::size_t len = text.size();
    while (len > 0 && text[len - 1] == '\0') --len;
    json::value root = json::parse(text.substr(0, len), path + " (safetensors header)", 8);
    if (!root.is_object()) fail(path, ": safetensors header is a JSON ", json::kind_name(root.k), ", expected an object");
    const std::byte* data = file.data() + 8 + n;
    const std::uint64_t data_size = file.size() - 8 - n;

    std::vector<st_tensor> out;
    out.reserve(root.size());
    for (std::size_t e = 0; e < root.size(); ++e) {
        const std::string& name = root.keys[e];
        const json::value& entry = root.items[e];
        if (name == "__metadata__") {
            if (!entry.is_object()) fail(path, ": __metadata__ is not an object");
            for (std::size_t k = 0; k < entry.size(); ++k) {
                if (!entry.items[k].is_string()) fail(path, ": __metadata__['", entry.keys[k], "'] is not a string");
                if (metadata) metadata->emplace_back(entry.keys[k], entry.items[k].s);
            }
            continue;
        }
        auto bad = [&](auto&&... what) { fail(path, ": tensor '", name, "': ", what...); };
        if (!entry.is_object()) bad("entry is a JSON ", json::kind_name(entry.k), ", expected an object");
        const json::value* dt = entry.find("dtype");
        const json::value* sh = entry.find("shape");
        const json::value* off = entry.find("data_offsets");
        if (!dt || !dt->is_string()) bad("missing or non-string 'dtype'");
        if (!sh || !sh->is_array()) bad("missing or non-array 'shape'");
        if (!off || !off->is_array() || off->items.size() != 2) bad("'data_offsets' must be an array [begin, end]");
        auto info = st_detail::lookup(dt->s);
        if (!info) bad("unknown dtype '", dt->s.substr(0, 40), "'");
        st_tensor t;
        t.name = name;
        t.dtype_name = std::string(info->name);
        t.type = info->gguf;
        t.elem_size = info->size;
        if (sh->items.size() > 8) bad("shape has ", sh->items.size(), " dimensions");
        unsigned __int128 count = 1;
        for (const auto& d : sh->items) {
            if (!d.is_number() || !d.integral || d.i < 0 || d.i > (std::int64_t(1) << 40))
                bad("shape entry is not a dimension (a non-negative integer)");
            t.shape.push_back(d.i);
            count *= (unsigned __int128)d.i;
        }
        for (int k = 0; k < 2; ++k)
            if (!off->items[k].is_number() || !off->items[k].integral || off->items[k].i < 0)
                bad("data_offsets entry is not a non-negative integer");
        t.begin = std::uint64_t(off->items[0].i);
        t.end = std::uint64_t(off->items[1].i);
        if (t.end < t.begin) bad("data_offsets [", t.begin, ", ", t.end, "] end before begin");
        if (t.end > data_size)
            bad("data_offsets [", t.begin, ", ", t.end, "] run past the data section (", data_size, " bytes; file truncated?)");
        const unsigned __int128 need = count * info->size;
        if (need != (unsigned __int128)(t.end - t.begin))
            bad("dtype ", t.dtype_name, " shape ", t.shape_string(), " needs ", std::uint64_t(need), " bytes but data_offsets span ",
                t.end - t.begin);
        t.data = data + t.begin;
        out.push_back(std::move(t));
    }
    // No two tensors may share bytes (a writer bug or a crafted file aliasing weights).
    std::vector<const st_tensor*> order;
    for (const auto& t : out)
        if (t.end > t.begin) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < order.size(); ++i)
        if (order[i]->begin < order[i - 1]->end)
            fail(path, ": tensors '", order[i - 1]->name, "' [", order[i - 1]->begin, ", ", order[i - 1]->end, ") and '", order[i]->name,
                 "' [", order[i]->begin, ", ", order[i]->end, ") overlap");
    return out;
}

// One mapped .safetensors file.
class safetensors_file {
public:
    explicit safetensors_file(const std::filesystem::path& path) : map_(path) {
        tensors_ = parse_safetensors(map_.bytes(), map_.path(), &metadata_);
        for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
    }
    const std::string& path() const { return map_.path(); }
    const std::vector<st_tensor>& tensors() const { return tensors_; }
    const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }
    const st_tensor* find(std::string_view name) const {
        auto it = index_.find(name);
        return it == index_.end() ? nullptr : &tensors_[it->second];
    }
    const mapped_file& map() const { return map_; }

private:
    mapped_file map_;
    std::vector<st_tensor> tensors_;
    std::vector<std::pair<std::string, std::string>> metadata_;
    std::map<std::string, std::size_t, std::less<>> index_;
};

}  // namespace clover::io
