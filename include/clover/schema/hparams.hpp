#pragma once
// Hyper-parameters of a Qwen3.5/3.6-MoE or Clover file (architecture.md §3.2,
// clover-diffusion.md §6) and the helpers that read GGUF keys with range checks. Which keys an
// architecture has is said by its header (arch/qwen35moe.hpp, arch/clover_moe.hpp); a file is
// read through arch/registry.hpp (read_hparams). Everything is validated there, once, so layers
// can trust the sizes.
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
    // The layer pattern as the file states it, per layer: GDN (true) or full attention (false).
    // Binding turns it into the layer's type (model_weights::layers[i].mixer); nothing after
    // binding reads it to choose a layer's code.
    std::vector<bool> recurrent;
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

// Where warnings go (defaults taken for keys the vendor's files are known to omit).
using warn_fn = void (*)(const std::string&);

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

}  // namespace clover
