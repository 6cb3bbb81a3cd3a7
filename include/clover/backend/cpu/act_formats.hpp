#pragma once
// Activation rows as the SIMD kernels read them. The VALUES are exactly the ggml partner-type
// rounding of quant/rows.hpp (so parity with llama.cpp is unchanged); only the layout differs, to
// move per-block work out of the inner loops, where it would be repeated for every weight row:
//   a8k_block  — one Q8_K block (256 int8, scale d) plus d·Σ of each 32-group (the Q4_K/Q5_K
//                "min" term becomes one FMA per super-block) and the 16-group sums (Q6_K's −32
//                offset becomes one integer multiply-add);
//   a8_pair    — two Q8_0 blocks (64 int8) with their scales spread over 8 lanes each and the
//                per-lane correction −16·Σq that lets VNNI multiply (w + 128) as unsigned bytes;
//   a8_lane    — one Q8_0 block of one token for the fast 16-row Q8_0 form (40 bytes: codes,
//                scale, −128·Σq), packed from a8_pair rows with the tokens of a block side by side.
#include <cstdint>
#include <cstring>

#include "clover/quant/q8_0.hpp"
#include "clover/quant/q8_k.hpp"

namespace clover::backend::cpu_detail {

struct alignas(64) a8k_block {
    std::int8_t qs[256];
    float dsum[8];           // d · Σ qs[32j .. 32j+31]
    std::int16_t bsums[16];  // Σ qs[16j .. 16j+15]
    float d;
    std::uint8_t pad_[60];
};
static_assert(sizeof(a8k_block) == 384);

inline void prep_a8k(const quant::block_q8_k& q, a8k_block& o) {
    for (int i = 0; i < 256; ++i) o.qs[i] = q.qs[i];
    for (int j = 0; j < 16; ++j) o.bsums[j] = q.bsums[j];
    for (int j = 0; j < 8; ++j) o.dsum[j] = q.d * float(int(q.bsums[2 * j]) + int(q.bsums[2 * j + 1]));
    o.d = q.d;
}

struct alignas(64) a8_pair {
    std::int8_t qs[64];
    float d[16];            // [d0 × 8 | d1 × 8]
    std::int32_t corr[16];  // [−16·Σq0 × 8 | −16·Σq1 × 8]: 8 lanes sum to −128·Σq
};
static_assert(sizeof(a8_pair) == 192);

// Blocks b0 and b1 (b1 may be null: a zero block) into one pair.
inline void prep_a8_pair(const quant::block_q8_0* b0, const quant::block_q8_0* b1, a8_pair& o) {
    const quant::block_q8_0* b[2] = {b0, b1};
    for (int h = 0; h < 2; ++h) {
        int s = 0;
        for (int i = 0; i < 32; ++i) {
            const std::int8_t v = b[h] ? b[h]->qs[i] : std::int8_t(0);
            o.qs[32 * h + i] = v;
            s += v;
        }
        const float d = b[h] ? quant::f16_to_f32(b[h]->d) : 0.f;
        for (int i = 0; i < 8; ++i) {
            o.d[8 * h + i] = d;
            o.corr[8 * h + i] = -16 * s;
        }
    }
}

// Block b of an a8_pair row seen as one Q8_0 block: its 32 codes, its scale and −128·Σq (the
// 8 lanes' corrections of its half, summed). The one place that knows where a block sits in the
// pair layout: pack_a8_lanes and the fast form's reads of a8_pair rows (k512::lanes_rows) use it.
struct a8_block_view {
    const std::int8_t* qs;
    float d;
    std::int32_t corr;
};
inline a8_block_view a8_pair_block(const a8_pair* row, std::int64_t b) {
    const a8_pair& p = row[b >> 1];
    const int h = int(b & 1);
    return {p.qs + 32 * h, p.d[8 * h], p.corr[8 * h] * 8};
}

struct a8_lane {
    std::int8_t qs[32];
    float d;
    std::int32_t corr;  // −128·Σq
};
static_assert(sizeof(a8_lane) == 40);

// Tokens [0, C) of a8_pair rows `stride` bytes apart into out[b·C + c] for the nb blocks: a block's
// C tokens in 40·C consecutive bytes, so that k512::q8_0_lanes_tile reads them as one stream (its
// 8 tokens of a8_pair rows were 48 KB of the L1 for K = 2048, beside the weights it streams).
inline void pack_a8_lanes(const std::byte* a, std::size_t stride, int C, std::int64_t nb, a8_lane* out) {
    for (int c = 0; c < C; ++c) {
        const auto* row = reinterpret_cast<const a8_pair*>(a + std::size_t(c) * stride);
        for (std::int64_t b = 0; b < nb; ++b) {
            const a8_block_view v = a8_pair_block(row, b);
            a8_lane& o = out[b * C + c];
            std::memcpy(o.qs, v.qs, 32);
            o.d = v.d;
            o.corr = v.corr;
        }
    }
}

}  // namespace clover::backend::cpu_detail
