#pragma once
// Test fixtures for the HF loader, `convert` and `gguf patch`, all made from a canonical
// synthesized GGUF by the inverse of the converter's transformations (io/canonical_form.hpp):
//  - write_safetensors: one .safetensors file from (name, dtype, shape, bytes) entries;
//  - make_hf_folder: config.json (wrapped or flat), 1..n shards + index, tokenizer.json and
//    tokenizer_config.json, from a GGUF: norms − 1, ssm_a → A_log, tiled → grouped V heads,
//    gate + up → packed gate_up_proj (or one tensor per expert), plus mtp.* / vision tensors
//    the loader must skip;
//  - rewrite_gguf: the vendor-file variants of a canonical file (key dropped, norms − 1,
//    ssm_a as A_log, grouped V heads), and the "settled" canonical file whose ssm_a is exactly
//    −exp(A_log) of the variant's A_log, so that patching back can be compared bit for bit.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <clover/io/canonical_form.hpp>
#include <clover/io/gguf.hpp>
#include <clover/io/gguf_writer.hpp>
#include <clover/arch/registry.hpp>
#include <clover/quant/rows.hpp>
#include <clover/tokenizer/pretokenizer.hpp>

namespace hftest {

namespace fs = std::filesystem;
using namespace clover;

struct st_entry {
    std::string name, dtype;  // "F32", "BF16", "F16"
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;
};

inline std::string json_escape(std::string_view s) {
    std::string o = "\"";
    for (char c : s) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (c == '"') o += "\\\"";
        else if (c == '\\') o += "\\\\";
        else if (c == '\n') o += "\\n";
        else if (c == '\t') o += "\\t";
        else if (c == '\r') o += "\\r";
        else if (u < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", u); o += b; }
        else o += c;
    }
    return o + "\"";
}

inline void write_text(const fs::path& p, const std::string& s) {
    std::ofstream(p, std::ios::binary).write(s.data(), std::streamsize(s.size()));
}

// The header JSON for entries laid out back to back (with `gap` zero bytes after each).
inline std::string st_header(const std::vector<st_entry>& es, std::size_t gap = 0) {
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
    std::uint64_t off = 0;
    for (const auto& e : es) {
        // Appends only: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
        h += ',';
        h += json_escape(e.name);
        h += ":{\"dtype\":\"";
        h += e.dtype;
        h += "\",\"shape\":[";
        for (std::size_t i = 0; i < e.shape.size(); ++i) {
            if (i) h += ',';
            h += std::to_string(e.shape[i]);
        }
        h += "],\"data_offsets\":[";
        h += std::to_string(off);
        h += ',';
        h += std::to_string(off + e.bytes.size());
        h += "]}";
        off += e.bytes.size() + gap;
    }
    return h + "}";
}

// gap: zero bytes after each tensor (an odd gap breaks the element alignment of what follows).
inline std::vector<std::byte> safetensors_bytes(const std::vector<st_entry>& es, std::size_t gap = 0) {
    std::string h = st_header(es, gap);
    while ((h.size() + 8) % 8) h += ' ';  // the reference writer pads with spaces
    std::vector<std::byte> out(8);
    const std::uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    for (char c : h) out.push_back(std::byte(c));
    for (const auto& e : es) {
        out.insert(out.end(), e.bytes.begin(), e.bytes.end());
        out.insert(out.end(), gap, std::byte{0});
    }
    return out;
}

inline void write_safetensors(const fs::path& p, const std::vector<st_entry>& es, std::size_t gap = 0) {
    auto b = safetensors_bytes(es, gap);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

inline const char* st_dtype(dtype t) { return t == dtype::f32 ? "F32" : t == dtype::bf16 ? "BF16" : "F16"; }

inline std::vector<std::byte> encode(const std::vector<float>& v, dtype t) {
    std::vector<std::byte> b(quant::row_bytes(t, std::int64_t(v.size())));
    quant::quantize_row(t, v.data(), b.data(), std::int64_t(v.size()));
    return b;
}

inline std::vector<float> decode(const io::gguf_tensor& t) {
    std::vector<float> v(std::size_t(t.nelements()));
    for (std::int64_t r = 0; r < t.nrows(); ++r)
        quant::dequantize_row(t.type, t.data + std::size_t(r) * t.row_bytes(), v.data() + r * t.ne[0], t.ne[0]);
    return v;
}

struct hf_options {
    dtype small = dtype::f32;     // norms, conv, A_log, dt_bias, diffusion scalars, shared-expert gate
    bool wrapped = true;          // model.language_model. + text_config (else model. + flat config)
    bool packed = true;           // experts.gate_up_proj / down_proj (else experts.N.*_proj.weight)
    int shards = 2;               // with 1: a single model.safetensors without an index
    bool extras = true;           // mtp.* and vision tensors the loader must skip
    bool tokenizer = true;
    bool old_rope_style = false;  // rope_theta / partial_rotary_factor at the top, rope_scaling.mrope_section
    std::size_t gap = 0;          // bytes between tensors in the shards (odd: misaligned F32 views)
};

// The HF name and HF tensor of one GGUF tensor (or several, for experts).
inline void hf_tensors_of(const io::gguf_file& g, const io::gguf_tensor& t, const hparams& h, const hf_options& o,
                          std::vector<st_entry>& out) {
    const std::string base = o.wrapped ? "model.language_model." : "model.";
    const io::gdn_head_dims heads{h.gdn_qk_heads(), h.gdn_v_heads(), h.gdn_dk(), h.gdn_dv()};
    auto rev = [&](std::vector<std::int64_t> s) { return std::vector<std::int64_t>(s.rbegin(), s.rend()); };
    std::vector<std::int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    // Matrices keep the GGUF's bytes (rows moved for the V order).
    auto matrix = [&](const std::string& name, const io::v_perm& pm) {
        std::vector<std::byte> b(t.nbytes);
        io::v_permute_tensor(pm, t.type, t.ne.data(), {t.data, t.nbytes}, b, io::v_order::grouped, heads, t.name);
        out.push_back({name, st_dtype(t.type), rev(ne), std::move(b)});
    };
    // Vectors: inverse value transform, V order, then the small dtype.
    auto vec = [&](const std::string& name, std::vector<std::int64_t> hf_shape, int op, const io::v_perm& pm) {
        std::vector<float> v = decode(t);
        for (float& x : v) x = op == 1 ? io::zero_centred_norm(x) : op == 2 ? io::a_log_of(x) : x;
        std::vector<float> p(v.size());
        const std::int64_t ne0 = t.ne[0], rows = t.nrows();
        for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t sr = pm.axis == io::v_axis::rows ? io::v_source_index(pm, r, io::v_order::grouped, heads) : r;
            if (pm.axis == io::v_axis::cols) io::v_permute_cols_f32(pm, v.data() + sr * ne0, p.data() + r * ne0, ne0, io::v_order::grouped, heads);
            else std::copy_n(v.data() + sr * ne0, ne0, p.data() + r * ne0);
        }
        out.push_back({name, st_dtype(o.small), std::move(hf_shape), encode(p, o.small)});
    };
    const std::string& n = t.name;
    if (n == "token_embd.weight") return matrix(base + "embed_tokens.weight", {});
    if (n == "output.weight") return matrix("lm_head.weight", {});
    if (n == "output_norm.weight") return vec(base + "norm.weight", rev(ne), 1, {});
    const std::size_t dot = n.find('.', 4);
    const int il = std::stoi(n.substr(4, dot - 4));
    const std::string s = n.substr(dot + 1);
    const std::string L = base + "layers." + std::to_string(il) + ".";
    const io::v_perm pm = h.recurrent[std::size_t(il)] ? io::v_perm_of(s, heads) : io::v_perm{};
    const std::int64_t X = h.n_expert, F = h.n_ff_exp, E = h.n_embd, K = h.ssm_conv, C = h.gdn_conv_channels();
    if (s == "attn_norm.weight") return vec(L + "input_layernorm.weight", rev(ne), 1, {});
    if (s == "post_attention_norm.weight") return vec(L + "post_attention_layernorm.weight", rev(ne), 1, {});
    if (s == "attn_q.weight") return matrix(L + "self_attn.q_proj.weight", {});
    if (s == "attn_k.weight") return matrix(L + "self_attn.k_proj.weight", {});
    if (s == "attn_v.weight") return matrix(L + "self_attn.v_proj.weight", {});
    if (s == "attn_output.weight") return matrix(L + "self_attn.o_proj.weight", {});
    if (s == "attn_q_norm.weight") return vec(L + "self_attn.q_norm.weight", rev(ne), 1, {});
    if (s == "attn_k_norm.weight") return vec(L + "self_attn.k_norm.weight", rev(ne), 1, {});
    const std::string A = L + "linear_attn.";
    if (s == "attn_qkv.weight") return matrix(A + "in_proj_qkv.weight", pm);
    if (s == "attn_gate.weight") return matrix(A + "in_proj_z.weight", pm);
    if (s == "ssm_beta.weight") return matrix(A + "in_proj_b.weight", pm);
    if (s == "ssm_alpha.weight") return matrix(A + "in_proj_a.weight", pm);
    if (s == "ssm_out.weight") return matrix(A + "out_proj.weight", pm);
    if (s == "ssm_conv1d.weight") return vec(A + "conv1d.weight", {C, 1, K}, 0, pm);
    if (s == "ssm_conv1d_right.weight") return vec(A + "conv_right_weight", {C, 1, K - 1}, 0, pm);
    if (s == "ssm_dt.bias") return vec(A + "dt_bias", rev(ne), 0, pm);
    if (s == "ssm_a") return vec(A + "A_log", rev(ne), 2, pm);
    if (s == "ssm_norm.weight") return vec(A + "norm.weight", rev(ne), 0, {});
    if (s == "ssm_bd_logit_scale") return vec(A + "bd_softmax_logit_scale", rev(ne), 0, pm);
    if (s == "ssm_bd_history_bias") return vec(A + "bd_softmax_history_bias", rev(ne), 0, pm);
    if (s == "ssm_bd_history_c") return vec(A + "bd_softmax_history_c", rev(ne), 0, pm);
    const std::string M = L + "mlp.";
    if (s == "ffn_gate_inp.weight") return matrix(M + "gate.weight", {});
    if (s == "ffn_gate_inp_shexp.weight") return vec(M + "shared_expert_gate.weight", {1, E}, 0, {});
    if (s == "ffn_gate_shexp.weight") return matrix(M + "shared_expert.gate_proj.weight", {});
    if (s == "ffn_up_shexp.weight") return matrix(M + "shared_expert.up_proj.weight", {});
    if (s == "ffn_down_shexp.weight") return matrix(M + "shared_expert.down_proj.weight", {});
    const std::size_t rb = t.row_bytes();
    if (s == "ffn_gate_exps.weight") {
        const io::gguf_tensor& up = g.tensor("blk." + std::to_string(il) + ".ffn_up_exps.weight");
        if (o.packed) {
            std::vector<std::byte> b;
            for (std::int64_t e = 0; e < X; ++e) {
                b.insert(b.end(), t.data + std::size_t(e * F) * rb, t.data + std::size_t((e + 1) * F) * rb);
                b.insert(b.end(), up.data + std::size_t(e * F) * rb, up.data + std::size_t((e + 1) * F) * rb);
            }
            out.push_back({M + "experts.gate_up_proj", st_dtype(t.type), {X, 2 * F, E}, std::move(b)});
        } else {
            for (std::int64_t e = 0; e < X; ++e) {
                const std::string P = M + "experts." + std::to_string(e) + ".";
                out.push_back({P + "gate_proj.weight", st_dtype(t.type), {F, E},
                               std::vector<std::byte>(t.data + std::size_t(e * F) * rb, t.data + std::size_t((e + 1) * F) * rb)});
                out.push_back({P + "up_proj.weight", st_dtype(t.type), {F, E},
                               std::vector<std::byte>(up.data + std::size_t(e * F) * rb, up.data + std::size_t((e + 1) * F) * rb)});
            }
        }
        return;
    }
    if (s == "ffn_up_exps.weight") return;  // written with the gate
    if (s == "ffn_down_exps.weight") {
        if (o.packed) return matrix(M + "experts.down_proj", {});
        for (std::int64_t e = 0; e < X; ++e)
            out.push_back({M + "experts." + std::to_string(e) + ".down_proj.weight", st_dtype(t.type), {E, F},
                           std::vector<std::byte>(t.data + std::size_t(e * E) * rb, t.data + std::size_t((e + 1) * E) * rb)});
        return;
    }
    throw std::runtime_error("hf fixture: no HF name for " + n);
}

inline std::string config_json(const io::gguf_file& g, const hparams& h, const hf_options& o) {
    auto num = [](double x) { char b[64]; std::snprintf(b, sizeof b, "%.17g", x); return std::string(b); };
    const std::string p = h.arch + ".";
    std::string t;  // the text model's fields
    auto field = [&](const std::string& k, const std::string& v) { t += (t.empty() ? "" : ",\n    ") + json_escape(k) + ": " + v; };
    field("model_type", json_escape(h.is_clover() ? "clover_moe_text" : "qwen3_5_moe_text"));
    field("hidden_size", std::to_string(h.n_embd));
    field("num_hidden_layers", std::to_string(h.n_layer));
    field("vocab_size", std::to_string(h.n_vocab));
    field("max_position_embeddings", std::to_string(h.n_ctx_train));
    field("num_attention_heads", std::to_string(h.n_head));
    field("num_key_value_heads", std::to_string(h.n_head_kv));
    field("head_dim", std::to_string(h.head_dim));
    field("hidden_act", "\"silu\"");
    field("attention_bias", "false");
    field("rms_norm_eps", num(h.rms_eps));
    const double prf = double(h.n_rot) / double(h.head_dim);
    if (std::int64_t(double(h.head_dim) * prf) != h.n_rot) throw std::runtime_error("hf fixture: n_rot not expressible");
    const std::string sect = "[" + std::to_string(h.rope_sections[0]) + ", " + std::to_string(h.rope_sections[1]) + ", " +
                             std::to_string(h.rope_sections[2]) + "]";
    if (o.old_rope_style) {
        field("rope_theta", num(h.rope_theta));
        field("partial_rotary_factor", num(prf));
        field("rope_scaling", "{\"type\": \"mrope\", \"mrope_section\": " + sect + ", \"mrope_interleaved\": true}");
    } else {
        field("rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": " + num(h.rope_theta) + ", \"partial_rotary_factor\": " +
                                     num(prf) + ", \"mrope_section\": " + sect + ", \"mrope_interleaved\": true}");
    }
    std::string lt = "[";
    for (std::int64_t i = 0; i < h.n_layer; ++i) lt += std::string(i ? ", " : "") + (h.recurrent[std::size_t(i)] ? "\"linear_attention\"" : "\"full_attention\"");
    field("layer_types", lt + "]");
    field("linear_num_key_heads", std::to_string(h.gdn_qk_heads()));
    field("linear_num_value_heads", std::to_string(h.gdn_v_heads()));
    field("linear_key_head_dim", std::to_string(h.gdn_dk()));
    field("linear_value_head_dim", std::to_string(h.gdn_dv()));
    field("linear_conv_kernel_dim", std::to_string(h.ssm_conv));
    field("num_experts", std::to_string(h.n_expert));
    field("num_experts_per_tok", std::to_string(h.n_expert_used));
    field("moe_intermediate_size", std::to_string(h.n_ff_exp));
    field("shared_expert_intermediate_size", std::to_string(h.n_ff_shexp));
    field("mtp_num_hidden_layers", "1");
    if (auto b = g.get_int("tokenizer.ggml.bos_token_id")) field("bos_token_id", std::to_string(*b));
    if (h.is_clover()) {
        field("block_size", std::to_string(h.diffusion_block));
        field("threshold", num(h.diffusion_threshold));
        field("expert_coreset", std::to_string(h.diffusion_coreset));
        if (h.mask_token_id >= 0) field("mask_token_id", std::to_string(h.mask_token_id));
    }
    const bool tie = !g.find_tensor("output.weight");
    const std::string arch = h.is_clover() ? "CloverMoeForConditionalGeneration" : "Qwen3_5MoeForConditionalGeneration";
    if (o.wrapped)
        return "{\n  \"architectures\": [\"" + arch + "\"],\n  \"model_type\": \"" + (h.is_clover() ? "clover_moe" : "qwen3_5_moe") +
               "\",\n  \"tie_word_embeddings\": " + (tie ? "true" : "false") + ",\n  \"text_config\": {\n    " + t +
               "\n  },\n  \"vision_config\": {\"depth\": 1}\n}\n";
    return "{\n  \"architectures\": [\"" + std::string(h.is_clover() ? "CloverMoeForCausalLM" : "Qwen3_5MoeForCausalLM") +
           "\"],\n  \"tie_word_embeddings\": " + (tie ? "true" : "false") + ",\n  " + t + "\n}\n";
}

inline void write_tokenizer(const io::gguf_file& g, const fs::path& dir) {
    const auto tokens = *g.get_string_array("tokenizer.ggml.tokens");
    const auto types = *g.get_int_array("tokenizer.ggml.token_type");
    const auto merges = *g.get_string_array("tokenizer.ggml.merges");
    std::string vocab, added;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (types[i] == 1) vocab += (vocab.empty() ? "" : ",") + json_escape(tokens[i]) + ":" + std::to_string(i);
        else if (types[i] == 3)
            added += (added.empty() ? "" : ",") + std::string("{\"id\":") + std::to_string(i) + ",\"content\":" + json_escape(tokens[i]) +
                     ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}";
    }
    std::string m;
    for (const auto& x : merges) {
        if (!m.empty()) m += ',';  // appends only: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&&
        m += json_escape(x);
    }
    const std::string pre = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":" +
                            json_escape(tok::qwen35_pattern) +
                            "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                            "\"trim_offsets\":false,\"use_regex\":false}]}";
    write_text(dir / "tokenizer.json", "{\"version\":\"1.0\",\"added_tokens\":[" + added +
                                           "],\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":" + pre +
                                           ",\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                           "\"trim_offsets\":false,\"use_regex\":false},\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                                           "\"unk_token\":null,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{" +
                                           vocab + "},\"merges\":[" + m + "]}}");
    const auto eos = g.get_int("tokenizer.ggml.eos_token_id");
    const auto pad = g.get_int("tokenizer.ggml.padding_token_id");
    write_text(dir / "tokenizer_config.json",
               "{\"add_bos_token\": false, \"bos_token\": null, \"eos_token\": " + json_escape(tokens[std::size_t(*eos)]) +
                   ", \"pad_token\": " + json_escape(tokens[std::size_t(*pad)]) + ", \"model_max_length\": 262144}");
}

// Writes an HF folder equivalent to the canonical GGUF at `gguf` (its matrices keep their dtype).
inline void make_hf_folder(const std::string& gguf, const fs::path& dir, const hf_options& o = {}) {
    io::gguf_file g(gguf);
    hparams h = read_hparams(g);
    h.n_vocab = g.tensor("token_embd.weight").ne[1];
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<st_entry> all;
    for (const auto& t : g.tensors()) hf_tensors_of(g, t, h, o, all);
    if (o.extras) {
        std::vector<float> z(std::size_t(h.n_embd * 2 * h.n_embd), 0.25f);
        all.push_back({"mtp.fc.weight", "F32", {h.n_embd, 2 * h.n_embd}, encode(z, dtype::f32)});
        all.push_back({"mtp.layers.0.input_layernorm.weight", "F32", {h.n_embd},
                       encode(std::vector<float>(std::size_t(h.n_embd), 0.f), dtype::f32)});
        if (o.wrapped)
            all.push_back({"model.visual.blocks.0.norm1.weight", "BF16", {8}, encode(std::vector<float>(8, 1.f), dtype::bf16)});
    }
    write_text(dir / "config.json", config_json(g, h, o));
    if (o.tokenizer && g.has("tokenizer.ggml.tokens")) write_tokenizer(g, dir);
    if (o.shards <= 1) {
        write_safetensors(dir / "model.safetensors", all, o.gap);
        return;
    }
    std::string map;
    std::uint64_t total = 0;
    for (int s = 0; s < o.shards; ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, o.shards);
        std::vector<st_entry> part;
        for (std::size_t i = all.size() * std::size_t(s) / std::size_t(o.shards); i < all.size() * std::size_t(s + 1) / std::size_t(o.shards); ++i) {
            map += (map.empty() ? "" : ",\n    ") + json_escape(all[i].name) + ": " + json_escape(name);
            total += all[i].bytes.size();
            part.push_back(std::move(all[i]));
        }
        write_safetensors(dir / name, part, o.gap);
    }
    write_text(dir / "model.safetensors.index.json",
               "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) + "},\n  \"weight_map\": {\n    " + map + "\n  }\n}\n");
}

// Vendor-variant and settled-canonical rewrites of a canonical GGUF.
struct rewrite_options {
    bool drop_shared_count = false;
    bool norms_minus_one = false;
    bool attn_norms_minus_one = false;  // only blk.N.attn_norm: a file whose norms disagree
    bool a_log = false;        // store A_log = log(−ssm_a)
    bool settle_a = false;     // store −exp(log(−ssm_a)): what patching the a_log variant gives back
    bool grouped = false;      // V heads in HF order
    std::string v_key = {};    // write {arch}.gdn.v_head_order = v_key (empty: none)
};

inline void rewrite_gguf(const std::string& in, const std::string& out, const rewrite_options& o) {
    io::gguf_file g(in);
    hparams h = read_hparams(g);
    const io::gdn_head_dims heads{h.gdn_qk_heads(), h.gdn_v_heads(), h.gdn_dk(), h.gdn_dv()};
    io::gguf_writer w(g.alignment());
    for (const auto& [k, v] : g.metadata())
        if (!(o.drop_shared_count && k == h.arch + ".expert_shared_count")) w.set(k, v);
    if (!o.v_key.empty()) w.set_string(h.arch + ".gdn.v_head_order", o.v_key);
    for (const auto& t : g.tensors()) {
        std::vector<std::byte> b(t.data, t.data + t.nbytes);
        const bool norm = t.name.ends_with("norm.weight") && !t.name.ends_with("ssm_norm.weight");
        const bool a = t.name.ends_with(".ssm_a");
        const bool minus = o.norms_minus_one || (o.attn_norms_minus_one && t.name.ends_with(".attn_norm.weight"));
        if ((norm && minus) || (a && (o.a_log || o.settle_a))) {
            std::vector<float> v = decode(t);
            for (float& x : v) x = norm ? io::zero_centred_norm(x) : o.a_log ? io::a_log_of(x) : io::canonical_ssm_a(io::a_log_of(x));
            b = encode(v, t.type);
        }
        if (o.grouped && t.name.starts_with("blk.")) {
            const std::size_t dot = t.name.find('.', 4);
            const int il = std::stoi(t.name.substr(4, dot - 4));
            if (il < h.n_layer && h.recurrent[std::size_t(il)]) {
                const io::v_perm pm = io::v_perm_of(t.name.substr(dot + 1), heads);
                std::vector<std::byte> d(b.size());
                io::v_permute_tensor(pm, t.type, t.ne.data(), b, d, io::v_order::grouped, heads, t.name);
                b = std::move(d);
            }
        }
        std::vector<std::int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
        w.add_tensor(t.name, t.type, ne, [b = std::move(b)](std::span<std::byte> dst) { std::memcpy(dst.data(), b.data(), dst.size()); });
    }
    w.write(out);
}

}  // namespace hftest
