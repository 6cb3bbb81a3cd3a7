#pragma once
// Row-level conversions between weight storage types and f32, and the "activation type" each
// weight type is multiplied with. Matching ggml, an activation row is first converted to the
// weight's partner type (F16 -> F16, BF16 -> BF16, Q8_0 -> Q8_0, Q4_K/Q5_K/Q6_K -> Q8_K,
// F32 -> F32) and the dot product runs in that representation: this is both the fast path and
// what makes our logits agree with llama.cpp's to the last digits on quantized files.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "clover/core/dtype.hpp"
#include "clover/core/error.hpp"
#include "clover/quant/half.hpp"
#include "clover/quant/q4_k.hpp"
#include "clover/quant/q5_k.hpp"
#include "clover/quant/q6_k.hpp"
#include "clover/quant/q8_0.hpp"
#include "clover/quant/q8_k.hpp"

namespace clover::quant {

constexpr bool is_supported_weight(dtype t) {
    return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::q8_0 || t == dtype::q4_k ||
           t == dtype::q5_k || t == dtype::q6_k;
}

// K-quants need rows that are whole super-blocks (256 values); Q8_0 whole blocks of 32.
constexpr std::int64_t row_granule(dtype t) {
    switch (t) {
        case dtype::q8_0: return 32;
        case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: case dtype::q8_k: return 256;
        default: return 1;
    }
}

constexpr dtype activation_type(dtype weight) {
    switch (weight) {
        case dtype::f16: return dtype::f16;
        case dtype::bf16: return dtype::bf16;
        case dtype::q8_0: return dtype::q8_0;
        case dtype::q4_k: case dtype::q5_k: case dtype::q6_k: return dtype::q8_k;
        default: return dtype::f32;
    }
}

// Bytes of one row of n elements stored as t.
inline std::size_t row_bytes(dtype t, std::int64_t n) {
    auto tr = *traits_of(t);
    return std::size_t(n / tr.block) * tr.block_bytes;
}

// src: one row of n elements stored as t -> dst: n floats.
inline void dequantize_row(dtype t, const void* src, float* dst, std::int64_t n) {
    switch (t) {
        case dtype::f32: std::memcpy(dst, src, std::size_t(n) * 4); return;
        case dtype::f16: {
            auto* s = static_cast<const f16_bits*>(src);
            for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
            return;
        }
        case dtype::bf16: {
            auto* s = static_cast<const bf16_bits*>(src);
            for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
            return;
        }
        case dtype::q8_0: dequantize_row_q8_0(static_cast<const block_q8_0*>(src), dst, n); return;
        case dtype::q4_k: dequantize_row_q4_k(static_cast<const block_q4_k*>(src), dst, n); return;
        case dtype::q5_k: dequantize_row_q5_k(static_cast<const block_q5_k*>(src), dst, n); return;
        case dtype::q6_k: dequantize_row_q6_k(static_cast<const block_q6_k*>(src), dst, n); return;
        case dtype::q8_k: dequantize_row_q8_k(static_cast<const block_q8_k*>(src), dst, n); return;
        default: fail("dequantize: tensor type ", dtype_name(t), " is not supported yet");
    }
}

// src: n floats -> dst: one row stored as t.
inline void quantize_row(dtype t, const float* src, void* dst, std::int64_t n) {
    switch (t) {
        case dtype::f32: std::memcpy(dst, src, std::size_t(n) * 4); return;
        case dtype::f16: {
            auto* d = static_cast<f16_bits*>(dst);
            for (std::int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
            return;
        }
        case dtype::bf16: {
            auto* d = static_cast<bf16_bits*>(dst);
            for (std::int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
            return;
        }
        case dtype::q8_0: quantize_row_q8_0(src, static_cast<block_q8_0*>(dst), n); return;
        case dtype::q4_k: quantize_row_q4_k(src, static_cast<block_q4_k*>(dst), n); return;
        case dtype::q5_k: quantize_row_q5_k(src, static_cast<block_q5_k*>(dst), n); return;
        case dtype::q6_k: quantize_row_q6_k(src, static_cast<block_q6_k*>(dst), n); return;
        case dtype::q8_k: quantize_row_q8_k(src, static_cast<block_q8_k*>(dst), n); return;
        default: fail("quantize: tensor type ", dtype_name(t), " is not supported yet");
    }
}

// Reference dot product of a weight row (type t) with an activation row already converted to
// activation_type(t). Plain loops: the twin every SIMD kernel is tested against.
inline float vec_dot_ref(dtype t, const void* w, const void* x, std::int64_t n) {
    switch (t) {
        case dtype::f32: {
            auto* a = static_cast<const float*>(w);
            auto* b = static_cast<const float*>(x);
            double s = 0;
            for (std::int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
            return float(s);
        }
        case dtype::f16: {
            auto* a = static_cast<const f16_bits*>(w);
            auto* b = static_cast<const f16_bits*>(x);
            double s = 0;
            for (std::int64_t i = 0; i < n; ++i) s += double(f16_to_f32(a[i])) * double(f16_to_f32(b[i]));
            return float(s);
        }
        case dtype::bf16: {
            auto* a = static_cast<const bf16_bits*>(w);
            auto* b = static_cast<const bf16_bits*>(x);
            double s = 0;
            for (std::int64_t i = 0; i < n; ++i) s += double(bf16_to_f32(a[i])) * double(bf16_to_f32(b[i]));
            return float(s);
        }
        case dtype::q8_0:
            return vec_dot_q8_0_ref(static_cast<const block_q8_0*>(w), static_cast<const block_q8_0*>(x), n);
        case dtype::q4_k:
            return vec_dot_q4_k_ref(static_cast<const block_q4_k*>(w), static_cast<const block_q8_k*>(x), n);
        case dtype::q5_k:
            return vec_dot_q5_k_ref(static_cast<const block_q5_k*>(w), static_cast<const block_q8_k*>(x), n);
        case dtype::q6_k:
            return vec_dot_q6_k_ref(static_cast<const block_q6_k*>(w), static_cast<const block_q8_k*>(x), n);
        default: fail("vec_dot: tensor type ", dtype_name(t), " is not supported yet");
    }
}

}  // namespace clover::quant
