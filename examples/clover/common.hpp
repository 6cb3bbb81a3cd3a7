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

struct device_flags {
    std::string device = "auto";  // auto | cpu | cuda | cuda:N
    long long n_cpu_moe = 0;
    bool mmap = false;
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
}

struct device_choice {
    bool cuda = false;
    int ordinal = 0;
    int n_cpu_moe = 0;
    bool mmap = false;  // weights used in place from the file map (no copy into huge pages)
};

// The device --device names, or one clear error: CUDA asked of a binary built without it, or
// of a machine without that GPU (the backend's own error names the device count).
inline device_choice resolve_device(const device_flags& d) {
    device_choice c;
    c.n_cpu_moe = int(d.n_cpu_moe);
    c.mmap = d.mmap;
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

template <class M>
std::unique_ptr<M> open_model(const std::string& path, int threads, const device_choice& c) {
    using B = typename M::backend_type;
    return std::make_unique<M>(open_weights(path), backend_options(std::type_identity<B>{}, threads, c), &warn);
}

// Calls body(std::type_identity<M>{}, choice) with the model type of the device --device picks.
template <class Body>
void on_device(const device_flags& d, Body&& body) {
    const device_choice c = resolve_device(d);
#if CLOVER_CLI_CUDA
    if (c.cuda) return body(std::type_identity<cuda_model>{}, c);
#endif
    body(std::type_identity<cpu_model>{}, c);
}

}  // namespace clover::cli
