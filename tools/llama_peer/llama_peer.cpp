// llama_peer: runs a GGUF through the prebuilt llama.cpp CPU libraries so tests can compare our
// engine against an independent implementation (logits for every prompt position, greedy tokens).
//
//   llama_peer -m MODEL.gguf --ids 1,2,3 [-o OUT.f32] [--gen N] [-t THREADS]
//              [--backends DIR] [--cpu-variant NAME] [-v]
//
// -o writes float32 little-endian [n_ids, n_vocab], row i = logits after ids[0..i].
// --gen N greedy-decodes N tokens after the prompt (argmax, lowest id on ties, EOS ignored)
// and prints them comma-separated on one stdout line.
// Any failure: one line on stderr, exit status 1.

#include "ggml-backend.h"
#include "llama.h"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#ifndef LLAMA_PEER_BACKENDS_DIR
#define LLAMA_PEER_BACKENDS_DIR ""
#endif

namespace {

struct Options {
    std::string model, out, backends = LLAMA_PEER_BACKENDS_DIR, cpu_variant;
    std::vector<llama_token> ids;
    int gen = 0;
    int threads = 1;
    bool verbose = false;
};

[[noreturn]] void fail(const std::string & msg) {
    std::fprintf(stderr, "llama_peer: %s\n", msg.c_str());
    std::exit(1);
}

int to_int(const std::string & s, const char * what) {
    try {
        size_t used = 0;
        const long v = std::stol(s, &used);
        if (used != s.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(s);
        return static_cast<int>(v);
    } catch (const std::exception &) {
        fail(std::string("bad ") + what + ": '" + s + "'");
    }
}

Options parse(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) fail("missing value after " + a);
            return argv[++i];
        };
        if (a == "-m") o.model = next();
        else if (a == "-o") o.out = next();
        else if (a == "--gen") o.gen = to_int(next(), "--gen");
        else if (a == "-t") o.threads = to_int(next(), "-t");
        else if (a == "--backends") o.backends = next();
        else if (a == "--cpu-variant") o.cpu_variant = next();
        else if (a == "-v") o.verbose = true;
        else if (a == "--ids") {
            const std::string list = next();
            size_t start = 0;
            while (start <= list.size()) {
                const size_t comma = std::min(list.find(',', start), list.size());
                o.ids.push_back(to_int(list.substr(start, comma - start), "token id"));
                start = comma + 1;
            }
        } else fail("unknown argument '" + a + "' (usage: -m MODEL --ids 1,2,3 [-o OUT] [--gen N] [-t T] [--backends DIR] [--cpu-variant NAME] [-v])");
    }
    if (o.model.empty()) fail("-m MODEL.gguf is required");
    if (o.ids.empty()) fail("--ids is required");
    if (o.gen < 0) fail("--gen must be >= 0");
    if (o.threads < 1) fail("-t must be >= 1");
    if (o.backends.empty()) fail("no backend folder: pass --backends DIR");
    return o;
}

std::string one_line(const char * text) {
    std::string s;
    for (const char * c = text; *c; ++c) s += (*c == '\n' ? ' ' : *c);
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
}

// Quiet mode keeps llama.cpp's error lines (joined by " | "), so a failure still says why on
// one line, e.g. "check_tensor_dims: tensor 'blk.0.ssm_a' not found".
std::string g_errors;
ggml_log_level g_last_level = GGML_LOG_LEVEL_NONE;
void quiet_log(ggml_log_level level, const char * text, void *) {
    const bool cont = level == GGML_LOG_LEVEL_CONT;
    if (cont) level = g_last_level;
    g_last_level = level;
    if (level != GGML_LOG_LEVEL_ERROR) return;
    const std::string line = one_line(text);
    if (line.empty()) return;
    g_errors += (g_errors.empty() ? "" : cont ? " " : " | ") + line;
}
std::string why() { return g_errors.empty() ? " (rerun with -v for llama.cpp's log)" : ": " + g_errors; }

// GGML_ASSERT/GGML_ABORT (e.g. an op that does not support a tensor's dtype) would otherwise
// print a gdb backtrace and SIGABRT; report it as one line and a plain failure exit instead.
void on_ggml_abort(const char * message) {
    std::fprintf(stderr, "llama_peer: ggml aborted: %s\n", one_line(message).c_str());
    std::fflush(stderr);
    std::_Exit(1);
}

// Some malformed models crash inside llama.cpp instead of failing: e.g. a GDN layer without
// attn_qkv/attn_gate loads (the loader marks them optional) and then dereferences null.
void on_crash(int) {
    static const char msg[] = "llama_peer: crashed inside llama.cpp (SIGSEGV/SIGBUS/SIGFPE); "
                              "check the GGUF's tensors, e.g. blk.N.attn_qkv/attn_gate on GDN layers\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    _exit(1);
}

// Which libggml-cpu-*.so got mapped: ggml picks the best-scoring variant for this CPU, and the
// variant decides the SIMD kernels (so the exact float rounding), hence worth printing under -v.
std::string loaded_cpu_variant() {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
        const size_t p = line.find("libggml-cpu-");
        if (p != std::string::npos) return line.substr(p);
    }
    return "?";
}

// Pure argmax over the row; strict '>' keeps the lowest index on ties.
llama_token argmax(const float * row, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (row[i] > row[best]) best = i;
    return best;
}

}  // namespace

int main(int argc, char ** argv) {
    const Options o = parse(argc, argv);
    if (!o.verbose) llama_log_set(quiet_log, nullptr);  // also silences ggml (llama_log_set forwards)
    ggml_set_abort_callback(on_ggml_abort);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE}) std::signal(sig, on_crash);

    // The package links no CPU backend into libggml: load one from the folder explicitly.
    if (o.cpu_variant.empty()) {
        ggml_backend_load_all_from_path(o.backends.c_str());
    } else {
        const std::string path = o.backends + "/libggml-cpu-" + o.cpu_variant + ".so";
        if (!ggml_backend_load(path.c_str())) fail("cannot load CPU backend " + path);
    }
    if (ggml_backend_dev_count() == 0) fail("no ggml backend found in " + o.backends);
    llama_backend_init();
    if (o.verbose) std::fprintf(stderr, "llama_peer: cpu backend %s\n", loaded_cpu_variant().c_str());

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mode = LLAMA_LOAD_MODE_NONE;  // read into memory: the test may rewrite the file later
    mp.use_extra_bufts = false;           // no weight repacking: plain ggml kernels, one code path
    mp.load_mtp = false;
    llama_model * model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) fail("cannot load model " + o.model + why());

    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_ids = static_cast<int>(o.ids.size());
    for (llama_token id : o.ids)
        if (id < 0 || id >= n_vocab) fail("token id " + std::to_string(id) + " out of range [0, " + std::to_string(n_vocab) + ")");

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(n_ids + o.gen + 1);
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(n_ids);  // the whole prompt in one ubatch
    cp.n_outputs_max = cp.n_outputs_max_per_seq = static_cast<uint32_t>(n_ids);
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = o.threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F32;  // an F16 cache would round K/V (and Q) to half
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) fail("cannot create context" + why());

    // Prompt: explicit positions 0..n-1, sequence 0, logits requested for every position.
    // llama_decode never adds BOS; only the ids given are seen.
    llama_batch batch = llama_batch_init(n_ids, 0, 1);
    for (int i = 0; i < n_ids; ++i) {
        batch.token[i] = o.ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_ids;
    if (const int rc = llama_decode(ctx, batch); rc != 0) fail("llama_decode(prompt) returned " + std::to_string(rc) + why());

    if (!o.out.empty()) {
        std::ofstream f(o.out, std::ios::binary);
        if (!f) fail("cannot write " + o.out);
        for (int i = 0; i < n_ids; ++i) {
            const float * row = llama_get_logits_ith(ctx, i);
            if (!row) fail("no logits for prompt position " + std::to_string(i));
            f.write(reinterpret_cast<const char *>(row), static_cast<std::streamsize>(sizeof(float)) * n_vocab);
        }
        if (!f.flush()) fail("short write to " + o.out);
    }

    if (o.gen > 0) {
        std::string line;
        llama_token tok = argmax(llama_get_logits_ith(ctx, n_ids - 1), n_vocab);
        for (int g = 0; g < o.gen; ++g) {
            if (g) line += ',';
            line += std::to_string(tok);
            if (g + 1 == o.gen) break;
            batch.n_tokens = 1;
            batch.token[0] = tok;
            batch.pos[0] = n_ids + g;
            batch.logits[0] = 1;
            if (const int rc = llama_decode(ctx, batch); rc != 0) fail("llama_decode(gen) returned " + std::to_string(rc) + why());
            tok = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
        }
        std::printf("%s\n", line.c_str());
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
