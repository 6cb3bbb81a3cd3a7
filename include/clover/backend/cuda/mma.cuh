#pragma once
// Tensor-core (int8 mma.sync) products for multi-row passes — prefill chunks, the 32-row
// preview, verify — that stay row-exact: every row equals the same row computed alone by
// mm_kernel (matmul.cuh), the single-row decode step's kernel, bit for bit.
//
// mm_kernel's order of float additions is the canonical one: for one output o and activation row,
// lane p (0..31) of a warp adds items p, p+32, p+64, ... in that order into a partial acc_p
// (item_combine, quant_dot.cuh, one fma-based step per item), then warp_sum's xor butterfly
// (offsets 16, 8, 4, 2, 1) adds the 32 partials; lane 0's value is the result.
//
// Here one warp computes a tile of 16 outputs × 8 activation rows. Per item, the 16×8 integer
// dots of the item's codes come from ONE mma (m16n8k32 .s8.s8, or m16n8k16 for Q6_K's groups of
// 16): an integer sum is exact in any order, so they equal mm_kernel's dp4a sums. The float steps
// then replay mm_kernel's sequence: classes p are visited one after another, each accumulating its
// items p, p+32, ... exactly as lane p would, and the butterfly is rebuilt from the class partials
// (mma_tree_push). Float formats (F32/F16/BF16) have no such path: a tensor core's float
// accumulation order is the hardware's, not ours to fix, so it could not equal the canonical order.
//
// The warp's work is written once (mma_tile), over a Warp that supplies the per-lane loop, the
// barrier and the mma instruction: on the device each lane runs its own part (mma_device_warp);
// the host test (cuda/tests/host/test_mma_host.cu) runs the same functions for all 32 lanes in
// turn with an emulated mma built from the fragment layout functions below, so everything but
// the instruction itself and the barrier is checked without a GPU.
//
// Cost model (unmeasured: no GPU was lent while this was written): per item and tile, one mma
// instead of 16·8·(item/4) dp4a spread over the warp, each weight item decoded once for 8 rows
// (mm_kernel: 4); the staging through shared memory and the per-item scale reads are the price.
#include <cstddef>
#include <cstdint>

#include "clover/backend/cuda/quant_dot.cuh"
#include "clover/core/dtype.hpp"

// Loops the device must unroll (constant register indices, no local memory): CLOVER_DEVICE_UNROLL.
#define CLOVER_MMA_UNROLL CLOVER_DEVICE_UNROLL

namespace clover::backend::cuda_detail {

inline constexpr int mma_m = 16;     // outputs per warp tile (the mma's M)
inline constexpr int mma_n = 8;      // activation rows per warp tile (the mma's N)
inline constexpr int mma_warps = 4;  // warp tiles per block, side by side over the outputs

// The weight formats with a tensor-core path: those whose items are integer dots.
__host__ __device__ constexpr bool mma_format(dtype t) {
    return t == dtype::q8_0 || t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k;
}

// ---- fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 / mma.m16n8k32 with integer
// type", .s8): lane = 4·group + t. A is 16 × KK row-major, B is KK × 8 (".col": each column's k
// consecutive), C/D 16 × 8 int32. A register holds 4 int8 of consecutive k, element k in byte k%4
// ("elements low to high"). KK = 32: A regs {(g, 4t), (g+8, 4t), (g, 16+4t), (g+8, 16+4t)}, B regs
// {4t, 16+4t} of column g; KK = 16: the first two A regs and the first B reg. C reg r holds
// (g + 8·(r/2), 2t + r%2).
__host__ __device__ constexpr int frag_a_row(int lane, int reg) { return lane / 4 + 8 * (reg % 2); }
__host__ __device__ constexpr int frag_a_k(int lane, int reg, int byte) { return 16 * (reg / 2) + 4 * (lane % 4) + byte; }
__host__ __device__ constexpr int frag_b_k(int lane, int reg, int byte) { return 16 * reg + 4 * (lane % 4) + byte; }
__host__ __device__ constexpr int frag_b_col(int lane) { return lane / 4; }
__host__ __device__ constexpr int frag_c_row(int lane, int reg) { return lane / 4 + 8 * (reg / 2); }
__host__ __device__ constexpr int frag_c_col(int lane, int reg) { return 2 * (lane % 4) + reg % 2; }

// The mma's K for format T (an item's element count) and the registers of its A and B fragments.
template <dtype T>
__host__ __device__ constexpr int mma_k() { return item_elems<T>(); }
template <dtype T>
__host__ __device__ constexpr int mma_a_regs() { return mma_k<T>() / 8; }
template <dtype T>
__host__ __device__ constexpr int mma_b_regs() { return mma_k<T>() / 16; }

// One lane's registers.
struct mma_lane {
    std::uint32_t a[4] = {}, b[2] = {};  // fragments (the first mma_a_regs / mma_b_regs used)
    int c[4] = {};                       // C fragment: one item's integer dots
    float acc[4] = {};                   // the current class's partial of the lane's 4 (output, row) pairs
    float tree[5][4] = {};               // pending butterfly subtrees, one per level (mma_tree_push)
};

// A warp's staging buffer in shared memory: the item's codes as int8, [16 outputs][KK] and
// [8 rows][KK], four codes per word (row stride KK/4 words). Rows of 32 bytes make the A loads of
// lanes 4 groups apart hit the same bank (a 2-way conflict); left so: unmeasured, and the plain
// layout is the one the load functions state.
struct mma_stage_buf {
    std::uint32_t a[mma_m * 8];
    std::uint32_t b[mma_n * 8];
};

// One warp's tile: outputs [o0, o0+16) of a weight matrix (those ≥ N read row N-1 and are not
// stored) times activation rows p0..p0+nr-1 (nr ≤ 8; the others read row p0 and are not stored).
struct mma_job {
    const std::uint8_t* w;      // the matrix: output o's row at w + o·row_bytes
    std::size_t row_bytes;
    std::int64_t o0, N;
    const std::uint8_t* x;      // activation rows in the partner type; row p reads x row xmap[p] (null: p)
    std::size_t x_row_bytes;
    const int* xmap;
    int p0, nr;
    float* y;                   // y[p·ldy + o]
    std::int64_t ldy;
    std::int64_t n_items;       // items<T>(K)
};

__host__ __device__ inline const std::uint8_t* mma_w_row(const mma_job& j, int m) {
    const std::int64_t o = j.o0 + m < j.N ? j.o0 + m : j.N - 1;
    return j.w + std::size_t(o) * j.row_bytes;
}
__host__ __device__ inline const std::uint8_t* mma_x_row(const mma_job& j, int n) {
    const int p = j.p0 + (n < j.nr ? n : 0);
    return j.x + std::size_t(j.xmap ? j.xmap[p] : p) * j.x_row_bytes;
}

// Lane's share of staging item `it`: the codes of half an output row (lane/2; 2 lanes per row)
// and of a quarter of an activation row (lane/4; 4 lanes per row), as item_w_word / item_x_word
// give them to dp4a in mm_kernel.
template <dtype T, class Buf>
__host__ __device__ inline void mma_stage(const mma_job& j, std::int64_t it, int lane, Buf& s) {
    constexpr int wpr = mma_k<T>() / 4;  // words per staged row: 8, Q6_K 4
    const int m = lane / 2, wa = (lane % 2) * (wpr / 2);
    const std::uint8_t* w = mma_w_row(j, m);
    CLOVER_MMA_UNROLL
    for (int q = 0; q < wpr / 2; ++q) s.a[m * wpr + wa + q] = item_w_word<T>(w, it, wa + q);
    const int n = lane / 4, wb = (lane % 4) * (wpr / 4);
    const std::uint8_t* x = mma_x_row(j, n);
    CLOVER_MMA_UNROLL
    for (int q = 0; q < wpr / 4; ++q) s.b[n * wpr + wb + q] = item_x_word<T>(x, it, wb + q);
}

// Lane's A and B fragments from the staged item: a register's 4 bytes are consecutive k (the
// layout functions at byte 0..3), the same 4 codes a staged word holds.
template <dtype T, class Buf>
__host__ __device__ inline void mma_load(int lane, const Buf& s, mma_lane& L) {
    constexpr int wpr = mma_k<T>() / 4;
    CLOVER_MMA_UNROLL
    for (int r = 0; r < mma_a_regs<T>(); ++r) L.a[r] = s.a[frag_a_row(lane, r) * wpr + frag_a_k(lane, r, 0) / 4];
    CLOVER_MMA_UNROLL
    for (int r = 0; r < mma_b_regs<T>(); ++r) L.b[r] = s.b[frag_b_col(lane) * wpr + frag_b_k(lane, r, 0) / 4];
}

// The float step of item `it` for the lane's 4 (output, row) pairs of the C fragment.
template <dtype T>
__host__ __device__ inline void mma_combine(const mma_job& j, std::int64_t it, int lane, mma_lane& L) {
    CLOVER_MMA_UNROLL
    for (int r = 0; r < 4; ++r) {
        const item_wscale ws = item_wscale_of<T>(mma_w_row(j, frag_c_row(lane, r)), it);
        const item_xscale xs = item_xscale_of<T>(mma_x_row(j, frag_c_col(lane, r)), it);
        L.acc[r] = item_combine<T>(L.acc[r], L.c[r], ws, xs);
    }
}

// Class i of the visit order is lane brev5(i) of mm_kernel: 0, 16, 8, 24, 4, 20, ...
__host__ __device__ constexpr int brev5(int i) {
    return ((i & 1) << 4) | ((i & 2) << 2) | (i & 4) | ((i & 8) >> 2) | ((i & 16) >> 4);
}

// warp_sum's butterfly, as lane 0 sees it, is a binary tree: level 0 adds the partials of lanes
// p and p^16, level 1 those sums of p and p^8, ..., level 4 those of p and p^1. In bit-reversed
// class order the leaves of every subtree are consecutive, so the tree builds like a binary
// counter: after leaf i (in acc), each level l whose bit of i is set adds its pending subtree (the
// lower lanes: left operand, as v + shfl(v) on the lower lane) to acc and goes up; the first clear
// bit parks acc at that level. After leaf 31 acc holds lane 0's sum: the same additions of the
// same values as warp_sum, so the same bits, with 5 pending values per pair instead of 32.
// (Unrolled with a carry flag rather than an early return, so every tree index is a constant and
// the lane's registers stay registers.)
__host__ __device__ inline void mma_tree_push(mma_lane& L, int i) {
    bool carry = true;
    CLOVER_MMA_UNROLL
    for (int l = 0; l < 5; ++l) {
        if (!carry) continue;
        if ((i >> l) & 1) {
            CLOVER_MMA_UNROLL
            for (int q = 0; q < 4; ++q) L.acc[q] = L.tree[l][q] + L.acc[q];
        } else {
            CLOVER_MMA_UNROLL
            for (int q = 0; q < 4; ++q) L.tree[l][q] = L.acc[q];
            carry = false;
        }
    }
}

__host__ __device__ inline void mma_store(const mma_job& j, int lane, const mma_lane& L) {
    CLOVER_MMA_UNROLL
    for (int r = 0; r < 4; ++r) {
        const int m = frag_c_row(lane, r), n = frag_c_col(lane, r);
        if (j.o0 + m < j.N && n < j.nr) j.y[std::int64_t(j.p0 + n) * j.ldy + j.o0 + m] = L.acc[r];
    }
}

// The warp's whole tile. Warp: each(f) calls f(lane, lane registers) for the lanes it runs,
// sync() orders the lanes' shared-memory accesses, mma<T>() sets every lane's c from the lanes'
// fragments (c = A·B, starting from zero). Control flow is warp-uniform (mma.sync needs all 32).
// (nv_exec_check_disable: the host test's Warp is host-only, the device's device-only; each
// instantiation is only ever called from its own side.)
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <dtype T, class Warp>
__host__ __device__ inline void mma_tile(const mma_job& j, Warp& warp) {
    auto&& buf = warp.buf();
    for (int i = 0; i < 32; ++i) {
        warp.each([&](int, mma_lane& L) {
            for (float& v : L.acc) v = 0.f;
        });
        for (std::int64_t it = brev5(i); it < j.n_items; it += 32) {
            warp.each([&](int lane, mma_lane&) { mma_stage<T>(j, it, lane, buf); });
            warp.sync();
            warp.each([&](int lane, mma_lane& L) { mma_load<T>(lane, buf, L); });
            warp.template mma<T>();
            warp.sync();  // every lane has its fragments before the next item's staging overwrites them
            warp.each([&](int lane, mma_lane& L) { mma_combine<T>(j, it, lane, L); });
        }
        warp.each([&](int, mma_lane& L) { mma_tree_push(L, i); });
    }
    warp.each([&](int lane, mma_lane& L) { mma_store(j, lane, L); });
}

// The staging buffer as the device's Warp hands it out: smem_ptr views of its two arrays (plain
// pointers under nvcc; under the emulated device, accesses its race detector sees).
struct mma_stage_ref {
    smem_ptr<std::uint32_t> a, b;
};

// The device's Warp: this thread's lane only; the host pass never runs it.
struct mma_device_warp {
    int lane;
    mma_lane L;
    mma_stage_buf* s;
    template <class F>
    __host__ __device__ void each(F&& f) { f(lane, L); }
    __host__ __device__ mma_stage_ref buf() { return {smem_ptr<std::uint32_t>(s->a), smem_ptr<std::uint32_t>(s->b)}; }
    __host__ __device__ void sync() {
#if CLOVER_DEVICE_CODE
        __syncwarp();
#endif
    }
    template <dtype T>
    __host__ __device__ void mma() {
#if CLOVER_DEVICE_CODE && defined(CLOVER_CUDA_EMU)
        // The emulated device's warp-collective mma (cuda/emu/), from the PTX ISA's fragment tables.
        if constexpr (mma_k<T>() == 32) ::clover_emu::mma_m16n8k32_s8(L.c, L.a, L.b);
        else ::clover_emu::mma_m16n8k16_s8(L.c, L.a, L.b);
#elif CLOVER_DEVICE_CODE
        // sm_80+ (the build targets sm_90). C = 0: each item's dots stand alone (their float steps differ).
        if constexpr (mma_k<T>() == 32) {
            asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                : "=r"(L.c[0]), "=r"(L.c[1]), "=r"(L.c[2]), "=r"(L.c[3])
                : "r"(L.a[0]), "r"(L.a[1]), "r"(L.a[2]), "r"(L.a[3]), "r"(L.b[0]), "r"(L.b[1]), "r"(0));
        } else {
            static_assert(mma_k<T>() == 16, "mma: K of 16 or 32");
            asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                : "=r"(L.c[0]), "=r"(L.c[1]), "=r"(L.c[2]), "=r"(L.c[3])
                : "r"(L.a[0]), "r"(L.a[1]), "r"(L.b[0]), "r"(0));
        }
#endif
    }
};

}  // namespace clover::backend::cuda_detail

#undef CLOVER_MMA_UNROLL
