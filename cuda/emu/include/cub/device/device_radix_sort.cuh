#pragma once
// cub::DeviceRadixSort::SortPairs on the emulated device: a stable sort by the key bits
// [begin_bit, end_bit) run as host work in stream order (clover_emu::enqueue_host). The first
// call (temp storage null) asks for a small scratch size, which must then be a device allocation.
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
struct DeviceRadixSort {
    template <class K, class V>
    static cudaError_t SortPairs(void* tmp, std::size_t& tmp_bytes, const K* keys_in, K* keys_out, const V* vals_in, V* vals_out,
                                 int n, int begin_bit = 0, int end_bit = int(sizeof(K) * 8), cudaStream_t s = nullptr) {
        if (!tmp) {
            tmp_bytes = 256;
            return cudaSuccess;
        }
        if (n < 0 || begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit > end_bit) return cudaErrorInvalidValue;
        if (!clover_emu::device_range(tmp, tmp_bytes)) return cudaErrorInvalidValue;
        ::clover_emu::enqueue_host(s, "cub::DeviceRadixSort::SortPairs", [=] {
            const unsigned long long mask =
                end_bit - begin_bit >= 64 ? ~0ull : ((1ull << (end_bit - begin_bit)) - 1) << begin_bit;
            std::vector<int> idx(static_cast<std::size_t>(n));
            std::iota(idx.begin(), idx.end(), 0);
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
                return (static_cast<unsigned long long>(keys_in[a]) & mask) < (static_cast<unsigned long long>(keys_in[b]) & mask);
            });
            std::vector<K> k(static_cast<std::size_t>(n));
            std::vector<V> v(static_cast<std::size_t>(n));
            for (int i = 0; i < n; ++i) {
                k[std::size_t(i)] = keys_in[idx[std::size_t(i)]];
                v[std::size_t(i)] = vals_in[idx[std::size_t(i)]];
            }
            std::copy(k.begin(), k.end(), keys_out);
            std::copy(v.begin(), v.end(), vals_out);
        });
        return cudaSuccess;
    }
};
}  // namespace cub
