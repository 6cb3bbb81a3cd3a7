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
// Each integer format's item splits in two: the exact integer dot of the item's codes (any order,
// any instruction: dp4a here, the tensor cores' mma in mma.cuh) and item_combine, the one float
// step that adds it to the row's sum with the weight's and the activation's scales. Every kernel
// that computes a row calls item_combine with the same (acc, dot) sequence, so rows agree bit for
// bit whichever kernel ran them.
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
#if CLOVER_DEVICE_CODE
    return __dp4a(int(a), int(b), c);
#else
    for (int i = 0; i < 4; ++i) c += int(std::int8_t(a >> (8 * i))) * int(std::int8_t(b >> (8 * i)));
    return c;
#endif
}

// A little-endian 32-bit word from 4-byte aligned p / from 2-byte aligned p (two halves).
__host__ __device__ inline std::uint32_t load_w32(const std::uint8_t* p) {
#if CLOVER_DEVICE_CODE
    return *reinterpret_cast<const std::uint32_t*>(p);
#else
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
#endif
}
__host__ __device__ inline std::uint32_t load_w32_from_halves(const std::uint8_t* p) {
#if CLOVER_DEVICE_CODE
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

// ---- the integer formats' items: codes, scales and the float step -----------------------------

template <dtype T>
__host__ __device__ constexpr bool int_item_format() {
    return T == dtype::q8_0 || T == dtype::q4_k || T == dtype::q5_k || T == dtype::q6_k;
}
// Elements per item: a Q6_K group is 16, every other integer item 32.
template <dtype T>
__host__ __device__ constexpr int item_elems() {
    return T == dtype::q6_k ? 16 : 32;
}

// The scales of item `it`: the weight's (Q8_0: d; K-quants: the super-block's d, dmin and the
// sub-block's integer scale and min) and the activation's (d; Q4_K/Q5_K: the sum of the item's
// 32 activation codes, from the Q8_K bsums).
struct item_wscale {
    float d = 0.f, dmin = 0.f;
    int sc = 0, m = 0;
};
struct item_xscale {
    float d = 0.f;
    int msum = 0;
};

template <dtype T>
__host__ __device__ inline item_wscale item_wscale_of(const std::uint8_t* w, std::int64_t it) {
    item_wscale s;
    if constexpr (T == dtype::q8_0) {
        s.d = f16_to_f32(load_u16(w + it * q8_0_bytes));
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        const std::uint8_t* wb = w + it / 8 * (T == dtype::q4_k ? 144 : 176);
        s.d = f16_to_f32(load_u16(wb));
        s.dmin = f16_to_f32(load_u16(wb + 2));
        scale_min_k4(wb + 4, int(it % 8), s.sc, s.m);
    } else if constexpr (T == dtype::q6_k) {
        const std::uint8_t* wb = w + it / 16 * 210;
        s.d = f16_to_f32(load_u16(wb + 208));
        s.sc = std::int8_t(wb[192 + it % 16]);
    }
    return s;
}
template <dtype T>
__host__ __device__ inline item_xscale item_xscale_of(const std::uint8_t* x, std::int64_t it) {
    item_xscale s;
    if constexpr (T == dtype::q8_0) {
        s.d = f16_to_f32(load_u16(x + it * q8_0_bytes));
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        const std::uint8_t* ab = x + it / 8 * q8_k_bytes;
        const int j = int(it % 8);
        s.d = load_f32(ab);
        s.msum = int(std::int16_t(load_u16(ab + 260 + 4 * j))) + int(std::int16_t(load_u16(ab + 262 + 4 * j)));
    } else if constexpr (T == dtype::q6_k) {
        s.d = load_f32(x + it / 16 * q8_k_bytes);
    }
    return s;
}

// A product rounded once, never fused with a later add: on the device __fmul_rn (ptxas may fuse a
// plain mul.f32 into an fma, and which one it fuses could differ between kernels); on the host it
// only ever feeds an fmaf operand, where no compiler contracts it.
__host__ __device__ inline float mul_rn(float a, float b) {
#if CLOVER_DEVICE_CODE
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

// acc plus item `it`'s share of the row: dot is the exact integer sum of the item's code
// products (Q6_K: with the -32 offset taken out). Every operation is spelled out (fmaf, mul_rn) so
// no compiler can contract or reassociate it differently in different kernels or on the host.
// Q8_0 and Q6_K: a rounded scale product, then one fma into acc — the PTX nvcc emitted for the
// earlier plain expressions, so mm_kernel keeps its bits. Q4_K/Q5_K: the earlier PTX left it to
// ptxas whether and how to fuse d·(sc·dot) − dmin·(m·msum); now fixed as the min term rounded and
// the scale term fused with it, then one fma into acc (mm_kernel's bits for these two formats may
// differ from before by that one rounding; no GPU was lent to compare).
template <dtype T>
__host__ __device__ inline float item_combine(float acc, int dot, const item_wscale& w, const item_xscale& x) {
    static_assert(int_item_format<T>(), "item_combine: integer formats only");
    if constexpr (T == dtype::q8_0) {
        return fmaf(mul_rn(w.d, x.d), float(dot), acc);
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        return fmaf(x.d, fmaf(w.d, float(w.sc * dot), -mul_rn(w.dmin, float(w.m * x.msum))), acc);
    } else {
        return fmaf(mul_rn(x.d, w.d), float(w.sc * dot), acc);
    }
}

// Codes 4j..4j+3 of item `it` of weight row w, as four int8 in one little-endian word (element
// 4j in the low byte): the operands of dp4a and of the mma. Q4_K/Q5_K codes are 0..31, Q6_K codes
// have their -32 offset applied, Q8_0 codes are the stored int8. j < item_elems / 4.
template <dtype T>
__host__ __device__ inline std::uint32_t item_w_word(const std::uint8_t* w, std::int64_t it, int j) {
    if constexpr (T == dtype::q8_0) {
        return load_w32_from_halves(w + it * q8_0_bytes + 2 + 4 * j);
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
        const std::uint8_t* wb = w + it / 8 * (T == dtype::q4_k ? 144 : 176);
        const int sb = int(it % 8);
        // Sub-blocks 2k and 2k+1 share 32 bytes of codes: low nibbles, then high nibbles.
        const std::uint8_t* qs = wb + (T == dtype::q4_k ? 16 : 48) + 32 * (sb / 2);
        std::uint32_t q = (load_w32(qs + 4 * j) >> (4 * (sb % 2))) & 0x0f0f0f0fu;
        // Q5_K: bit sb of each of the 32 high-bit bytes is the fifth bit of this sub-block.
        if constexpr (T == dtype::q5_k) q |= ((load_w32(wb + 16 + 4 * j) >> sb) & 0x01010101u) << 4;
        return q;
    } else {
        static_assert(T == dtype::q6_k, "item_w_word: integer formats only");
        // Group g: elements 16g..16g+15 of a 256-block, all in half h = g/8 and quarter
        // k = (g%8)/2 of it, at positions l = 16(g%2) + e: 16 consecutive low and high bytes.
        const std::uint8_t* wb = w + it / 16 * 210;
        const int g = int(it % 16), h = g / 8, k = (g % 8) / 2, l0 = 16 * (g % 2);
        const std::uint32_t lw = load_w32_from_halves(wb + 64 * h + (k & 1) * 32 + l0 + 4 * j);
        const std::uint32_t hw = load_w32_from_halves(wb + 128 + 32 * h + l0 + 4 * j);
        const std::uint32_t q = ((k < 2 ? lw : lw >> 4) & 0x0f0f0f0fu) | (((hw >> (2 * k)) & 0x03030303u) << 4);
        // code - 32 in every byte (codes are 0..63): with the top bit of each byte set no borrow
        // crosses a byte, and flipping it back leaves (code - 32) mod 256, the int8 code.
        return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    }
}
// Activation codes 4j..4j+3 of item `it` of activation row x (Q8_0, or Q8_K for the K-quants).
template <dtype T>
__host__ __device__ inline std::uint32_t item_x_word(const std::uint8_t* x, std::int64_t it, int j) {
    if constexpr (T == dtype::q8_0) return load_w32_from_halves(x + it * q8_0_bytes + 2 + 4 * j);
    else if constexpr (T == dtype::q4_k || T == dtype::q5_k) return load_w32(x + it / 8 * q8_k_bytes + 4 + 32 * (it % 8) + 4 * j);
    else return load_w32(x + it / 16 * q8_k_bytes + 4 + 16 * (it % 16) + 4 * j);
}

// The exact integer dot of item `it` of weight row w and activation row x (the packed form).
template <dtype T>
__host__ __device__ inline int item_int_dot(const std::uint8_t* w, const std::uint8_t* x, std::int64_t it) {
    int dot = 0;
    for (int j = 0; j < item_elems<T>() / 4; ++j) dot = dp4a(item_w_word<T>(w, it, j), item_x_word<T>(x, it, j), dot);
    return dot;
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
            acc[r] = item_combine<T>(acc[r], s, item_wscale{dw, 0.f, 0, 0}, item_xscale{f16_to_f32(load_u16(xb)), 0});
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
            acc[r] = item_combine<T>(acc[r], dot, item_wscale{d, dmin, sc, m}, item_xscale{load_f32(ab), msum});
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
            acc[r] = item_combine<T>(acc[r], dot, item_wscale{d, 0.f, sc, 0}, item_xscale{load_f32(ab), 0});
        }
    }
}

// The packed form (see the top of the file): the weight item's code words read once, dp4a per
// activation row, then the shared float step; formats without integer codes use the plain one.
template <dtype T, int R>
__host__ __device__ inline void item_dot(const std::uint8_t* w, const std::uint8_t* const* x, std::int64_t it, float* acc, int nr) {
    if constexpr (int_item_format<T>()) {
        constexpr int nw = item_elems<T>() / 4;
        const item_wscale ws = item_wscale_of<T>(w, it);
        std::uint32_t q[nw];
        for (int j = 0; j < nw; ++j) q[j] = item_w_word<T>(w, it, j);
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            int dot = 0;
            for (int j = 0; j < nw; ++j) dot = dp4a(q[j], item_x_word<T>(x[r], it, j), dot);
            acc[r] = item_combine<T>(acc[r], dot, ws, item_xscale_of<T>(x[r], it));
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
