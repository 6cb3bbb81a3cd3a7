#pragma once
// Small helpers of the emulator's own tests: a device array with host round trips.
#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace emutest {

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class T>
struct dev {
    T* p = nullptr;
    std::size_t n = 0;
    explicit dev(std::size_t count) : n(count) { (void)cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)); }
    explicit dev(const std::vector<T>& h) : dev(h.size()) { (void)cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
    ~dev() { (void)cudaFree(p); }
    dev(const dev&) = delete;
    dev& operator=(const dev&) = delete;
    std::vector<T> host() const {
        std::vector<T> h(n);
        (void)cudaDeviceSynchronize();
        (void)cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return h;
    }
};

}  // namespace emutest
