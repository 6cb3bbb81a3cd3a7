#pragma once
// GGUF v3 writer. Metadata first, tensors declared with their shapes, then the file is streamed
// tensor by tensor: each tensor's bytes come from a fill callback (synthesis, conversion) or a
// span (copying from another mapped file), so memory stays bounded by the largest tensor.
// Writes go through io::atomic_output (a fresh temporary file, fsync, rename): a failure never
// leaves a broken OUT, and an OUT that is one of the inputs is refused.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "clover/io/atomic_file.hpp"
#include "clover/io/gguf.hpp"

namespace clover::io {

class gguf_writer {
public:
    using fill_fn = std::function<void(std::span<std::byte>)>;

    explicit gguf_writer(std::size_t alignment = 32) : alignment_(alignment) {}

    void set(const std::string& key, gguf_value v) {
        for (auto& kv : kv_)
            if (kv.first == key) { kv.second = std::move(v); return; }
        kv_.emplace_back(key, std::move(v));
    }
    void remove(const std::string& key) {
        std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; });
    }
    void set_string(const std::string& key, std::string s) { gguf_value v; v.type = gguf_type::string; v.s = std::move(s); set(key, std::move(v)); }
    void set_u32(const std::string& key, std::uint32_t x) { set(key, scalar(gguf_type::u32, x)); }
    void set_i32(const std::string& key, std::int32_t x) { set(key, scalar(gguf_type::i32, x)); }
    void set_u64(const std::string& key, std::uint64_t x) { set(key, scalar(gguf_type::u64, std::int64_t(x))); }
    void set_bool(const std::string& key, bool x) { set(key, scalar(gguf_type::boolean, x ? 1 : 0)); }
    void set_f32(const std::string& key, float x) { gguf_value v; v.type = gguf_type::f32; v.f = x; set(key, std::move(v)); }
    void set_string_array(const std::string& key, std::vector<std::string> a) {
        gguf_value v; v.type = gguf_type::array; v.elem = gguf_type::string; v.strs = std::move(a); set(key, std::move(v));
    }
    void set_int_array(const std::string& key, gguf_type elem, std::vector<std::int64_t> a) {
        gguf_value v; v.type = gguf_type::array; v.elem = elem; v.ints = std::move(a); set(key, std::move(v));
    }
    void set_f32_array(const std::string& key, std::vector<double> a) {
        gguf_value v; v.type = gguf_type::array; v.elem = gguf_type::f32; v.floats = std::move(a); set(key, std::move(v));
    }

    void add_tensor(std::string name, dtype type, std::vector<std::int64_t> ne, fill_fn fill) {
        gguf_tensor t;
        t.name = std::move(name);
        t.type = type;
        t.n_dims = int(ne.size());
        if (ne.empty() || ne.size() > 4) fail("gguf writer: tensor '", t.name, "' needs 1..4 dimensions");
        for (std::size_t d = 0; d < ne.size(); ++d) t.ne[d] = ne[d];
        auto tr = traits_of(type);
        if (!tr || t.ne[0] % tr->block != 0)
            fail("gguf writer: tensor '", t.name, "': row ", t.ne[0], " is not a multiple of the ", dtype_name(type), " block");
        t.nbytes = t.row_bytes() * std::size_t(t.nrows());
        t.offset = next_offset_;
        next_offset_ += (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
        tensors_.push_back(std::move(t));
        fills_.push_back(std::move(fill));
    }
    void add_tensor_bytes(std::string name, dtype type, std::vector<std::int64_t> ne, std::span<const std::byte> src) {
        add_tensor(std::move(name), type, std::move(ne), [src](std::span<std::byte> dst) {
            if (src.size() != dst.size()) fail("gguf writer: source bytes do not match the tensor size");
            std::memcpy(dst.data(), src.data(), dst.size());
        });
    }
    const std::vector<gguf_tensor>& tensors() const { return tensors_; }
    const std::vector<std::pair<std::string, gguf_value>>& metadata() const { return kv_; }

    // The bytes before the data section, as write() lays them out: magic, counts, metadata,
    // tensor records, zero padding to the alignment (pad = false: without that padding).
    // Tensor i's data then starts at header().size() + tensors()[i].offset. For callers that
    // place tensor bytes themselves (`gguf patch` copies them with copy_file_range).
    std::vector<std::byte> header(bool pad = true) {
        set_u32("general.alignment", std::uint32_t(alignment_));
        std::vector<std::byte> head;
        put(head, "GGUF", 4);
        put_t<std::uint32_t>(head, 3);
        put_t<std::uint64_t>(head, tensors_.size());
        put_t<std::uint64_t>(head, kv_.size());
        for (auto& [k, v] : kv_) {
            put_str(head, k);
            put_t<std::uint32_t>(head, std::uint32_t(v.type));
            put_value(head, v);
        }
        for (auto& t : tensors_) {
            put_str(head, t.name);
            put_t<std::uint32_t>(head, std::uint32_t(t.n_dims));
            for (int d = 0; d < t.n_dims; ++d) put_t<std::uint64_t>(head, std::uint64_t(t.ne[d]));
            put_t<std::uint32_t>(head, std::uint32_t(t.type));
            put_t<std::uint64_t>(head, t.offset);
        }
        if (pad) head.resize((head.size() + alignment_ - 1) / alignment_ * alignment_);
        return head;
    }
    // Bytes of the data section (every tensor padded to the alignment).
    std::uint64_t data_size() const { return next_offset_; }

    // progress(i, n) is called after each tensor. The file is written through io::atomic_output:
    // all or nothing, and never over one of `inputs` (the files the tensors are read from).
    void write(const std::filesystem::path& out, const std::function<void(std::size_t, std::size_t)>& progress = {},
               std::vector<file_identity> inputs = {}) {
        atomic_output f(out, std::move(inputs));
        const std::vector<std::byte> head = header();
        f.write(head.data(), head.size());
        std::vector<std::byte> buf;
        for (std::size_t i = 0; i < tensors_.size(); ++i) {
            const auto& t = tensors_[i];
            std::size_t padded = (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
            buf.assign(padded, std::byte{0});
            fills_[i](std::span<std::byte>(buf.data(), t.nbytes));
            f.write(buf.data(), padded);
            if (progress) progress(i + 1, tensors_.size());
        }
        f.commit();
    }

private:
    static gguf_value scalar(gguf_type t, std::int64_t x) { gguf_value v; v.type = t; v.i = x; return v; }
    static void put(std::vector<std::byte>& b, const void* p, std::size_t n) {
        auto* c = static_cast<const std::byte*>(p);
        b.insert(b.end(), c, c + n);
    }
    template <class T>
    static void put_t(std::vector<std::byte>& b, T x) { put(b, &x, sizeof x); }
    static void put_str(std::vector<std::byte>& b, const std::string& s) {
        put_t<std::uint64_t>(b, s.size());
        put(b, s.data(), s.size());
    }
    static void put_scalar(std::vector<std::byte>& b, gguf_type t, std::int64_t i, double f) {
        switch (t) {
            case gguf_type::u8: case gguf_type::boolean: put_t<std::uint8_t>(b, std::uint8_t(i)); break;
            case gguf_type::i8: put_t<std::int8_t>(b, std::int8_t(i)); break;
            case gguf_type::u16: put_t<std::uint16_t>(b, std::uint16_t(i)); break;
            case gguf_type::i16: put_t<std::int16_t>(b, std::int16_t(i)); break;
            case gguf_type::u32: put_t<std::uint32_t>(b, std::uint32_t(i)); break;
            case gguf_type::i32: put_t<std::int32_t>(b, std::int32_t(i)); break;
            case gguf_type::u64: put_t<std::uint64_t>(b, std::uint64_t(i)); break;
            case gguf_type::i64: put_t<std::int64_t>(b, i); break;
            case gguf_type::f32: put_t<float>(b, float(f)); break;
            case gguf_type::f64: put_t<double>(b, f); break;
            default: fail("gguf writer: bad scalar type");
        }
    }
    static void put_value(std::vector<std::byte>& b, const gguf_value& v) {
        if (v.type == gguf_type::string) { put_str(b, v.s); return; }
        if (v.type != gguf_type::array) { put_scalar(b, v.type, v.i, v.f); return; }
        put_t<std::uint32_t>(b, std::uint32_t(v.elem));
        put_t<std::uint64_t>(b, v.array_size());
        put_array_items(b, v);
    }
    static void put_array_items(std::vector<std::byte>& b, const gguf_value& a) {
        if (a.elem == gguf_type::string) for (auto& s : a.strs) put_str(b, s);
        else if (a.elem == gguf_type::array) for (auto& x : a.arrays) put_value(b, x);
        else if (gguf_is_float(a.elem)) for (double x : a.floats) put_scalar(b, a.elem, 0, x);
        else for (std::int64_t x : a.ints) put_scalar(b, a.elem, x, 0);
    }
    std::size_t alignment_;
    std::vector<std::pair<std::string, gguf_value>> kv_;
    std::vector<gguf_tensor> tensors_;
    std::vector<fill_fn> fills_;
    std::uint64_t next_offset_ = 0;
};

}  // namespace clover::io
