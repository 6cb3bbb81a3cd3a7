#pragma once
// cuda_fp16.h of the emulated device: the conversions backend::cuda uses. The rounding is GCC's
// _Float16 (correctly rounded, ties to even, overflow to inf): independent of quant/half.hpp's
// bit rule, so a mistake there does not agree with itself here.
#include <cstdint>
#include <cstring>

struct __half {
    std::uint16_t x;
};
inline __half __ushort_as_half(unsigned short v) { return __half{v}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) {
    _Float16 f;
    std::memcpy(&f, &h.x, 2);
    return float(f);
}
inline __half __float2half_rn(float v) {
    const _Float16 f = static_cast<_Float16>(v);
    __half h;
    std::memcpy(&h.x, &f, 2);
    return h;
}
inline __half __float2half(float v) { return __float2half_rn(v); }
