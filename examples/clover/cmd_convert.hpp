#pragma once
// `clover convert HF_DIR -o OUT.gguf [--type ...]` and `clover gguf patch IN OUT` (cli.md), and
// the vendor-variant part of `clover gguf info`.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <clover/io/hf_convert.hpp>
#include <clover/io/hf_model.hpp>
#include <clover/model/file_variants.hpp>

#include "common.hpp"

namespace clover::cli {

inline std::string gb(std::uint64_t bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f GB", double(bytes) / 1e9);
    return b;
}

// `gguf info`: which variant the file is, what was detected and what cannot be told.
inline void print_variant_report(const io::gguf_file& f) {
    if (f.is_virtual() && f.get_string(f.get_string("general.architecture").value_or("") + ".gdn.v_head_order") == "grouped") {
        std::printf("\nHF folder read directly: canonical keys and tensor names; V heads in the HF (grouped) order, as its key states;\n"
                    "`clover convert` writes it as a canonical GGUF (tiled V heads)\n");
        return;
    }
    const variant_report r = detect_variant(f);
    std::printf("\n%s", r.describe().c_str());
    if (r.needs_patch())
        std::printf("  clover itself runs the file after fixing these in memory (logits, generate, run, ...); other engines need the patched copy\n");
}

inline void add_patch_command(CLI::App* gguf) {
    auto* c = gguf->add_subcommand("patch", "Rewrite a vendor-variant Clover/Qwen3.5-MoE file into the canonical form");
    struct opts {
        std::string in, out, v_heads = "auto", norms = "auto", ssm_a = "auto";
    };
    auto o = std::make_shared<opts>();
    c->add_option("input", o->in, "GGUF file to patch")->required();
    c->add_option("output", o->out, "canonical GGUF to write")->required();
    c->add_option("--v-heads", o->v_heads,
                  "V-head order of the input's GDN tensors (values cannot tell): auto (the file's key, else tiled) | grouped | tiled")
        ->check(CLI::IsMember({"auto", "grouped", "tiled"}));
    c->add_option("--norms", o->norms, "norm weights: auto (detect) | add-one (zero-centred: fold the +1) | keep")
        ->check(CLI::IsMember({"auto", "add-one", "keep"}));
    c->add_option("--ssm-a", o->ssm_a, "ssm_a: auto (detect) | from-a-log (holds A_log: store -exp) | keep")
        ->check(CLI::IsMember({"auto", "from-a-log", "keep"}));
    c->callback([o] {
        patch_options po;
        po.warn = &warn;
        po.v_heads = o->v_heads == "grouped" ? v_heads_choice::grouped : o->v_heads == "tiled" ? v_heads_choice::tiled : v_heads_choice::from_file;
        if (o->norms != "auto") po.norms_add_one = o->norms == "add-one";
        if (o->ssm_a != "auto") po.ssm_a_from_a_log = o->ssm_a == "from-a-log";
        po.progress = [last = 0.0](std::uint64_t done, std::uint64_t total) mutable {
            const double f = total ? double(done) / double(total) : 1.0;
            if (f - last >= 0.02 || done == total) {
                std::fprintf(stderr, "\rpatch: %5.1f%% of %s", 100.0 * f, gb(total).c_str());
                last = f;
            }
        };
        const patch_result r = patch_file(o->in, o->out, po);
        std::string applied;
        for (const auto& a : r.applied) applied += (applied.empty() ? "" : ", ") + a;
        std::fprintf(stderr, "\npatch: %s: %s; %zu tensors rewritten, %zu copied as they are; %s in %.2f s (%.2f GB/s)\n",
                     o->out.c_str(), applied.empty() ? "nothing to patch (a byte copy with clover.patch.applied)" : applied.c_str(),
                     r.n_changed, r.n_copied, gb(r.bytes).c_str(), r.seconds, r.seconds > 0 ? double(r.bytes) / 1e9 / r.seconds : 0.0);
        if (r.v_order_assumed)
            std::fprintf(stderr, "patch: note: the file does not state its V-head order and values cannot tell; tiled (canonical) was "
                                 "assumed — if its converter skipped the reorder, patch again with --v-heads grouped\n");
    });
}

inline void add_convert_commands(CLI::App& app) {
    auto* c = app.add_subcommand("convert", "HF safetensors folder -> canonical GGUF (block-diffusion tensors kept)");
    struct opts {
        std::string dir, out, type = "auto";
        int threads = 0;
    };
    auto o = std::make_shared<opts>();
    c->add_option("hf_dir", o->dir, "HF model folder (config.json, *.safetensors)")->required();
    c->add_option("-o,--output", o->out, "output GGUF")->required();
    c->add_option("--type", o->type, "auto (keep each matrix's dtype) | f32 | f16 | bf16 | q8_0 | q4_k | q4_k_m")
        ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "q8_0", "q4_k", "q4_k_m"}));
    c->add_option("-t,--threads", o->threads, "threads (0: all)")->check(CLI::Range(0, 4096));
    c->callback([o] {
        hf::convert_options co;
        co.type = o->type;
        co.threads = o->threads;
        co.warn = &warn;
        co.progress = [](std::size_t i, std::size_t n, std::uint64_t done, std::uint64_t total) {
            if (i == n || i % 16 == 0)
                std::fprintf(stderr, "\rconvert: %zu/%zu tensors, %s of %s", i, n, gb(done).c_str(), gb(total).c_str());
        };
        const hf::convert_result r = convert_hf(o->dir, o->out, co);
        std::fprintf(stderr, "\nconvert: wrote %s (%s, %zu tensors, %s) in %.1f s\n", o->out.c_str(), r.arch.c_str(), r.n_tensors,
                     gb(r.bytes).c_str(), r.seconds);
    });
}

}  // namespace clover::cli
