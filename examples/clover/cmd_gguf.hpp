#pragma once
// `clover gguf info` and `clover gguf synth` (cli.md).
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <clover/model/synth.hpp>

#include "cmd_convert.hpp"
#include "common.hpp"

namespace clover::cli {

inline std::string value_summary(const io::gguf_value& v) {
    using io::gguf_type;
    if (v.type == gguf_type::string) return v.s.size() > 60 ? "\"" + v.s.substr(0, 57) + "...\"" : "\"" + v.s + "\"";
    if (v.type == gguf_type::boolean) return v.i ? "true" : "false";
    if (io::gguf_is_float(v.type)) { char b[32]; std::snprintf(b, sizeof b, "%g", v.f); return b; }
    if (v.type != gguf_type::array) return std::to_string(v.i);
    std::string s = "[" + std::string(io::gguf_type_name(v.elem)) + " x " + std::to_string(v.array_size()) + "]";
    if (v.array_size() <= 8 && v.elem != gguf_type::string && v.elem != gguf_type::array) {
        s += " {";
        for (std::size_t i = 0; i < v.array_size(); ++i) {
            if (i) s += ", ";
            if (io::gguf_is_float(v.elem)) { char b[32]; std::snprintf(b, sizeof b, "%g", v.floats[i]); s += b; }
            else s += std::to_string(v.ints[i]);
        }
        s += "}";
    }
    return s;
}

inline void gguf_info(const std::string& path) {
    // The file as it is (vendor variants not fixed: info reports them).
    auto f = std::filesystem::is_directory(path) ? load_hf(path, &warn) : std::make_shared<const io::gguf_file>(path);
    std::printf("file: %s\nGGUF version %u, %zu metadata keys, %zu tensors, alignment %zu\n\n", path.c_str(), f->version(),
                f->metadata().size(), f->tensors().size(), f->alignment());
    std::printf("metadata:\n");
    for (const auto& [k, v] : f->metadata()) std::printf("  %-48s %s\n", k.c_str(), value_summary(v).c_str());
    std::size_t total = 0;
    std::printf("\ntensors:\n  %-40s %-6s %-28s %12s\n", "name", "type", "shape", "bytes");
    for (const auto& t : f->tensors()) {
        std::printf("  %-40s %-6s %-28s %12zu\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(),
                    t.shape_string().c_str(), t.nbytes);
        total += t.nbytes;
    }
    std::printf("  total %.3f GiB\n", double(total) / (1024.0 * 1024 * 1024));
    print_variant_report(*f);
    std::printf("\n");
    // What can it run? Binding the weights checks every shape.
    try {
        hparams h = read_hparams(*f, &warn);
        model_weights w = bind_weights(f, h);
        std::printf("architecture %s: %lld layers (%lld attention, %lld Gated DeltaNet), n_embd %lld, n_vocab %lld\n",
                    h.arch.c_str(), (long long)h.n_layer, (long long)h.n_attention_layers(),
                    (long long)(h.n_layer - h.n_attention_layers()), (long long)h.n_embd, (long long)h.n_vocab);
        std::printf("experts %lld (top-%lld, ff %lld) + %lld shared (ff %lld)\n", (long long)h.n_expert,
                    (long long)h.n_expert_used, (long long)h.n_ff_exp, (long long)h.n_expert_shared, (long long)h.n_ff_shexp);
        std::printf("can run: AR (causal) yes; diffusion %s\n",
                    !h.is_clover() ? "no (not a clover_moe file)"
                    : !w.has_diffusion() ? ("no (missing " + w.missing_diffusion.front() + " and " +
                                           std::to_string(w.missing_diffusion.size() - 1) + " more)").c_str()
                    : h.mask_token_id < 0 ? "no (no diffusion.mask_token_id)" : "yes");
    } catch (const error& e) {
        std::printf("can run: nothing — %s\n", e.what());
    }
}

inline void add_gguf_commands(CLI::App& app) {
    auto* g = app.add_subcommand("gguf", "Inspect and write GGUF files");
    g->require_subcommand(1);
    {
        auto* c = g->add_subcommand("info", "Architecture, hyper-parameters, tensors and capabilities of a file");
        auto path = std::make_shared<std::string>();
        c->add_option("file", *path, "GGUF file or HF model folder")->required();
        c->callback([path] { gguf_info(*path); });
    }
    add_patch_command(g);
    {
        auto* c = g->add_subcommand("synth", "Write a random-weight model of real shapes");
        struct opts {
            std::string arch = "qwen35moe", preset = "tiny", type = "f32", out;
            long long layers = 0, vocab = 0;
            unsigned long long seed = 42;
            bool tie = false;
        };
        auto o = std::make_shared<opts>();
        c->add_option("--arch", o->arch, "qwen35moe | clover_moe")->check(CLI::IsMember({"qwen35moe", "clover_moe"}));
        c->add_option("--preset", o->preset, "tiny | clover-35b-a3b");
        c->add_option("--layers", o->layers, "number of layers (default: the preset's)")->check(CLI::Range(1LL, 4096LL));
        c->add_option("--vocab", o->vocab, "vocabulary size (default: the preset's)")->check(CLI::Range(263LL, 1LL << 24));
        c->add_option("--type", o->type, "f32 | f16 | bf16 | q8_0 | q4_k | q5_k | q6_k | q4_k_m (matrices; vectors stay f32)");
        c->add_option("--seed", o->seed, "random seed");
        c->add_flag("--tie-embeddings", o->tie, "omit output.weight (the LM head reuses token_embd)");
        c->add_option("-o,--output", o->out, "output GGUF")->required();
        c->callback([o] {
            synth::spec s = synth::preset(o->preset);
            s.arch = o->arch;
            if (o->layers) s.n_layer = o->layers;
            if (o->vocab) s.n_vocab = o->vocab;
            const bool mix = o->type == "q4_k_m" || o->type == "Q4_K_M";
            auto t = mix ? std::optional<dtype>(dtype::q4_k) : dtype_from_name(o->type);
            if (!t || !quant::is_supported_weight(*t))
                fail("synth: --type '", o->type, "' is not one of f32, f16, bf16, q8_0, q4_k, q5_k, q6_k, q4_k_m");
            s.type = *t;
            s.q4_k_m = mix;
            s.seed = o->seed;
            s.tie_embeddings = o->tie;
            synth::write(s, o->out, [](std::size_t i, std::size_t n) {
                if (i == n || i % 64 == 0) std::fprintf(stderr, "\rsynth: %zu/%zu tensors", i, n);
                if (i == n) std::fprintf(stderr, "\n");
            });
        });
    }
}

}  // namespace clover::cli
