#pragma once
// Shared pieces of the `clover` command: id lists, model opening, output helpers.
#include <cstdio>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <clover/backend/offload.hpp>
#include <clover/backend/trace.hpp>
#include <clover/clover.hpp>
#include <clover/io/atomic_file.hpp>
#include <clover/io/hf_model.hpp>
#include <clover/model/file_variants.hpp>
#if CLOVER_CLI_MPI
#include <clover/dist/mpi.hpp>
#include <clover/pipeline/pipeline.hpp>
#endif

namespace clover::cli {

inline void warn(const std::string& msg) { std::fprintf(stderr, "warning: %s\n", msg.c_str()); }

// "1,2,3" or "1 2 3" (any mix of commas and whitespace).
inline std::vector<token> parse_ids(const std::string& text, const std::string& what) {
    std::vector<token> ids;
    std::string cur;
    auto flush = [&] {
        if (cur.empty()) return;
        std::size_t pos = 0;
        long long v = 0;
        try {
            v = std::stoll(cur, &pos);
        } catch (...) {
            pos = 0;
        }
        if (pos != cur.size() || v < 0 || v > 0x7fffffff) fail(what, ": '", cur, "' is not a token id");
        ids.push_back(token(v));
        cur.clear();
    };
    for (char c : text) {
        if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') flush();
        else cur += c;
    }
    flush();
    return ids;
}

inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(path, ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The files that reading `paths` touches (a model file, every file an HF folder is read from,
// an ids file; empty paths skipped): what an output must never replace.
inline std::vector<io::file_identity> input_identities(std::initializer_list<std::string> paths) {
    std::vector<io::file_identity> ids;
    for (const auto& p : paths) {
        if (p.empty()) continue;
        if (std::filesystem::is_directory(p)) {
            for (auto& id : hf::input_files(p)) ids.push_back(std::move(id));
        } else if (auto id = io::identity_of(p)) {
            ids.push_back(std::move(*id));
        }
    }
    return ids;
}

// Writes a whole output file, all or nothing (io/atomic_file.hpp: a temporary file, fsync,
// rename), refusing an output that is one of `inputs` (paths as given on the command line).
inline void write_output_file(const std::string& out, std::span<const std::byte> bytes, std::initializer_list<std::string> inputs) {
    io::write_file_atomically(out, bytes, input_identities(inputs));
}

inline std::string join_ids(const std::vector<token>& ids) {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ',';  // not `"," + std::to_string(...)`: GCC 12 -Wrestrict false positive
        s += std::to_string(ids[i]);
    }
    return s;
}

// A GGUF file (known vendor variants made canonical in memory, with a warning) or an HF folder.
inline std::shared_ptr<const io::gguf_file> open_weights(const std::string& path) {
    return clover::open(path, &warn);
}

// ---- Where a model runs: --device and --n-cpu-moe (run, serve, bench, logits, generate) ----
//
// The CPU build knows one backend; the CUDA build (CLOVER_CUDA=ON: the same main.cpp compiled by
// nvcc as cuda/examples/clover_cli.cu, CLOVER_CLI_CUDA=1) knows both. A command body is written
// once, as a generic lambda over the model type, and instantiated for each backend this binary
// has; --device picks one at run time.
using cpu_model = model<variants::from_file, backend::cpu>;
#if CLOVER_CLI_CUDA
// --device cuda: backend::cuda, composed with backend::cpu for --n-cpu-moe (backend/offload.hpp;
// no CPU backend is made while no layer is placed on the host).
using cuda_backend = backend::offload<backend::cuda, backend::cpu>;
using cuda_model = model<variants::from_file, cuda_backend>;
inline constexpr bool built_with_cuda = true;
#else
inline constexpr bool built_with_cuda = false;
#endif

#if CLOVER_CLI_MPI
inline constexpr bool built_with_mpi = true;
#else
inline constexpr bool built_with_mpi = false;
#endif

// Ends the command with this exit status and nothing printed: a rank other than 0 under
// --pipeline with an error that rank 0 finds too and reports (bad flags, a split that does not
// fit the file). Status 0: the job's status is rank 0's, and a rank that exits non-zero first
// makes mpirun stop rank 0 before it prints.
struct quiet_exit {
    int code;
};

struct device_flags {
    std::string device = "auto";  // auto | cpu | cuda | cuda:N
    long long n_cpu_moe = 0;
    bool mmap = false;
    long long pipeline = 0;   // --pipeline N: the model split by layers over N MPI ranks (0: one process)
    std::string layer_split;  // --layer-split 3,5: layers per rank (empty: even)
};

inline void add_device_flags(CLI::App* c, device_flags& d) {
    c->add_option("--device", d.device,
                  "where the model runs: auto (the first CUDA device when this clover has CUDA and a GPU is there, else the "
                  "CPU), cpu, cuda or cuda:N")
        ->check([](const std::string& v) -> std::string {
            if (v == "auto" || v == "cpu" || v == "cuda") return "";
            if (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.size() < 10 &&
                v.find_first_not_of("0123456789", 5) == std::string::npos)
                return "";
            return "--device must be auto, cpu, cuda or cuda:N (got '" + v + "')";
        });
    c->add_option("--n-cpu-moe", d.n_cpu_moe,
                  "CUDA: keep the routed experts of the first N layers in host memory and compute them on the CPU "
                  "(for a GPU smaller than the model)")
        ->check(CLI::Range(0LL, 1LL << 20));
    c->add_flag("--mmap", d.mmap,
                "use the weights in place from the file map (loads at once and shares the page cache) instead of a "
                "private copy in 2 MiB pages, which decodes faster and is the default when the model fits in memory");
    c->add_option("--pipeline", d.pipeline,
                  "split the model's layers over the N ranks of `mpirun -np N` (CPU stages; rank 0 runs the command, "
                  "each other rank loads and runs only its own layers)")
        ->check(CLI::Range(1LL, 4096LL));
    c->add_option("--layer-split", d.layer_split,
                  "with --pipeline: layers per rank, comma separated (e.g. 3,5: layers 0-2 on rank 0, 3-7 on rank 1; default: even)");
}

struct device_choice {
    bool cuda = false;
    int ordinal = 0;
    int n_cpu_moe = 0;
    bool mmap = false;  // weights used in place from the file map (no copy into huge pages)
    int pipeline = 0;   // --pipeline N (0: the whole model in this process)
    std::vector<std::int64_t> layer_split;  // --layer-split's counts (empty: even)
#if CLOVER_CLI_MPI
    dist::communicator* comm = nullptr;  // under --pipeline: the MPI world (on_device owns it)
#endif
};

// --pipeline and --layer-split, checked before anything is opened: the split's counts (the
// sum against the file's layer count is checked when the file is open, before any loading).
inline std::vector<std::int64_t> pipeline_counts(const device_flags& d) {
    if (d.pipeline == 0) {
        if (!d.layer_split.empty())
            fail("--layer-split needs --pipeline N (it gives the layers of each of the N ranks of a model split over MPI ranks)");
        return {};
    }
    if (!built_with_mpi)
        fail("--pipeline ", d.pipeline, ": this clover was built without MPI",
             built_with_cuda ? " (the CUDA build's clover has no --pipeline yet: use the CPU build's, build/clover)"
                             : " (install libopenmpi-dev and openmpi-bin, e.g. scripts/setup.sh, then reconfigure: "
                               "cmake --preset release, and rebuild)");
    if (d.pipeline == 1)
        fail("--pipeline 1 is the whole model in one process: drop --pipeline (a split needs 2 or more ranks)");
    if (d.device != "auto" && d.device != "cpu")
        fail("--pipeline runs its stages on the CPU: --device ", d.device, " does not go with it (use --device cpu or leave it out)");
    if (d.layer_split.empty()) return {};
#if CLOVER_CLI_MPI
    std::vector<std::int64_t> counts = pipeline::parse_layer_split(d.layer_split);
    std::int64_t sum = 0;
    for (std::int64_t n : counts) sum += n;
    pipeline::counted_split(sum, int(d.pipeline), counts);  // one count per rank, each at least 1
    return counts;
#else
    return {};
#endif
}

// The device --device names, or one clear error: CUDA asked of a binary built without it, or
// of a machine without that GPU (the backend's own error names the device count).
inline device_choice resolve_device(const device_flags& d) {
    device_choice c;
    c.n_cpu_moe = int(d.n_cpu_moe);
    c.mmap = d.mmap;
    c.layer_split = pipeline_counts(d);
    c.pipeline = int(d.pipeline);
    if (c.pipeline > 0) {  // CPU stages (pipeline_counts refused another --device)
        if (d.n_cpu_moe > 0) warn("--n-cpu-moe has no effect with --pipeline (its stages run on the CPU)");
        return c;
    }
    if (d.device == "cpu") {
        if (d.n_cpu_moe > 0) warn("--n-cpu-moe has no effect with --device cpu (every expert is in host memory already)");
        return c;
    }
    const bool asked = d.device != "auto";
    if (asked && !built_with_cuda)
        fail("--device ", d.device, ": this clover was built without CUDA (configure with -DCLOVER_CUDA=ON, e.g. "
             "`cmake --preset cuda`; its clover is build-cuda/clover)");
#if CLOVER_CLI_CUDA
    if (asked) {
        c.cuda = true;
        c.ordinal = d.device.size() > 5 ? std::stoi(d.device.substr(5)) : 0;
        return c;
    }
    c.cuda = backend::cuda_detail::device_count() > 0;
#endif
    if (!c.cuda && d.n_cpu_moe > 0) warn("--n-cpu-moe has no effect on the CPU (no CUDA device is in use)");
    return c;
}

inline backend::cpu_options backend_options(std::type_identity<backend::cpu>, int threads, const device_choice& c) {
    return {.threads = threads, .huge_pages = !c.mmap};
}
#if CLOVER_CLI_CUDA
inline cuda_backend::options backend_options(std::type_identity<cuda_backend>, int threads, const device_choice& c) {
    return {.device = {.device = c.ordinal},
            .host = {.threads = threads, .huge_pages = !c.mmap},
            .host_moe_layers = c.n_cpu_moe};
}
#endif
template <class Inner>
auto backend_options(std::type_identity<backend::trace<Inner>>, int threads, const device_choice& c) {
    return backend_options(std::type_identity<Inner>{}, threads, c);
}

// Backend name and what it runs on, for tables and JSON ("CPU" + the ISA, "CUDA" + the card).
inline std::string backend_isa(const backend::cpu&) { return backend::cpu::isa_name(); }
#if CLOVER_CLI_CUDA
inline std::string backend_isa(const cuda_backend& be) { return be.device().device_name(); }
#endif
template <class Inner>
std::string backend_isa(backend::trace<Inner>& be) {
    return backend_isa(be.inner());
}

// Where the host's copy of the weights is (cpu::weights_placement), for load lines.
inline std::string weights_placement(const backend::cpu& be) { return be.weights_placement(); }
#if CLOVER_CLI_CUDA
inline std::string weights_placement(cuda_backend& be) {
    if (!be.host()) return "on the GPU";
    return "on the GPU, the experts of " + std::to_string(be.host_layers().size()) + " layers on the host: " +
           be.host()->weights_placement();
}
#endif
template <class Inner>
std::string weights_placement(backend::trace<Inner>& be) {
    return weights_placement(be.inner());
}

// ---- --pipeline N: the model split by layers over the ranks of `mpirun -np N` ----
//
// Rank 0 runs the command on a pipeline_model (pipeline/pipeline.hpp: it runs the first stage and
// drives the others) in place of the model, so a command body is written once for both. Every
// other rank runs the same command line: its open_model loads only its own stage, serves it
// (pipeline::serve_stage) until rank 0 shuts the pipeline down, and ends the body with
// stage_served, which on_device catches; it prints nothing on stdout.
template <class M>
inline constexpr bool is_pipeline = false;

#if CLOVER_CLI_MPI
// Rank 0's model under --pipeline: the pipeline, plus model::commit and model::preview (what
// logits and bench call), made of the pipeline's passes as the model makes them of its own.
class pipeline_model : public pipeline::pipeline<variants::from_file, backend::cpu> {
    using base = clover::pipeline::pipeline<variants::from_file, backend::cpu>;

public:
    using base::base;
    void commit(session& s, std::span<const token> ids, logits_rows rows, std::vector<float>& logits, bool exact = false) {
        const std::int64_t n = std::int64_t(ids.size()), V = n_vocab();
        for (std::size_t i = 0; i < ids.size(); ++i)  // all checked before the first chunk runs, as model::commit does
            if (ids[i] < 0 || ids[i] >= V) fail("token id ", ids[i], " at position ", i, " is out of range [0, ", V, ")");
        if (s.n_past() + n > s.n_ctx()) fail("context full: ", s.n_past(), " + ", n, " tokens exceed the context size ", s.n_ctx());
        logits.assign(rows == logits_rows::all ? std::size_t(n * V) : rows == logits_rows::last && n > 0 ? std::size_t(V) : 0, 0.f);
        std::vector<float> part;
        for (std::int64_t c0 = 0; c0 < n; c0 += s.batch()) {  // the model's chunks: the same rows per pass
            const std::int64_t m = std::min(s.batch(), n - c0);
            const std::int64_t want = rows == logits_rows::all ? m : rows == logits_rows::last && c0 + m == n ? 1 : 0;
            const pass_request r{&s, pass_kind::commit, ids.subspan(std::size_t(c0), std::size_t(m)), want};
            run(std::span(&r, 1), part, exact);
            if (want) std::copy(part.begin(), part.end(), logits.begin() + (rows == logits_rows::all ? c0 * V : 0));
        }
    }
    void preview(const session& s, std::span<const token> block, std::int64_t coreset, std::vector<float>& logits) {
        if (block.empty()) fail("preview: the block is empty");
        const pass_request r{const_cast<session*>(&s), pass_kind::preview, block, std::int64_t(block.size()), coreset};
        run(std::span(&r, 1), logits);
    }
};
template <>
inline constexpr bool is_pipeline<pipeline_model> = true;

// Thrown by open_model on a rank other than 0 once its stage is shut down: `why` says why its
// stage failed ("" when it did not). Any other error on such a rank came before its stage was
// opened, from what every rank checks alike, and rank 0 reports it.
struct stage_served {
    std::string why;
};

// Rank 0: the pipeline (its first stage loaded here). Any other rank: its own stage, served
// until rank 0 shuts down. A split that does not fit the file fails on every rank alike before
// anything is loaded; rank 0 says so.
inline std::unique_ptr<pipeline_model> open_pipeline(const std::string& path, int threads, const device_choice& c) {
    auto f = open_weights(path);
    const backend::cpu_options bo = backend_options(std::type_identity<backend::cpu>{}, threads, c);
    if (c.comm->rank() == 0)
        return std::make_unique<pipeline_model>(std::move(f), *c.comm, pipeline::pipeline_options{.layer_split = c.layer_split}, bo, &warn);
    const stage_range r = pipeline::stage_of_rank(*f, *c.comm, c.layer_split);  // a bad split: rank 0 says so too
    std::string why;
    try {
        cpu_model stage(std::move(f), r, bo, &warn);
        why = pipeline::serve_stage(stage, *c.comm);
    } catch (const std::exception& e) {
        why = e.what();
    }
    throw stage_served{why};
}
#endif

// Where a command reports the backend and the file from: the model, or rank 0's stage of a pipeline.
template <class M>
auto& stage0(M& m) {
    if constexpr (is_pipeline<M>) return m.first_stage();
    else return m;
}

template <class M>
std::unique_ptr<M> open_model(const std::string& path, int threads, const device_choice& c) {
#if CLOVER_CLI_MPI
    if constexpr (is_pipeline<M>) return open_pipeline(path, threads, c);
    else
#endif
    return std::make_unique<M>(open_weights(path), backend_options(std::type_identity<typename M::backend_type>{}, threads, c), &warn);
}

// Calls body(std::type_identity<M>{}, choice) with the model type of the device --device picks
// (--pipeline: pipeline_model, with the MPI world in choice.comm for the body's lifetime).
template <class Body>
void on_device(const device_flags& d, Body&& body) {
#if CLOVER_CLI_MPI
    if (d.pipeline > 1) {
        dist::mpi_session mpi(nullptr, nullptr);
        dist::mpi_communicator comm;
        device_choice c;
        try {  // every rank finds the same flag errors: rank 0 says them
            c = resolve_device(d);
            if (comm.size() != c.pipeline)
                fail("--pipeline ", c.pipeline, ": the MPI world has ", comm.size(), comm.size() == 1 ? " rank" : " ranks",
                     "; run under mpirun -np ", c.pipeline, " (one rank per stage)");
        } catch (const clover::error&) {
            if (comm.rank() != 0) throw quiet_exit{0};
            throw;
        }
        c.comm = &comm;
        try {
            body(std::type_identity<pipeline_model>{}, c);
        } catch (const stage_served& s) {
            if (!s.why.empty()) fail("rank ", comm.rank(), ": ", s.why);
        } catch (const std::exception&) {
            if (comm.rank() != 0) throw quiet_exit{0};
            throw;
        }
        return;
    }
#endif
    const device_choice c = resolve_device(d);  // without MPI, --pipeline is an error here
#if CLOVER_CLI_CUDA
    if (c.cuda) return body(std::type_identity<cuda_model>{}, c);
#endif
    body(std::type_identity<cpu_model>{}, c);
}

}  // namespace clover::cli
