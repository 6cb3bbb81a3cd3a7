#pragma once
// The Q6_K form of the layout backend::cpu rearranges product matrices into at load
// (weight_layout::rows16; matmul.hpp: x16_block): 16 rows per super-block, read as one stream.
// Q8_0's and Q4_K's repacked forms sit in kernels_avx512.hpp beside the transposing forms they
// share their arithmetic with; this one has its own (the codes come out of the lanes differently).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "clover/backend/cpu/kernels_avx512.hpp"

#if CLOVER_CPU_AVX512 && CLOVER_CPU_AVX512_VNNI
namespace clover::backend::cpu_detail::k512 {

// Q6_K rows repacked into groups of 16, as Q8_0 and Q4_K are: q6_k_lanes_rows unpacks each
// super-block of 16 rows to bytes and transposes it (16 row streams, 2 × 16 stores and 8
// transposes per super-block); here that is done once, at load, the group is one sequential
// stream, and the product takes the 6-bit codes out of the lanes with a shift, a select and a mask.
// Per super-block 3,360 bytes, the bytes of 16 rows of the file rearranged:
//   [0, 32)       the 16 rows' f16 d, lane order (lane l: row q8_0_lanes_row[l]);
//   [32, 288)     scale pairs: pair i, lane l: bytes (scales[2i], scales[2i + 1]) of the lane's row;
//   [288, 2336)   low nibbles, chunk pairs (2m, 2m + 1) of 32 values, 8 registers each: register j,
//                 lane l, byte i = lo(code 64m + 4j + i) | lo(code 64m + 32 + 4j + i) << 4;
//   [2336, 3360)  high 2 bits, chunk quads 4h .. 4h + 3: register j, lane l, byte i =
//                 Σ_q hi(code 128h + 32q + 4j + i) << 2q.
// Its sums are q6_k_lanes_rows' and the twin q6_k_blockwise_ref's, bit for bit (the super-block's
// int32 is exact in any order; acc = fma(float(isum), d_w·d_a, acc) per super-block in order), at
// every token count, so it is row-exact and serves every product of a rearranged matrix.
// The prefetch is what made it pay: a first form of this layout prefetched a whole group ahead,
// as the others do, and streamed slower than the row tiles at one token and than the transposing
// form at eight; prefetching the one stream 2 super-blocks (6.7 KB) ahead, spread over the 8
// chunks, beats both (bench_repack --type q6_k -t 2; the figures: docs/performance.md,
// "Measurements behind code choices").
inline constexpr std::size_t q6_k_x16_block_bytes = 16 * sizeof(quant::block_q6_k);
inline constexpr std::size_t q6_k_x16_scales = 32, q6_k_x16_lo = 288, q6_k_x16_hi = 2336;
inline constexpr std::size_t q6_k_x16_pf_ahead = 2 * q6_k_x16_block_bytes;  // the stream prefetch's distance
// Rows w, w + ws, …, w + 15·ws of nsb super-blocks into out (nsb · q6_k_x16_block_bytes bytes).
inline void repack_q6_k_x16(const std::byte* w, std::size_t ws, std::int64_t nsb, std::byte* out) {
    alignas(64) std::uint8_t u[16][256];
    alignas(64) std::int16_t s16[16][16];
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x03);
    for (std::int64_t b = 0; b < nsb; ++b) {
        std::byte* o = out + std::size_t(b) * q6_k_x16_block_bytes;
        q6_k_unpack16(w, ws, b, u, s16);
        for (int l = 0; l < 16; ++l) {
            const int r = q8_0_lanes_row[l];
            std::memcpy(o + 2 * l, &reinterpret_cast<const quant::block_q6_k*>(w + std::size_t(r) * ws)[b].d, 2);
            for (int i = 0; i < 16; ++i) o[q6_k_x16_scales + 32 * std::size_t(i / 2) + 2 * std::size_t(l) + std::size_t(i % 2)] = std::byte(std::uint8_t(s16[r][i]));
        }
        __m512i wt[8][8];  // [chunk][register]: the codes in the lanes
        for (int k = 0; k < 8; ++k) transpose16x32(reinterpret_cast<const std::byte*>(u[0] + 32 * k), 256, wt[k]);
        for (int m = 0; m < 4; ++m)
            for (int j = 0; j < 8; ++j)
                _mm512_storeu_si512(o + q6_k_x16_lo + 512 * std::size_t(m) + 64 * std::size_t(j),
                                    _mm512_or_si512(_mm512_and_si512(wt[2 * m][j], m4), _mm512_slli_epi16(_mm512_and_si512(wt[2 * m + 1][j], m4), 4)));
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 8; ++j) {
                __m512i v = _mm512_setzero_si512();
                for (int q = 0; q < 4; ++q)
                    v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(wt[4 * h + q][j], 4), m3), 2 * q));
                _mm512_storeu_si512(o + q6_k_x16_hi + 512 * std::size_t(h) + 64 * std::size_t(j), v);
            }
    }
}
inline void repack_q6_k_group(const std::byte* w, std::size_t ws, std::int64_t K, std::byte* out) { repack_q6_k_x16(w, ws, K / 256, out); }
// 16 rows × C ≤ 8 tokens of a repacked group g (K / 256 super-blocks) against a8k_block rows,
// y[c·ldy + r]. pf (or null): super-block b's share of the stream is prefetched from
// pf + b · 3,360, spread over its 8 chunks; x16_block passes g + q6_k_x16_pf_ahead, which runs on
// past the group's end into the next group of the stream.
template <int C>
void q6_k_x16_tile(const std::byte* g, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                   const std::byte* pf) {
    const std::int64_t nsb = K / 256;
    const __m512i lane_row = _mm512_loadu_si512(q8_0_lanes_row);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3f = _mm512_set1_epi8(0x3f);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nsb; ++b) {
        const std::byte* o = g + std::size_t(b) * q6_k_x16_block_bytes;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(o)));
        // lane l, dword: (scales[2i], scales[2i + 1]) of the lane's row as int16
        auto pair = [&](int i) {
            return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + q6_k_x16_scales + 32 * std::size_t(i))));
        };
        const a8k_block* ab[C];
        for (int c = 0; c < C; ++c) ab[c] = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as) + b;
        __m512i isum[C];
        {
            __m512i sp[8];  // converted once for all the tokens
            for (int i = 0; i < 8; ++i) sp[i] = pair(i);
            q6_k_offset_sums<C>(sp, ab, isum);
        }
        for (int k = 0; k < 8; ++k) {  // values 32k .. 32k + 31: sub-blocks 2k and 2k + 1
            prefetch_part<q6_k_x16_block_bytes, 8>(pf, b, k);  // 420 bytes: 7 lines
            const std::byte* lo = o + q6_k_x16_lo + 512 * std::size_t(k >> 1);
            const std::byte* hi = o + q6_k_x16_hi + 512 * std::size_t(k >> 2);
            const int hs = 2 * (k & 3);  // where chunk k's high bits sit; they go to bits 4, 5
            __m512i wt[8];
            for (int j = 0; j < 8; ++j) {
                const __m512i l = _mm512_loadu_si512(lo + 64 * j), h = _mm512_loadu_si512(hi + 64 * j);
                const __m512i ln = (k & 1) ? _mm512_srli_epi16(l, 4) : l;
                const __m512i hn = hs <= 4 ? _mm512_slli_epi16(h, 4 - hs) : _mm512_srli_epi16(h, hs - 4);
                // bits 0–3 from ln, 4–7 from hn (m4 ? ln : hn), then the code's 6 bits
                wt[j] = _mm512_and_si512(_mm512_ternarylogic_epi32(ln, hn, m4, 0xe4), m3f);
            }
            const __m512i sp = pair(k);
            q6_k_chunk_sums<C>(wt, _mm512_srai_epi32(_mm512_slli_epi32(sp, 16), 16), _mm512_srai_epi32(sp, 16), ab, k, isum);
        }
        for (int c = 0; c < C; ++c)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(ab[c]->d)), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, _mm512_permutexvar_ps(lane_row, acc[c]));
}

}  // namespace clover::backend::cpu_detail::k512
#endif
