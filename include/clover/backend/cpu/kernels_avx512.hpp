#pragma once
// AVX-512 (BW/VL/DQ; VNNI where compiled for) tiles of the quantized products: R weight rows ×
// C activation rows at a time, y[c·ldy + r] = dot(w_r, a_c). Each weight super-block is
// unpacked once per tile and used for C activation rows; each activation load serves R rows.
// Twins: quant::vec_dot_*_ref (tests/quant compares every (R, C) on odd sizes).
//
// Inner loops (per 64 values, per (r, c)):
//   K-quants: vpmaddubsw (u8 weights × s8 activations → int16 pairs; no saturation since
//             q ≤ 63) then vpdpwssd with the sub-block scales → int32; one float FMA per
//             super-block. Q4_K/Q5_K mins: one FMA per super-block against the activation's
//             d·Σ32 (act_formats.hpp); Q6_K's −32 offset: one vpdpwssd against the 16-sums.
//   Q8_0:     vpdpbusd of (w + 128) as u8 × a, started from the per-lane correction −16·Σa, so
//             the 8 lanes of a block sum to Σ w·a exactly; then cvt and one FMA with d_w·d_a.
// benchmarks/bench_kernels compares them with the AVX2 tiles (the figures: docs/performance.md,
// "Measurements behind code choices").
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "clover/backend/cpu/act_formats.hpp"
#include "clover/backend/cpu/simd.hpp"
#include "clover/quant/rows.hpp"

#if CLOVER_CPU_AVX512
#include <immintrin.h>

namespace clover::backend::cpu_detail::k512 {

// Σ(u8 × s8) over 4-byte groups into int32 lanes. u must be < 128 without VNNI (no saturation
// of the int16 pair sums), which holds for every K-quant code.
inline __m512i dot_u8s8(__m512i acc, __m512i u, __m512i s) {
#if CLOVER_CPU_AVX512_VNNI
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}
inline __m512i dot_i16(__m512i acc, __m512i a, __m512i b) {
#if CLOVER_CPU_AVX512_VNNI
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}
inline float h2f(quant::f16_bits h) { return _cvtsh_ss(h); }

// ---------------------------------------------------------------- Q8_0 × Q8_0 (a8_pair rows)

// PF (the streaming form of the small-batch path, matmul.hpp): each block step also prefetches
// into L1 the same place pfd bytes further on (the next row pair), a line at a time, so that the
// loads of the next pair are in flight while this one computes instead of issued in one burst.
template <int R, int C, bool PF>
void q8_0_tile_body(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                    std::int64_t ldy, std::ptrdiff_t pfd) {
    const std::int64_t nb = K / 32, np = (nb + 1) / 2;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (std::int64_t p = 0; p < np; ++p) {
        const bool hi = 2 * p + 1 < nb;
        __m512i wv[R];
        __m512 dw[R];
        for (int r = 0; r < R; ++r) {
            const auto* blk = reinterpret_cast<const quant::block_q8_0*>(w + std::size_t(r) * ws) + 2 * p;
            if constexpr (PF) {  // a pair of blocks is 68 bytes: its first and last byte's lines
                __builtin_prefetch(reinterpret_cast<const char*>(blk) + pfd, 0, 3);
                __builtin_prefetch(reinterpret_cast<const char*>(blk) + pfd + 67, 0, 3);
            }
            const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0].qs));
            const __m256i up = hi ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1].qs)) : _mm256_setzero_si256();
            wv[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), up, 1), flip);  // w + 128
            dw[r] = _mm512_insertf32x8(_mm512_set1_ps(h2f(blk[0].d)), _mm256_set1_ps(hi ? h2f(blk[1].d) : 0.f), 1);
        }
        for (int c = 0; c < C; ++c) {
            const auto& ap = reinterpret_cast<const a8_pair*>(a + std::size_t(c) * as)[p];
            const __m512i av = _mm512_load_si512(ap.qs);
            const __m512 da = _mm512_load_ps(ap.d);
            const __m512i corr = _mm512_load_si512(ap.corr);
            for (int r = 0; r < R; ++r) {
#if CLOVER_CPU_AVX512_VNNI
                const __m512i dot = _mm512_dpbusd_epi32(corr, wv[r], av);
#else
                // (w + 128) reaches 255: without VNNI use |w| × sign-moved a (no int16 overflow).
                const __m512i ws8 = _mm512_xor_si512(wv[r], flip);
                const __m512i aw = _mm512_mask_sub_epi8(av, _mm512_movepi8_mask(ws8), _mm512_setzero_si512(), av);
                const __m512i dot = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(ws8), aw), _mm512_set1_epi16(1));
                (void)corr;
#endif
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw[r], da), acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
}
template <int R, int C>
void q8_0_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy) {
    q8_0_tile_body<R, C, false>(w, ws, a, as, K, y, ldy, 0);
}
template <int R, int C>
void q8_0_tile_pf(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                  std::ptrdiff_t pfd) {
    q8_0_tile_body<R, C, true>(w, ws, a, as, K, y, ldy, pfd);
}

// ---------------------------------------------------------------- Q8_0, 16 weight rows in the lanes
#if CLOVER_CPU_AVX512_VNNI
// The fast (not row-exact) Q8_0 product for several tokens: 16 weight rows × C ≤ 8 tokens,
// y[c·ldy + r] for r < 16. The tiles above keep one weight row per register, so after every
// vpdpbusd (64 MACs) each (row, token) pays a convert, a scale product and an FMA: 4 ops per
// 64 MACs, which is what bounds 8 sequences decoding together on Q8_0 (bench_kernels batch8).
// Here a block of 16 rows is transposed (lane l = dword j of row lane_row[l]), so one
// vpdpbusd against a broadcast activation dword serves 16 rows, and the convert/scale/FMA
// come once per (16 rows, token, block): 8 + 4 ops per 512 MACs, plus the transpose (16 loads,
// 24 shuffles) shared by the C tokens. The sum differs from the row tiles' lane order — each
// block's exact int32 dot, then acc = fma(float(dot), d_w·d_a, acc) over the blocks in order,
// which is the twin q8_0_blockwise_ref (and ggml's own per-block order) — so it runs only where
// a batch is not row-exact (matmul.hpp). The int32 dot: (w + 128) as u8 × a, started from
// −128·Σa (8 × the a8_pair's per-lane −16·Σa).
inline constexpr int q8_0_lanes_row[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};  // an involution

// Rows ws bytes apart; ws · 15 must fit an int32 (the scales are gathered; matmul.hpp checks).
// pf (streaming, or null): the next 16 rows, 16·ws contiguous bytes, prefetched a block's share
// (16 · 34 bytes) per block. Without it the 16 interleaved streams read DRAM slower than the
// row tiles do (bench_kernels batch8 fast; docs/performance.md).
// The activations come in one of two layouts (Acts):
//   lanes_packed — a[b·C + c] (pack_a8_lanes): for the streaming small batch, where 8 tokens of
//                  a8_pair rows (48 KB at K = 2048) crowded the weights out of L1 (bench_kernels
//                  batch8 fast; docs/performance.md);
//   lanes_rows   — the a8_pair rows themselves: for prefill, whose 32-row chunks would pack each
//                  8-token group for only two 16-row groups (pp512 is unchanged against reading
//                  the rows everywhere, within noise).
// 32 bytes of each of 16 rows (row r at q + r·stride) transposed into dwords: wt[j] lane l =
// dword j of row q8_0_lanes_row[l]. Rows r and r + 8 share a register ([row r | row r + 8]), then an
// 8 × 8 dword transpose per 256-bit half: 16 loads and 24 shuffles.
inline void transpose16x32(const std::byte* q, std::size_t stride, __m512i (&wt)[8]) {
    __m512i z[8];
    for (int r = 0; r < 8; ++r)
        z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + std::size_t(r) * stride))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + std::size_t(r + 8) * stride)), 1);
    __m512i t[8], u[8];
    for (int g = 0; g < 2; ++g) {  // rows 4g .. 4g + 3 of each half
        const __m512i* zz = z + 4 * g;
        t[4 * g + 0] = _mm512_unpacklo_epi32(zz[0], zz[1]);
        t[4 * g + 1] = _mm512_unpackhi_epi32(zz[0], zz[1]);
        t[4 * g + 2] = _mm512_unpacklo_epi32(zz[2], zz[3]);
        t[4 * g + 3] = _mm512_unpackhi_epi32(zz[2], zz[3]);
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);  // dword 0 (or 4) of the 4 rows
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);  // dword 1 (or 5)
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);  // dword 2 (or 6)
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);  // dword 3 (or 7)
    }
    for (int j = 0; j < 4; ++j) {  // 128-bit lanes: [rows 0–3 | 8–11 | 4–7 | 12–15]
        wt[j] = _mm512_shuffle_i32x4(u[j], u[j + 4], 0x88);
        wt[j + 4] = _mm512_shuffle_i32x4(u[j], u[j + 4], 0xdd);
    }
}

// The 16-row forms' streaming prefetch: pf (or null) is the next 16 rows, 16 · bs contiguous
// bytes per block of bs bytes; block b's share (the lines of bytes [share·b, share·(b + 1)))
// is prefetched while block b of the current rows is computed.
inline void prefetch_share(const std::byte* pf, std::size_t share, std::int64_t b) {
    if (!pf) return;
    const std::size_t step = share * std::size_t(b);
    for (std::size_t o = step & ~std::size_t(63); o < step + share; o += 64) __builtin_prefetch(reinterpret_cast<const char*>(pf) + o, 0, 3);
}
// The repacked forms' stream prefetch (kernel_set::x16_pf_ahead): pf (or null) is the stream
// itself some super-blocks ahead, block_bytes per super-block; super-block b's bytes are split
// into `parts` equal shares and share `part` (its lines, rounded up) is prefetched while chunk
// `part` of super-block b is computed, so the lines go out spread over the super-block.
template <std::size_t block_bytes, int parts>
inline void prefetch_part(const std::byte* pf, std::int64_t b, int part) {
    if (!pf) return;
    constexpr std::size_t share = block_bytes / parts, lines = (share + 63) / 64;
    const char* p = reinterpret_cast<const char*>(pf) + std::size_t(b) * block_bytes + share * std::size_t(part);
    for (std::size_t line = 0; line < lines; ++line) __builtin_prefetch(p + 64 * line, 0, 3);
}

struct lanes_packed {
    const a8_lane* a;
    std::int64_t C;
    const std::int8_t* qs(std::int64_t b, int c) const { return a[b * C + c].qs; }
    float d(std::int64_t b, int c) const { return a[b * C + c].d; }
    std::int32_t corr(std::int64_t b, int c) const { return a[b * C + c].corr; }
};
struct lanes_rows {
    const std::byte* a;
    std::size_t stride;
    a8_block_view v(std::int64_t b, int c) const { return a8_pair_block(reinterpret_cast<const a8_pair*>(a + std::size_t(c) * stride), b); }
    const std::int8_t* qs(std::int64_t b, int c) const { return v(b, c).qs; }
    float d(std::int64_t b, int c) const { return v(b, c).d; }
    std::int32_t corr(std::int64_t b, int c) const { return v(b, c).corr; }
};
// Block b for C tokens: wt the 16 rows' codes in the lanes (u8: + 128), dw their scales.
template <int C, class Acts>
inline void q8_0_lanes_block(const __m512i (&wt)[8], __m512 dw, const Acts& a, std::int64_t b, __m512 (&acc)[C]) {
    for (int c = 0; c < C; ++c) {
        // broadcast loads of the activation's dwords (a copy to a local array first had the
        // compiler store and reload them: pp512 0.89x)
        const std::int8_t* qa = a.qs(b, c);
        __m512i dot = _mm512_set1_epi32(a.corr(b, c));
        for (int j = 0; j < 8; ++j) dot = _mm512_dpbusd_epi32(dot, wt[j], _mm512_broadcastd_epi32(_mm_loadu_si32(qa + 4 * j)));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(a.d(b, c))), acc[c]);
    }
}
template <int C, class Acts>
void q8_0_lanes_tile(const std::byte* w, std::size_t ws, Acts a, std::int64_t K, float* y, std::int64_t ldy, const std::byte* pf) {
    constexpr std::size_t bs = sizeof(quant::block_q8_0);  // 34: f16 d, then 32 codes
    const std::int64_t nb = K / 32;
    const __m512i lane_row = _mm512_loadu_si512(q8_0_lanes_row);
    const __m512i scale_off = _mm512_mullo_epi32(lane_row, _mm512_set1_epi32(int(ws)));
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nb; ++b) {
        prefetch_share(pf, 16 * bs, b);
        __m512i wt[8];
        transpose16x32(w + std::size_t(b) * bs + 2, ws, wt);  // row 0's codes of block b
        for (int j = 0; j < 8; ++j) wt[j] = _mm512_xor_si512(wt[j], flip);
        const __m512i d16 = _mm512_i32gather_epi32(scale_off, w + std::size_t(b) * bs, 1);  // low half: the f16 d
        q8_0_lanes_block<C>(wt, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d16)), a, b, acc);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, _mm512_permutexvar_ps(lane_row, acc[c]));
}
template <int C>
void q8_0_lanes_packed(const std::byte* w, std::size_t ws, const a8_lane* a, std::int64_t K, float* y, std::int64_t ldy,
                       const std::byte* pf) {
    q8_0_lanes_tile<C>(w, ws, lanes_packed{a, C}, K, y, ldy, pf);
}
template <int C>
void q8_0_lanes_rows(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                     std::int64_t ldy, const std::byte* pf) {
    q8_0_lanes_tile<C>(w, ws, lanes_rows{a, as}, K, y, ldy, pf);
}

// Q8_0 rows repacked into groups of 16, so that the form above reads no row twice and transposes
// nothing: block b of a group at b · 544 bytes holds the 16 rows' f16 scales in lane order
// (lane l: row q8_0_lanes_row[l]), then the codes as transpose16x32 leaves them, offset to u8 —
// the bytes of 16 rows of the file, rearranged. Its products are q8_0_lanes_tile's, bit for bit.
// backend::cpu rearranges Q8_0 matrices so at load (matmul.hpp: x16_block); bench_repack measured
// it (two threads streaming: 1 token as fast as the row tiles, 8 tokens well ahead of the
// transposing form; docs/performance.md, "A repacked Q8_0 (and Q4_K) layout, probed").
inline constexpr std::size_t q8_0_x16_block_bytes = 16 * sizeof(quant::block_q8_0);
// Rows w, w + ws, …, w + 15·ws of nb blocks into out (nb · q8_0_x16_block_bytes bytes).
inline void repack_q8_0_x16(const std::byte* w, std::size_t ws, std::int64_t nb, std::byte* out) {
    constexpr std::size_t bs = sizeof(quant::block_q8_0);
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (std::int64_t b = 0; b < nb; ++b) {
        std::byte* o = out + std::size_t(b) * q8_0_x16_block_bytes;
        for (int l = 0; l < 16; ++l) std::memcpy(o + 2 * l, w + std::size_t(q8_0_lanes_row[l]) * ws + std::size_t(b) * bs, 2);
        __m512i wt[8];
        transpose16x32(w + std::size_t(b) * bs + 2, ws, wt);
        for (int j = 0; j < 8; ++j) _mm512_storeu_si512(o + 32 + 64 * j, _mm512_xor_si512(wt[j], flip));
    }
}
// 16 rows × C ≤ 8 tokens of a repacked group g (nb blocks), y[c·ldy + r]. pf (or null): a
// group to prefetch block by block (the probe measured two groups ahead best).
template <int C, class Acts>
void q8_0_x16_tile(const std::byte* g, Acts a, std::int64_t nb, float* y, std::int64_t ldy, const std::byte* pf) {
    const __m512i lane_row = _mm512_loadu_si512(q8_0_lanes_row);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* o = g + std::size_t(b) * q8_0_x16_block_bytes;
        prefetch_share(pf, q8_0_x16_block_bytes, b);
        __m512i wt[8];
        for (int j = 0; j < 8; ++j) wt[j] = _mm512_loadu_si512(o + 32 + 64 * j);
        q8_0_lanes_block<C>(wt, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(o))), a, b, acc);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, _mm512_permutexvar_ps(lane_row, acc[c]));
}

// ---------------------------------------------------------------- Q6_K, 16 weight rows in the lanes
// The fast (not row-exact) Q6_K product of several tokens, on a8k_block rows: 16 weight rows ×
// C ≤ 8 tokens, y[c·ldy + r] for r < 16. The row tiles pay two multiply instructions per 64
// multiply-adds and (row, token) (vpmaddubsw, then vpdpwssd with the 16-value scales). Here a
// super-block of 16 rows is unpacked to bytes (u, 4 KB on the stack) and transposed 32 values at
// a time (transpose16x32), so one vpdpbusd against a broadcast activation dword feeds 16 rows;
// each 16-value sub-block then takes one vpmulld by its 16 rows' scales: 5 multiplies per 256
// multiply-adds instead of 8. The −32 offset is one vpdpwssd per scale pair and token against
// the activation's 16-sums. The super-block's int32 Σ sc·(q − 32)·a is exact in any order (the
// same integer the row tiles form); the float sum is acc = fma(float(isum), d_w·d_a, acc) per
// super-block in order — the twin q6_k_blockwise_ref, not the row tiles' lane order — so, as
// the Q8_0 form, it runs only where a batch need not be row-exact. pf (streaming, or null): the
// next 16 rows (16·ws contiguous bytes), a super-block's share prefetched per super-block.
// Against the row tiles it gains in prefill (bench_kernels gemm fast), not in the streaming small
// batch, where every fast form meets the same memory cap (the figures: docs/performance.md).
// Super-block b of the 16 rows w, w + ws, …: u[r] the row's 256 codes (0..63) as bytes, s16[r]
// its 16 scales.
inline void q6_k_unpack16(const std::byte* w, std::size_t ws, std::int64_t b, std::uint8_t (&u)[16][256], std::int16_t (&s16)[16][16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);  // as q6_k_tile_body
    const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    for (int r = 0; r < 16; ++r) {
        const auto* blk = reinterpret_cast<const quant::block_q6_k*>(w + std::size_t(r) * ws) + b;
        for (int g = 0; g < 4; ++g) {  // values 64g .. 64g + 63: half g/2, nibble g%2
            const int h = g / 2;
            const __m512i ql = _mm512_loadu_si512(blk->ql + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h)));
            const __m512i lo = (g & 1) ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
            const __m512i hb = (g & 1) ? _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30) : _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30);
            _mm512_storeu_si512(u[r] + 64 * g, _mm512_or_si512(lo, hb));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(s16[r]), _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales))));
    }
}
// The 16-row Q6_K forms' int32 sums for C tokens of one super-block (ab[c]: the tokens' a8k_block).
// Start: isum[c] = −32·Σ sc·(16-sum of a), from sp[i] (lane l: the scales 2i and 2i + 1 of the
// lane's row as int16).
template <int C>
inline void q6_k_offset_sums(const __m512i (&sp)[8], const a8k_block* const (&ab)[C], __m512i (&isum)[C]) {
    for (int c = 0; c < C; ++c) {
        __m512i corr = _mm512_setzero_si512();
        for (int i = 0; i < 8; ++i) corr = _mm512_dpwssd_epi32(corr, sp[i], _mm512_broadcastd_epi32(_mm_loadu_si32(ab[c]->bsums + 2 * i)));
        isum[c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(corr, 5));
    }
}
// Chunk k (values 32k .. 32k + 31: sub-blocks 2k and 2k + 1): wt the 16 rows' codes in the lanes
// (transpose16x32's layout), sc0 / sc1 the two sub-blocks' scales of each lane's row.
template <int C>
inline void q6_k_chunk_sums(const __m512i (&wt)[8], __m512i sc0, __m512i sc1, const a8k_block* const (&ab)[C], int k,
                            __m512i (&isum)[C]) {
    for (int c = 0; c < C; ++c) {
        const std::int8_t* qa = ab[c]->qs + 32 * k;
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) {
            d0 = _mm512_dpbusd_epi32(d0, wt[j], _mm512_broadcastd_epi32(_mm_loadu_si32(qa + 4 * j)));
            d1 = _mm512_dpbusd_epi32(d1, wt[j + 4], _mm512_broadcastd_epi32(_mm_loadu_si32(qa + 16 + 4 * j)));
        }
        isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(d0, sc0), _mm512_mullo_epi32(d1, sc1)));
    }
}
template <int C>
void q6_k_lanes_rows(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                     std::int64_t ldy, const std::byte* pf) {
    constexpr std::size_t bs = sizeof(quant::block_q6_k);  // 210: ql[128], qh[64], scales[16], f16 d
    const std::int64_t nsb = K / 256;
    const __m512i lane_row = _mm512_loadu_si512(q8_0_lanes_row);
    // the gather reads the dword at 206 (scales[14..15], d) so that it stays inside the block
    const __m512i d_off = _mm512_add_epi32(_mm512_mullo_epi32(lane_row, _mm512_set1_epi32(int(ws))), _mm512_set1_epi32(206));
    alignas(64) std::uint8_t u[16][256];   // the 16 rows' codes (0..63) of one super-block
    alignas(64) std::int16_t s16[16][16];  // their scales
    alignas(64) std::int32_t sc[16][16];   // [sub-block][lane]: the scale of the lane's row
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nsb; ++b) {
        prefetch_share(pf, 16 * bs, b);
        q6_k_unpack16(w, ws, b, u, s16);
        __m512i sp[8];  // lane l, dword i: the scales 2i and 2i + 1 of the lane's row, as int16
        transpose16x32(reinterpret_cast<const std::byte*>(s16), 32, sp);
        for (int i = 0; i < 8; ++i) {
            _mm512_store_si512(sc[2 * i], _mm512_srai_epi32(_mm512_slli_epi32(sp[i], 16), 16));
            _mm512_store_si512(sc[2 * i + 1], _mm512_srai_epi32(sp[i], 16));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
            _mm512_srli_epi32(_mm512_i32gather_epi32(d_off, w + std::size_t(b) * bs, 1), 16)));
        const a8k_block* ab[C];
        for (int c = 0; c < C; ++c) ab[c] = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as) + b;
        __m512i isum[C];
        q6_k_offset_sums<C>(sp, ab, isum);
        for (int k = 0; k < 8; ++k) {  // values 32k .. 32k + 31: sub-blocks 2k and 2k + 1
            __m512i wt[8];
            transpose16x32(reinterpret_cast<const std::byte*>(u[0] + 32 * k), 256, wt);
            q6_k_chunk_sums<C>(wt, _mm512_load_si512(sc[2 * k]), _mm512_load_si512(sc[2 * k + 1]), ab, k, isum);
        }
        for (int c = 0; c < C; ++c)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(ab[c]->d)), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, _mm512_permutexvar_ps(lane_row, acc[c]));
}

// ---------------------------------------------------------------- Q4_K, 16 weight rows in the lanes
// The fast (not row-exact) Q4_K product, as q6_k_lanes_rows but with no unpacking: a 32-byte
// chunk of nibbles of 16 rows is transposed as it lies (transpose16x32), and each transposed
// dword holds 4 values of sub-block 2p (low nibbles) and 4 of sub-block 2p + 1 (high), so one
// transpose feeds 16 vpdpbusd of 16 rows × 4 values. Per sub-block and 16 rows one vpmulld by
// the 6-bit scales. d, dmin and the 12 scale bytes of the 16 rows come in 4 gathers and are
// unpacked in the lanes (k4_scales, lane-wise). The mins: msum = Σ m_j·(32-sum of a), one
// vpdpwssd per sub-block and token against the 16-sum pairs. Per super-block, in this order
// (the twin q4_k_blockwise_ref): acc = fma(−msum, dmin_w·d_a, acc), acc = fma(isum, d_w·d_a,
// acc). pf: as q6_k_lanes_rows.
// As Q6_K's form: faster than the row tiles in prefill, at the same memory cap as the other fast
// forms in the streaming small batch (bench_kernels; docs/performance.md).
// Where q4_k_lanes_body reads a super-block of 16 rows: the file's rows (4 gathers and 4
// transposes per super-block) or a group repacked once (repack_q4_k_x16: plain loads).
struct q4_k_rows_source {
    static constexpr bool stream = false;  // pf: a group to prefetch, its share per super-block in one burst
    const std::byte* w;
    std::size_t ws;
    __m512i row_off;  // lane l: q8_0_lanes_row[l] · ws
    q4_k_rows_source(const std::byte* w_, std::size_t ws_)
        : w(w_), ws(ws_), row_off(_mm512_mullo_epi32(_mm512_loadu_si512(q8_0_lanes_row), _mm512_set1_epi32(int(ws_)))) {}
    // [d | dmin] and the 12 scale bytes (3 dwords) of each lane's row
    void scales(std::int64_t b, __m512i& dd, __m512i& w0, __m512i& w1, __m512i& w2) const {
        const std::byte* base = w + std::size_t(b) * sizeof(quant::block_q4_k);
        dd = _mm512_i32gather_epi32(row_off, base, 1);
        w0 = _mm512_i32gather_epi32(row_off, base + 4, 1);
        w1 = _mm512_i32gather_epi32(row_off, base + 8, 1);
        w2 = _mm512_i32gather_epi32(row_off, base + 12, 1);
    }
    // qs[32p ..] of the 16 rows in the lanes (transpose16x32's layout)
    void nibbles(std::int64_t b, int p, __m512i (&q)[8]) const {
        transpose16x32(w + std::size_t(b) * sizeof(quant::block_q4_k) + 16 + 32 * p, ws, q);
    }
};
// A Q4_K group of 16 rows repacked (repack_q4_k_x16): per super-block 2,304 bytes — the 16 rows'
// [d | dmin], then their scale dwords 0, 1, 2, each as 16 lanes, then qs in 4 chunks of 8
// registers as transpose16x32 leaves them — the bytes of 16 rows of the file, rearranged.
inline constexpr std::size_t q4_k_x16_block_bytes = 16 * sizeof(quant::block_q4_k);
inline constexpr std::size_t q4_k_x16_pf_ahead = 2 * q4_k_x16_block_bytes;  // the stream prefetch's distance
struct q4_k_x16_source {
    // pf: the stream itself, q4_k_x16_pf_ahead on, spread over the 4 chunks of each super-block —
    // what rescued Q6_K's repacked form (kernels_avx512_x16.hpp). It beats prefetching the whole
    // group two on in one burst at each super-block's start, at 1 and at 8 tokens and end to end
    // (bench_repack --type q4_k -t 2, clover bench; docs/performance.md).
    static constexpr bool stream = true;
    const std::byte* g;
    void scales(std::int64_t b, __m512i& dd, __m512i& w0, __m512i& w1, __m512i& w2) const {
        const std::byte* o = g + std::size_t(b) * q4_k_x16_block_bytes;
        dd = _mm512_loadu_si512(o);
        w0 = _mm512_loadu_si512(o + 64);
        w1 = _mm512_loadu_si512(o + 128);
        w2 = _mm512_loadu_si512(o + 192);
    }
    void nibbles(std::int64_t b, int p, __m512i (&q)[8]) const {
        const std::byte* o = g + std::size_t(b) * q4_k_x16_block_bytes + 256 + 512 * std::size_t(p);
        for (int j = 0; j < 8; ++j) q[j] = _mm512_loadu_si512(o + 64 * j);
    }
};
// Rows w, w + ws, …, w + 15·ws of nsb super-blocks into out (nsb · q4_k_x16_block_bytes bytes).
inline void repack_q4_k_x16(const std::byte* w, std::size_t ws, std::int64_t nsb, std::byte* out) {
    const q4_k_rows_source src(w, ws);
    for (std::int64_t b = 0; b < nsb; ++b) {
        std::byte* o = out + std::size_t(b) * q4_k_x16_block_bytes;
        __m512i v[4];
        src.scales(b, v[0], v[1], v[2], v[3]);
        for (int i = 0; i < 4; ++i) _mm512_storeu_si512(o + 64 * i, v[i]);
        for (int p = 0; p < 4; ++p) {
            __m512i q[8];
            src.nibbles(b, p, q);
            for (int j = 0; j < 8; ++j) _mm512_storeu_si512(o + 256 + 512 * p + 64 * j, q[j]);
        }
    }
}

template <int C, class Source>
inline void q4_k_lanes_body(const Source& src, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                            const std::byte* pf) {
    constexpr std::size_t bs = sizeof(quant::block_q4_k);  // 144: f16 d, f16 dmin, scales[12], qs[128]
    const std::int64_t nsb = K / 256;
    const __m512i lane_row = _mm512_loadu_si512(q8_0_lanes_row);
    const __m512i m4 = _mm512_set1_epi8(0x0f), b3f = _mm512_set1_epi8(0x3f), b30 = _mm512_set1_epi8(0x30), lo8 = _mm512_set1_epi32(0xff);
    auto byte_of = [&](__m512i v, int i) { return _mm512_and_si512(_mm512_srli_epi32(v, 8 * i), lo8); };
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nsb; ++b) {
        if constexpr (!Source::stream) prefetch_share(pf, 16 * bs, b);
        __m512i dd, w0, w1, w2;  // [d | dmin] and the scale dwords of each lane's row
        src.scales(b, dd, w0, w1, w2);
        // k4_scales, lane-wise: byte j of sc_lo / m_lo is (sc, m)[j], of sc_hi / m_hi (sc, m)[j + 4]
        const __m512i sc_lo = _mm512_and_si512(w0, b3f), m_lo = _mm512_and_si512(w1, b3f);
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(w2, m4), _mm512_and_si512(_mm512_srli_epi32(w0, 2), b30));
        const __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4), _mm512_and_si512(_mm512_srli_epi32(w1, 2), b30));
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512 dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        const a8k_block* ab[C];
        for (int c = 0; c < C; ++c) ab[c] = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as) + b;
        {  // the mins first
            __m512i msum[C];
            for (int c = 0; c < C; ++c) msum[c] = _mm512_setzero_si512();
            for (int j = 0; j < 8; ++j) {
                const __m512i mj = byte_of(j < 4 ? m_lo : m_hi, j & 3);
                const __m512i mp = _mm512_or_si512(mj, _mm512_slli_epi32(mj, 16));  // (m_j, m_j) as int16
                for (int c = 0; c < C; ++c)
                    msum[c] = _mm512_dpwssd_epi32(msum[c], mp, _mm512_broadcastd_epi32(_mm_loadu_si32(ab[c]->bsums + 2 * j)));
            }
            for (int c = 0; c < C; ++c)
                acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[c]), _mm512_mul_ps(dmw, _mm512_set1_ps(ab[c]->d)), acc[c]);
        }
        __m512i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p) {  // qs[32p ..]: sub-blocks 2p (low nibbles) and 2p + 1 (high)
            if constexpr (Source::stream) prefetch_part<16 * bs, 4>(pf, b, p);  // 576 bytes: 9 lines
            __m512i lo[8], hi[8];
            src.nibbles(b, p, lo);
            for (int j = 0; j < 8; ++j) {
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(lo[j], 4), m4);
                lo[j] = _mm512_and_si512(lo[j], m4);
            }
            const __m512i s0 = byte_of(p < 2 ? sc_lo : sc_hi, (2 * p) & 3), s1 = byte_of(p < 2 ? sc_lo : sc_hi, (2 * p + 1) & 3);
            // Unrolled, the tokens' sums stay in registers: g++ 12 kept the loop at 8 tokens and
            // isum[c] in memory (load, add, store per token and chunk), which slowed the 8-token
            // tile in L2 and streaming alike (docs/performance.md).
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) {
                const std::int8_t* qa = ab[c]->qs + 64 * p;
                __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
                for (int j = 0; j < 8; ++j) {
                    d0 = _mm512_dpbusd_epi32(d0, lo[j], _mm512_broadcastd_epi32(_mm_loadu_si32(qa + 4 * j)));
                    d1 = _mm512_dpbusd_epi32(d1, hi[j], _mm512_broadcastd_epi32(_mm_loadu_si32(qa + 32 + 4 * j)));
                }
                isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(d0, s0), _mm512_mullo_epi32(d1, s1)));
            }
        }
        for (int c = 0; c < C; ++c)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dw, _mm512_set1_ps(ab[c]->d)), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, _mm512_permutexvar_ps(lane_row, acc[c]));
}
template <int C>
void q4_k_lanes_rows(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                     std::int64_t ldy, const std::byte* pf) {
    q4_k_lanes_body<C>(q4_k_rows_source(w, ws), a, as, K, y, ldy, pf);
}
// 16 rows × C ≤ 8 tokens of a repacked group g (K / 256 super-blocks); pf: a group to prefetch.
template <int C>
void q4_k_x16_tile(const std::byte* g, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                   const std::byte* pf) {
    q4_k_lanes_body<C>(q4_k_x16_source{g}, a, as, K, y, ldy, pf);
}
// The repacked forms with the signatures of the kernel table (matmul.hpp: kernel_set::x16_*).
template <int C>
void q8_0_x16_packed(const std::byte* g, const a8_lane* a, std::int64_t K, float* y, std::int64_t ldy, const std::byte* pf) {
    q8_0_x16_tile<C>(g, lanes_packed{a, C}, K / 32, y, ldy, pf);
}
template <int C>
void q8_0_x16_rows(const std::byte* g, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                   const std::byte* pf) {
    q8_0_x16_tile<C>(g, lanes_rows{a, as}, K / 32, y, ldy, pf);
}
inline void repack_q8_0_group(const std::byte* w, std::size_t ws, std::int64_t K, std::byte* out) { repack_q8_0_x16(w, ws, K / 32, out); }
inline void repack_q4_k_group(const std::byte* w, std::size_t ws, std::int64_t K, std::byte* out) { repack_q4_k_x16(w, ws, K / 256, out); }
#endif

// ---------------------------------------------------------------- K-quants × Q8_K (a8k_block rows)

// The 8 (scale, min) pairs of a Q4_K/Q5_K field as two 64-bit words of bytes.
inline void k4_scales(const std::uint8_t* b, std::uint64_t& sc, std::uint64_t& mn) {
    std::uint32_t w0, w1, w2;
    std::memcpy(&w0, b, 4);
    std::memcpy(&w1, b + 4, 4);
    std::memcpy(&w2, b + 8, 4);
    const std::uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    const std::uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const std::uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    sc = std::uint64_t(sc_lo) | (std::uint64_t(sc_hi) << 32);
    mn = std::uint64_t(m_lo) | (std::uint64_t(m_hi) << 32);
}

// Scale vectors for the pairs of sub-blocks: int16 lanes 0–15 = sc[2p], 16–31 = sc[2p+1].
// k4_scale_bytes keeps the 8 scales as words in every 128-bit lane (one register per row);
// k4_scale_pair picks pair p with one byte shuffle when it is needed. Building all four
// vectors up front needs 4 registers per row: with 4 rows that spilled and ran the one-row
// (decode) product at a third of the memory bandwidth (bench_kernels; docs/performance.md).
inline __m512i k4_scale_bytes(std::uint64_t sc) {
    return _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(std::int64_t(sc))));
}
inline __m512i k4_scale_pair(__m512i w8, int p) {
    alignas(64) static const std::int8_t ctl[4][64] = {
#define CLOVER_K4_CTL(a0, a1, b0, b1)                                                                                   \
    {a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, \
     a0, a1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, \
     b0, b1, b0, b1}
        CLOVER_K4_CTL(0, 1, 2, 3), CLOVER_K4_CTL(4, 5, 6, 7), CLOVER_K4_CTL(8, 9, 10, 11), CLOVER_K4_CTL(12, 13, 14, 15)
#undef CLOVER_K4_CTL
    };
    return _mm512_shuffle_epi8(w8, _mm512_load_si512(ctl[p]));
}

// dmin · m[0..7] as 8 floats (zero-extended to 16 lanes).
inline __m512 k4_mins(std::uint64_t mn, float dmin) {
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(std::int64_t(mn))));
    return _mm512_zextps256_ps512(_mm256_mul_ps(m, _mm256_set1_ps(dmin)));
}

// 64 codes of pair p from 32 bytes of nibbles: low nibbles → values 0–31, high → 32–63.
inline __m512i k4_nibbles(const std::uint8_t* q32) {
    const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q32)));
    const __m512i sh = _mm512_set_epi64(0x0004000400040004ll, 0x0004000400040004ll, 0x0004000400040004ll, 0x0004000400040004ll,
                                        0, 0, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi16(b, sh), _mm512_set1_epi8(0x0f));
}

// Shared body of Q4_K and Q5_K: Block is block_q4_k or block_q5_k. PF: as q8_0_tile_body, a
// line per row and pair of sub-blocks (4 × 64 bytes cover a super-block of 144 or 176).
template <class Block, bool Five, int R, int C, bool PF = false>
void k4_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
             std::int64_t ldy, std::ptrdiff_t pfd = 0) {
    const std::int64_t nsb = K / 256;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (std::int64_t b = 0; b < nsb; ++b) {
        const Block* blk[R];
        __m512i sw[R];
        __m512 mv[R];
        float d[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const Block*>(w + std::size_t(r) * ws) + b;
            std::uint64_t sc, mn;
            k4_scales(blk[r]->scales, sc, mn);
            sw[r] = k4_scale_bytes(sc);
            mv[r] = k4_mins(mn, h2f(blk[r]->dmin));
            d[r] = h2f(blk[r]->d);
        }
        __m512i isum[R][C];
        for (int p = 0; p < 4; ++p) {
            __m512i wv[R], sv[R];
            for (int r = 0; r < R; ++r) {
                if constexpr (PF) __builtin_prefetch(reinterpret_cast<const char*>(blk[r]) + pfd + 64 * p, 0, 3);
                sv[r] = k4_scale_pair(sw[r], p);
                wv[r] = k4_nibbles(blk[r]->qs + 32 * p);
                if constexpr (Five) {
                    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh)));
                    const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * p))), _mm256_set1_epi8(char(1 << (2 * p + 1))), 1);
                    wv[r] = _mm512_mask_add_epi8(wv[r], _mm512_test_epi8_mask(qh, bit), wv[r], _mm512_set1_epi8(16));
                }
            }
            for (int c = 0; c < C; ++c) {
                const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
                const __m512i av = _mm512_load_si512(ab.qs + 64 * p);
                for (int r = 0; r < R; ++r) {
                    const __m512i prod = _mm512_maddubs_epi16(wv[r], av);
                    isum[r][c] = p == 0 ? _mm512_madd_epi16(prod, sv[r]) : dot_i16(isum[r][c], prod, sv[r]);
                }
            }
        }
        for (int c = 0; c < C; ++c) {
            const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
            const __m512 da = _mm512_set1_ps(ab.d);
            const __m512 ds = _mm512_zextps256_ps512(_mm256_load_ps(ab.dsum));
            for (int r = 0; r < R; ++r) {
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_mul_ps(_mm512_set1_ps(d[r]), da), acc[r][c]);
                acc[r][c] = _mm512_fnmadd_ps(mv[r], ds, acc[r][c]);
            }
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
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
void q4_k_tile_pf(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                  std::ptrdiff_t pfd) {
    k4_tile<quant::block_q4_k, false, R, C, true>(w, ws, a, as, K, y, ldy, pfd);
}
template <int R, int C>
void q5_k_tile_pf(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                  std::ptrdiff_t pfd) {
    k4_tile<quant::block_q5_k, true, R, C, true>(w, ws, a, as, K, y, ldy, pfd);
}

// Q6_K: 4 groups of 64 values per super-block; group g = half g/2, nibble g%2. PF: as
// q8_0_tile_body, a line per row and group (4 × 64 bytes cover a super-block of 210).
template <int R, int C, bool PF>
void q6_k_tile_body(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
                    std::int64_t ldy, std::ptrdiff_t pfd) {
    const std::int64_t nsb = K / 256;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    // qh shifts per group (16-bit lanes; low 256 bits | high 256 bits): bits 0–1 | 2–3 → 4–5
    // (left 4 | 2), bits 4–5 | 6–7 → 4–5 (right 0 | 2).
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    for (std::int64_t b = 0; b < nsb; ++b) {
        const quant::block_q6_k* blk[R];
        __m512i s16z[R], off[R];
        float d[R];
        for (int r = 0; r < R; ++r) {
            blk[r] = reinterpret_cast<const quant::block_q6_k*>(w + std::size_t(r) * ws) + b;
            const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r]->scales)));
            s16z[r] = _mm512_zextsi256_si512(s16);  // group scales as words; expanded per group below
            off[r] = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5)));  // −32·sc
            d[r] = h2f(blk[r]->d);
        }
        __m512i isum[R][C];
        for (int c = 0; c < C; ++c) {
            const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
            const __m512i bs = _mm512_zextsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(ab.bsums)));
            for (int r = 0; r < R; ++r) isum[r][c] = _mm512_madd_epi16(off[r], bs);
        }
        for (int g = 0; g < 4; ++g) {
            const int h = g / 2;
            // lanes 8i..8i+7 ← scale 4g + i (one vpermw per row and group; see k4_scale_pair)
            alignas(64) static const std::int16_t idx_tab[4][32] = {
                {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
                {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
                {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
                {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
            const __m512i idx = _mm512_load_si512(idx_tab[g]);
            __m512i wv[R], sv[R];
            for (int r = 0; r < R; ++r) {
                if constexpr (PF) __builtin_prefetch(reinterpret_cast<const char*>(blk[r]) + pfd + 64 * g, 0, 3);
                sv[r] = _mm512_permutexvar_epi16(idx, s16z[r]);
                const __m512i ql = _mm512_loadu_si512(blk[r]->ql + 64 * h);
                const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r]->qh + 32 * h)));
                const __m512i lo = (g & 1) ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
                const __m512i hb = (g & 1) ? _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30)
                                           : _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30);
                wv[r] = _mm512_or_si512(lo, hb);
            }
            for (int c = 0; c < C; ++c) {
                const auto& ab = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b];
                const __m512i av = _mm512_load_si512(ab.qs + 64 * g);
                for (int r = 0; r < R; ++r) isum[r][c] = dot_i16(isum[r][c], _mm512_maddubs_epi16(wv[r], av), sv[r]);
            }
        }
        for (int c = 0; c < C; ++c) {
            const float da = reinterpret_cast<const a8k_block*>(a + std::size_t(c) * as)[b].d;
            for (int r = 0; r < R; ++r)
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_set1_ps(d[r] * da), acc[r][c]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int R, int C>
void q6_k_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy) {
    q6_k_tile_body<R, C, false>(w, ws, a, as, K, y, ldy, 0);
}
template <int R, int C>
void q6_k_tile_pf(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y, std::int64_t ldy,
                  std::ptrdiff_t pfd) {
    q6_k_tile_body<R, C, true>(w, ws, a, as, K, y, ldy, pfd);
}

// ---------------------------------------------------------------- BF16 × BF16 (vdpbf16ps)
#if CLOVER_CPU_AVX512_BF16
// Activation rows: bf16 values (ggml's rounding), zero-padded to a multiple of 32.
template <int R, int C>
void bf16_tile(const std::byte* w, std::size_t ws, const std::byte* a, std::size_t as, std::int64_t K, float* y,
               std::int64_t ldy) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    std::int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512i wv[R];
        for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_si512(reinterpret_cast<const quant::bf16_bits*>(w + std::size_t(r) * ws) + k);
        for (int c = 0; c < C; ++c) {
            const __m512i av = _mm512_loadu_si512(reinterpret_cast<const quant::bf16_bits*>(a + std::size_t(c) * as) + k);
            for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv[r], (__m512bh)av);
        }
    }
    if (k < K) {  // tail: the activation is zero-padded; mask the weight loads
        const __mmask32 m = __mmask32((1ull << (K - k)) - 1);
        __m512i wv[R];
        for (int r = 0; r < R; ++r)
            wv[r] = _mm512_maskz_loadu_epi16(m, reinterpret_cast<const quant::bf16_bits*>(w + std::size_t(r) * ws) + k);
        for (int c = 0; c < C; ++c) {
            const __m512i av = _mm512_loadu_si512(reinterpret_cast<const quant::bf16_bits*>(a + std::size_t(c) * as) + k);
            for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv[r], (__m512bh)av);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) y[c * ldy + r] = _mm512_reduce_add_ps(acc[r][c]);
}
#endif

}  // namespace clover::backend::cpu_detail::k512
#endif
