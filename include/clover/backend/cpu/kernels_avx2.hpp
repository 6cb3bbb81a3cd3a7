#pragma once
// AVX2 (+FMA, F16C) tiles of the quantized products: R weight rows × C activation rows,
// y[c·ldy + r] = dot(w_r, a_c); the same structure as kernels_avx512.hpp with 32-value vectors.
//   K-quants: vpmaddubsw (u8 codes × s8 activations) then vpmaddwd with the broadcast sub-block
//             scale → int32; one float FMA per super-block; mins / −32 offsets as in AVX-512.
//   Q8_0:     the sign trick (|w| as u8 × a with w's sign) — (w + 128) would overflow int16.
// Twins: quant::vec_dot_*_ref (tests/quant).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "clover/backend/cpu/act_formats.hpp"
#include "clover/backend/cpu/simd.hpp"
#include "clover/quant/rows.hpp"

#if CLOVER_CPU_AVX2
#include <immintrin.h>

namespace clover::backend::cpu_detail::k256 {

inline float h2f(quant::f16_bits h) { return _cvtsh_ss(h); }
inline float hsum(__m256 v) { return avx2::reduce(v); }

// ---------------------------------------------------------------- Q8_0 × Q8_0 (block_q8_0 rows)
template <int R, int C>
void q8_0_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
               std::int64_t ldy) {
    const std::int64_t nb = K / 32;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (std::int64_t k = 0; k < nb; ++k) {
        __m256i wa[R], wv[R];
        float dw[R];
        for (int r = 0; r < R; ++r) {
            const auto& blk = reinterpret_cast<const quant::block_q8_0*>(w + std::size_t(r) * ws)[k];
            wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
            wa[r] = _mm256_sign_epi8(wv[r], wv[r]);
            dw[r] = h2f(blk.d);
        }
        for (int c = 0; c < C; ++c) {
            const auto& ab = reinterpret_cast<const quant::block_q8_0*>(a + std::size_t(c) * as)[k];
            const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs));
            const float da = h2f(ab.d);
            for (int r = 0; r < R; ++r) {
                const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(av, wv[r])), ones);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw[r] * da), acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

// v shifted left by S bits (right by −S) in each 16-bit lane; callers mask to bits that stay
// inside their byte.
template <int S>
inline __m256i shift_bits(__m256i v) {
    if constexpr (S > 0) return _mm256_slli_epi16(v, S);
    else if constexpr (S < 0) return _mm256_srli_epi16(v, -S);
    else return v;
}

// ---------------------------------------------------------------- K-quants × Q8_K (a8k_block rows)
// Decode with one activation row is bound by these tiles' instruction count, not by DRAM, on a
// 2-core AVX2 VM (Q4_K_M read its weights slower than Q8_0 did; docs/performance.md). So
// per super-block: the scale field is unpacked four bytes at a time (unpack_scales_k4x4; the
// per-byte loop of quant::unpack_scales_k4 was about a third of the Q4_K tile's instructions),
// and each sub-block's scale is one in-lane byte shuffle of a register (bcast16) instead of a
// scalar load + broadcast. Bits equal quant::unpack_scales_k4 (tests/quant).
inline void unpack_scales_k4x4(const std::uint8_t* b, std::uint64_t& sc, std::uint64_t& mn) {
    std::uint32_t u[3];
    std::memcpy(u, b, 12);
    constexpr std::uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, bits45 = 0x30303030u;
    sc = (u[0] & low6) | (std::uint64_t((u[2] & low4) | ((u[0] >> 2) & bits45)) << 32);
    mn = (u[1] & low6) | (std::uint64_t(((u[2] >> 4) & low4) | ((u[1] >> 2) & bits45)) << 32);
}

// Every int16 lane = int16 element J of v's lane (v holds 8 int16 per 128-bit lane).
template <int J>
inline __m256i bcast16(__m256i v) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16(short(0x0100 * (2 * J + 1) + 2 * J)));
}

template <class Block, bool Five, int R, int C, int JJ>
inline void k4_step(const Block* const* blk, const __m256i* scv, const std::byte* a, std::size_t as, std::int64_t b,
                    __m256i (&isum)[R][C]) {
    // 32 code bytes: sub-block 2·JJ in the low nibbles, 2·JJ + 1 in the high ones.
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i wl[R], wh[R];
    for (int r = 0; r < R; ++r) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qs + 32 * JJ));
        wl[r] = _mm256_and_si256(q, m4);
        wh[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (Five) {
            // qh bit j of byte l is the fifth bit of value 32j + l: shift it to bit 4.
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh));
            const __m256i b16 = _mm256_set1_epi8(16);
            wl[r] = _mm256_or_si256(wl[r], _mm256_and_si256(shift_bits<4 - 2 * JJ>(qh), b16));
            wh[r] = _mm256_or_si256(wh[r], _mm256_and_si256(shift_bits<3 - 2 * JJ>(qh), b16));
        }
    }
    for (int c = 0; c < C; ++c) {
        const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
        const __m256i al = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.qs + 64 * JJ));
        const __m256i ah = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.qs + 64 * JJ + 32));
        for (int r = 0; r < R; ++r) {
            const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(wl[r], al), bcast16<2 * JJ>(scv[r]));
            const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(wh[r], ah), bcast16<2 * JJ + 1>(scv[r]));
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_add_epi32(pl, ph));
        }
    }
}

template <class Block, bool Five, int R, int C>
void k4_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
             std::int64_t ldy) {
    const std::int64_t nsb = K / 256;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (std::int64_t b = 0; b < nsb; ++b) {
        const Block* blk[R];
        __m256i scv[R];  // the 8 sub-block scales as int16, in both lanes
        __m256 mv[R];    // dmin · min_j
        float d[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const Block*>(w + std::size_t(r) * ws) + b;
            std::uint64_t sc64, mn64;
            unpack_scales_k4x4(blk[r]->scales, sc64, mn64);
            scv[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(std::int64_t(sc64))));
            mv[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(std::int64_t(mn64)))),
                                  _mm256_set1_ps(h2f(blk[r]->dmin)));
            d[r] = h2f(blk[r]->d);
        }
        __m256i isum[R][C];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
        k4_step<Block, Five, R, C, 0>(blk, scv, a, as, b, isum);
        k4_step<Block, Five, R, C, 1>(blk, scv, a, as, b, isum);
        k4_step<Block, Five, R, C, 2>(blk, scv, a, as, b, isum);
        k4_step<Block, Five, R, C, 3>(blk, scv, a, as, b, isum);
        for (int c = 0; c < C; ++c) {
            const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
            const __m256 ds = _mm256_load_ps(ab.dsum);
            for (int r = 0; r < R; ++r) {
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), _mm256_set1_ps(d[r] * ab.d), acc[r][c]);
                acc[r][c] = _mm256_fnmadd_ps(mv[r], ds, acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

template <int R, int C>
void q4_k_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy) {
    k4_tile<quant::block_q4_k, false, R, C>(w, ws, a, as, K, y, ldy);
}
template <int R, int C>
void q5_k_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy) {
    k4_tile<quant::block_q5_k, true, R, C>(w, ws, a, as, K, y, ldy);
}

// ---------------------------------------------------------------- Q6_K × Q8_K
// Values 32q .. 32q+31 (q = 4h + k): low 4 bits from ql[64h + 32(k & 1) ..] (low nibbles for
// k < 2), high 2 bits from qh[32h ..] bits 2k, 2k+1; scales 2q (first 16 values) and 2q + 1.
// The two high bits go to bits 4–5 with one mask and at most one shift (k = 2 needs none), and
// the scales are in-lane shuffles of one register per half: per 32 values 6–8 instructions
// instead of 14 (the former shift-mask-shift and two scalar broadcasts).
template <int R, int C, int Q>
inline void q6_step(const quant::block_q6_k* const* blk, const __m256i* sh, const std::byte* a, std::size_t as,
                    std::int64_t b, __m256i (&isum)[R][C]) {
    constexpr int h = Q / 4, k = Q % 4;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i hmask = _mm256_set1_epi8(char(0x03 << (2 * k)));
    // lane 0: int16 element 2k of the half's scales; lane 1: element 2k + 1
    const __m256i smask = _mm256_set_m128i(_mm_set1_epi16(short(0x0100 * (4 * k + 3) + 4 * k + 2)),
                                           _mm_set1_epi16(short(0x0100 * (4 * k + 1) + 4 * k)));
    __m256i wv[R], sv[R];
    for (int r = 0; r < R; ++r) {
        const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->ql + 64 * h + 32 * (k & 1)));
        const __m256i qh = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh + 32 * h)), hmask);
        const __m256i lo = k < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
        wv[r] = _mm256_or_si256(lo, shift_bits<4 - 2 * k>(qh));
        sv[r] = _mm256_shuffle_epi8(sh[r], smask);
    }
    for (int c = 0; c < C; ++c) {
        const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
        const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * Q));
        for (int r = 0; r < R; ++r)
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r], av), sv[r]));
    }
}

template <int R, int C>
void q6_k_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
               std::int64_t ldy) {
    const std::int64_t nsb = K / 256;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    for (std::int64_t b = 0; b < nsb; ++b) {
        const quant::block_q6_k* blk[R];
        __m256i s16[R], sh[R];
        float d[R];
        __m256i isum[R][C];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const quant::block_q6_k*>(w + std::size_t(r) * ws) + b;
            s16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r]->scales)));
            d[r] = h2f(blk[r]->d);
            // the −32 offset of every code: Σ_j (−32 · scale_j) · (Σ of activation group j)
            const __m256i off = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16[r], 5));
            for (int c = 0; c < C; ++c) {
                const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
                isum[r][c] = _mm256_madd_epi16(off, _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.bsums)));
            }
        }
        for (int r = 0; r < R; ++r) sh[r] = _mm256_permute2x128_si256(s16[r], s16[r], 0x00);  // scales 0..7
        q6_step<R, C, 0>(blk, sh, a, as, b, isum);
        q6_step<R, C, 1>(blk, sh, a, as, b, isum);
        q6_step<R, C, 2>(blk, sh, a, as, b, isum);
        q6_step<R, C, 3>(blk, sh, a, as, b, isum);
        for (int r = 0; r < R; ++r) sh[r] = _mm256_permute2x128_si256(s16[r], s16[r], 0x11);  // scales 8..15
        q6_step<R, C, 4>(blk, sh, a, as, b, isum);
        q6_step<R, C, 5>(blk, sh, a, as, b, isum);
        q6_step<R, C, 6>(blk, sh, a, as, b, isum);
        q6_step<R, C, 7>(blk, sh, a, as, b, isum);
        for (int c = 0; c < C; ++c) {
            const float da = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b].d;
            for (int r = 0; r < R; ++r)
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]), _mm256_set1_ps(d[r] * da), acc[r][c]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = hsum(acc[r][c]);
}

}  // namespace clover::backend::cpu_detail::k256
#endif
