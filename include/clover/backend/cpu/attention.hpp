#pragma once
// The CPU backend's gated-attention primitives (architecture.md §2.2, clover-diffusion.md §3)
// over the paged KV cache of backend/cpu/state.hpp.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "clover/backend/concept.hpp"
#include "clover/backend/cpu/attend.hpp"
#include "clover/backend/cpu/rope.hpp"
#include "clover/backend/cpu/state.hpp"
#include "clover/backend/cpu/thread_pool.hpp"
#include "clover/backend/cpu/vec_ops.hpp"
#include "clover/core/batch.hpp"
#include "clover/core/math.hpp"
#include "clover/quant/half.hpp"

namespace clover::backend::cpu_detail {

// q/k RMSNorm per head, rope at each row's position, gate split off; K/V of commit and verify
// rows appended to the sequence's pages. qg [n, H*2*hd]; k, v [n, Hkv*hd] (normed and roped in
// place); q, gate [n, H*hd].
inline void attn_prepare(thread_pool& pool, const batch& bt, state_pool& st, std::int64_t layer, const attention_shape& a,
                         const float* q_norm, const float* k_norm, const float* qg, float* k, const float* v, float* q,
                         float* gate) {
    const std::int64_t H = a.n_head, Hkv = a.n_head_kv, hd = a.head_dim, kvw = Hkv * hd;
    const rope_params rp{a.n_rot, a.rope_theta, {a.rope_sections[0], a.rope_sections[1], a.rope_sections[2], a.rope_sections[3]}};
    const auto segs = bt.segments();
    pool.parallel_for(bt.rows(), 8, [&](std::int64_t r0, std::int64_t r1) {
        std::vector<float> cs(std::size_t(rp.n_rot));
        std::size_t si = 0;
        for (std::int64_t r = r0; r < r1; ++r) {
            while (r >= segs[si].row0 + segs[si].n) ++si;
            const segment& s = segs[si];
            const std::int64_t pos = s.pos0 + (r - s.row0);
            rope_cache(rp, pos, cs.data());
            for (std::int64_t h = 0; h < H; ++h) {
                const float* src = qg + (r * H + h) * 2 * hd;
                float* qh = q + (r * H + h) * hd;
                math::rms_norm(src, q_norm, qh, hd, a.rms_eps);
                rope_apply(qh, rp.n_rot, cs.data());
                std::memcpy(gate + (r * H + h) * hd, src + hd, std::size_t(hd) * 4);
            }
            for (std::int64_t h = 0; h < Hkv; ++h) {
                float* kh = k + (r * Hkv + h) * hd;
                math::rms_norm(kh, k_norm, kh, hd, a.rms_eps);
                rope_apply(kh, rp.n_rot, cs.data());
            }
            if (s.kind == pass_kind::preview) continue;
            void* kd = st.kv(layer, s.seq, pos, 0);
            void* vd = st.kv(layer, s.seq, pos, 1);
            if (st.kv_f16()) {
                auto* k16 = static_cast<quant::f16_bits*>(kd);
                auto* v16 = static_cast<quant::f16_bits*>(vd);
                for (std::int64_t i = 0; i < kvw; ++i) {
                    k16[i] = quant::f32_to_f16(k[r * kvw + i]);
                    v16[i] = quant::f32_to_f16(v[r * kvw + i]);
                }
            } else {
                std::memcpy(kd, k + r * kvw, std::size_t(kvw) * 4);
                std::memcpy(vd, v + r * kvw, std::size_t(kvw) * 4);
            }
        }
    });
}

// out[n, H*hd] = attention ⊙ sigmoid(gate). Commit/verify rows: causal over the cache [0, pos].
// Preview rows: the cache [0, pos0) and every row of the block (k, v fresh, F32). One task per
// (block of up to rows_per_task consecutive rows of one segment, KV head): the block's rows
// read each key block once (attend_rows; each row's result the same bits as alone), and the
// KV head's `group` query heads are contiguous in q, gate and out.
inline void attention(thread_pool& pool, const batch& bt, const state_pool& st, std::int64_t layer,
                      const attention_shape& a, const float* q, const float* gate, const float* k, const float* v,
                      float* out) {
    // 8 rows per task: the rows of a task share each key block's conversion and transpose
    // (attend_rows). bench_kernels --attention, 2-core EPYC (Zen 5), AVX-512, 2 heads of 64 at 2,048
    // keys: 4 rows together 1.36–1.53x one at a time with the lane-parallel scores, ~1.6–1.9x with
    // keys across lanes; 8 rows another ~1.06x per row over 4. Decode rows of different sequences
    // stay one task each.
    constexpr std::int64_t rows_per_task = 8;
    const std::int64_t H = a.n_head, Hkv = a.n_head_kv, hd = a.head_dim, kvw = Hkv * hd, group = H / Hkv;
    const auto segs = bt.segments();
    const bool f16 = st.kv_f16();
    const std::size_t eb = f16 ? 2 : 4;
    struct row_block {
        std::size_t seg;
        std::int64_t r0, n;
    };
    std::vector<row_block> blocks;
    for (std::size_t si = 0; si < segs.size(); ++si)
        for (std::int64_t r = segs[si].row0; r < segs[si].row0 + segs[si].n; r += rows_per_task)
            blocks.push_back({si, r, std::min(rows_per_task, segs[si].row0 + segs[si].n - r)});
    // Each segment's cached keys as runs of KV head 0 (one per page), looked up once here: the
    // pool's lookup takes its lock, and the tasks would repeat it per page and KV head.
    std::vector<std::vector<kv_run>> seg_runs(segs.size());
    for (std::size_t si = 0; si < segs.size(); ++si) {
        const segment& s = segs[si];
        const std::int64_t most = s.kind == pass_kind::preview ? s.pos0 : s.pos0 + s.n;  // keys of its last row
        for (std::int64_t p0 = 0; p0 < most;) {
            const std::int64_t len = std::min(st.run_from(p0), most - p0);
            seg_runs[si].push_back({st.kv(layer, s.seq, p0, 0), st.kv(layer, s.seq, p0, 1), kvw, len, f16});
            p0 += len;
        }
    }
    pool.parallel_for(std::int64_t(blocks.size()) * Hkv, 1, [&](std::int64_t b, std::int64_t e) {
        std::vector<float> p;
        std::vector<kv_run> runs, cut;
        const float* qs[rows_per_task];
        float* os[rows_per_task];
        std::int64_t nk[rows_per_task];
        for (std::int64_t t = b; t < e; ++t) {
            // KV head major: a thread's consecutive tasks read the same head's keys and values,
            // which can stay in its L2 (both heads of the bundled model at ~2,750 positions are
            // 1.4 MB of F16 K and V; one is 0.7 MB); a little faster than alternating the heads
            // (docs/performance.md).
            const row_block& blk = blocks[std::size_t(t % std::int64_t(blocks.size()))];
            const std::int64_t kvh = t / std::int64_t(blocks.size());
            const segment& s = segs[blk.seg];
            const bool preview = s.kind == pass_kind::preview;
            // Keys of the block's last row: the most any of its rows reads.
            const std::int64_t cached = preview ? s.pos0 : s.pos0 + (blk.r0 + blk.n - 1 - s.row0) + 1;
            runs.clear();
            const std::size_t off = std::size_t(kvh * hd) * eb;
            std::int64_t left = cached;
            for (const kv_run& r : seg_runs[blk.seg]) {
                if (left <= 0) break;
                runs.push_back({static_cast<const std::byte*>(r.k) + off, static_cast<const std::byte*>(r.v) + off, kvw,
                                std::min(r.n, left), f16});
                left -= r.n;
            }
            if (preview) runs.push_back({k + s.row0 * kvw + kvh * hd, v + s.row0 * kvw + kvh * hd, kvw, s.n, false});
            for (std::int64_t i = 0; i < blk.n; ++i) {
                const std::int64_t r = blk.r0 + i, h0 = r * H + kvh * group;  // the group's first head
                qs[i] = q + h0 * hd;
                os[i] = out + h0 * hd;
                nk[i] = preview ? s.pos0 + s.n : s.pos0 + (r - s.row0) + 1;
            }
            attend_rows(qs, nk, int(blk.n), group, runs, hd, a.scale, os, p, cut);
            for (std::int64_t i = 0; i < blk.n; ++i) {
                const std::int64_t h0 = (blk.r0 + i) * H + kvh * group;
                float* o = out + h0 * hd;
                const float* g = gate + h0 * hd;
                for (std::int64_t x = 0; x < group * hd; ++x) o[x] *= math::sigmoid(g[x]);
            }
        }
    });
}

}  // namespace clover::backend::cpu_detail
