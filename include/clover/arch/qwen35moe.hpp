#pragma once
// The qwen35moe architecture (Qwen3.5/3.6-MoE, as llama.cpp's converter writes it): the data
// that says what the model is. Keys under the prefix `qwen35moe.`; layers in the order of the
// layer pattern, each a token mixer (Gated DeltaNet or gated attention, by the pattern) and a
// sparse MoE, both pre-norm residual; tensors `blk.N.*` as each layer's weights type binds them
// (layers/*.hpp). clover_moe (arch/clover_moe.hpp) is this architecture plus block diffusion, so
// the readers below are written to be reused under its prefix.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "clover/arch/model_weights.hpp"
#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"
#include "clover/layers/gated_attention.hpp"
#include "clover/layers/gated_deltanet.hpp"
#include "clover/layers/sparse_moe.hpp"
#include "clover/schema/hparams.hpp"
#include "clover/schema/weights.hpp"

namespace clover::arch {

struct qwen35moe {
    static constexpr const char* name = "qwen35moe";

    static hparams read_hparams(const io::gguf_file& f, warn_fn /*no defaults worth a warning*/) {
        hparams h;
        h.arch = name;
        read_keys(f, h, [] {});
        read_layer_pattern(f, h);
        return h;
    }

    static model_weights bind_weights(std::shared_ptr<const io::gguf_file> file, hparams& h) {
        return bind_layers(std::move(file), h, [](layers::gdn_weights&, weight_binder&, const std::string&, model_weights&) {});
    }

    // The family's keys under the prefix h.arch + "." (h.arch set by the caller), in the order
    // they are checked. on_missing_shared_count() runs when expert_shared_count is absent, before
    // any later key can fail (clover_moe warns there).
    template <class OnMissingSharedCount>
    static void read_keys(const io::gguf_file& f, hparams& h, OnMissingSharedCount&& on_missing_shared_count) {
        using detail::optional_int;
        using detail::require_int;
        const std::string p = h.arch + ".";
        constexpr std::int64_t big = std::int64_t(1) << 31;
        h.n_embd = require_int(f, p + "embedding_length", 1, 1 << 20);
        h.n_layer = require_int(f, p + "block_count", 1, 4096);
        h.n_ctx_train = optional_int(f, p + "context_length", 262144, 1, big);

        // gated attention
        h.n_head = require_int(f, p + "attention.head_count", 1, 4096);
        h.n_head_kv = require_int(f, p + "attention.head_count_kv", 1, 4096);
        h.head_dim = optional_int(f, p + "attention.key_length", h.n_embd / h.n_head, 1, 1 << 16);
        std::int64_t vdim = optional_int(f, p + "attention.value_length", h.head_dim, 1, 1 << 16);
        if (vdim != h.head_dim) fail(f.path(), ": attention.value_length ", vdim, " differs from key_length ", h.head_dim);
        if (h.n_head % h.n_head_kv != 0)
            fail(f.path(), ": attention.head_count ", h.n_head, " is not a multiple of head_count_kv ", h.n_head_kv);
        h.n_rot = optional_int(f, p + "rope.dimension_count", h.head_dim, 2, h.head_dim);
        if (h.n_rot % 2 != 0) fail(f.path(), ": rope.dimension_count ", h.n_rot, " must be even");
        if (auto th = f.get_float(p + "rope.freq_base")) h.rope_theta = float(*th);
        if (auto e = f.get_float(p + "attention.layer_norm_rms_epsilon")) h.rms_eps = float(*e);
        else fail(f.path(), ": key not found: ", p, "attention.layer_norm_rms_epsilon");
        if (auto s = f.get_float(p + "attention.scale")) h.attn_scale = float(*s);
        if (auto sec = f.get_int_array(p + "rope.dimension_sections")) {
            if (sec->size() > 4) fail(f.path(), ": rope.dimension_sections has ", sec->size(), " entries (at most 4)");
            std::int64_t sum = 0;
            for (std::size_t i = 0; i < sec->size(); ++i) {
                if ((*sec)[i] < 0) fail(f.path(), ": rope.dimension_sections has a negative entry");
                h.rope_sections[i] = int((*sec)[i]);
                sum += (*sec)[i];
            }
            if (sum == 0) fail(f.path(), ": rope.dimension_sections are all zero");
            if (sum > h.n_rot / 2) fail(f.path(), ": rope.dimension_sections sum ", sum, " exceeds rope.dimension_count/2 = ", h.n_rot / 2);
        }

        // Gated DeltaNet
        h.ssm_conv = require_int(f, p + "ssm.conv_kernel", 1, 64);
        h.ssm_d_state = require_int(f, p + "ssm.state_size", 1, 4096);
        h.ssm_n_group = require_int(f, p + "ssm.group_count", 1, 4096);
        h.ssm_dt_rank = require_int(f, p + "ssm.time_step_rank", 1, 4096);
        h.ssm_d_inner = require_int(f, p + "ssm.inner_size", 1, 1 << 20);
        if (h.ssm_dt_rank % h.ssm_n_group != 0)
            fail(f.path(), ": ssm.time_step_rank (V heads) ", h.ssm_dt_rank, " is not a multiple of ssm.group_count (QK heads) ", h.ssm_n_group);
        if (h.ssm_d_inner % h.ssm_dt_rank != 0)
            fail(f.path(), ": ssm.inner_size ", h.ssm_d_inner, " is not a multiple of ssm.time_step_rank ", h.ssm_dt_rank);

        // MoE
        h.n_expert = require_int(f, p + "expert_count", 1, 1 << 16);
        h.n_expert_used = require_int(f, p + "expert_used_count", 1, h.n_expert);
        h.n_ff_exp = require_int(f, p + "expert_feed_forward_length", 1, 1 << 20);
        h.n_ff_shexp = optional_int(f, p + "expert_shared_feed_forward_length", 0, 0, 1 << 20);
        if (!f.has(p + "expert_shared_count")) on_missing_shared_count();
        h.n_expert_shared = optional_int(f, p + "expert_shared_count", 1, 0, 1);

        // Our key (written by load_hf and `clover gguf patch`): "grouped" = the V heads of the GDN
        // tensors are in HF order; "tiled" or absent = the canonical GGUF order.
        if (auto order = f.get_string(p + "gdn.v_head_order")) {
            if (*order != "tiled" && *order != "grouped")
                fail(f.path(), ": key ", p, "gdn.v_head_order = '", *order, "' (expected tiled or grouped)");
            h.gdn_grouped_heads = *order == "grouped";
        }
    }

    // The layer kinds in order: attention.recurrent_layers when the file has it (a flag per
    // layer), else every full_attention_interval-th layer is attention and the rest GDN. The
    // trailing MTP layers (nextn_predict_layers) are not part of the main pass.
    static void read_layer_pattern(const io::gguf_file& f, hparams& h) {
        using detail::optional_int;
        const std::string p = h.arch + ".";
        h.recurrent.assign(std::size_t(h.n_layer), false);
        if (auto rl = f.get_int_array(p + "attention.recurrent_layers")) {
            if (std::int64_t(rl->size()) < h.n_layer)
                fail(f.path(), ": attention.recurrent_layers has ", rl->size(), " entries for ", h.n_layer, " layers");
            for (std::int64_t i = 0; i < h.n_layer; ++i) h.recurrent[std::size_t(i)] = (*rl)[std::size_t(i)] != 0;
        } else {
            std::int64_t interval = optional_int(f, p + "full_attention_interval", 4, 1, 4096);
            for (std::int64_t i = 0; i < h.n_layer; ++i) h.recurrent[std::size_t(i)] = (i + 1) % interval != 0;
        }
        std::int64_t nextn = optional_int(f, p + "nextn_predict_layers", 0, 0, h.n_layer - 1);
        if (nextn > 0) {  // the MTP block is stored as extra trailing layers; the main pass skips them
            h.n_layer -= nextn;
            h.recurrent.resize(std::size_t(h.n_layer));
        }
    }

    // Binds the whole decoder, layer by layer in file order, so the first bad tensor is the one
    // reported. The pattern becomes each layer's type here, once. gdn_extra(g, binder, prefix,
    // weights) runs right after a GDN layer's own tensors (clover_moe binds its extras there).
    template <class GdnExtra>
    static model_weights bind_layers(std::shared_ptr<const io::gguf_file> file, hparams& h, GdnExtra&& gdn_extra) {
        model_weights mw;
        mw.file = std::move(file);
        const io::gguf_file& f = *mw.file;
        weight_binder b = mw.binder();
        // n_vocab is not a key: the embedding's rows say it.
        const io::gguf_tensor* emb = f.find_tensor("token_embd.weight");
        if (!emb) fail(f.path(), ": missing tensor 'token_embd.weight'");
        if (emb->n_dims != 2 || emb->ne[0] != h.n_embd)
            fail(f.path(), ": tensor 'token_embd.weight' has shape ", emb->shape_string(), ", expected {", h.n_embd, ", n_vocab}");
        h.n_vocab = emb->ne[1];
        const std::int64_t E = h.n_embd, V = h.n_vocab;
        mw.tok_embd = b.matrix("token_embd.weight", {E, V});
        mw.output_norm = b.vector_f32("output_norm.weight", {E});
        mw.output = b.matrix("output.weight", {E, V}, false);
        if (!mw.output) mw.output = mw.tok_embd;  // tied embeddings

        for (std::int64_t il = 0; il < h.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            layer_weights L;
            L.attn_norm = b.vector_f32(p + "attn_norm.weight", {E});
            L.post_norm = b.vector_f32(p + "post_attention_norm.weight", {E});
            if (h.recurrent[std::size_t(il)]) {
                layers::gdn_weights g = layers::gdn_weights::bind(b, p, h);
                gdn_extra(g, b, p, mw);
                L.mixer = std::move(g);
            } else {
                L.mixer = layers::attention_weights::bind(b, p, h);
            }
            L.moe = layers::moe_weights::bind(b, p, h);
            mw.layers.push_back(std::move(L));
        }
        return mw;
    }
};

}  // namespace clover::arch
