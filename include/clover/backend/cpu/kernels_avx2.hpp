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

// ---------------------------------------------------------------- K-quants × Q8_K (a8k_block rows)
template <class Block, bool Five, int R, int C>
void k4_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
             std::int64_t ldy) {
    const std::int64_t nsb = K / 256;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (std::int64_t b = 0; b < nsb; ++b) {
        const Block* blk[R];
        std::uint8_t sc[R][8], mn[R][8];
        __m256 mv[R];
        float d[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const Block*>(w + std::size_t(r) * ws) + b;
            quant::unpack_scales_k4(blk[r]->scales, sc[r], mn[r]);
            std::uint64_t m64;
            std::memcpy(&m64, mn[r], 8);
            mv[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(std::int64_t(m64)))),
                                  _mm256_set1_ps(h2f(blk[r]->dmin)));
            d[r] = h2f(blk[r]->d);
        }
        __m256i isum[R][C];
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {  // sub-block j: chunk j/2, low (even j) or high nibbles
            __m256i wv[R], sv[R];
            for (int r = 0; r < R; ++r) {
                const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qs + 32 * (j / 2)));
                wv[r] = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
                if constexpr (Five) {
                    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh));
                    const __m256i bit = _mm256_set1_epi8(char(1 << j));
                    const __m256i has = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                    wv[r] = _mm256_or_si256(wv[r], _mm256_and_si256(has, _mm256_set1_epi8(16)));
                }
                sv[r] = _mm256_set1_epi16(short(sc[r][j]));
            }
            for (int c = 0; c < C; ++c) {
                const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
                const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
                for (int r = 0; r < R; ++r)
                    isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r], av), sv[r]));
            }
        }
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

template <int R, int C>
void q6_k_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
               std::int64_t ldy) {
    const std::int64_t nsb = K / 256;
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x03);
    for (std::int64_t b = 0; b < nsb; ++b) {
        const quant::block_q6_k* blk[R];
        __m256i off[R];
        float d[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const quant::block_q6_k*>(w + std::size_t(r) * ws) + b;
            const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r]->scales)));
            off[r] = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5));  // −32·sc
            d[r] = h2f(blk[r]->d);
        }
        __m256i isum[R][C];
        for (int c = 0; c < C; ++c) {
            const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
            const __m256i bs = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.bsums));
            for (int r = 0; r < R; ++r) isum[r][c] = _mm256_madd_epi16(off[r], bs);
        }
        for (int q = 0; q < 8; ++q) {  // 32 values 32q..32q+31: half q/4, k = q%4
            const int h = q / 4, k = q % 4;
            __m256i wv[R], sv[R];
            for (int r = 0; r < R; ++r) {
                const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->ql + 64 * h + 32 * (k & 1)));
                const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh + 32 * h));
                const __m256i lo = k < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
                const __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3), 4);
                wv[r] = _mm256_or_si256(lo, hb);
                const std::int8_t* s = blk[r]->scales + 2 * q;
                sv[r] = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
            }
            for (int c = 0; c < C; ++c) {
                const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
                const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * q));
                for (int r = 0; r < R; ++r)
                    isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r], av), sv[r]));
            }
        }
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
