#pragma once
// The CPU backend's state pool: the backend-neutral pool (backend/state_pool.hpp) over host
// memory. Float arrays are std::vectors, KV chunks zeroed heap blocks, copies memcpy.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "clover/backend/state_pool.hpp"

namespace clover::backend::cpu_detail {

// A std::vector<float> that can also be zeroed in place (what the pool asks of Store::floats).
struct host_floats : std::vector<float> {
    using std::vector<float>::vector;
    void zero() { std::fill(begin(), end(), 0.f); }
};

struct host_store {
    using floats = host_floats;
    using bytes = std::unique_ptr<std::byte[]>;
    static floats floats_of(std::size_t n) { return floats(n); }
    static bytes bytes_of(std::size_t n) { return bytes(new std::byte[n]()); }
    static void copy(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
    static bool equal(const void* a, const void* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }
    static bool equal(const floats& a, const floats& b) { return a == b; }
};

using state_pool = basic_state_pool<host_store>;
using gdn_record = state_pool::gdn_record;
using gdn_checkpoint = state_pool::gdn_checkpoint;
using gdn_slot = state_pool::gdn_slot;

}  // namespace clover::backend::cpu_detail
