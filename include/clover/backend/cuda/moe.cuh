#pragma once
// Sparse MoE on the device (layers/sparse_moe.hpp is the CPU twin), with CCCL doing the sorting:
//   route_topk   per row: cub::BlockRadixSort of the router probabilities (descending, stable:
//                ties keep the lower expert index first, the CPU rule), top k renormalised;
//                experts outside the coreset mask are never chosen
//   coreset      score[e] = Σ_t P[t, e] (double, rows in order as on the CPU), then the C best by
//                one cub::BlockRadixSort over the scores -> a 0/1 mask
//   group        cub::DeviceRadixSort of the n·k (expert, slot) pairs, counts, cub::DeviceScan
//                for the expert offsets and for the tile list of the grouped products
//   experts      gate/up and down as expert-grouped products (matmul.cuh tiles: each tile of up
//                to mm_rows rows shares one expert matrix), SwiGLU, and a combine that adds the k
//                contributions of a row in increasing expert order, as the CPU loop does
// Everything is launched on one stream with no host synchronisation: grid sizes use the host-
// known bounds (n·k rows, n·k/R + X tiles) and surplus blocks exit on the device-side counts.
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "clover/backend/cuda/matmul.cuh"
#include "clover/backend/cuda/ops.cuh"
#include "clover/backend/cuda/runtime.cuh"

namespace clover::backend::cuda_detail {

inline constexpr int route_threads = 128, route_items = 4;  // up to 512 experts per row
inline constexpr int max_experts = route_threads * route_items;
// Experts per row (k): the size of route_topk's shared top-k arrays; checked on the host by
// every entry that takes k.
inline constexpr int max_experts_used = 64;

// probs [n, X] -> ids/w [n, k]. allowed: X bytes (1 = may be chosen) or null for all.
static __global__ void __launch_bounds__(route_threads) route_topk_kernel(const float* probs, std::int64_t X, int k,
                                                                   const std::uint8_t* allowed, int* ids, float* w) {
    using sorter = cub::BlockRadixSort<float, route_threads, route_items, int>;
    __shared__ typename sorter::TempStorage tmp;
    __shared__ int top_id[max_experts_used];
    __shared__ float top_p[max_experts_used];
    const float* p = probs + std::int64_t(blockIdx.x) * X;
    float key[route_items];
    int val[route_items];
    for (int i = 0; i < route_items; ++i) {  // blocked arrangement: thread t holds t*items + i
        const int e = threadIdx.x * route_items + i;
        val[i] = e;
        // Probabilities are >= +0: masked experts (-1) and padding (-2) sort after every real one.
        key[i] = e < X ? (allowed && !allowed[e] ? -1.f : p[e]) : -2.f;
    }
    sorter(tmp).SortDescending(key, val);
    for (int i = 0; i < route_items; ++i) {
        const int r = threadIdx.x * route_items + i;
        if (r < k) {
            top_id[r] = val[i];
            top_p[r] = key[i];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // A coreset smaller than k leaves fewer candidates than slots: as route_row, the slots
        // past them get weight 0 on the first candidate.
        int kk = 0;
        while (kk < k && top_p[kk] >= 0.f) ++kk;
        double sum = 0;  // as route_row: the renormalisation sum in double
        for (int j = 0; j < kk; ++j) sum += top_p[j];
        for (int j = 0; j < k; ++j) {
            ids[blockIdx.x * k + j] = j < kk ? top_id[j] : top_id[0];
            w[blockIdx.x * k + j] = j < kk ? float(top_p[j] / sum) : 0.f;
        }
    }
}

inline void route_topk(const float* probs, std::int64_t n, std::int64_t X, int k, const std::uint8_t* allowed, int* ids,
                       float* w, cudaStream_t s) {
    if (X > max_experts) fail("cuda routing: ", X, " experts exceed ", max_experts);
    if (k < 1 || k > max_experts_used || k > X)
        fail("cuda routing: k = ", k, " experts per row is out of range (1..", max_experts_used, ", and at most ", X, ")");
    if (n <= 0) return;
    route_topk_kernel<<<grid_x("route_topk_kernel", n), route_threads, 0, s>>>(probs, X, k, allowed, ids, w);
    check_launch("route_topk");
}

// The expert coreset as a mask (select_coreset): C <= 0 or C >= X -> all experts allowed.
static __global__ void __launch_bounds__(route_threads) coreset_kernel(const float* probs, std::int64_t n, std::int64_t X,
                                                                std::int64_t C, std::uint8_t* allowed) {
    using sorter = cub::BlockRadixSort<double, route_threads, route_items, int>;
    __shared__ typename sorter::TempStorage tmp;
    double key[route_items];
    int val[route_items];
    for (int i = 0; i < route_items; ++i) {
        const int e = threadIdx.x * route_items + i;
        val[i] = e;
        double s = -1.0;  // padding sorts last
        if (e < X) {
            s = 0.0;
            for (std::int64_t t = 0; t < n; ++t) s += probs[t * X + e];
            allowed[e] = C <= 0 || C >= X;
        }
        key[i] = s;
    }
    __syncthreads();
    sorter(tmp).SortDescending(key, val);
    if (C > 0 && C < X)
        for (int i = 0; i < route_items; ++i)
            if (threadIdx.x * route_items + i < C) allowed[val[i]] = 1;
}

inline void coreset(const float* probs, std::int64_t n, std::int64_t X, std::int64_t C, std::uint8_t* allowed,
                    cudaStream_t s) {
    if (X > max_experts) fail("cuda coreset: ", X, " experts exceed ", max_experts);
    coreset_kernel<<<1, route_threads, 0, s>>>(probs, n, X, C, allowed);
    check_launch("coreset");
}

// Device scratch of the grouping step and the expert products, sized for n rows.
struct moe_scratch {
    device_buffer keys, keys_sorted, slots, slots_sorted, counts, offsets, tile_counts, tile_offsets, tiles, xmap, inv,
        cub_tmp, act, act_up, gu, hbuf, ys, sh_act, sh_gu, sh_h, sh_y, sh_gate;
};

static __global__ void iota_kernel(int* v, std::int64_t n) {
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) v[i] = int(i);
}
static __global__ void count_kernel(const int* ids, std::int64_t n, int* counts) {
    const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(counts + ids[i], 1);  // integer counts: the order of the adds does not matter
}
static __global__ void tile_count_kernel(const int* counts, std::int64_t X, int* tc) {
    const std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e < X) tc[e] = (counts[e] + mm_rows - 1) / mm_rows;
    if (e == X) tc[e] = 0;  // so the exclusive scan's last entry is the total
}
// Tiles of expert e: rows [off[e] + r·R, min(off[e+1], ...)). Also xmap and the slot inverse.
static __global__ void tiles_kernel(const int* offsets, const int* tile_offsets, std::int64_t X, mm_tile* tiles) {
    const std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= X) return;
    const int p0 = offsets[e], p1 = offsets[e + 1];
    int ti = tile_offsets[e];
    for (int p = p0; p < p1; p += mm_rows) tiles[ti++] = mm_tile{int(e), p, min(p1, p + mm_rows)};
}
static __global__ void maps_kernel(const int* slots_sorted, std::int64_t nk, int k, int* xmap, int* inv) {
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
static __global__ void combine_kernel(const int* ids, const float* w, const int* inv, const float* ys, float* out,
                                      std::int64_t n, int k, std::int64_t E, const float* sgate, const float* ysh) {
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
    int* tcount = sc.tile_counts.get<int>(std::size_t(X + 1));
    int* toff = sc.tile_offsets.get<int>(std::size_t(X + 1));
    const std::int64_t max_tiles = nk / mm_rows + X;
    auto* tiles = sc.tiles.get<mm_tile>(std::size_t(max_tiles));
    int* xmap = sc.xmap.get<int>(std::size_t(nk));
    int* inv = sc.inv.get<int>(std::size_t(nk));

    CLOVER_CUDA_CHECK(cudaMemcpyAsync(keys, ids, std::size_t(nk) * 4, cudaMemcpyDeviceToDevice, s));
    iota_kernel<<<blocks_for("iota_kernel", nk, 256), 256, 0, s>>>(slots, nk);
    int end_bit = 1;
    while ((std::int64_t(1) << end_bit) < X) ++end_bit;
    std::size_t sort_bytes = 0, scan_bytes = 0;
    CLOVER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, keys_sorted, slots, slots_sorted, int(nk), 0, end_bit, s));
    CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, offsets, int(X + 1), s));
    void* tmp = sc.cub_tmp.get<std::uint8_t>(std::max(sort_bytes, scan_bytes));
    // Stable radix sort: within an expert, slots stay in row order (the CPU's rows_of[e] order).
    CLOVER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, sort_bytes, keys, keys_sorted, slots, slots_sorted, int(nk), 0, end_bit, s));
    CLOVER_CUDA_CHECK(cudaMemsetAsync(counts, 0, std::size_t(X + 1) * 4, s));
    count_kernel<<<blocks_for("count_kernel", nk, 256), 256, 0, s>>>(ids, nk, counts);
    CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, scan_bytes, counts, offsets, int(X + 1), s));
    tile_count_kernel<<<blocks_for("tile_count_kernel", X + 1, 256), 256, 0, s>>>(counts, X, tcount);
    CLOVER_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp, scan_bytes, tcount, toff, int(X + 1), s));
    tiles_kernel<<<blocks_for("tiles_kernel", X, 128), 128, 0, s>>>(offsets, toff, X, tiles);
    maps_kernel<<<blocks_for("maps_kernel", nk, 256), 256, 0, s>>>(slots_sorted, nk, k, xmap, inv);
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
    a.w = gate.data;
    a.row_bytes = gate.row_bytes;
    a.mat_bytes = gate.mat_bytes();
    a.y = gu;
    a.N = up ? F : 2 * F;
    launch_mm(gate.type, a, max_tiles, s);
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
        launch_mm(up->type, a, max_tiles, s);
    }
    float* hb = sc.hbuf.get<float>(std::size_t(nk * F));
    swiglu(gu, hb, nk, F, s);
    // down: activations are the sorted rows themselves.
    const dtype dt = quant::activation_type(down.type);
    quantize_activations(dt, hb, act, nk, F, s);
    float* ys = sc.ys.get<float>(std::size_t(nk * E));
    mm_args d{};
    d.w = down.data;
    d.row_bytes = down.row_bytes;
    d.mat_bytes = down.mat_bytes();
    d.x = dt == dtype::f32 ? reinterpret_cast<const std::uint8_t*>(hb) : static_cast<const std::uint8_t*>(act);
    d.x_row_bytes = quant::row_bytes(dt, F);
    d.y = ys;
    d.ldy = E;
    d.N = E;
    d.K = F;
    d.n = nk;
    d.tiles = tiles;
    d.n_tiles = toff + X;
    launch_mm(down.type, d, max_tiles, s);

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
        float* sh = sc.sh_h.get<float>(std::size_t(n * Fs));
        swiglu(sgu, sh, n, Fs, s);
        ysh = sc.sh_y.get<float>(std::size_t(n * E));
        matmul(sd, sh, ysh, n, sact, s);
        sgate = sc.sh_gate.get<float>(std::size_t(n));
        matmul(gi, x, sgate, n, sact, s);
    }
    combine_kernel<<<blocks_for("combine_kernel", n * E, 256), 256, 0, s>>>(ids, w, inv, ys, out, n, k, E, sgate, ysh);
    check_launch("moe combine");
}

}  // namespace clover::backend::cuda_detail
