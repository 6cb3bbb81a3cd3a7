#pragma once
// A recording stand-in for the CUDA runtime (cudart_stub.cpp), linked instead of cudart into
// tests_cuda_host: backend::cuda's host side runs unchanged on a machine without a GPU, every
// "device" allocation is host memory, copies are memcpy, and kernel launches are recorded, not
// run. So CI can count what a pass asks of the device — read-backs, host waits, uploads,
// launches and their configurations — though no kernel computes anything (device memory holds
// zeros or whatever was copied in; the logits read back are not the model's).
//
// It knows CUDA graphs as stream capture makes them: work queued on a capturing stream becomes
// the graph's nodes instead of running; cudaGraphLaunch runs an executable's nodes then (copies
// read their source at launch time, kernels are recorded as launched). What breaks a capture on a
// GPU fails here too, loudly: a wait on the capturing stream, a synchronous copy, a free or a
// device-wide wait while a capture is open, a copy to or from pageable host memory in a capture.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cudastub {

// One kernel launch as the runtime saw it: the kernel (by the name nvcc registered), its grid,
// block and dynamic shared memory. Two passes of the same shape must launch the same sequence
// for a CUDA graph captured from one to replay for the other.
struct launch {
    std::string kernel;
    unsigned gx, gy, gz, bx, by, bz;
    std::size_t smem;
    bool operator==(const launch&) const = default;
};

struct counters {
    std::int64_t d2h = 0;          // copies device → host (cudaMemcpy*, any size): read-backs
    std::int64_t h2d = 0;          // copies host → device
    std::int64_t d2d = 0;          // copies device → device
    std::int64_t memsets = 0;
    std::int64_t host_waits = 0;   // cudaStreamSynchronize, cudaDeviceSynchronize, synchronous cudaMemcpy
    std::int64_t mallocs = 0;      // cudaMalloc + cudaHostAlloc (each one a device-wide wait on a GPU)
    std::int64_t frees = 0;        // cudaFree + cudaFreeHost (likewise)
    std::int64_t bad_launches = 0; // configurations a GPU would refuse (grid y/z > 65,535, > 1,024 threads, ...)
    std::vector<launch> launches;  // every kernel run: launched directly or by a graph launch
    // Graphs.
    std::int64_t direct_launches = 0;     // kernels launched on a stream that was not capturing
    std::int64_t graph_launches = 0;      // cudaGraphLaunch
    std::int64_t graph_kernels = 0;       // kernels run by graph launches
    std::int64_t captures = 0;            // cudaStreamBeginCapture
    std::int64_t instantiations = 0;      // cudaGraphInstantiate(WithFlags)
    std::int64_t updates = 0;             // cudaGraphExecUpdate that succeeded ...
    std::int64_t update_refusals = 0;     // ... and that found another topology
    std::int64_t exec_destroys = 0;       // cudaGraphExecDestroy
    std::int64_t capture_violations = 0;  // calls a capture forbids (see above); each fails
    std::vector<std::int64_t> graph_execs;  // the executable (by instantiation number) of each graph launch
    std::vector<std::size_t> alloc_bytes;  // the size of each allocation, in order (to tell who asked)
};

// What the runtime has recorded since the last reset(); thread-safe.
counters snapshot();
void reset();
// Executables instantiated and not yet destroyed (not cleared by reset).
std::int64_t live_execs();

}  // namespace cudastub
