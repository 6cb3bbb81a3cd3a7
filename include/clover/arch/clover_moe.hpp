#pragma once
// The clover_moe architecture (Clover, block diffusion over the qwen35moe decoder;
// clover-diffusion.md §6): qwen35moe's keys under the prefix `clover_moe.`, its layer pattern
// and tensors, plus the diffusion keys (block size, expert coreset, confidence threshold, mask
// token) and the block-diffusion tensors of every GDN layer. Those tensors are optional: a file
// without them still runs causally, and the model names the missing ones when asked to preview.
#include <memory>
#include <string>
#include <utility>

#include "clover/arch/model_weights.hpp"
#include "clover/arch/qwen35moe.hpp"
#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"
#include "clover/layers/gated_deltanet.hpp"
#include "clover/schema/hparams.hpp"
#include "clover/schema/weights.hpp"

namespace clover::arch {

struct clover_moe {
    static constexpr const char* name = "clover_moe";

    static hparams read_hparams(const io::gguf_file& f, warn_fn warn) {
        using detail::optional_int;
        hparams h;
        h.arch = name;
        const std::string p = h.arch + ".";
        // The vendor's files omit expert_shared_count; they have one shared expert.
        qwen35moe::read_keys(f, h, [&] {
            if (warn) warn(f.path() + ": " + p + "expert_shared_count missing; using 1 (as the vendor's files imply)");
        });
        qwen35moe::read_layer_pattern(f, h);
        constexpr std::int64_t big = std::int64_t(1) << 31;
        h.diffusion_block = optional_int(f, p + "diffusion.block_size", 32, 1, 4096);
        if (auto t = f.get_float(p + "diffusion.threshold")) h.diffusion_threshold = float(*t);
        h.diffusion_coreset = optional_int(f, p + "diffusion.expert_coreset", 16, 0, h.n_expert);
        h.mask_token_id = optional_int(f, p + "diffusion.mask_token_id", -1, 0, big);
        return h;
    }

    static model_weights bind_weights(std::shared_ptr<const io::gguf_file> file, hparams& h) {
        model_weights mw = qwen35moe::bind_layers(
            std::move(file), h, [&h](layers::gdn_weights& g, weight_binder& b, const std::string& p, model_weights& w) {
                g.bind_diffusion(b, p, h, w.missing_diffusion);
            });
        mw.diffusion_tensors = true;
        // n_vocab is known only once token_embd is bound.
        if (h.mask_token_id >= h.n_vocab)
            fail(mw.file->path(), ": diffusion.mask_token_id ", h.mask_token_id, " is not below n_vocab ", h.n_vocab);
        return mw;
    }
};

}  // namespace clover::arch
