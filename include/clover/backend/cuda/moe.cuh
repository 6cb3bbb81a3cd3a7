#pragma once
// Sparse MoE on the device (layers/sparse_moe.hpp is the CPU twin):
//   route        one kernel per layer after the router product: softmax of every row (a
//                non-finite logit counts as -inf, a row without a finite one is uniform), the
//                preview block's expert coreset (score[e] = Σ_t P[t, e] in double, rows in
//                order as on the CPU, the C best -> a mask), then each row's top k among the
//                allowed experts (ties: lower index first, the CPU rule), renormalised
//   group        cub::DeviceRadixSort of the n·k (expert, slot) pairs, counts, cub::DeviceScan
//                for the expert offsets and for the tile list of the grouped products
//   experts      gate/up and down as expert-grouped products (matmul.cuh tiles: each tile of up
//                to mm_rows rows shares one expert matrix; experts of 8 rows or more in an
//                integer format: tiles of up to 8 rows on the tensor-core kernel, mma.cuh),
//                SwiGLU written straight as the down product's activation rows (ops.cuh swiglu_act), and a combine that adds the k
//                contributions of a row in increasing expert order, as the CPU loop does
// Everything is launched on one stream with no host synchronisation: grid sizes use the host-
// known bounds (n·k rows, n·k/R + X tiles) and surplus blocks exit on the device-side counts.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <vector>

#include "clover/backend/cuda/matmul.cuh"
#include "clover/backend/cuda/ops.cuh"
#include "clover/backend/cuda/runtime.cuh"
#include "clover/core/batch.hpp"

namespace clover::backend::cuda_detail {

// ---- routing (cpu_detail::moe_route) ----
// One block per routing group (route_group): a preview segment whose coreset restricts its
// experts (all its rows share the mask), or up to route_warps rows routed on their own. A warp
// routes one row at a time with the row's probabilities in registers (lane l holds experts l,
// l + 32, ...), so a row needs no block-wide synchronisation and its result does not depend on
// the other rows of the pass (row-exact); a coreset group synchronises three times (every row's
// softmax before the scores, the scores before the ranks, the mask before the top-k).
// The kernel is built for 8 experts per lane (X <= 256, the models' count) and for 16: registers
// and loop trips for the experts a row has, not for the largest count.
inline constexpr int route_warps = 8, route_threads = 32 * route_warps;
inline constexpr int max_experts = 32 * 16;
// Experts per row (k): the size of the kernel's shared top-k slots; checked on the host by every
// entry that takes k.
inline constexpr int max_experts_used = 64;

struct route_group {
    std::int32_t row0 = 0, n = 0;  // rows [row0, row0 + n) of the pass
    std::int32_t coreset = 0;      // C: 0 < C < X restricts the rows to the group's C best experts
};

// The CPU's order of candidates (route_row, select_coreset): the larger value first, the lower
// expert index on ties.
template <class T>
__host__ __device__ inline bool route_before(T a, int ea, T b, int eb) {
    return a != b ? a > b : ea < eb;
}

// How many experts come before e by score (route_before), counted up to `limit`: e is one of the
// C best (what select_coreset keeps) iff coreset_rank(score, X, e, C) < C. The count stops at the
// limit because only that matters, which keeps the O(X²) scan short for all but the best experts.
// Scores: const double* (the host twins), or route_kernel's shared array (checked accesses on the
// emulated device).
template <class Scores>
__host__ __device__ inline int coreset_rank(Scores score, int X, int e, int limit) {
    int r = 0;
    const double se = score[e];
    for (int f = 0; f < X && r < limit; ++f) {
        const double sf = score[f];
        r += route_before(sf, f, se, e) ? 1 : 0;
    }
    return r;
}

// A row's k slots from its kk best candidates (top_p descending), as route_row: the weights
// renormalised over the kk in double; slots past them (a coreset smaller than k) get weight 0 on
// the best candidate.
// (P, I: const float* / const int*, or warp_topk's smem_ptr slots.)
template <class P, class I>
__host__ __device__ inline void route_finish(P top_p, I top_id, int kk, int k, int* ids, float* w) {
    double sum = 0;
    for (int j = 0; j < kk; ++j) sum += top_p[j];
    for (int j = 0; j < k; ++j) {
        ids[j] = j < kk ? top_id[j] : top_id[0];
        w[j] = j < kk ? float(top_p[j] / sum) : 0.f;
    }
}

// Softmax of one row by one warp (math::softmax: float max, exp, sum in double, scale by the
// float inverse): p [X] logits in, probabilities out; v: the lane's probabilities (0 past X).
// Non-finite logits as cpu_detail::route_logits: a NaN or infinite logit counts as -inf; a row
// with no finite logit is uniform (its max is -inf in every lane: the row's logits become 0).
// Without it a NaN row's probabilities were NaN, warp_topk took no candidate and the row's ids
// came from uninitialised shared slots (count_kernel's atomicAdd offsets).
// The max is exact in any order. The sum is the lane's in i order, then a butterfly: each step
// adds the same two values in both partner lanes (a + b == b + a), so every lane ends with the
// same sum. Its order differs from the CPU's running sum (as softmax_rows' block reduction
// does), so the probabilities equal math::softmax's to rounding, not always to the bit (device
// expf is not the host's either); everything after them is bit-exact with the CPU.
template <int items>
static __device__ __forceinline__ void warp_softmax(float* p, int X, float (&v)[items]) {
    const int lane = int(threadIdx.x) % 32;
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < items; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < X ? p[e] : -INFINITY;
        if (!(fabsf(v[i]) <= FLT_MAX)) v[i] = -INFINITY;  // NaN, +-inf
        mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (mx == -INFINITY) {  // no finite logit: all equal
        mx = 0.f;
#pragma unroll
        for (int i = 0; i < items; ++i) v[i] = 0.f;
    }
    double s = 0;
#pragma unroll
    for (int i = 0; i < items; ++i) {
        v[i] = lane + 32 * i < X ? expf(v[i] - mx) : 0.f;
        s += v[i];
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float inv = float(1.0 / s);
#pragma unroll
    for (int i = 0; i < items; ++i) {
        const int e = lane + 32 * i;
        v[i] *= inv;
        if (e < X) p[e] = v[i];
    }
}

// The top k of one row by one warp among the allowed experts (mask null: all), in route_row's
// order, by k rounds of a warp argmax: each lane's best (its experts rise with i, so taking only
// a strictly larger value keeps the lower index on ties), then a butterfly under route_before, a
// total order on (value, expert) pairs, so every lane ends with the same winner; the winner's
// lane then drops it. Non-candidates (masked, taken, past X) are -1, below every probability
// (>= +0). Every lane runs every round (the shuffles need all 32). top_p/top_id: the warp's
// shared slots, written and read by lane 0 only; lane 0 writes the row's ids/w [k].
template <int items>
static __device__ __forceinline__ void warp_topk(float (&v)[items], int X, int k, smem_ptr<const std::uint8_t> mask,
                                                 smem_ptr<float> top_p, smem_ptr<int> top_id, int* ids, float* w) {
    const int lane = int(threadIdx.x) % 32;
#pragma unroll
    for (int i = 0; i < items; ++i) {
        const int e = lane + 32 * i;
        if (e >= X || (mask && !mask[e])) v[i] = -1.f;
    }
    int kk = 0;  // candidates taken: fewer than k only when the coreset is smaller than k
    for (int j = 0; j < k; ++j) {
        float bp = v[0];
        int be = lane;
#pragma unroll
        for (int i = 1; i < items; ++i)
            if (v[i] > bp) {
                bp = v[i];
                be = lane + 32 * i;
            }
        for (int o = 16; o > 0; o /= 2) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (route_before(op, oe, bp, be)) {
                bp = op;
                be = oe;
            }
        }
        if (bp >= 0.f) {  // the same in every lane
#pragma unroll
            for (int i = 0; i < items; ++i)
                if (lane + 32 * i == be) v[i] = -1.f;
            if (lane == 0) {
                top_p[kk] = bp;
                top_id[kk] = be;
            }
            ++kk;
        }
    }
    if (lane == 0) route_finish(top_p, top_id, kk, k, ids, w);
}

// probs [n_rows, X]: router logits in, probabilities out (as the CPU's moe_route) -> ids/w
// [n_rows, k]. groups: one per block; null when no row has a coreset: block b then routes rows
// [b·route_warps, (b+1)·route_warps) on their own. items: experts per lane (X <= 32·items).
template <int items>
static __global__ void __launch_bounds__(route_threads) route_kernel(float* probs, int X, int k, const route_group* groups,
                                                                     int n_rows, int* ids, float* w) {
    CLOVER_LAUNCH_BOUND(route_threads);
    CLOVER_SHARED(double, score, [max_experts]);
    CLOVER_SHARED(std::uint8_t, mask, [max_experts]);
    CLOVER_SHARED(float, top_p, [route_warps][max_experts_used]);
    CLOVER_SHARED(int, top_id, [route_warps][max_experts_used]);
    static_assert((sizeof(double) + 1) * max_experts + (sizeof(float) + sizeof(int)) * route_warps * max_experts_used <= 48 * 1024,
                  "static shared memory limit");
    route_group g;
    if (groups) {
        g = groups[blockIdx.x];
    } else {
        g.row0 = int(blockIdx.x) * route_warps;
        g.n = min(route_warps, n_rows - g.row0);
        g.coreset = 0;
    }
    const int warp = int(threadIdx.x) / 32;
    float v[items];
    if (!(g.coreset > 0 && g.coreset < X)) {  // the same for the whole block: no coreset
        for (int t = warp; t < g.n; t += route_warps) {
            const std::int64_t row = g.row0 + t;
            warp_softmax(probs + row * X, X, v);
            warp_topk(v, X, k, nullptr, top_p[warp], top_id[warp], ids + row * k, w + row * k);
        }
        return;
    }
    for (int t = warp; t < g.n; t += route_warps) warp_softmax(probs + std::int64_t(g.row0 + t) * X, X, v);
    __syncthreads();  // makes every row's probabilities, written by the other warps, visible
    for (int e = int(threadIdx.x); e < X; e += route_threads) {
        double s = 0;  // select_coreset's score: Σ_t P[t, e] in double, rows in order
        for (int t = 0; t < g.n; ++t) s += probs[std::int64_t(g.row0 + t) * X + e];
        score[e] = s;
    }
    __syncthreads();
    for (int e = int(threadIdx.x); e < X; e += route_threads) mask[e] = coreset_rank(score, X, e, g.coreset) < g.coreset;
    __syncthreads();
    for (int t = warp; t < g.n; t += route_warps) {
        const std::int64_t row = g.row0 + t;
        const int lane = int(threadIdx.x) % 32;
#pragma unroll
        for (int i = 0; i < items; ++i) v[i] = lane + 32 * i < X ? probs[row * X + lane + 32 * i] : 0.f;
        warp_topk(v, X, k, mask, top_p[warp], top_id[warp], ids + row * k, w + row * k);
    }
}

// The routing groups of a pass (route_kernel's table), as the CPU's moe_route restricts rows:
// each preview segment whose coreset restricts it (0 < C < X) is one group; every other
// segment's rows go in groups of up to route_warps. Empty when no segment is restricted: the
// kernel then forms its groups from the block index and the pass uploads no table.
inline void route_groups(const batch& bt, std::int64_t X, std::vector<route_group>& out) {
    out.clear();
    auto restricted = [&](const segment& sg) { return sg.kind == pass_kind::preview && sg.coreset > 0 && sg.coreset < X; };
    bool any = false;
    for (const segment& sg : bt.segments()) any = any || restricted(sg);
    if (!any) return;
    if (bt.rows() > INT_MAX) fail("cuda routing: ", bt.rows(), " rows exceed the int row index");
    for (const segment& sg : bt.segments()) {
        if (restricted(sg)) {
            out.push_back({std::int32_t(sg.row0), std::int32_t(sg.n), std::int32_t(sg.coreset)});
            continue;
        }
        for (std::int64_t r = 0; r < sg.n; r += route_warps)
            out.push_back({std::int32_t(sg.row0 + r), std::int32_t(std::min<std::int64_t>(route_warps, sg.n - r)), 0});
    }
}

// Routes n rows in one launch: probs [n, X] (router logits in, probabilities out) -> ids/w [n, k].
// groups: route_groups' table on the device (n_groups entries), or null when it is empty.
// Shared memory is fixed (no part of it grows with a group's rows: they stay in probs).
inline void route(float* probs, std::int64_t n, std::int64_t X, int k, const route_group* groups, std::int64_t n_groups,
                  int* ids, float* w, cudaStream_t s) {
    if (X < 1 || X > max_experts) fail("cuda routing: ", X, " experts are outside the kernel's 1..", max_experts);
    if (k < 1 || k > max_experts_used || k > X)
        fail("cuda routing: k = ", k, " experts per row is out of range (1..", max_experts_used, ", and at most ", X, ")");
    if (n > INT_MAX) fail("cuda routing: ", n, " rows exceed the int row index");
    if (n <= 0) return;
    if (groups && n_groups < 1) fail("cuda routing: a group table without groups for ", n, " rows");
    const std::int64_t blocks = groups ? n_groups : (n + route_warps - 1) / route_warps;
    if (X <= 32 * 8)
        launch(route_kernel<8>, "route_kernel<8>", grid_x("route_kernel", blocks), route_threads, 0, s, probs, int(X), k, groups, int(n), ids, w);
    else
        launch(route_kernel<16>, "route_kernel<16>", grid_x("route_kernel", blocks), route_threads, 0, s, probs, int(X), k, groups, int(n), ids, w);
    check_launch("route");
}

// Device scratch of the grouping step and the expert products, sized for n rows.
struct moe_scratch {
    device_buffer keys, keys_sorted, slots, slots_sorted, counts, offsets, tile_counts, tile_offsets, tiles, xmap, inv,
        cub_tmp, act, act_up, gu, hbuf, ys, sh_act, sh_gu, sh_h, sh_y, sh_gate;
};

static __global__ void __launch_bounds__(256) iota_kernel(int* v, std::int64_t n) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) v[i] = int(i);
}
static __global__ void __launch_bounds__(256) count_kernel(const int* ids, std::int64_t n, int* counts) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(counts + ids[i], 1);  // integer counts: the order of the adds does not matter
}
// Tiles of one expert with `rows` rows: tiles of mm_rows (mm_kernel, the first list) or, when
// big > 0 and rows >= big, tiles of mma_n (mma_kernel, the second list). __host__ __device__: the
// host test (test_mma_host.cu) builds both lists with these and checks cover and bounds.
__host__ __device__ inline bool expert_to_mma(int rows, int big) { return big > 0 && rows >= big; }
__host__ __device__ inline int expert_tile_count(int rows, int big, bool second_list) {
    if (expert_to_mma(rows, big) != second_list) return 0;
    const int R = second_list ? mma_n : mm_rows;
    return (rows + R - 1) / R;
}
// Expert e's tiles, rows [p0 + r·R, min(p1, ...)), at its offset in its list: tile_offsets holds
// the exclusive scans of both lists' counts (X + 1 entries each).
__host__ __device__ inline void expert_tiles(int e, int p0, int p1, int big, const int* tile_offsets, std::int64_t X,
                                             mm_tile* tiles, mm_tile* tiles8) {
    const bool to_mma = expert_to_mma(p1 - p0, big);
    const int R = to_mma ? mma_n : mm_rows;
    mm_tile* out = to_mma ? tiles8 : tiles;
    int ti = tile_offsets[to_mma ? X + 1 + e : e];
    for (int p = p0; p < p1; p += R) out[ti++] = mm_tile{e, p, p + R < p1 ? p + R : p1};
}
static __global__ void __launch_bounds__(256) tile_count_kernel(const int* counts, std::int64_t X, int big, int* tc) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e < X) {
        tc[e] = expert_tile_count(counts[e], big, false);
        tc[X + 1 + e] = expert_tile_count(counts[e], big, true);
    }
    if (e == X) tc[X] = tc[2 * X + 1] = 0;  // so each exclusive scan's last entry is its total
}
static __global__ void __launch_bounds__(128) tiles_kernel(const int* offsets, const int* tile_offsets, std::int64_t X, int big, mm_tile* tiles,
                                                           mm_tile* tiles8) {
    CLOVER_LAUNCH_BOUND(128);
    const std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e < X) expert_tiles(int(e), offsets[e], offsets[e + 1], big, tile_offsets, X, tiles, tiles8);
}
static __global__ void __launch_bounds__(256) maps_kernel(const int* slots_sorted, std::int64_t nk, int k, int* xmap, int* inv) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= nk) return;
    xmap[p] = slots_sorted[p] / k;  // the token row of sorted position p
    inv[slots_sorted[p]] = int(p);
}
// out[t] = Σ_j w[t,j] · ys[pos(t,j)] over the row's k slots in increasing expert id (slots of
// equal id in slot order; weight-0 coreset padding skipped), as the CPU loop adds them; then,
// with a shared expert, + sigmoid(sgate[t]) · ysh[t] (sgate: the row's x·g, ysh: [n, E]).
// The slots are visited by repeated selection of the next (id, slot) pair, k² reads of k ids
// (k <= max_experts_used), instead of sorting into a local array that would live in local memory.
static __global__ void __launch_bounds__(256) combine_kernel(const int* ids, const float* w, const int* inv, const float* ys, float* out,
                                                             std::int64_t n, int k, std::int64_t E, const float* sgate, const float* ysh) {
    CLOVER_LAUNCH_BOUND(256);
    const std::int64_t id = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= n * E) return;
    const std::int64_t t = id / E, i = id % E;
    const int* rid = ids + t * k;
    float acc = 0.f;
    int prev_id = -1, prev_j = -1;
    for (int step = 0; step < k; ++step) {
        int best_id = INT_MAX, best_j = -1;
        for (int j = 0; j < k; ++j) {
            const int e = rid[j];
            const bool after_prev = e > prev_id || (e == prev_id && j > prev_j);
            if (after_prev && (e < best_id || (e == best_id && j < best_j))) {
                best_id = e;
                best_j = j;
            }
        }
        prev_id = best_id;
        prev_j = best_j;
        const std::int64_t slot = t * k + best_j;
        const float wt = w[slot];
        if (wt == 0.f) continue;
        acc += wt * ys[std::int64_t(inv[slot]) * E + i];
    }
    if (sgate) acc += sigmoid(sgate[t]) * ysh[id];
    out[id] = acc;
}

// The shared expert of a MoE layer on the device: gate [Fs, E] and up [Fs, E], down [E, Fs], and
// its input gate g [E] (F32, one row), all device copies (backend::cuda::upload).
struct moe_shared {
    const device_matrix* gate = nullptr;
    const device_matrix* up = nullptr;
    const device_matrix* down = nullptr;
    const device_matrix* input_gate = nullptr;
};

// The experts of one layer on the device. gate_up: [2F, E] per expert (merged), or gate and up
// separately (up non-null); down: [E, F] per expert; shared: the shared expert, or null (or
// empty) for none. x [n, E], ids/w [n, k] -> out [n, E].
inline void moe_experts(const device_matrix& gate, const device_matrix* up, const device_matrix& down, const float* x,
                        const int* ids, const float* w, float* out, std::int64_t n, int k, moe_scratch& sc,
                        cudaStream_t s, const moe_shared* shared = nullptr) {
    const std::int64_t X = gate.n_mat, E = gate.cols, F = up ? gate.rows : gate.rows / 2, nk = n * k;
    if (n <= 0) return;
    if (k < 1 || k > max_experts_used)
        fail("cuda moe_experts: k = ", k, " experts per row is out of range (1..", max_experts_used, ")");
    if (nk > std::int64_t(INT_MAX)) fail("cuda moe_experts: ", n, " rows x ", k, " experts exceed the int slot index");
    const bool has_shared = shared && shared->gate && shared->up && shared->down && shared->input_gate;
    int* keys = sc.keys.get<int>(std::size_t(nk));
    int* keys_sorted = sc.keys_sorted.get<int>(std::size_t(nk));
    int* slots = sc.slots.get<int>(std::size_t(nk));
    int* slots_sorted = sc.slots_sorted.get<int>(std::size_t(nk));
    int* counts = sc.counts.get<int>(std::size_t(X + 1));
    int* offsets = sc.offsets.get<int>(std::size_t(X + 1));
    // Experts with at least mma_min_rows rows run on the tensor-core kernel (mma.cuh) in tiles of
    // mma_n rows when every expert product is in an integer format; the others, and all of them
    // otherwise, on mm_kernel in tiles of mm_rows. Either kernel gives a row the same bits. Only
    // when n >= mma_min_rows can an expert have that many rows (a row picks an expert once), so
    // decode steps keep the single list and its launches.
    const bool split = n >= mma_min_rows && mma_format(gate.type) && (!up || mma_format(up->type)) && mma_format(down.type);
    const int big = split ? int(mma_min_rows) : 0;
    int* tcount = sc.tile_counts.get<int>(std::size_t(2 * (X + 1)));
    int* toff = sc.tile_offsets.get<int>(std::size_t(2 * (X + 1)));
    const std::int64_t max_tiles = nk / mm_rows + X, max_tiles8 = split ? nk / mma_n + X : 0;
    auto* tiles = sc.tiles.get<mm_tile>(std::size_t(max_tiles + max_tiles8));
    mm_tile* tiles8 = tiles + max_tiles;
    int* xmap = sc.xmap.get<int>(std::size_t(nk));
    int* inv = sc.inv.get<int>(std::size_t(nk));

    CLOVER_CUDA_CHECK(cudaMemcpyAsync(keys, ids, std::size_t(nk) * 4, cudaMemcpyDeviceToDevice, s));
    launch(iota_kernel, "iota_kernel", blocks_for("iota_kernel", nk, 256), 256, 0, s, slots, nk);
    int end_bit = 1;
    while ((std::int64_t(1) << end_bit) < X) ++end_bit;
    std::size_t sort_bytes = 0, scan_bytes = 0;
    CLOVER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, keys_sorted, slots, slots_sorted, int(nk), 0, end_bit, s));
    CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, offsets, int(X + 1), s));
    void* tmp = sc.cub_tmp.get<std::uint8_t>(std::max(sort_bytes, scan_bytes));
    // Stable radix sort: within an expert, slots stay in row order (the CPU's rows_of[e] order).
    CLOVER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, sort_bytes, keys, keys_sorted, slots, slots_sorted, int(nk), 0, end_bit, s));
    CLOVER_CUDA_CHECK(cudaMemsetAsync(counts, 0, std::size_t(X + 1) * 4, s));
    launch(count_kernel, "count_kernel", blocks_for("count_kernel", nk, 256), 256, 0, s, ids, nk, counts);
    CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, scan_bytes, counts, offsets, int(X + 1), s));
    launch(tile_count_kernel, "tile_count_kernel", blocks_for("tile_count_kernel", X + 1, 256), 256, 0, s, counts, X, big, tcount);
    CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, scan_bytes, tcount, toff, int(X + 1), s));
    if (split) CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, scan_bytes, tcount + X + 1, toff + X + 1, int(X + 1), s));
    launch(tiles_kernel, "tiles_kernel", blocks_for("tiles_kernel", X, 128), 128, 0, s, offsets, toff, X, big, tiles, tiles8);
    launch(maps_kernel, "maps_kernel", blocks_for("maps_kernel", nk, 256), 256, 0, s, slots_sorted, nk, k, xmap, inv);
    check_launch("moe grouping");

    // gate/up: activations are the n token rows, converted once; rows come through xmap.
    const dtype at = quant::activation_type(gate.type);
    void* act = sc.act.get<std::uint8_t>(std::max(act_bytes(gate.type, n, E), act_bytes(down.type, nk, F)));
    quantize_activations(at, x, act, n, E, s);
    float* gu = sc.gu.get<float>(std::size_t(nk * 2 * F));
    mm_args a{};
    a.x = at == dtype::f32 ? reinterpret_cast<const std::uint8_t*>(x) : static_cast<const std::uint8_t*>(act);
    a.x_row_bytes = quant::row_bytes(at, E);
    a.xmap = xmap;
    a.ldy = 2 * F;
    a.K = E;
    a.n = nk;
    a.tiles = tiles;
    a.n_tiles = toff + X;
    // A grouped product: the mm_rows tiles, then (split) the mma_n tiles of the big experts.
    const auto grouped = [&](dtype t, mm_args g) {
        launch_mm(t, g, max_tiles, s);
        if (!split) return;
        g.tiles = tiles8;
        g.n_tiles = toff + 2 * X + 1;
        launch_mm(t, g, max_tiles8, s, true);
    };
    a.w = gate.data;
    a.row_bytes = gate.row_bytes;
    a.mat_bytes = gate.mat_bytes();
    a.y = gu;
    a.N = up ? F : 2 * F;
    grouped(gate.type, a);
    if (up) {
        // A separate up tensor may be stored in another format than gate (a mixed quantization):
        // its product reads activations in its own partner type.
        const dtype ut = quant::activation_type(up->type);
        if (ut != at) {
            void* act_up = sc.act_up.get<std::uint8_t>(act_bytes(up->type, n, E));
            quantize_activations(ut, x, act_up, n, E, s);
            a.x = ut == dtype::f32 ? reinterpret_cast<const std::uint8_t*>(x) : static_cast<const std::uint8_t*>(act_up);
            a.x_row_bytes = quant::row_bytes(ut, E);
        }
        a.w = up->data;
        a.row_bytes = up->row_bytes;
        a.mat_bytes = up->mat_bytes();
        a.y = gu + F;
        a.N = F;
        grouped(up->type, a);
    }
    // down: activations are the sorted rows themselves, SwiGLU written straight in the down
    // product's partner type (F32: the floats, in hbuf), one launch instead of two.
    const dtype dt = quant::activation_type(down.type);
    void* hact = dt == dtype::f32 ? static_cast<void*>(sc.hbuf.get<float>(std::size_t(nk * F))) : act;
    swiglu_act(dt, gu, hact, nk, F, s);
    float* ys = sc.ys.get<float>(std::size_t(nk * E));
    mm_args d{};
    d.w = down.data;
    d.row_bytes = down.row_bytes;
    d.mat_bytes = down.mat_bytes();
    d.x = static_cast<const std::uint8_t*>(hact);
    d.x_row_bytes = quant::row_bytes(dt, F);
    d.y = ys;
    d.ldy = E;
    d.N = E;
    d.K = F;
    d.n = nk;
    d.tiles = tiles;
    d.n_tiles = toff + X;
    grouped(down.type, d);

    // The shared expert over all n rows, as dense products: [gate | up] rows of width 2·Fs, SwiGLU,
    // down; and the per-row input gate x·g as a one-row F32 product (sigmoid in the combine).
    float* ysh = nullptr;
    float* sgate = nullptr;
    if (has_shared) {
        const device_matrix &sg = *shared->gate, &su = *shared->up, &sd = *shared->down, &gi = *shared->input_gate;
        const std::int64_t Fs = sg.rows;
        if (sg.cols != E || su.cols != E || su.rows != Fs || sd.rows != E || sd.cols != Fs || gi.cols != E || gi.rows != 1)
            fail("cuda moe_experts: the shared expert's shapes do not match the layer (E = ", E, ", Fs = ", Fs, ")");
        float* sgu = sc.sh_gu.get<float>(std::size_t(n * 2 * Fs));
        void* sact = sc.sh_act.get<std::uint8_t>(std::max({act_bytes(sg.type, n, E), act_bytes(su.type, n, E),
                                                       act_bytes(sd.type, n, Fs), act_bytes(gi.type, n, E)}));
        matmul(sg, x, sgu, n, sact, s, 2 * Fs);
        matmul(su, x, sgu + Fs, n, sact, s, 2 * Fs);
        // SwiGLU straight into sd's activation rows (sact, or the floats in sh for F32), as above.
        float* sh = sc.sh_h.get<float>(std::size_t(n * Fs));
        const dtype sdt = quant::activation_type(sd.type);
        swiglu_act(sdt, sgu, sdt == dtype::f32 ? static_cast<void*>(sh) : sact, n, Fs, s);
        ysh = sc.sh_y.get<float>(std::size_t(n * E));
        matmul(sd, sh, ysh, n, sact, s, 0, nullptr, -1, /*converted=*/true);
        sgate = sc.sh_gate.get<float>(std::size_t(n));
        matmul(gi, x, sgate, n, sact, s);
    }
    launch(combine_kernel, "combine_kernel", blocks_for("combine_kernel", n * E, 256), 256, 0, s, ids, w, inv, ys, out, n, k, E, sgate, ysh);
    check_launch("moe combine");
}

}  // namespace clover::backend::cuda_detail
