#pragma once
// IEEE half and bfloat16 <-> float, bit-exact with ggml's reference conversions (the peer we
// compare logits against rounds activations the same way before F16/BF16 dot products).
#include <bit>
#include <cstdint>
#include <cstring>

namespace clover::quant {

using f16_bits = std::uint16_t;
using bf16_bits = std::uint16_t;

constexpr float f16_to_f32(f16_bits h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1f;
    std::uint32_t man = h & 0x3ffu;
    std::uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: renormalise
            int e = -1;
            do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
            bits = sign | (std::uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return std::bit_cast<float>(bits);
}

// Round to nearest even, overflow to inf, NaN kept quiet.
constexpr f16_bits f32_to_f16(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return f16_bits(sign | 0x7e00u);  // NaN
    if (ax >= 0x477ff000u) return f16_bits(sign | 0x7c00u);  // >= 65520 rounds to inf
    if (ax < 0x38800000u) {                                  // below the smallest normal half
        if (ax < 0x33000000u) return f16_bits(sign);         // < 2^-25 rounds to 0
        const std::uint32_t e = ax >> 23;
        const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126 - e;                 // 14..24 bits dropped
        std::uint32_t r = m >> shift;
        const std::uint32_t rem = m & ((1u << shift) - 1);
        const std::uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return f16_bits(sign | r);
    }
    std::uint32_t r = ((ax >> 13) - ((127 - 15) << 10));
    const std::uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return f16_bits(sign | r);
}

constexpr float bf16_to_f32(bf16_bits h) { return std::bit_cast<float>(std::uint32_t(h) << 16); }

constexpr bf16_bits f32_to_bf16(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_bits((u >> 16) | 64u);  // quiet NaN
    return bf16_bits((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace clover::quant
