#pragma once
// The per-format dot products of the matrix-product kernel (matmul.cuh): a weight row is walked
// in "items" (an element, a Q8_0 block, a K-quant sub-block of 32, a Q6_K group of 16), and
// item_dot<T, R> adds item `it` of weight row w times R activation rows (already in the weight's
// partner type, quant/rows.hpp) into acc[r], r < nr.
//
// Two forms, bit-identical:
//   item_dot_ref  the plain one: byte loads, codes unpacked one by one, int products summed in
//                 a loop — the twin;
//   item_dot      packed: the codes of 4 elements stay in one 32-bit word (nibbles, the Q5_K
//                 fifth bit and the Q6_K high bits merged with masks), and __dp4a sums four
//                 int8 products per instruction. An integer sum is exact in any order, and the
//                 float arithmetic after it is the same expressions, so both forms give the same
//                 bits (test_quant_dot.cu checks every format on the host; the kernel twins check the
//                 kernels on a GPU). For the quantized formats this replaces 32 byte loads, 32
//                 unpacks and 32 multiply-adds per item and activation row with 8 word loads and
//                 8 dp4a (unmeasured: no GPU was lent while this was written).
// Everything here is __host__ __device__: on the host, dp4a is the same sum written out, so the
// exactness test runs in CI without a GPU.
//
// Alignment the packed loads need (launch_mm checks it on the host): Q4_K/Q5_K weight rows and
// every Q8_K activation row 4-byte aligned (blocks of 144, 176 and 292 bytes keep it); Q8_0 rows
// and Q6_K rows (blocks of 34 and 210 bytes) only 2-byte aligned, read as 16-bit halves.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "clover/backend/cuda/runtime.cuh"
#include "clover/core/dtype.hpp"

namespace clover::backend::cuda_detail {

inline constexpr std::size_t q8_0_bytes = 34, q8_k_bytes = 292;

// Four int8 products of a and b (byte by byte, signed) added to c.
__host__ __device__ inline int dp4a(std::uint32_t a, std::uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(int(a), int(b), c);
#else
    for (int i = 0; i < 4; ++i) c += int(std::int8_t(a >> (8 * i))) * int(std::int8_t(b >> (8 * i)));
    return c;
#endif
}

// A little-endian 32-bit word from 4-byte aligned p / from 2-byte aligned p (two halves).
__host__ __device__ inline std::uint32_t load_w32(const std::uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const std::uint32_t*>(p);
#else
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
#endif
}
__host__ __device__ inline std::uint32_t load_w32_from_halves(const std::uint8_t* p) {
#ifdef __CUDA_ARCH__
    const auto* h = reinterpret_cast<const std::uint16_t*>(p);
    return std::uint32_t(h[0]) | (std::uint32_t(h[1]) << 16);
#else
    return load_w32(p);
#endif
}

template <dtype T>
__host__ __device__ constexpr std::int64_t items(std::int64_t K) {
    if constexpr (T == dtype::q8_0) return K / 32;
    else if constexpr (T == dtype::q4_k || T == dtype::q5_k) return K / 256 * 8;
    else if constexpr (T == dtype::q6_k) return K / 256 * 16;
    else return K;
}

// The (scale, min) of sub-block j from the 12 packed bytes (quant::unpack_scales_k4).
__host__ __device__ inline void scale_min_k4(const std::uint8_t* b, int j, int& sc, int& m) {
    if (j < 4) {
        sc = b[j] & 63;
        m = b[j + 4] & 63;
    } else {
        sc = (b[j + 4] & 15) | ((b[j - 4] >> 6) << 4);
        m = (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
    }
}

template <dtype T, int R>
__host__ __device__ inline void item_dot_ref(const std::uint8_t* w, const std::uint8_t* const* x, std::int64_t it, float* acc, int nr) {
    if constexpr (T == dtype::f32) {
        const float wv = reinterpret_cast<const float*>(w)[it];
        for (int r = 0; r < R; ++r)
            if (r < nr) acc[r] = fmaf(wv, reinterpret_cast<const float*>(x[r])[it], acc[r]);
    } else if constexpr (T == dtype::f16 || T == dtype::bf16) {
        auto cvt = [](std::uint16_t h) { return T == dtype::f16 ? f16_to_f32(h) : bf16_to_f32(h); };
        const float wv = cvt(reinterpret_cast<const std::uint16_t*>(w)[it]);
        for (int r = 0; r < R; ++r)
            if (r < nr) acc[r] = fmaf(wv, cvt(reinterpret_cast<const std::uint16_t*>(x[r])[it]), acc[r]);
    } else if constexpr (T == dtype::q8_0) {
        // Byte loads: blocks are 34 bytes, so the int8 run is only 2-byte aligned (no dp4a loads).
        const std::uint8_t* wb = w + it * q8_0_bytes;
        const float dw = f16_to_f32(load_u16(wb));
        int q[32];
        for (int i = 0; i < 32; ++i) q[i] = std::int8_t(wb[2 + i]);
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            const std::uint8_t* xb = x[r] + it * q8_0_bytes;
            int s = 0;
            for (int i = 0; i < 32; ++i) s += q[i] * int(std::int8_t(xb[2 + i]));
            acc[r] += float(s) * (dw * f16_to_f32(load_u16(xb)));
        }
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        constexpr std::size_t bb = T == dtype::q4_k ? 144 : 176;
        const std::int64_t b = it / 8;
        const int j = int(it % 8);
        const std::uint8_t* wb = w + b * bb;
        const float d = f16_to_f32(load_u16(wb)), dmin = f16_to_f32(load_u16(wb + 2));
        int sc, m;
        scale_min_k4(wb + 4, j, sc, m);
        const std::uint8_t* qs = wb + (T == dtype::q4_k ? 16 : 48) + 32 * (j / 2);
        int q[32];
        for (int l = 0; l < 32; ++l) {
            q[l] = j % 2 == 0 ? (qs[l] & 15) : (qs[l] >> 4);
            if constexpr (T == dtype::q5_k) q[l] |= ((wb[16 + l] >> j) & 1) << 4;
        }
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            const std::uint8_t* ab = x[r] + b * q8_k_bytes;
            const auto* aq = reinterpret_cast<const std::int8_t*>(ab + 4) + 32 * j;
            const auto* bs = reinterpret_cast<const std::int16_t*>(ab + 260);
            int dot = 0;
            for (int l = 0; l < 32; ++l) dot += q[l] * int(aq[l]);
            const int msum = int(bs[2 * j]) + int(bs[2 * j + 1]);
            acc[r] += load_f32(ab) * (d * float(sc * dot) - dmin * float(m * msum));
        }
    } else if constexpr (T == dtype::q6_k) {
        const std::int64_t b = it / 16;
        const int g = int(it % 16);
        const std::uint8_t* wb = w + b * 210;
        const float d = f16_to_f32(load_u16(wb + 208));
        const int sc = std::int8_t(wb[192 + g]);
        int q[16];
        for (int e = 0; e < 16; ++e) {  // quant::q6_k_code for element 16g + e
            const int i = 16 * g + e, h = i / 128, rr = i % 128, k = rr / 32, l = rr % 32;
            const std::uint8_t lo = wb[64 * h + (k & 1) * 32 + l];
            const int low = k < 2 ? (lo & 15) : (lo >> 4);
            q[e] = (low | (((wb[128 + 32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
        }
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            const std::uint8_t* ab = x[r] + b * q8_k_bytes;
            const auto* aq = reinterpret_cast<const std::int8_t*>(ab + 4) + 16 * g;
            int dot = 0;
            for (int e = 0; e < 16; ++e) dot += q[e] * int(aq[e]);
            acc[r] += load_f32(ab) * d * float(sc * dot);
        }
    }
}

// The packed form (see the top of the file); formats without integer codes use the plain one.
template <dtype T, int R>
__host__ __device__ inline void item_dot(const std::uint8_t* w, const std::uint8_t* const* x, std::int64_t it, float* acc, int nr) {
    if constexpr (T == dtype::q8_0) {
        const std::uint8_t* wb = w + it * q8_0_bytes;
        const float dw = f16_to_f32(load_u16(wb));
        std::uint32_t q[8];
        for (int i = 0; i < 8; ++i) q[i] = load_w32_from_halves(wb + 2 + 4 * i);
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            const std::uint8_t* xb = x[r] + it * q8_0_bytes;
            int s = 0;
            for (int i = 0; i < 8; ++i) s = dp4a(q[i], load_w32_from_halves(xb + 2 + 4 * i), s);
            acc[r] += float(s) * (dw * f16_to_f32(load_u16(xb)));
        }
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        constexpr std::size_t bb = T == dtype::q4_k ? 144 : 176;
        const std::int64_t b = it / 8;
        const int j = int(it % 8);
        const std::uint8_t* wb = w + b * bb;
        const float d = f16_to_f32(load_u16(wb)), dmin = f16_to_f32(load_u16(wb + 2));
        int sc, m;
        scale_min_k4(wb + 4, j, sc, m);
        // Sub-blocks 2k and 2k+1 share 32 bytes of codes: low nibbles, then high nibbles.
        const std::uint8_t* qs = wb + (T == dtype::q4_k ? 16 : 48) + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        std::uint32_t q[8];
        for (int i = 0; i < 8; ++i) {
            q[i] = (load_w32(qs + 4 * i) >> shift) & 0x0f0f0f0fu;
            // Q5_K: bit j of each of the 32 high-bit bytes is the fifth bit of this sub-block.
            if constexpr (T == dtype::q5_k) q[i] |= ((load_w32(wb + 16 + 4 * i) >> j) & 0x01010101u) << 4;
        }
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            const std::uint8_t* ab = x[r] + b * q8_k_bytes;
            const std::uint8_t* aq = ab + 4 + 32 * j;
            int dot = 0;
            for (int i = 0; i < 8; ++i) dot = dp4a(q[i], load_w32(aq + 4 * i), dot);
            const int msum = int(std::int16_t(load_u16(ab + 260 + 4 * j))) + int(std::int16_t(load_u16(ab + 262 + 4 * j)));
            acc[r] += load_f32(ab) * (d * float(sc * dot) - dmin * float(m * msum));
        }
    } else if constexpr (T == dtype::q6_k) {
        // Group g: elements 16g..16g+15 of a 256-block, all in half h = g/8 and quarter
        // k = (g%8)/2 of it, at positions l = 16(g%2) + e: 16 consecutive low and high bytes.
        const std::int64_t b = it / 16;
        const int g = int(it % 16), h = g / 8, k = (g % 8) / 2, l0 = 16 * (g % 2);
        const std::uint8_t* wb = w + b * 210;
        const float d = f16_to_f32(load_u16(wb + 208));
        const int sc = std::int8_t(wb[192 + g]);
        const std::uint8_t* lo = wb + 64 * h + (k & 1) * 32 + l0;
        const std::uint8_t* hi = wb + 128 + 32 * h + l0;
        std::uint32_t q[4];  // codes 0..63; the -32 offset is taken out of the sum below
        for (int i = 0; i < 4; ++i) {
            const std::uint32_t lw = load_w32_from_halves(lo + 4 * i), hw = load_w32_from_halves(hi + 4 * i);
            q[i] = ((k < 2 ? lw : lw >> 4) & 0x0f0f0f0fu) | (((hw >> (2 * k)) & 0x03030303u) << 4);
        }
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            const std::uint8_t* ab = x[r] + b * q8_k_bytes;
            const std::uint8_t* aq = ab + 4 + 16 * g;
            int dot = 0, asum = 0;
            for (int i = 0; i < 4; ++i) {
                const std::uint32_t a = load_w32(aq + 4 * i);
                dot = dp4a(q[i], a, dot);
                asum = dp4a(0x01010101u, a, asum);
            }
            dot -= 32 * asum;  // sum of (code - 32) * a
            acc[r] += load_f32(ab) * d * float(sc * dot);
        }
    } else {
        item_dot_ref<T, R>(w, x, it, acc, nr);
    }
}

// The alignment item_dot's word loads need, of weight rows and of activation rows (bytes).
__host__ __device__ constexpr std::size_t weight_align(dtype t) {
    return t == dtype::q4_k || t == dtype::q5_k ? 4 : t == dtype::q8_0 || t == dtype::q6_k ? 2 : 1;
}
__host__ __device__ constexpr std::size_t activation_align(dtype t) {
    return t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k ? 4 : t == dtype::q8_0 ? 2 : 1;
}

}  // namespace clover::backend::cuda_detail
