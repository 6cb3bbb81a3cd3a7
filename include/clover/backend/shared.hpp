#pragma once
// What the backends share below themselves (backend/cpu, backend/cuda and their compositions,
// backend/offload.hpp), each with one definition here, so no backend includes another.
#include <cstdint>

#include "clover/core/batch.hpp"

namespace clover::backend {

// The Gated DeltaNet's delta rule over a segment: rows below this use the recurrence; at or
// above, the chunked WY form (both exact to rounding; the chunked form does the state work as
// matrix products).
inline constexpr std::int64_t gdn_chunked_min_rows = 2;

// Whether a segment's delta rule takes the chunked form: commit segments of at least
// gdn_chunked_min_rows rows, unless the pass is row-exact as a whole (batch::exact: every row as a
// one-row pass computes it, i.e. by the recurrence). Verify rows always take the recurrence (they
// keep a record a rollback replays); preview rows take the block softmax.
inline bool gdn_chunked_segment(const batch& bt, const segment& s) {
    return s.kind == pass_kind::commit && !bt.exact && s.n >= gdn_chunked_min_rows;
}

// A device tensor's or route's copy in host memory, as a device backend hands it to host work
// (backend::offload: the layers placed on the host backend). Row-major, the shapes of the
// backend concept's tensor ([rows, cols] f32) and route ([rows, k] ids and weights).
struct host_tensor {
    float* data = nullptr;
    std::int64_t rows = 0, cols = 0;
};
struct host_route {
    std::int32_t* ids = nullptr;
    float* w = nullptr;
    std::int64_t rows = 0, k = 0;
};

}  // namespace clover::backend
