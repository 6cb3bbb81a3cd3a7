#pragma once
// config.json of an HF Qwen3.5/3.6-MoE or Clover checkpoint → the hyper-parameters, and the
// canonical GGUF metadata keys they become (architecture.md §1.1, §3.2; clover-diffusion.md §6).
//
// Layouts: flat (Qwen3_5MoeForCausalLM, model_type "qwen3_5_moe_text") or wrapped
// (Qwen3_5MoeForConditionalGeneration: the text model's fields under "text_config"; a few, such
// as tie_word_embeddings, may sit at the top). A field is looked up in text_config first, then at
// the top. RoPE fields come from "rope_parameters" (newer transformers) or from the top level and
// "rope_scaling" (older). Clover's block-diffusion fields are not public; this reader accepts
// the spellings listed in diffusion_keys below, at the top, in text_config, or in an object named
// "diffusion" / "diffusion_config" there. Every bad value is one clover::error naming the file
// and the field.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/io/json.hpp"
#include "clover/io/regular_file.hpp"

namespace clover::io {

struct hf_config {
    std::string source;                     // the config.json path, for messages
    std::string model_type;                 // of the text model
    std::vector<std::string> architectures;
    std::string name;                       // _name_or_path, else the folder name
    bool wrapped = false;                   // fields under text_config
    bool clover = false;                    // says it is a Clover (block-diffusion) model
    std::int64_t vocab = 0, hidden = 0, n_layer = 0, max_pos = 262144;
    std::int64_t n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
    std::array<int, 4> sections{1, 0, 0, 0};  // GGUF rope.dimension_sections (see rope_sections())
    double rope_theta = 10000.0, rms_eps = 1e-6, partial_rotary = 0.25;
    std::vector<bool> recurrent;            // per layer: linear attention (GDN)
    std::int64_t interval = 0;              // full_attention_interval when the pattern is regular, else 0
    std::int64_t qk_heads = 0, v_heads = 0, dk = 0, dv = 0, conv_kernel = 4;
    std::int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    bool tie = false;
    std::int64_t mtp_layers = 0;
    std::int64_t bos = -1, eos = -1;
    // block diffusion (absent: the GGUF defaults of clover-diffusion.md §6)
    std::optional<std::int64_t> block_size, mask_token_id, coreset;
    std::optional<double> threshold;

    std::int64_t conv_channels() const { return 2 * qk_heads * dk + v_heads * dv; }
};

namespace hfc_detail {

inline std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

struct fields {
    const json::value& root;
    const json::value* text;  // text_config or nullptr
    const std::string& src;

    const json::value* find(std::string_view key) const {
        if (text)
            if (const json::value* v = text->find(key)) return v;
        return root.find(key);
    }
    std::optional<std::int64_t> opt_int(std::string_view key, std::int64_t lo, std::int64_t hi) const {
        const json::value* v = find(key);
        if (!v || v->is_null()) return std::nullopt;
        if (!v->is_number() || !v->integral) fail(src, ": field '", key, "' is not an integer");
        if (v->i < lo || v->i > hi) fail(src, ": field '", key, "' = ", v->i, " is out of range [", lo, ", ", hi, "]");
        return v->i;
    }
    std::int64_t req_int(std::string_view key, std::int64_t lo, std::int64_t hi) const {
        auto v = opt_int(key, lo, hi);
        if (!v) fail(src, ": missing field '", key, "'");
        return *v;
    }
    std::optional<double> opt_num(const json::value* v, std::string_view key) const {
        if (!v || v->is_null()) return std::nullopt;
        if (!v->is_number()) fail(src, ": field '", key, "' is not a number");
        return v->num;
    }
    std::optional<double> opt_num(std::string_view key) const { return opt_num(find(key), key); }
    std::optional<bool> opt_bool(std::string_view key) const {
        const json::value* v = find(key);
        if (!v || v->is_null()) return std::nullopt;
        if (!v->is_bool()) fail(src, ": field '", key, "' is not true or false");
        return v->b;
    }
    std::string opt_string(std::string_view key) const {
        const json::value* v = find(key);
        if (!v || v->is_null()) return {};
        if (!v->is_string()) fail(src, ": field '", key, "' is not a string");
        return v->s;
    }
};

// A JSON file of the folder: a regular file only (a FIFO would block), of bounded size.
inline std::string read_text(const std::filesystem::path& p, std::size_t max_bytes = std::size_t(64) << 20) {
    return read_regular_file(p, max_bytes);
}

}  // namespace hfc_detail

// The GGUF section list for HF's interleaved MRoPE sections (t, h, w). For text every stream is
// the token position, so what matters is that no frequency slot falls outside the three streams
// under the GGUF rule (layers/rope.hpp: those slots get position 0); HF puts every slot not
// claimed by h or w on t. When the HF sections leave such a slot, {1, 0, 0, 0} (every slot on t,
// i.e. plain NEOX) is the text-equivalent list.
inline std::array<int, 4> rope_sections_for(const std::vector<std::int64_t>& mrope, std::int64_t n_rot) {
    std::array<int, 4> s{0, 0, 0, 0};
    for (std::size_t i = 0; i < mrope.size() && i < 3; ++i) s[i] = int(mrope[i]);
    const int sect = s[0] + s[1] + s[2];
    if (sect <= 0 || sect > n_rot / 2) return {1, 0, 0, 0};
    for (int i = 0; i < sect; ++i) {
        const bool t = i % 3 == 0 && i < 3 * s[0], h = i % 3 == 1 && i < 3 * s[1], w = i % 3 == 2 && i < 3 * s[2];
        if (!(t || h || w)) return {1, 0, 0, 0};
    }
    return s;
}

// Reads config.json (path: the file, or the model folder holding it).
inline hf_config read_hf_config(std::filesystem::path path) {
    if (std::filesystem::is_directory(path)) path /= "config.json";
    hf_config c;
    c.source = path.string();
    if (!std::filesystem::exists(path)) fail(c.source, ": missing (an HF model folder needs config.json)");
    const std::string text = hfc_detail::read_text(path);
    const json::value root = json::parse(text, c.source);
    if (!root.is_object()) fail(c.source, ": not a JSON object");
    const json::value* tc = root.find("text_config");
    if (tc && !tc->is_null() && !tc->is_object()) fail(c.source, ": field 'text_config' is not an object");
    c.wrapped = tc && tc->is_object();
    hfc_detail::fields f{root, c.wrapped ? tc : nullptr, c.source};

    c.model_type = f.opt_string("model_type");
    if (const json::value* a = root.find("architectures"); a && a->is_array())
        for (const auto& x : a->items)
            if (x.is_string()) c.architectures.push_back(x.s);
    std::string kinds = hfc_detail::lower(c.model_type);
    if (const json::value* mt = root.find("model_type"); mt && mt->is_string()) kinds += " " + hfc_detail::lower(mt->s);
    for (const auto& a : c.architectures) kinds += " " + hfc_detail::lower(a);
    c.clover = kinds.find("clover") != std::string::npos;
    if (kinds.find("qwen3_next") != std::string::npos || kinds.find("qwen3next") != std::string::npos)
        fail(c.source, ": model_type qwen3_next (fused in_proj_qkvz / in_proj_ba projections) is not supported; "
                       "this loader reads Qwen3.5/3.6-MoE and Clover checkpoints");
    if (const json::value* q = f.find("quantization_config"); q && q->is_object()) {
        const json::value* m = q->find("quant_method");
        fail(c.source, ": a quantized checkpoint (quantization_config", m && m->is_string() ? ": " + m->s : std::string(),
             ") is not supported; use the BF16/F16/F32 checkpoint");
    }
    if (f.opt_bool("attn_output_gate") == false)
        fail(c.source, ": attn_output_gate = false is not supported (Qwen3.5 attention has the output gate)");
    c.name = f.opt_string("_name_or_path");
    if (c.name.empty()) c.name = path.parent_path().filename().string();

    constexpr std::int64_t big = std::int64_t(1) << 31;
    c.hidden = f.req_int("hidden_size", 1, 1 << 20);
    c.n_layer = f.req_int("num_hidden_layers", 1, 4096);
    c.vocab = f.req_int("vocab_size", 1, 1 << 28);
    c.max_pos = f.opt_int("max_position_embeddings", 1, big).value_or(262144);
    c.n_head = f.req_int("num_attention_heads", 1, 4096);
    c.n_head_kv = f.opt_int("num_key_value_heads", 1, 4096).value_or(c.n_head);
    if (c.n_head % c.n_head_kv != 0)
        fail(c.source, ": num_attention_heads ", c.n_head, " is not a multiple of num_key_value_heads ", c.n_head_kv);
    c.head_dim = f.opt_int("head_dim", 1, 1 << 16).value_or(c.hidden / c.n_head);
    if (c.head_dim < 1) fail(c.source, ": head_dim is 0 (hidden_size / num_attention_heads)");
    if (auto act = f.opt_string("hidden_act"); !act.empty() && act != "silu")
        fail(c.source, ": hidden_act '", act, "' is not supported (silu)");
    if (f.opt_bool("attention_bias").value_or(false)) fail(c.source, ": attention_bias = true is not supported");
    c.rms_eps = f.opt_num("rms_norm_eps").value_or(1e-6);
    if (!(c.rms_eps > 0 && c.rms_eps < 1)) fail(c.source, ": rms_norm_eps ", c.rms_eps, " is out of range (0, 1)");

    // RoPE: rope_parameters (newer) or top-level + rope_scaling (older).
    const json::value* rp = f.find("rope_parameters");
    if (rp && !rp->is_null() && !rp->is_object()) fail(c.source, ": field 'rope_parameters' is not an object");
    const json::value* rs = f.find("rope_scaling");
    if (rs && !rs->is_null() && !rs->is_object()) fail(c.source, ": field 'rope_scaling' is not an object");
    auto rope_field = [&](std::string_view key) -> const json::value* {
        if (rp && rp->is_object())
            if (const json::value* v = rp->find(key)) return v;
        if (const json::value* v = f.find(key)) return v;
        if (rs && rs->is_object()) return rs->find(key);
        return nullptr;
    };
    for (const json::value* o : {rp, rs}) {
        if (!o || !o->is_object()) continue;
        const json::value* t = o->find("rope_type");
        if (!t) t = o->find("type");
        if (t && t->is_string() && t->s != "default" && t->s != "mrope")
            fail(c.source, ": rope type '", t->s, "' is not supported (default / mrope)");
    }
    if (auto th = f.opt_num(rope_field("rope_theta"), "rope_theta")) c.rope_theta = *th;
    if (!(c.rope_theta > 0)) fail(c.source, ": rope_theta must be positive");
    if (auto pr = f.opt_num(rope_field("partial_rotary_factor"), "partial_rotary_factor")) c.partial_rotary = *pr;
    if (!(c.partial_rotary > 0 && c.partial_rotary <= 1)) fail(c.source, ": partial_rotary_factor ", c.partial_rotary, " is out of range (0, 1]");
    c.n_rot = std::int64_t(double(c.head_dim) * c.partial_rotary);  // int(), as HF computes it
    if (c.n_rot < 2 || c.n_rot % 2 != 0)
        fail(c.source, ": head_dim ", c.head_dim, " × partial_rotary_factor ", c.partial_rotary, " = ", c.n_rot, " rotary dims (must be even and ≥ 2)");
    std::vector<std::int64_t> mrope;
    if (const json::value* ms = rope_field("mrope_section"); ms && !ms->is_null()) {
        if (!ms->is_array() || ms->items.size() > 4) fail(c.source, ": field 'mrope_section' is not an array of up to 4 integers");
        for (const auto& x : ms->items) {
            if (!x.is_number() || !x.integral || x.i < 0 || x.i > 4096) fail(c.source, ": field 'mrope_section' has a bad entry");
            mrope.push_back(x.i);
        }
    }
    c.sections = rope_sections_for(mrope, c.n_rot);

    // Layer pattern.
    c.recurrent.assign(std::size_t(c.n_layer), false);
    if (const json::value* lt = f.find("layer_types"); lt && !lt->is_null()) {
        if (!lt->is_array() || std::int64_t(lt->items.size()) != c.n_layer)
            fail(c.source, ": field 'layer_types' must list ", c.n_layer, " layers (num_hidden_layers)");
        for (std::int64_t i = 0; i < c.n_layer; ++i) {
            const json::value& x = lt->items[std::size_t(i)];
            if (x.is_string() && x.s == "linear_attention") c.recurrent[std::size_t(i)] = true;
            else if (!(x.is_string() && x.s == "full_attention"))
                fail(c.source, ": layer_types[", i, "] is not \"linear_attention\" or \"full_attention\"");
        }
        // Regular when full attention sits exactly at every interval-th layer.
        for (std::int64_t n = 1; n <= c.n_layer && !c.interval; ++n) {
            bool ok = true;
            for (std::int64_t i = 0; i < c.n_layer && ok; ++i) ok = c.recurrent[std::size_t(i)] == ((i + 1) % n != 0);
            if (ok) c.interval = n;
        }
    } else {
        c.interval = f.opt_int("full_attention_interval", 1, 4096).value_or(4);
        for (std::int64_t i = 0; i < c.n_layer; ++i) c.recurrent[std::size_t(i)] = (i + 1) % c.interval != 0;
    }

    // Gated DeltaNet.
    c.qk_heads = f.req_int("linear_num_key_heads", 1, 4096);
    c.v_heads = f.req_int("linear_num_value_heads", 1, 4096);
    c.dk = f.req_int("linear_key_head_dim", 1, 4096);
    c.dv = f.req_int("linear_value_head_dim", 1, 4096);
    c.conv_kernel = f.opt_int("linear_conv_kernel_dim", 2, 64).value_or(4);
    if (c.v_heads % c.qk_heads != 0)
        fail(c.source, ": linear_num_value_heads ", c.v_heads, " is not a multiple of linear_num_key_heads ", c.qk_heads);

    // MoE.
    c.n_expert = f.req_int("num_experts", 1, 1 << 16);
    c.n_expert_used = f.req_int("num_experts_per_tok", 1, c.n_expert);
    c.n_ff_exp = f.req_int("moe_intermediate_size", 1, 1 << 20);
    c.n_ff_shexp = f.opt_int("shared_expert_intermediate_size", 0, 1 << 20).value_or(0);
    if (auto mlp_only = f.find("mlp_only_layers"); mlp_only && mlp_only->is_array() && !mlp_only->items.empty())
        fail(c.source, ": mlp_only_layers (dense layers between MoE layers) is not supported");

    c.tie = f.opt_bool("tie_word_embeddings").value_or(false);
    c.mtp_layers = f.opt_int("mtp_num_hidden_layers", 0, 64).value_or(0);
    c.bos = f.opt_int("bos_token_id", 0, big).value_or(-1);
    if (const json::value* e = f.find("eos_token_id"); e && e->is_number() && e->integral && e->i >= 0) c.eos = e->i;
    else if (e && e->is_array() && !e->items.empty() && e->items[0].is_number() && e->items[0].integral) c.eos = e->items[0].i;

    // Block diffusion (spellings this reader accepts; the vendor's are not public).
    std::vector<const json::value*> scopes;
    for (const json::value* o : {f.text, &root}) {
        if (!o) continue;
        scopes.push_back(o);
        for (const char* sub : {"diffusion", "diffusion_config"})
            if (const json::value* d = o->find(sub); d && d->is_object()) scopes.push_back(d);
    }
    auto diff_field = [&](std::initializer_list<const char*> names) -> std::pair<const json::value*, std::string> {
        for (const json::value* s : scopes)
            for (const char* n : names)
                if (const json::value* v = s->find(n); v && !v->is_null()) return {v, n};
        return {nullptr, {}};
    };
    auto diff_int = [&](std::initializer_list<const char*> names, std::int64_t lo, std::int64_t hi) -> std::optional<std::int64_t> {
        auto [v, n] = diff_field(names);
        if (!v) return std::nullopt;
        if (!v->is_number() || !v->integral || v->i < lo || v->i > hi)
            fail(c.source, ": field '", n, "' is not an integer in [", lo, ", ", hi, "]");
        return v->i;
    };
    c.block_size = diff_int({"block_size", "block_length", "diffusion_block_size", "bd_size"}, 1, 4096);
    c.mask_token_id = diff_int({"mask_token_id", "mask_id"}, 0, big);
    c.coreset = diff_int({"expert_coreset", "coreset_size", "expert_coreset_size"}, 0, c.n_expert);
    if (auto [v, n] = diff_field({"threshold", "diffusion_threshold", "confidence_threshold"}); v) {
        if (!v->is_number() || !(v->num >= 0 && v->num <= 1)) fail(c.source, ": field '", n, "' is not a number in [0, 1]");
        c.threshold = v->num;
    }
    if (c.block_size || c.mask_token_id) c.clover = true;
    return c;
}

// Writes the canonical GGUF hyper-parameter keys (not the tokenizer) for arch "qwen35moe" or
// "clover_moe". mask_token_id: the config's, else the caller's (the id of "<|mask|>"), else none.
inline void put_gguf_metadata(const hf_config& c, const std::string& arch, gguf_writer& w, std::int64_t mask_token_id = -1) {
    const std::string p = arch + ".";
    w.set_string("general.architecture", arch);
    w.set_string("general.name", c.name);
    w.set_u32(p + "block_count", std::uint32_t(c.n_layer));
    w.set_u32(p + "context_length", std::uint32_t(std::min<std::int64_t>(c.max_pos, 0xffffffffll)));
    w.set_u32(p + "embedding_length", std::uint32_t(c.hidden));
    w.set_u32(p + "attention.head_count", std::uint32_t(c.n_head));
    w.set_u32(p + "attention.head_count_kv", std::uint32_t(c.n_head_kv));
    w.set_u32(p + "attention.key_length", std::uint32_t(c.head_dim));
    w.set_u32(p + "attention.value_length", std::uint32_t(c.head_dim));
    w.set_f32(p + "attention.layer_norm_rms_epsilon", float(c.rms_eps));
    w.set_f32(p + "rope.freq_base", float(c.rope_theta));
    w.set_u32(p + "rope.dimension_count", std::uint32_t(c.n_rot));
    w.set_int_array(p + "rope.dimension_sections", gguf_type::i32, {c.sections[0], c.sections[1], c.sections[2], c.sections[3]});
    w.set_u32(p + "expert_count", std::uint32_t(c.n_expert));
    w.set_u32(p + "expert_used_count", std::uint32_t(c.n_expert_used));
    w.set_u32(p + "expert_feed_forward_length", std::uint32_t(c.n_ff_exp));
    w.set_u32(p + "expert_shared_feed_forward_length", std::uint32_t(c.n_ff_shexp));
    w.set_u32(p + "ssm.conv_kernel", std::uint32_t(c.conv_kernel));
    w.set_u32(p + "ssm.state_size", std::uint32_t(c.dk));
    w.set_u32(p + "ssm.group_count", std::uint32_t(c.qk_heads));
    w.set_u32(p + "ssm.time_step_rank", std::uint32_t(c.v_heads));
    w.set_u32(p + "ssm.inner_size", std::uint32_t(c.v_heads * c.dv));
    if (c.interval > 0) {
        w.set_u32(p + "full_attention_interval", std::uint32_t(c.interval));
    } else {
        std::vector<std::int64_t> r(c.recurrent.begin(), c.recurrent.end());
        w.set_int_array(p + "attention.recurrent_layers", gguf_type::boolean, std::move(r));
    }
    if (arch == "clover_moe") {
        w.set_u32(p + "expert_shared_count", c.n_ff_shexp > 0 ? 1 : 0);
        w.set_u32(p + "diffusion.block_size", std::uint32_t(c.block_size.value_or(32)));
        w.set_f32(p + "diffusion.threshold", float(c.threshold.value_or(0.95)));
        const std::int64_t mask = c.mask_token_id.value_or(mask_token_id);
        if (mask >= 0) w.set_u32(p + "diffusion.mask_token_id", std::uint32_t(mask));
        w.set_u32(p + "diffusion.expert_coreset", std::uint32_t(c.coreset.value_or(std::min<std::int64_t>(16, c.n_expert))));
    }
}

}  // namespace clover::io
