#pragma once
// Packet traits: the instruction set is chosen at compile time (the compiler's target macros),
// never by run-time dispatch. Kernels are written once against a packet type P (f32 lanes,
// load/store/fma/reduce, half and bfloat16 loads) or, for the integer dot products, once per
// ISA (quant kernels in kernels_avx2.hpp / kernels_avx512.hpp). `native` is the widest ISA the
// build targets; `scalar` is always there for the reference twins.
//
// check_cpu() is the one CPUID check: it compares the features the binary was compiled for with
// what the running CPU has and refuses (clover::error) a binary the CPU cannot run, instead of
// dying later on an illegal instruction.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "clover/core/error.hpp"
#include "clover/quant/half.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define CLOVER_CPU_AVX2 1
#endif
#if CLOVER_CPU_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CLOVER_CPU_AVX512 1
#endif
#if CLOVER_CPU_AVX512 && defined(__AVX512VNNI__)
#define CLOVER_CPU_AVX512_VNNI 1
#endif
#if CLOVER_CPU_AVX512 && defined(__AVX512BF16__)
#define CLOVER_CPU_AVX512_BF16 1
#endif

namespace clover::backend::cpu_detail {

// Plain C++: one lane. The reference twins and the fallback when no SIMD target is enabled.
struct scalar {
    static constexpr const char* name = "scalar";
    static constexpr int lanes = 1;
    using f32v = float;
    static f32v zero() { return 0.f; }
    static f32v set1(float x) { return x; }
    static f32v load(const float* p) { return *p; }
    static void store(float* p, f32v v) { *p = v; }
    static f32v add(f32v a, f32v b) { return a + b; }
    static f32v mul(f32v a, f32v b) { return a * b; }
    static f32v fma(f32v a, f32v b, f32v c) { return a * b + c; }  // a·b + c
    static float reduce(f32v v) { return v; }
    static void transpose(f32v*) {}
    static f32v load_f16(const quant::f16_bits* p) { return quant::f16_to_f32(*p); }
    static f32v load_bf16(const quant::bf16_bits* p) { return quant::bf16_to_f32(*p); }
};

#if CLOVER_CPU_AVX2
struct avx2 {
    static constexpr const char* name = "AVX2";
    static constexpr int lanes = 8;
    using f32v = __m256;
    static f32v zero() { return _mm256_setzero_ps(); }
    static f32v set1(float x) { return _mm256_set1_ps(x); }
    static f32v load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, f32v v) { _mm256_storeu_ps(p, v); }
    static f32v add(f32v a, f32v b) { return _mm256_add_ps(a, b); }
    static f32v mul(f32v a, f32v b) { return _mm256_mul_ps(a, b); }
    static f32v fma(f32v a, f32v b, f32v c) { return _mm256_fmadd_ps(a, b, c); }
    static float reduce(f32v v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    // In place: r[d] lane t = r[t] lane d before (an 8 × 8 block; attend.hpp's keys across lanes).
    static void transpose(f32v* r) {
        __m256 t[8], u[8];
        for (int i = 0; i < 4; ++i) {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 2; ++i) {
            u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (int k = 0; k < 4; ++k) {
            r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
            r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
        }
    }
    static f32v load_f16(const quant::f16_bits* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static f32v load_bf16(const quant::bf16_bits* p) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
};
#endif

#if CLOVER_CPU_AVX512
struct avx512 {
    static constexpr const char* name = "AVX512";
    static constexpr int lanes = 16;
    using f32v = __m512;
    static f32v zero() { return _mm512_setzero_ps(); }
    static f32v set1(float x) { return _mm512_set1_ps(x); }
    static f32v load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, f32v v) { _mm512_storeu_ps(p, v); }
    static f32v add(f32v a, f32v b) { return _mm512_add_ps(a, b); }
    static f32v mul(f32v a, f32v b) { return _mm512_mul_ps(a, b); }
    static f32v fma(f32v a, f32v b, f32v c) { return _mm512_fmadd_ps(a, b, c); }
    // Written out (the tree of GCC's _mm512_reduce_add_ps: lanes j + j+8, then j + j+4, then
    // j + j+2, then 0 + 1) so that it gives the same bits whatever compiler defines the intrinsic.
    static float reduce(f32v v) {
        const __m256 h = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
        const __m128 q = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
        const __m128 r = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
        return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
    }
    // In place: r[d] lane t = r[t] lane d before (a 16 × 16 block; attend.hpp's keys across
    // lanes): 64 shuffles — pairs within 128-bit blocks, then quads, then blocks across vectors.
    static void transpose(f32v* r) {
        __m512 t[16], u[16];
        for (int i = 0; i < 8; ++i) {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; ++i) {  // block m of u[4i + k]: rows 4i .. 4i+3 of column 4m + k
            u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (int k = 0; k < 4; ++k) {
            const __m512 x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
            const __m512 y0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), y1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
            r[k] = _mm512_shuffle_f32x4(x0, y0, 0x88);
            r[8 + k] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
            r[4 + k] = _mm512_shuffle_f32x4(x1, y1, 0x88);
            r[12 + k] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
        }
    }
    static f32v load_f16(const quant::f16_bits* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static f32v load_bf16(const quant::bf16_bits* p) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
};
#endif

#if CLOVER_CPU_AVX512
using native = avx512;
#elif CLOVER_CPU_AVX2
using native = avx2;
#else
using native = scalar;
#endif

// "AVX512+VNNI+BF16", "AVX2", "scalar": what this build's kernels use.
inline const char* isa_name() {
#if CLOVER_CPU_AVX512_VNNI && CLOVER_CPU_AVX512_BF16
    return "AVX512+VNNI+BF16";
#elif CLOVER_CPU_AVX512_VNNI
    return "AVX512+VNNI";
#elif CLOVER_CPU_AVX512
    return "AVX512";
#elif CLOVER_CPU_AVX2
    return "AVX2";
#else
    return "scalar";
#endif
}

// Features this binary was compiled to use, each with its CPUID name.
inline std::string missing_cpu_features() {
    std::string missing;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    auto need = [&](bool have, const char* what) {
        if (have) return;
        if (!missing.empty()) missing += ' ';  // appending in steps: GCC 12's -Wrestrict misfires on "" + std::string
        missing += what;
    };
    (void)need;  // a build without -march flags checks nothing
#if defined(__AVX2__)
    need(__builtin_cpu_supports("avx2"), "avx2");
#endif
#if defined(__FMA__)
    need(__builtin_cpu_supports("fma"), "fma");
#endif
#if defined(__AVX512F__)
    need(__builtin_cpu_supports("avx512f"), "avx512f");
#endif
#if defined(__AVX512BW__)
    need(__builtin_cpu_supports("avx512bw"), "avx512bw");
#endif
#if defined(__AVX512VL__)
    need(__builtin_cpu_supports("avx512vl"), "avx512vl");
#endif
#if defined(__AVX512DQ__)
    need(__builtin_cpu_supports("avx512dq"), "avx512dq");
#endif
#if defined(__AVX512VNNI__)
    need(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
#endif
#if defined(__AVX512BF16__)
    need(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
#endif
#endif
    return missing;
}

// Throws once per process if the CPU lacks a feature the kernels were compiled for.
inline void check_cpu() {
    static const std::string missing = missing_cpu_features();
    if (!missing.empty())
        fail("this clover build uses ", isa_name(), " kernels but the CPU lacks: ", missing,
             " (rebuild on this machine, or configure with -DCLOVER_NATIVE=OFF)");
}

}  // namespace clover::backend::cpu_detail
