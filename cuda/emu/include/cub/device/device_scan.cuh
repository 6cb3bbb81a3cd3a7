#pragma once
// cub::DeviceScan::ExclusiveSum on the emulated device: host work in stream order (see
// device_radix_sort.cuh for the scratch protocol).
#include <cstddef>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
struct DeviceScan {
    template <class In, class Out>
    static cudaError_t ExclusiveSum(void* tmp, std::size_t& tmp_bytes, In in, Out out, int n, cudaStream_t s = nullptr) {
        if (!tmp) {
            tmp_bytes = 256;
            return cudaSuccess;
        }
        if (n < 0) return cudaErrorInvalidValue;
        if (!clover_emu::device_range(tmp, tmp_bytes)) return cudaErrorInvalidValue;
        ::clover_emu::enqueue_host(s, "cub::DeviceScan::ExclusiveSum", [=] {
            using T = std::remove_cvref_t<decltype(in[0])>;
            std::vector<T> v(in, in + n);  // in and out may be the same array
            T acc{};
            for (int i = 0; i < n; ++i) {
                out[i] = acc;
                acc = acc + v[std::size_t(i)];
            }
        });
        return cudaSuccess;
    }
};
}  // namespace cub
