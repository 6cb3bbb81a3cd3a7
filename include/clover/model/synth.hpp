#pragma once
// `clover gguf synth`: random-weight models of real shapes, for tests and benchmarks. The file
// is a complete qwen35moe / clover_moe GGUF — metadata, a byte-level BPE vocabulary that other
// engines accept, every tensor of architecture.md §3.3 (and the block-diffusion tensors for
// clover_moe) — so the same file runs through clover and llama.cpp.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/core/rng.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/quant/rows.hpp"

namespace clover::synth {

struct spec {
    std::string arch = "qwen35moe";  // or clover_moe
    std::string preset = "tiny";
    std::int64_t n_vocab = 512, n_embd = 64, n_layer = 4, interval = 4;
    std::int64_t n_head = 4, n_head_kv = 2, head_dim = 32, n_rot = 8;
    std::vector<std::int64_t> sections{2, 1, 1, 0};
    float rope_theta = 10000000.f, rms_eps = 1e-6f;
    std::int64_t ssm_conv = 4, ssm_d_state = 16, ssm_n_group = 2, ssm_dt_rank = 4, ssm_d_inner = 64;
    std::int64_t n_expert = 8, n_expert_used = 2, n_ff_exp = 32, n_ff_shexp = 32;
    dtype type = dtype::f32;   // matrices; vectors are always F32
    bool q4_k_m = false;       // type = Q4_K with llama.cpp's Q4_K_M mix (detail::mix_type)
    std::uint64_t seed = 42;
    bool tie_embeddings = false;
};

// Presets: `tiny` (unit tests) and `clover-35b-a3b` (the real dimensions; use `layers` to cut depth).
inline spec preset(const std::string& name) {
    spec s;
    s.preset = name;
    if (name == "tiny") return s;
    if (name == "clover-35b-a3b" || name == "qwen36-35b-a3b") {
        s.n_vocab = 248320; s.n_embd = 2048; s.n_layer = 40; s.interval = 4;
        s.n_head = 16; s.n_head_kv = 2; s.head_dim = 256; s.n_rot = 64; s.sections = {11, 11, 10, 0};
        s.ssm_conv = 4; s.ssm_d_state = 128; s.ssm_n_group = 16; s.ssm_dt_rank = 32; s.ssm_d_inner = 4096;
        s.n_expert = 256; s.n_expert_used = 8; s.n_ff_exp = 512; s.n_ff_shexp = 512;
        return s;
    }
    fail("synth: unknown preset '", name, "' (known: tiny, clover-35b-a3b)");
}

// The special tokens every synthetic vocabulary ends with (ids n_vocab-7 .. n_vocab-1).
inline const std::vector<std::string>& special_tokens() {
    static const std::vector<std::string> s = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                               "</think>", "<|mask|>", "<|fim_pad|>"};
    return s;
}

namespace detail {

// GPT-2 byte -> printable code point map, UTF-8 encoded.
inline std::string byte_token(int b) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; ++x)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
        cp = 256 + n;
    }
    std::string out;
    if (cp < 0x80) out += char(cp);
    else { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    return out;
}

// A valid byte-level BPE vocabulary: 256 byte tokens, merges of earlier tokens (letters first,
// so ordinary text merges), then the special tokens.
inline void vocab(std::int64_t n_vocab, std::vector<std::string>& tokens, std::vector<std::int64_t>& types,
                  std::vector<std::string>& merges) {
    const std::int64_t n_special = std::int64_t(special_tokens().size());
    if (n_vocab < 256 + n_special) fail("synth: n_vocab must be at least ", 256 + n_special);
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b));
    std::string order = " etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789.,_()=:";
    std::vector<std::string> base;
    for (char c : order) base.push_back(byte_token((unsigned char)c));
    const std::int64_t n_merge = n_vocab - 256 - n_special;
    std::vector<std::string> made;
    // Pairs (a, b) of base symbols, then (merged, base) pairs, until the vocabulary is full.
    for (std::size_t level = 0; std::int64_t(merges.size()) < n_merge; ++level) {
        const std::vector<std::string> left = level == 0 ? base : made;
        std::vector<std::string> next;
        for (const auto& a : left) {
            for (const auto& b : base) {
                if (std::int64_t(merges.size()) >= n_merge) break;
                merges.push_back(a + " " + b);
                tokens.push_back(a + b);
                next.push_back(a + b);
            }
            if (std::int64_t(merges.size()) >= n_merge) break;
        }
        made = std::move(next);
    }
    types.assign(tokens.size(), 1);  // normal
    for (const auto& s : special_tokens()) {
        tokens.push_back(s);
        types.push_back(3);  // control
    }
}

// A K-quant needs rows of whole 256-blocks. llama.cpp falls back to Q5_0/Q5_1/Q8_0 for Q4_K/Q5_K/Q6_K
// on narrower rows; we have no Q5_0/Q5_1, so every K-quant falls back to Q8_0 (then F16).
inline dtype fit_type(dtype t, std::int64_t cols) {
    if (cols % quant::row_granule(t) == 0) return t;
    return cols % 32 == 0 ? dtype::q8_0 : dtype::f16;
}

// llama.cpp's "more bits" layers (llama_tensor_get_type_impl in src/llama-quant.cpp of the
// v0.5.0 source bundle): the first and last eighth, and every third layer in between.
constexpr bool use_more_bits(std::int64_t i, std::int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The Q4_K_M mix as llama.cpp applies it to a qwen35moe model (same source):
//   output.weight (and token_embd when tied) -> Q6_K;
//   attn_v / attn_qkv (one counter over both, in file order: GDN layers have attn_qkv, which
//     llama.cpp counts as "attention-v-like") -> Q6_K where use_more_bits(counter, total);
//   ffn_down* (ffn_down_exps and ffn_down_shexp) -> Q6_K where use_more_bits(layer, n_layer);
//   ffn_gate_inp (the router) is never quantized (F32, as the converter writes it);
//   everything else Q4_K. (The 8-expert-only rules do not apply: 256 experts.)
inline dtype mix_type(const spec& s, const std::string& name, std::int64_t layer, std::int64_t wv_index) {
    if (!s.q4_k_m) return s.type;
    auto has = [&](const char* k) { return name.find(k) != std::string::npos; };
    if (name == "output.weight" || (s.tie_embeddings && name == "token_embd.weight")) return dtype::q6_k;
    if (has("ffn_gate_inp.weight")) return dtype::f32;
    if (has("attn_v.weight") || has("attn_qkv.weight")) return use_more_bits(wv_index, s.n_layer) ? dtype::q6_k : dtype::q4_k;
    if (has("ffn_down")) return use_more_bits(layer, s.n_layer) ? dtype::q6_k : dtype::q4_k;
    return dtype::q4_k;
}

}  // namespace detail

// Writes the model to `out`. progress(i, n) after each tensor.
inline void write(const spec& s, const std::filesystem::path& out,
                  const std::function<void(std::size_t, std::size_t)>& progress = {}) {
    if (s.arch != "qwen35moe" && s.arch != "clover_moe") fail("synth: unknown --arch '", s.arch, "' (qwen35moe or clover_moe)");
    if (!quant::is_supported_weight(s.type)) fail("synth: --type ", dtype_name(s.type), " is not supported yet");
    const bool clover = s.arch == "clover_moe";
    io::gguf_writer w;
    const std::string p = s.arch + ".";
    w.set_string("general.architecture", s.arch);
    w.set_string("general.name", "clover-synth-" + s.preset);
    // llama_ftype: F32 0, F16 1, Q8_0 7, Q4_K_S 14 (pure Q4_K), Q4_K_M 15, Q5_K_S 16, Q6_K 18, BF16 32
    w.set_u32("general.file_type", s.q4_k_m ? 15 : s.type == dtype::f32 ? 0 : s.type == dtype::f16 ? 1 : s.type == dtype::q8_0 ? 7
                                   : s.type == dtype::q4_k ? 14 : s.type == dtype::q5_k ? 16 : s.type == dtype::q6_k ? 18 : 32);
    w.set_u32(p + "block_count", std::uint32_t(s.n_layer));
    w.set_u32(p + "context_length", 262144);
    w.set_u32(p + "embedding_length", std::uint32_t(s.n_embd));
    w.set_u32(p + "attention.head_count", std::uint32_t(s.n_head));
    w.set_u32(p + "attention.head_count_kv", std::uint32_t(s.n_head_kv));
    w.set_u32(p + "attention.key_length", std::uint32_t(s.head_dim));
    w.set_u32(p + "attention.value_length", std::uint32_t(s.head_dim));
    w.set_f32(p + "attention.layer_norm_rms_epsilon", s.rms_eps);
    w.set_f32(p + "rope.freq_base", s.rope_theta);
    w.set_u32(p + "rope.dimension_count", std::uint32_t(s.n_rot));
    w.set_int_array(p + "rope.dimension_sections", io::gguf_type::i32, s.sections);
    w.set_u32(p + "expert_count", std::uint32_t(s.n_expert));
    w.set_u32(p + "expert_used_count", std::uint32_t(s.n_expert_used));
    w.set_u32(p + "expert_feed_forward_length", std::uint32_t(s.n_ff_exp));
    w.set_u32(p + "expert_shared_feed_forward_length", std::uint32_t(s.n_ff_shexp));
    w.set_u32(p + "ssm.conv_kernel", std::uint32_t(s.ssm_conv));
    w.set_u32(p + "ssm.state_size", std::uint32_t(s.ssm_d_state));
    w.set_u32(p + "ssm.group_count", std::uint32_t(s.ssm_n_group));
    w.set_u32(p + "ssm.time_step_rank", std::uint32_t(s.ssm_dt_rank));
    w.set_u32(p + "ssm.inner_size", std::uint32_t(s.ssm_d_inner));
    w.set_u32(p + "full_attention_interval", std::uint32_t(s.interval));
    std::vector<std::string> tokens, merges;
    std::vector<std::int64_t> types;
    detail::vocab(s.n_vocab, tokens, types, merges);
    const std::int64_t first_special = s.n_vocab - std::int64_t(special_tokens().size());
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen35");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_int_array("tokenizer.ggml.token_type", io::gguf_type::i32, types);
    w.set_string_array("tokenizer.ggml.merges", merges);
    w.set_u32("tokenizer.ggml.bos_token_id", std::uint32_t(first_special));
    w.set_u32("tokenizer.ggml.eos_token_id", std::uint32_t(first_special + 2));
    w.set_u32("tokenizer.ggml.padding_token_id", std::uint32_t(first_special));
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    if (clover) {
        w.set_u32(p + "expert_shared_count", 1);
        w.set_u32(p + "diffusion.block_size", 32);
        w.set_f32(p + "diffusion.threshold", 0.95f);
        w.set_u32(p + "diffusion.mask_token_id", std::uint32_t(first_special + 5));
        w.set_u32(p + "diffusion.expert_coreset", std::uint32_t(std::min<std::int64_t>(16, s.n_expert)));
    }

    // Each tensor gets its own seed (seed, tensor index), so files of different types share values.
    std::uint64_t tensor_no = 0;
    auto add = [&](const std::string& name, std::vector<std::int64_t> ne, dtype t, std::function<float(rng&)> gen) {
        t = detail::fit_type(t, ne[0]);
        const std::uint64_t seed = s.seed * 1000003ull + tensor_no++;
        w.add_tensor(name, t, ne, [=](std::span<std::byte> dst) {
            rng r(seed);
            const std::int64_t cols = ne[0];
            const std::size_t rb = quant::row_bytes(t, cols);
            std::vector<float> row(static_cast<std::size_t>(cols));
            for (std::size_t off = 0; off < dst.size(); off += rb) {
                for (auto& x : row) x = gen(r);
                quant::quantize_row(t, row.data(), dst.data() + off, cols);
            }
        });
    };
    std::int64_t layer = -1, wv_index = 0;  // for the Q4_K_M mix
    auto mat = [&](const std::string& name, std::vector<std::int64_t> ne) {
        const float a = std::sqrt(3.f / float(ne[0]));  // unit-variance outputs for unit inputs
        const dtype t = detail::mix_type(s, name, layer, wv_index);
        if (name.find("attn_v.weight") != std::string::npos || name.find("attn_qkv.weight") != std::string::npos) ++wv_index;
        add(name, ne, t, [a](rng& r) { return r.uniform(-a, a); });
    };
    auto vec = [&](const std::string& name, std::vector<std::int64_t> ne, float lo, float hi) {
        add(name, ne, dtype::f32, [lo, hi](rng& r) { return r.uniform(lo, hi); });
    };
    const std::int64_t E = s.n_embd, Vv = s.n_vocab, hd = s.head_dim;
    const std::int64_t C = 2 * s.ssm_n_group * s.ssm_d_state + s.ssm_d_inner, Hv = s.ssm_dt_rank;
    add("token_embd.weight", {E, Vv}, detail::mix_type(s, "token_embd.weight", -1, 0), [](rng& r) { return r.uniform(-1.f, 1.f); });
    vec("output_norm.weight", {E}, 0.8f, 1.2f);
    if (!s.tie_embeddings) mat("output.weight", {E, Vv});
    for (std::int64_t il = 0; il < s.n_layer; ++il) {
        layer = il;
        const std::string b = "blk." + std::to_string(il) + ".";
        vec(b + "attn_norm.weight", {E}, 0.8f, 1.2f);
        vec(b + "post_attention_norm.weight", {E}, 0.8f, 1.2f);
        if ((il + 1) % s.interval == 0) {
            mat(b + "attn_q.weight", {E, 2 * s.n_head * hd});
            mat(b + "attn_k.weight", {E, s.n_head_kv * hd});
            mat(b + "attn_v.weight", {E, s.n_head_kv * hd});
            mat(b + "attn_output.weight", {s.n_head * hd, E});
            vec(b + "attn_q_norm.weight", {hd}, 0.8f, 1.2f);
            vec(b + "attn_k_norm.weight", {hd}, 0.8f, 1.2f);
        } else {
            mat(b + "attn_qkv.weight", {E, C});
            mat(b + "attn_gate.weight", {E, s.ssm_d_inner});
            mat(b + "ssm_beta.weight", {E, Hv});
            mat(b + "ssm_alpha.weight", {E, Hv});
            vec(b + "ssm_conv1d.weight", {s.ssm_conv, C}, -0.5f, 0.5f);
            vec(b + "ssm_dt.bias", {Hv}, -4.f, -1.f);
            add(b + "ssm_a", {Hv}, dtype::f32, [](rng& r) { return -std::exp(r.uniform(-2.f, 1.f)); });
            vec(b + "ssm_norm.weight", {s.ssm_d_inner / Hv}, 0.8f, 1.2f);
            mat(b + "ssm_out.weight", {s.ssm_d_inner, E});
            if (clover) {
                vec(b + "ssm_conv1d_right.weight", {s.ssm_conv - 1, C}, -0.3f, 0.3f);
                vec(b + "ssm_bd_logit_scale", {Hv}, 1.f, 4.f);
                vec(b + "ssm_bd_history_bias", {Hv}, -1.f, 1.f);
                vec(b + "ssm_bd_history_c", {Hv}, 0.5f, 1.5f);
            }
        }
        mat(b + "ffn_gate_inp.weight", {E, s.n_expert});
        mat(b + "ffn_gate_exps.weight", {E, s.n_ff_exp, s.n_expert});
        mat(b + "ffn_up_exps.weight", {E, s.n_ff_exp, s.n_expert});
        mat(b + "ffn_down_exps.weight", {s.n_ff_exp, E, s.n_expert});
        vec(b + "ffn_gate_inp_shexp.weight", {E}, -0.2f, 0.2f);
        mat(b + "ffn_gate_shexp.weight", {E, s.n_ff_shexp});
        mat(b + "ffn_up_shexp.weight", {E, s.n_ff_shexp});
        mat(b + "ffn_down_shexp.weight", {s.n_ff_shexp, E});
    }
    w.write(out, progress);
}

}  // namespace clover::synth
