// The backend conformance table (tests/backend/conformance_table.hpp) on backend::cuda against
// backend::cpu: every primitive over every segment mix (prefill chunk, decode rows, verify rows,
// 32-row previews with and without a coreset, several sequences in one pass), weight type
// (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K; F16/F32 KV pages for attention) and odd shape, in fast
// and exact mode, within the tolerance each output's kind states (conformance.hpp: tolerance());
// and the device's own row-exactness (each segment alone equals the batch, bit for bit). Small
// shapes: on the emulated device a block's threads are fibers.
#include "cuda_test.hpp"
#include "pass_test_util.hpp"

#include <memory>

#include "../../tests/backend/conformance_table.hpp"
#include "../../tests/backend/cpu_io.hpp"

namespace conformance {

template <>
struct io<clover::backend::cuda> {
    using B = clover::backend::cuda;
    static void put(B&, B::tensor t, const std::vector<float>& h) { cudatest::put(t, h); }
    // A deferred norm (rms_norm, add_rms_norm) runs when a later primitive needs it: reading
    // its output directly runs it first.
    static std::vector<float> get(B& be, B::context& cx, B::tensor t) {
        be.flush_norm(cx);
        return cudatest::get(t);
    }
    static void put_route(B&, B::route r, const std::vector<std::int32_t>& ids, const std::vector<float>& w) {
        CLOVER_CUDA_CHECK(cudaMemcpy(r.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        CLOVER_CUDA_CHECK(cudaMemcpy(r.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
        CLOVER_CUDA_CHECK(cudaDeviceSynchronize());
    }
    static void get_route(B&, B::context&, B::route r, std::vector<std::int32_t>& ids, std::vector<float>& w) {
        CLOVER_CUDA_CHECK(cudaDeviceSynchronize());
        ids.resize(std::size_t(r.rows * r.k));
        w.resize(ids.size());
        CLOVER_CUDA_CHECK(cudaMemcpy(ids.data(), r.ids, ids.size() * 4, cudaMemcpyDeviceToHost));
        CLOVER_CUDA_CHECK(cudaMemcpy(w.data(), r.w, w.size() * 4, cudaMemcpyDeviceToHost));
    }
    static void read(B::state& st, void* host, const void* mem, std::size_t bytes) { st.store().read(host, mem, bytes); }
};

}  // namespace conformance

// A namespace of its own: tests_cuda compiles the test files in unity units (unity_*.cu).
namespace cuda_test_conformance {

// Graphs off: the table reads tensors in the middle of a pass, which a captured pass forbids.
CUDA_TEST_CASE("backend conformance table, small shapes: the CUDA backend equals the CPU backend in both modes and is row-exact") {
    using clover::backend::cpu;
    using clover::backend::cuda;
    conformance::check_peer(
        conformance::table<cuda>(), conformance::table<cpu>(),
        [] { return std::make_unique<cuda>(clover::backend::cuda_options{.graphs = false}); },
        [] { return std::make_unique<cpu>(clover::backend::cpu_options{.threads = 2}); });
}

}  // namespace cuda_test_conformance
