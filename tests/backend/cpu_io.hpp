#pragma once
// io<backend::cpu> for the conformance harness (conformance.hpp): the CPU's tensors, routes and
// state are host memory.
#include <cstring>
#include <vector>

#include <clover/backend/cpu/cpu.hpp>

#include "conformance.hpp"

namespace conformance {

template <>
struct io<backend::cpu> {
    using B = backend::cpu;
    static void put(B&, B::tensor t, const std::vector<float>& h) {
        REQUIRE(h.size() == std::size_t(t.rows * t.cols));
        if (!h.empty()) std::memcpy(t.data, h.data(), h.size() * 4);
    }
    static std::vector<float> get(B&, B::context&, B::tensor t) { return {t.data, t.data + t.rows * t.cols}; }
    static void put_route(B&, B::route r, const std::vector<std::int32_t>& ids, const std::vector<float>& w) {
        // An empty segment has no route rows: memcpy from a null data() is undefined even for 0 bytes.
        if (!ids.empty()) std::memcpy(r.ids, ids.data(), ids.size() * 4);
        if (!w.empty()) std::memcpy(r.w, w.data(), w.size() * 4);
    }
    static void get_route(B&, B::context&, B::route r, std::vector<std::int32_t>& ids, std::vector<float>& w) {
        ids.assign(r.ids, r.ids + r.rows * r.k);
        w.assign(r.w, r.w + r.rows * r.k);
    }
    static void read(B::state&, void* host, const void* mem, std::size_t bytes) {
        if (bytes) std::memcpy(host, mem, bytes);
    }
};

}  // namespace conformance
