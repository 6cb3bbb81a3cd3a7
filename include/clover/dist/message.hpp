#pragma once
/// @file
/// @brief Messages between ranks: a byte writer and a checked byte reader.
///
/// Every field carries a one-byte type code (arrays also their element code and count), so a
/// reader that expects a different layout than the writer produced (another kind of message, an
/// int where a float was written, a row of the wrong width, a truncated message) stops at the
/// first mismatch with one clover::error naming the message, the field and what it found,
/// instead of reading garbage. Ranks are assumed to share the byte order (little-endian hosts).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "clover/core/error.hpp"

namespace clover::dist {

static_assert(std::endian::native == std::endian::little, "clover::dist messages assume little-endian ranks");

/// The bytes of one message.
using bytes = std::vector<std::byte>;

namespace detail {

enum class code : std::uint8_t { kind = 1, u8, u16, i32, u32, i64, u64, f32, f64, str, array, raw };

constexpr const char* code_name(std::uint8_t c) {
    switch (code(c)) {
        case code::kind: return "message kind";
        case code::u8: return "u8";
        case code::u16: return "u16";
        case code::i32: return "i32";
        case code::u32: return "u32";
        case code::i64: return "i64";
        case code::u64: return "u64";
        case code::f32: return "f32";
        case code::f64: return "f64";
        case code::str: return "string";
        case code::array: return "array";
        case code::raw: return "raw element";
    }
    return "unknown code";
}

// The element code of an array of T: arithmetic types by kind and size, anything else trivially
// copyable as raw elements of sizeof(T) bytes (checked by size only).
template <class T>
constexpr code code_of() {
    static_assert(std::is_trivially_copyable_v<T>, "message arrays hold trivially copyable elements");
    if constexpr (std::is_same_v<T, float>) return code::f32;
    else if constexpr (std::is_same_v<T, double>) return code::f64;
    else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 1 && std::is_unsigned_v<T>)
        return code::u8;
    else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 2 && std::is_unsigned_v<T>)
        return code::u16;
    else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 4)
        return std::is_signed_v<T> ? code::i32 : code::u32;
    else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 8)
        return std::is_signed_v<T> ? code::i64 : code::u64;
    else
        return code::raw;
}

}  // namespace detail

/// Builds one message: a kind first (what the message is), then typed fields in order.
class writer {
public:
    /// Starts a message of the given kind; the reader checks it before any field.
    explicit writer(std::uint32_t kind) { put_code(detail::code::kind); put_raw(kind); }

    /// Appends a u8 field.
    writer& u8(std::uint8_t v) { return scalar(detail::code::u8, v); }
    /// Appends an i32 field.
    writer& i32(std::int32_t v) { return scalar(detail::code::i32, v); }
    /// Appends a u32 field.
    writer& u32(std::uint32_t v) { return scalar(detail::code::u32, v); }
    /// Appends an i64 field.
    writer& i64(std::int64_t v) { return scalar(detail::code::i64, v); }
    /// Appends a u64 field.
    writer& u64(std::uint64_t v) { return scalar(detail::code::u64, v); }
    /// Appends an f32 field.
    writer& f32(float v) { return scalar(detail::code::f32, v); }
    /// Appends an f64 field.
    writer& f64(double v) { return scalar(detail::code::f64, v); }

    /// Appends a string field (its length, then its bytes).
    writer& str(std::string_view s) {
        put_code(detail::code::str);
        put_raw(std::uint64_t(s.size()));
        append(s.data(), s.size());
        return *this;
    }

    /// Appends an array field: element code, element size, count, then the elements' bytes
    /// (e.g. token ids, positions, or hidden rows [rows, n_embd] as f32 or bf16 bits).
    template <class T>
    writer& array(std::span<const T> v) {
        put_code(detail::code::array);
        put_code(detail::code_of<T>());
        static_assert(sizeof(T) <= 255, "message array elements are at most 255 bytes");
        put_raw(std::uint8_t(sizeof(T)));
        put_raw(std::uint64_t(v.size()));
        append(v.data(), v.size_bytes());
        return *this;
    }
    /// Appends an array field from a vector.
    template <class T>
    writer& array(const std::vector<T>& v) { return array(std::span<const T>(v)); }

    /// The message so far (bytes).
    std::size_t size() const { return buf_.size(); }
    /// Moves the message out; the writer is empty afterwards.
    bytes take() { return std::move(buf_); }

private:
    template <class T>
    writer& scalar(detail::code c, T v) { put_code(c); put_raw(v); return *this; }
    void put_code(detail::code c) { put_raw(std::uint8_t(c)); }
    template <class T>
    void put_raw(T v) { append(&v, sizeof v); }
    void append(const void* p, std::size_t n) {
        const std::size_t at = buf_.size();
        buf_.resize(at + n);
        if (n) std::memcpy(buf_.data() + at, p, n);
    }
    bytes buf_;
};

/// Reads one message field by field, checking each field's type code, an array's element type
/// and length, and the end of the message. Any mismatch throws clover::error naming `what`
/// (e.g. "batch from rank 0"), the field's index and what was found.
class reader {
public:
    /// Reads `data` (which must outlive the reader) as a message of kind `kind`.
    reader(std::span<const std::byte> data, std::uint32_t kind, std::string what) : data_(data), what_(std::move(what)) {
        expect(detail::code::kind);
        const auto k = get_raw<std::uint32_t>();
        if (k != kind) fail(what_, ": expected a message of kind ", kind, ", got kind ", k);
    }

    /// Reads a u8 field.
    std::uint8_t u8() { return scalar<std::uint8_t>(detail::code::u8); }
    /// Reads an i32 field.
    std::int32_t i32() { return scalar<std::int32_t>(detail::code::i32); }
    /// Reads a u32 field.
    std::uint32_t u32() { return scalar<std::uint32_t>(detail::code::u32); }
    /// Reads an i64 field.
    std::int64_t i64() { return scalar<std::int64_t>(detail::code::i64); }
    /// Reads a u64 field.
    std::uint64_t u64() { return scalar<std::uint64_t>(detail::code::u64); }
    /// Reads an f32 field.
    float f32() { return scalar<float>(detail::code::f32); }
    /// Reads an f64 field.
    double f64() { return scalar<double>(detail::code::f64); }

    /// Reads a string field.
    std::string str() {
        expect(detail::code::str);
        const auto n = get_raw<std::uint64_t>();
        need(n, "string");
        std::string s(reinterpret_cast<const char*>(data_.data() + at_), std::size_t(n));
        at_ += std::size_t(n);
        ++field_;
        return s;
    }

    /// Reads an array field of any length into a new vector.
    template <class T>
    std::vector<T> array() {
        const std::uint64_t n = array_header<T>();
        std::vector<T> out(static_cast<std::size_t>(n));
        copy_out(out.data(), std::size_t(n));
        return out;
    }

    /// Reads an array field that must hold exactly `out.size()` elements, into `out` (e.g. hidden
    /// rows into a preallocated [rows, n_embd] buffer).
    template <class T>
    void array_into(std::span<T> out) {
        const std::uint64_t n = array_header<T>();
        if (n != out.size())
            fail(what_, ": field ", field_, " holds ", n, " elements, expected ", out.size());
        copy_out(out.data(), out.size());
    }

    /// Throws unless every byte was read (a longer message than expected is a mismatch too).
    void finish() const {
        if (at_ != data_.size())
            fail(what_, ": ", data_.size() - at_, " unread bytes after field ", field_, " (the writer sent more fields)");
    }

    /// Bytes not read yet.
    std::size_t remaining() const { return data_.size() - at_; }

private:
    template <class T>
    T scalar(detail::code c) {
        expect(c);
        T v = get_raw<T>();
        ++field_;
        return v;
    }

    template <class T>
    std::uint64_t array_header() {
        expect(detail::code::array);
        const auto elem = get_raw<std::uint8_t>();
        const auto size = get_raw<std::uint8_t>();
        if (elem != std::uint8_t(detail::code_of<T>()) || size != sizeof(T))
            fail(what_, ": field ", field_, " is an array of ", detail::code_name(elem), " (", unsigned(size),
                 " bytes each), expected ", detail::code_name(std::uint8_t(detail::code_of<T>())), " (", sizeof(T),
                 " bytes each)");
        const auto n = get_raw<std::uint64_t>();
        // n * sizeof(T) could overflow: compare against what is left instead of multiplying first.
        if (n > remaining() / sizeof(T))
            fail(what_, ": field ", field_, " claims ", n, " elements of ", sizeof(T), " bytes but only ", remaining(),
                 " bytes remain");
        return n;
    }

    template <class T>
    void copy_out(T* dst, std::size_t n) {
        if (n) std::memcpy(dst, data_.data() + at_, n * sizeof(T));
        at_ += n * sizeof(T);
        ++field_;
    }

    void expect(detail::code c) {
        need(1, detail::code_name(std::uint8_t(c)));
        const auto got = std::uint8_t(data_[at_]);
        if (got != std::uint8_t(c))
            fail(what_, ": field ", field_, " is a ", detail::code_name(got), ", expected a ",
                 detail::code_name(std::uint8_t(c)));
        ++at_;
    }

    void need(std::uint64_t n, const char* name) const {
        if (n > remaining())
            fail(what_, ": message ends inside field ", field_, " (", name, ": needs ", n, " bytes, ", remaining(),
                 " remain)");
    }

    template <class T>
    T get_raw() {
        need(sizeof(T), detail::code_name(std::uint8_t(detail::code_of<T>())));
        T v;
        std::memcpy(&v, data_.data() + at_, sizeof v);
        at_ += sizeof v;
        return v;
    }

    std::span<const std::byte> data_;
    std::string what_;
    std::size_t at_ = 0;
    std::size_t field_ = 0;
};

}  // namespace clover::dist
