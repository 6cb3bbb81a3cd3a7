#pragma once
// Hyper-parameters of a Qwen3.5/3.6-MoE or Clover file, read from GGUF metadata under the
// architecture's key prefix (`qwen35moe.` or `clover_moe.`; architecture.md §3.2,
// clover-diffusion.md §6). Everything is validated here, once, so layers can trust the sizes.
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/io/gguf.hpp"

namespace clover {

struct hparams {
    std::string arch;  // "qwen35moe" or "clover_moe"
    std::int64_t n_vocab = 0, n_embd = 0, n_layer = 0, n_ctx_train = 0;
    // gated attention
    std::int64_t n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
    std::array<int, 4> rope_sections{0, 0, 0, 0};  // all zero: plain NEOX (no multi-section rope)
    float rope_theta = 10000.f, rms_eps = 1e-6f, attn_scale = 0.f;  // attn_scale 0: 1/sqrt(head_dim)
    // Gated DeltaNet
    std::int64_t ssm_conv = 0, ssm_d_state = 0, ssm_n_group = 0, ssm_dt_rank = 0, ssm_d_inner = 0;
    // MoE
    std::int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0, n_expert_shared = 1;
    std::vector<bool> recurrent;  // per layer: GDN (true) or full attention (false)
    // V-head order of the GDN tensors: GGUF files are tiled (V slot h pairs with QK head
    // h mod n_qk); HF checkpoints are grouped (h / (n_v/n_qk)). architecture.md §3.5.
    bool gdn_grouped_heads = false;
    // block diffusion (clover_moe)
    std::int64_t diffusion_block = 32, diffusion_coreset = 16, mask_token_id = -1;
    float diffusion_threshold = 0.95f;

    // Derived GDN sizes.
    std::int64_t gdn_dk() const { return ssm_d_state; }
    std::int64_t gdn_dv() const { return ssm_d_inner / ssm_dt_rank; }
    std::int64_t gdn_qk_heads() const { return ssm_n_group; }
    std::int64_t gdn_v_heads() const { return ssm_dt_rank; }
    std::int64_t gdn_conv_channels() const { return 2 * ssm_n_group * ssm_d_state + ssm_d_inner; }
    std::int64_t gdn_qk_head_of(std::int64_t v_head) const {
        return gdn_grouped_heads ? v_head / (ssm_dt_rank / ssm_n_group) : v_head % ssm_n_group;
    }
    std::int64_t n_attention_layers() const {
        std::int64_t n = 0;
        for (bool r : recurrent) n += !r;
        return n;
    }
    bool is_clover() const { return arch == "clover_moe"; }
};

namespace detail {
inline std::int64_t require_int(const io::gguf_file& f, const std::string& key, std::int64_t lo, std::int64_t hi) {
    auto v = f.get_int(key);
    if (!v) fail(f.path(), ": key not found: ", key);
    if (*v < lo || *v > hi) fail(f.path(), ": key ", key, " = ", *v, " is out of range [", lo, ", ", hi, "]");
    return *v;
}
inline std::int64_t optional_int(const io::gguf_file& f, const std::string& key, std::int64_t def, std::int64_t lo, std::int64_t hi) {
    if (!f.has(key)) return def;
    return require_int(f, key, lo, hi);
}
}  // namespace detail

// Reads and checks the hyper-parameters. Warnings (defaults taken for keys the vendor's files
// are known to omit) go to `warn`.
inline hparams read_hparams(const io::gguf_file& f, void (*warn)(const std::string&) = nullptr) {
    using detail::optional_int;
    using detail::require_int;
    hparams h;
    auto arch = f.get_string("general.architecture");
    if (!arch) fail(f.path(), ": key not found: general.architecture");
    if (*arch != "qwen35moe" && *arch != "clover_moe")
        fail(f.path(), ": architecture '", *arch, "' is not supported (expected qwen35moe or clover_moe)");
    h.arch = *arch;
    const std::string p = h.arch + ".";
    constexpr std::int64_t big = std::int64_t(1) << 31;
    h.n_embd = require_int(f, p + "embedding_length", 1, 1 << 20);
    h.n_layer = require_int(f, p + "block_count", 1, 4096);
    h.n_ctx_train = optional_int(f, p + "context_length", 262144, 1, big);
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

    h.ssm_conv = require_int(f, p + "ssm.conv_kernel", 1, 64);
    h.ssm_d_state = require_int(f, p + "ssm.state_size", 1, 4096);
    h.ssm_n_group = require_int(f, p + "ssm.group_count", 1, 4096);
    h.ssm_dt_rank = require_int(f, p + "ssm.time_step_rank", 1, 4096);
    h.ssm_d_inner = require_int(f, p + "ssm.inner_size", 1, 1 << 20);
    if (h.ssm_dt_rank % h.ssm_n_group != 0)
        fail(f.path(), ": ssm.time_step_rank (V heads) ", h.ssm_dt_rank, " is not a multiple of ssm.group_count (QK heads) ", h.ssm_n_group);
    if (h.ssm_d_inner % h.ssm_dt_rank != 0)
        fail(f.path(), ": ssm.inner_size ", h.ssm_d_inner, " is not a multiple of ssm.time_step_rank ", h.ssm_dt_rank);

    h.n_expert = require_int(f, p + "expert_count", 1, 1 << 16);
    h.n_expert_used = require_int(f, p + "expert_used_count", 1, h.n_expert);
    h.n_ff_exp = require_int(f, p + "expert_feed_forward_length", 1, 1 << 20);
    h.n_ff_shexp = optional_int(f, p + "expert_shared_feed_forward_length", 0, 0, 1 << 20);
    if (h.is_clover() && !f.has(p + "expert_shared_count")) {
        if (warn) warn(f.path() + ": clover_moe.expert_shared_count missing; using 1 (as the vendor's files imply)");
        h.n_expert_shared = 1;
    } else {
        h.n_expert_shared = optional_int(f, p + "expert_shared_count", 1, 0, 1);
    }

    // Our key (written by load_hf and `clover gguf patch`): "grouped" = the V heads of the GDN
    // tensors are in HF order; "tiled" or absent = the canonical GGUF order.
    if (auto order = f.get_string(p + "gdn.v_head_order")) {
        if (*order != "tiled" && *order != "grouped")
            fail(f.path(), ": key ", p, "gdn.v_head_order = '", *order, "' (expected tiled or grouped)");
        h.gdn_grouped_heads = *order == "grouped";
    }

    h.recurrent.assign(std::size_t(h.n_layer), false);
    if (auto rl = f.get_int_array(p + "attention.recurrent_layers")) {
        if (std::int64_t(rl->size()) < h.n_layer)
            fail(f.path(), ": attention.recurrent_layers has ", rl->size(), " entries for ", h.n_layer, " layers");
        for (std::int64_t i = 0; i < h.n_layer; ++i) h.recurrent[i] = (*rl)[i] != 0;
    } else {
        std::int64_t interval = optional_int(f, p + "full_attention_interval", 4, 1, 4096);
        for (std::int64_t i = 0; i < h.n_layer; ++i) h.recurrent[i] = (i + 1) % interval != 0;
    }
    std::int64_t nextn = optional_int(f, p + "nextn_predict_layers", 0, 0, h.n_layer - 1);
    if (nextn > 0) {  // the MTP block is stored as extra trailing layers; the main pass skips them
        h.n_layer -= nextn;
        h.recurrent.resize(std::size_t(h.n_layer));
    }

    if (h.is_clover()) {
        h.diffusion_block = optional_int(f, p + "diffusion.block_size", 32, 1, 4096);
        if (auto t = f.get_float(p + "diffusion.threshold")) h.diffusion_threshold = float(*t);
        h.diffusion_coreset = optional_int(f, p + "diffusion.expert_coreset", 16, 0, h.n_expert);
        h.mask_token_id = optional_int(f, p + "diffusion.mask_token_id", -1, 0, big);
    }
    return h;
}

}  // namespace clover
