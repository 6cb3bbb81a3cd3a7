#pragma once
// GGUF (v2/v3) reader over a memory map. Every read is bounds-checked: a truncated or hostile
// file yields one clover::error naming the file and what is wrong, never a crash or a hang
// (counts are checked against the bytes left before anything is allocated).
//
// Layout (little-endian): "GGUF" u32 version, u64 n_tensors, u64 n_kv, n_kv × (key, u32 type,
// value), n_tensors × (name, u32 n_dims, n_dims × u64 ne, u32 dtype, u64 offset), padding to
// `general.alignment` (default 32), then tensor data at data_offset + offset.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clover/core/dtype.hpp"
#include "clover/core/error.hpp"
#include "clover/io/mapped_file.hpp"

namespace clover::io {

enum class gguf_type : std::uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
    string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

constexpr std::string_view gguf_type_name(gguf_type t) {
    constexpr std::string_view names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                          "string", "array", "u64", "i64", "f64"};
    auto i = static_cast<std::uint32_t>(t);
    return i < 13 ? names[i] : std::string_view{"invalid"};
}
constexpr bool gguf_is_integer(gguf_type t) {
    return t == gguf_type::u8 || t == gguf_type::i8 || t == gguf_type::u16 || t == gguf_type::i16 ||
           t == gguf_type::u32 || t == gguf_type::i32 || t == gguf_type::u64 || t == gguf_type::i64;
}
constexpr bool gguf_is_float(gguf_type t) { return t == gguf_type::f32 || t == gguf_type::f64; }

// One metadata value. Scalars keep their GGUF type (so a rewrite can keep it); integers are held
// as int64 (u64 values above INT64_MAX keep their bit pattern), floats as double.
struct gguf_value {
    gguf_type type = gguf_type::u32;
    gguf_type elem = gguf_type::u32;    // arrays: the element type
    std::int64_t i = 0;                 // integer and bool scalars
    double f = 0;                       // float scalars
    std::string s;                      // string scalar
    std::vector<std::int64_t> ints;     // arrays of integers or bools
    std::vector<double> floats;         // arrays of floats
    std::vector<std::string> strs;      // arrays of strings
    std::vector<gguf_value> arrays;     // arrays of arrays

    std::size_t array_size() const {
        if (type != gguf_type::array) return 0;
        if (elem == gguf_type::string) return strs.size();
        if (elem == gguf_type::array) return arrays.size();
        if (gguf_is_float(elem)) return floats.size();
        return ints.size();
    }
};

struct gguf_tensor {
    std::string name;
    dtype type = dtype::f32;
    int n_dims = 1;
    std::array<std::int64_t, 4> ne{1, 1, 1, 1};  // ne[0] is contiguous
    std::uint64_t offset = 0;                    // relative to the data section
    std::size_t nbytes = 0;
    const std::byte* data = nullptr;

    std::int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    std::int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    std::size_t row_bytes() const {
        auto tr = *traits_of(type);
        return std::size_t(ne[0] / tr.block) * tr.block_bytes;
    }
    std::string shape_string() const {
        std::string s = "{";
        for (int d = 0; d < n_dims; ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
        return s + "}";
    }
};

class gguf_file {
public:
    explicit gguf_file(const std::filesystem::path& path) : map_(path) {
        path_ = map_.path();
        parse();
    }

    // A virtual file assembled in memory (an HF folder, a file with vendor variants fixed in
    // memory): metadata as given, tensors whose `data` points at bytes that `keep_alive` owns
    // (mapped shards, converted buffers). `path` names it in messages. The same checks as for a
    // parsed file apply: unique keys and names, known types, whole blocks, sizes that match.
    gguf_file(std::string path, std::vector<std::pair<std::string, gguf_value>> kv, std::vector<gguf_tensor> tensors,
              std::shared_ptr<const void> keep_alive)
        : path_(std::move(path)), version_(3), kv_(std::move(kv)), tensors_(std::move(tensors)), keep_(std::move(keep_alive)),
          virtual_(true) {
        for (std::size_t i = 0; i < kv_.size(); ++i)
            if (!kv_index_.emplace(kv_[i].first, i).second) fail(path_, ": duplicate metadata key '", kv_[i].first, "'");
        if (const gguf_value* a = find("general.alignment"); a && a->type == gguf_type::u32 && a->i > 0) alignment_ = std::size_t(a->i);
        for (std::size_t i = 0; i < tensors_.size(); ++i) {
            gguf_tensor& t = tensors_[i];
            if (!tensor_index_.emplace(t.name, i).second) fail(path_, ": duplicate tensor '", t.name, "'");
            auto tr = traits_of(t.type);
            if (!tr) fail(path_, ": tensor '", t.name, "': unknown tensor type ", std::uint32_t(t.type));
            if (t.n_dims < 1 || t.n_dims > 4) fail(path_, ": tensor '", t.name, "': ", t.n_dims, " dimensions (1..4 allowed)");
            for (int d = 0; d < 4; ++d)
                if (t.ne[d] < 1 || (d >= t.n_dims && t.ne[d] != 1)) fail(path_, ": tensor '", t.name, "': bad shape ", t.shape_string());
            if (t.ne[0] % tr->block != 0) fail(path_, ": tensor '", t.name, "': row is not a whole number of ", tr->name, " blocks");
            const std::optional<std::size_t> size = byte_size(t);
            if (!size) fail(path_, ": tensor '", t.name, "' ", t.shape_string(), ": its size does not fit in 64 bits");
            const std::size_t bytes = *size;
            if (t.nbytes == 0) t.nbytes = bytes;
            if (t.nbytes != bytes || !t.data) fail(path_, ": tensor '", t.name, "': no data or ", t.nbytes, " bytes for ", bytes);
        }
    }

    const std::string& path() const { return path_; }
    bool is_virtual() const { return virtual_; }
    std::uint32_t version() const { return version_; }
    std::size_t alignment() const { return alignment_; }
    std::size_t data_offset() const { return data_offset_; }
    const mapped_file& map() const { return map_; }

    // Metadata in file order.
    const std::vector<std::pair<std::string, gguf_value>>& metadata() const { return kv_; }
    const gguf_value* find(std::string_view key) const {
        auto it = kv_index_.find(std::string(key));
        return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
    }
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters: nullopt when the key is absent; an error naming the key when its type is wrong.
    std::optional<std::string> get_string(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != gguf_type::string) wrong_type(key, *v, "string");
        return v->s;
    }
    std::optional<std::int64_t> get_int(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (!gguf_is_integer(v->type)) wrong_type(key, *v, "integer");
        if (v->type == gguf_type::u64 && v->i < 0) fail(path(), ": key '", key, "': value too large");
        return v->i;
    }
    std::optional<double> get_float(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (gguf_is_float(v->type)) return v->f;
        if (gguf_is_integer(v->type)) return double(v->i);
        wrong_type(key, *v, "float");
    }
    std::optional<bool> get_bool(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != gguf_type::boolean) wrong_type(key, *v, "bool");
        return v->i != 0;
    }
    std::optional<std::vector<std::string>> get_string_array(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != gguf_type::array || v->elem != gguf_type::string) wrong_type(key, *v, "array of string");
        return v->strs;
    }
    std::optional<std::vector<std::int64_t>> get_int_array(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != gguf_type::array || !(gguf_is_integer(v->elem) || v->elem == gguf_type::boolean))
            wrong_type(key, *v, "array of integer");
        return v->ints;
    }
    std::optional<std::vector<double>> get_float_array(std::string_view key) const {
        const gguf_value* v = find(key);
        if (!v) return std::nullopt;
        if (v->type != gguf_type::array || !gguf_is_float(v->elem)) wrong_type(key, *v, "array of float");
        return v->floats;
    }

    const std::vector<gguf_tensor>& tensors() const { return tensors_; }
    const gguf_tensor* find_tensor(std::string_view name) const {
        auto it = tensor_index_.find(std::string(name));
        return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
    }
    const gguf_tensor& tensor(std::string_view name) const {
        const gguf_tensor* t = find_tensor(name);
        if (!t) fail(path(), ": missing tensor '", name, "'");
        return *t;
    }

private:
    // The bytes of t (a known type, dimensions >= 1, whole blocks per row), or nullopt when its
    // element count or size does not fit in 64 bits: then nelements() and nrows() could not
    // be trusted either.
    static std::optional<std::size_t> byte_size(const gguf_tensor& t) {
        std::int64_t n = 1;
        for (std::int64_t d : t.ne)
            if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
        std::size_t bytes = 0;
        if (__builtin_mul_overflow(t.row_bytes(), std::size_t(t.nrows()), &bytes)) return std::nullopt;
        return bytes;
    }

    [[noreturn]] void wrong_type(std::string_view key, const gguf_value& v, std::string_view want) const {
        std::string got(gguf_type_name(v.type));
        if (v.type == gguf_type::array) got += " of " + std::string(gguf_type_name(v.elem));
        fail(path(), ": key '", key, "' has type ", got, ", expected ", want);
    }

    // Bounds-checked little-endian cursor over the map.
    struct cursor {
        const gguf_file* f;
        std::size_t pos = 0;
        std::size_t left() const { return f->map_.size() - pos; }
        void need(std::size_t n, const char* what) const {
            if (n > left()) fail(f->path(), ": truncated file while reading ", what, " at byte ", pos);
        }
        template <class T>
        T read(const char* what) {
            need(sizeof(T), what);
            T v;
            std::memcpy(&v, f->map_.data() + pos, sizeof(T));
            pos += sizeof(T);
            return v;
        }
        std::string read_string(const char* what) {
            auto n = read<std::uint64_t>(what);
            if (n > left()) fail(f->path(), ": string length ", n, " of ", what, " runs past the end of the file");
            std::string s(reinterpret_cast<const char*>(f->map_.data() + pos), std::size_t(n));
            pos += std::size_t(n);
            return s;
        }
    };

    // Reserves room for n items, but never more memory than the file bytes left could fill:
    // a count is checked against the bytes before, yet an item in memory is larger than its
    // encoding (an empty string: 8 bytes in the file, 32 in memory), and a count that passes
    // may still be followed by truncated items.
    template <class V>
    static void reserve_within(V& v, std::uint64_t n, std::size_t bytes_left) {
        v.reserve(std::size_t(std::min<std::uint64_t>(n, bytes_left / sizeof(typename V::value_type))));
    }

    // Arrays of arrays cost ~150 bytes of memory for 12 bytes of file each; nothing real uses
    // many (llama.cpp reads none), so a file may hold this many in all.
    static constexpr std::uint64_t max_nested_arrays = 65536;
    std::uint64_t nested_arrays_ = 0;

    static std::size_t scalar_size(gguf_type t) {
        switch (t) {
            case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
            case gguf_type::u16: case gguf_type::i16: return 2;
            case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
            case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: return 8;
            case gguf_type::string: return 8;  // at least its length prefix
            case gguf_type::array: return 12;  // at least type + count
        }
        return 0;
    }

    gguf_value read_value(cursor& c, gguf_type t, const std::string& key, int depth) {
        gguf_value v;
        v.type = t;
        switch (t) {
            case gguf_type::u8: v.i = c.read<std::uint8_t>("value"); break;
            case gguf_type::i8: v.i = c.read<std::int8_t>("value"); break;
            case gguf_type::u16: v.i = c.read<std::uint16_t>("value"); break;
            case gguf_type::i16: v.i = c.read<std::int16_t>("value"); break;
            case gguf_type::u32: v.i = c.read<std::uint32_t>("value"); break;
            case gguf_type::i32: v.i = c.read<std::int32_t>("value"); break;
            case gguf_type::u64: v.i = std::int64_t(c.read<std::uint64_t>("value")); break;
            case gguf_type::i64: v.i = c.read<std::int64_t>("value"); break;
            case gguf_type::f32: v.f = c.read<float>("value"); break;
            case gguf_type::f64: v.f = c.read<double>("value"); break;
            case gguf_type::boolean: {
                auto b = c.read<std::uint8_t>("value");
                if (b > 1) fail(path(), ": key '", key, "': bool value ", int(b), " is neither 0 nor 1");
                v.i = b;
                break;
            }
            case gguf_type::string: v.s = c.read_string("string value"); break;
            case gguf_type::array: {
                if (depth >= 4) fail(path(), ": key '", key, "': arrays nested too deeply");
                auto et = c.read<std::uint32_t>("array type");
                if (et > 12) fail(path(), ": key '", key, "': unknown array element type ", et);
                v.elem = gguf_type(et);
                auto n = c.read<std::uint64_t>("array length");
                if (n > c.left() / scalar_size(v.elem))
                    fail(path(), ": key '", key, "': array length ", n, " exceeds the file size");
                if (v.elem == gguf_type::string) {
                    reserve_within(v.strs, n, c.left());
                    for (std::uint64_t k = 0; k < n; ++k) v.strs.push_back(c.read_string("array string"));
                } else if (v.elem == gguf_type::array) {
                    if (n > max_nested_arrays - nested_arrays_)
                        fail(path(), ": key '", key, "': ", n, " nested arrays (arrays of arrays); at most ", max_nested_arrays,
                             " in a file");
                    nested_arrays_ += n;
                    reserve_within(v.arrays, n, c.left());
                    for (std::uint64_t k = 0; k < n; ++k)
                        v.arrays.push_back(read_value(c, gguf_type::array, key, depth + 1));
                } else if (gguf_is_float(v.elem)) {
                    reserve_within(v.floats, n, c.left());
                    for (std::uint64_t k = 0; k < n; ++k) v.floats.push_back(read_value(c, v.elem, key, depth + 1).f);
                } else {
                    reserve_within(v.ints, n, c.left());
                    for (std::uint64_t k = 0; k < n; ++k) v.ints.push_back(read_value(c, v.elem, key, depth + 1).i);
                }
                break;
            }
            default: fail(path(), ": key '", key, "': unknown value type ", std::uint32_t(t));
        }
        return v;
    }

    void parse() {
        cursor c{this};
        if (map_.size() < 4 || std::memcmp(map_.data(), "GGUF", 4) != 0) fail(path(), ": not a GGUF file (bad magic)");
        c.pos = 4;
        version_ = c.read<std::uint32_t>("version");
        if (version_ != 2 && version_ != 3)
            fail(path(), ": unsupported GGUF version ", version_, " (supported: 2, 3)");
        auto n_tensors = c.read<std::uint64_t>("tensor count");
        auto n_kv = c.read<std::uint64_t>("metadata count");
        // Each key/value takes at least 13 bytes and each tensor record at least 32.
        if (n_kv > c.left() / 13) fail(path(), ": metadata count ", n_kv, " exceeds the file size");
        if (n_tensors > c.left() / 32) fail(path(), ": tensor count ", n_tensors, " exceeds the file size");

        reserve_within(kv_, n_kv, c.left());
        for (std::uint64_t k = 0; k < n_kv; ++k) {
            std::string key = c.read_string("metadata key");
            auto t = c.read<std::uint32_t>("metadata type");
            if (t > 12) fail(path(), ": key '", key, "': unknown value type ", t);
            gguf_value v = read_value(c, gguf_type(t), key, 0);
            if (kv_index_.count(key)) fail(path(), ": duplicate metadata key '", key, "'");
            kv_index_[key] = kv_.size();
            kv_.emplace_back(std::move(key), std::move(v));
        }
        if (const gguf_value* a = find("general.alignment")) {
            if (a->type != gguf_type::u32 || a->i == 0 || (a->i & (a->i - 1)) != 0)
                fail(path(), ": general.alignment must be a u32 power of two");
            alignment_ = std::size_t(a->i);
        }

        reserve_within(tensors_, n_tensors, c.left());
        for (std::uint64_t k = 0; k < n_tensors; ++k) {
            gguf_tensor t;
            t.name = c.read_string("tensor name");
            auto nd = c.read<std::uint32_t>("tensor dims");
            if (nd < 1 || nd > 4) fail(path(), ": tensor '", t.name, "': ", nd, " dimensions (1..4 allowed)");
            t.n_dims = int(nd);
            for (std::uint32_t d = 0; d < nd; ++d) {
                auto ne = c.read<std::uint64_t>("tensor shape");
                if (ne == 0 || ne > (std::uint64_t(1) << 40))
                    fail(path(), ": tensor '", t.name, "': dimension ", d, " is ", ne);
                t.ne[d] = std::int64_t(ne);
            }
            auto ty = c.read<std::uint32_t>("tensor type");
            auto tr = traits_of(dtype(ty));
            if (!tr) fail(path(), ": tensor '", t.name, "': unknown tensor type ", ty);
            t.type = dtype(ty);
            t.offset = c.read<std::uint64_t>("tensor offset");
            if (t.ne[0] % tr->block != 0)
                fail(path(), ": tensor '", t.name, "': row of ", t.ne[0], " elements is not a multiple of the ",
                     tr->name, " block (", tr->block, ")");
            const std::optional<std::size_t> bytes = byte_size(t);
            if (!bytes || *bytes > map_.size())
                fail(path(), ": tensor '", t.name, "' ", t.shape_string(), " is larger than the file",
                     bytes ? "" : " (its size does not even fit in 64 bits)");
            t.nbytes = *bytes;
            if (tensor_index_.count(t.name)) fail(path(), ": duplicate tensor '", t.name, "'");
            tensor_index_[t.name] = tensors_.size();
            tensors_.push_back(std::move(t));
        }
        data_offset_ = (c.pos + alignment_ - 1) / alignment_ * alignment_;
        if (data_offset_ > map_.size() && !tensors_.empty()) fail(path(), ": truncated file: no tensor data");
        std::size_t data_size = map_.size() > data_offset_ ? map_.size() - data_offset_ : 0;
        for (gguf_tensor& t : tensors_) {
            if (t.offset % alignment_ != 0)
                fail(path(), ": tensor '", t.name, "': data offset ", t.offset, " is not aligned to ", alignment_);
            if (t.offset > data_size || t.nbytes > data_size - t.offset)
                fail(path(), ": tensor '", t.name, "': data [", t.offset, ", +", t.nbytes,
                     ") is out of range (data section holds ", data_size, " bytes; file truncated?)");
            t.data = map_.data() + data_offset_ + t.offset;
        }
        refuse_overlaps();
    }

    // Two tensors sharing bytes: a writer bug, or a crafted file aliasing weights (a write
    // through one would change the other). safetensors refuses them too.
    void refuse_overlaps() const {
        std::vector<const gguf_tensor*> order;
        order.reserve(tensors_.size());
        for (const auto& t : tensors_) order.push_back(&t);
        std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
        for (std::size_t i = 1; i < order.size(); ++i) {
            const gguf_tensor& a = *order[i - 1];
            const gguf_tensor& b = *order[i];
            if (b.offset < a.offset + a.nbytes)
                fail(path(), ": tensors '", a.name, "' [", a.offset, ", ", a.offset + a.nbytes, ") and '", b.name, "' [", b.offset, ", ",
                     b.offset + b.nbytes, ") overlap");
        }
    }

    mapped_file map_;  // empty for a virtual file
    std::string path_;
    std::uint32_t version_ = 0;
    std::size_t alignment_ = 32;
    std::size_t data_offset_ = 0;
    std::vector<std::pair<std::string, gguf_value>> kv_;
    std::map<std::string, std::size_t, std::less<>> kv_index_;
    std::vector<gguf_tensor> tensors_;
    std::map<std::string, std::size_t, std::less<>> tensor_index_;
    std::shared_ptr<const void> keep_;  // virtual files: what owns the tensor bytes
    bool virtual_ = false;
};

}  // namespace clover::io
