#pragma once
// An HF model folder (config.json, model.safetensors.index.json + shards, or one
// model.safetensors; optionally tokenizer.json) read as a GGUF file would be:
//
//   auto file = clover::load_hf("Clover-35B-A3B-Preview/");   // shared_ptr<const io::gguf_file>
//   clover::model<clover::variants::from_file> m(file);         // same logits as the GGUF
//
// The result is a *virtual* io::gguf_file with canonical GGUF metadata keys and tensor names.
// Big matrices are views into the mapped shards (BF16/F16/F32; HF [out, in] row-major is GGUF
// ne {in, out}, so nothing is copied); packed experts gate_up_proj [E, 2I, H] are viewed as
// ffn_gate_up_exps. Small tensors become owned F32 with the converter's transformations
// (architecture.md §3.4, io/canonical_form.hpp): norms 1 + w (not the GDN output norm),
// A_log → ssm_a = −exp(A_log), conv1d [C, 1, K] squeezed, dt_bias → ssm_dt.bias. Per-expert
// tensors (mlp.experts.N.*) are stacked into owned buffers (that costs their size in memory).
// The V heads stay in HF's grouped order: the file says so with the key
// `{arch}.gdn.v_head_order = "grouped"`, which read_hparams turns into gdn_grouped_heads.
//
// open_hf() exposes the plan behind it (which HF rows make which GGUF tensor) for
// `clover convert` (io/hf_convert.hpp), which streams it into a canonical GGUF instead.
//
// Both the flat layout (model.layers.N...) and the wrapped one of
// Qwen3_5MoeForConditionalGeneration (model.language_model.layers.N..., config text_config)
// are read; mtp.* and vision tensors are skipped. Missing or mis-shaped tensors, unknown dtypes
// and missing shards are one clover::error naming the HF tensor and its shard.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "clover/core/error.hpp"
#include "clover/io/canonical_form.hpp"
#include "clover/io/gguf.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/io/hf_config.hpp"
#include "clover/io/json.hpp"
#include "clover/io/regular_file.hpp"
#include "clover/io/safetensors.hpp"
#include "clover/quant/rows.hpp"

namespace clover::hf {

using warn_fn = void (*)(const std::string&);

enum class value_op : std::uint8_t { none, plus_one, neg_exp };

// Rows [row0, row0 + nrows) of an HF tensor seen as rows of the planned tensor's ne[0] elements.
struct row_src {
    const io::st_tensor* t = nullptr;
    std::int64_t row0 = 0, nrows = 0;
};

// One GGUF tensor and where its rows come from.
struct planned_tensor {
    std::string name;              // GGUF name
    std::vector<std::int64_t> ne;  // GGUF shape, ggml order
    bool vector = false;           // a small tensor GGUF keeps in F32 (norms, conv taps, A, dt, gates)
    value_op op = value_op::none;
    std::vector<row_src> parts;    // concatenated in order
    io::v_perm perm;               // its V-head-indexed slice (GDN tensors)
    std::string hf_name;           // the (first) HF tensor, for messages
    std::vector<std::int64_t> starts;  // first row of each part

    std::int64_t nrows() const {
        std::int64_t n = 1;
        for (std::size_t d = 1; d < ne.size(); ++d) n *= ne[d];
        return n;
    }
    std::int64_t nelements() const { return ne[0] * nrows(); }
    dtype src_type() const { return *parts.front().t->type; }
    std::size_t src_row_bytes() const { return std::size_t(ne[0]) * parts.front().t->elem_size; }
    const std::byte* row(std::int64_t r) const {
        auto it = std::upper_bound(starts.begin(), starts.end(), r);
        const std::size_t k = std::size_t(it - starts.begin()) - 1;
        return parts[k].t->data + std::size_t(parts[k].row0 + (r - starts[k])) * src_row_bytes();
    }
};

// One row of an HF tensor (element type of t) as f32.
inline void row_to_f32(const io::st_tensor& t, const std::byte* p, float* out, std::int64_t n) {
    if (t.type == dtype::f64) {
        for (std::int64_t i = 0; i < n; ++i) {
            double x;
            std::memcpy(&x, p + std::size_t(i) * 8, 8);
            out[i] = float(x);
        }
        return;
    }
    quant::dequantize_row(*t.type, p, out, n);
}

inline float apply_op(value_op op, float x) {
    switch (op) {
        case value_op::plus_one: return io::canonical_norm(x);
        case value_op::neg_exp: return io::canonical_ssm_a(x);
        default: return x;
    }
}

// A vector tensor's values, transformed, in the file's head order.
inline std::vector<float> vector_values(const planned_tensor& pt) {
    std::vector<float> v(std::size_t(pt.nelements()));
    for (std::int64_t r = 0; r < pt.nrows(); ++r) {
        const std::int64_t k = std::int64_t(std::upper_bound(pt.starts.begin(), pt.starts.end(), r) - pt.starts.begin()) - 1;
        row_to_f32(*pt.parts[std::size_t(k)].t, pt.row(r), v.data() + r * pt.ne[0], pt.ne[0]);
    }
    for (float& x : v) x = apply_op(pt.op, x);
    return v;
}

// Keys a layer above io adds to the folder's metadata: the tokenizer's (model/open.hpp turns
// tokenizer.json into tokenizer.* keys; io reads files and knows no tokenizer). Called with the
// folder, its config's bos/eos ids and the writer; returns the id of "<|mask|>" or -1.
using metadata_hook = std::function<std::int64_t(const std::filesystem::path& dir, std::int64_t bos, std::int64_t eos,
                                                 io::gguf_writer& w, std::int64_t n_vocab, warn_fn warn)>;

struct hf_options {
    // gate_up_proj → ffn_gate_exps + ffn_up_exps (what the stock converter writes; `convert`),
    // instead of one ffn_gate_up_exps view (`load_hf`: no copy).
    bool split_packed_experts = false;
    warn_fn warn = nullptr;
    metadata_hook extra_keys = {};
};

// The opened folder: config, mapped shards, the canonical metadata and the tensor plan.
struct hf_folder {
    std::filesystem::path dir;
    io::hf_config cfg;
    std::string arch;  // qwen35moe or clover_moe
    io::gdn_head_dims heads;
    std::vector<std::unique_ptr<io::safetensors_file>> shards;
    std::vector<std::pair<std::string, io::gguf_value>> metadata;  // without gdn.v_head_order
    std::vector<planned_tensor> tensors;
    std::size_t n_skipped = 0;         // mtp.* and vision tensors
    std::vector<std::string> unused;   // text-model tensors nothing maps
    bool has_tokenizer = false;
};

namespace hf_detail {

struct located {
    const io::st_tensor* t;
    const std::string* shard;
};

// Refuses a file of the model folder that resolves (through symlinks) outside it: a folder from
// elsewhere must not make us read, or convert into a GGUF, a file the user never gave. One
// exception: the HF hub cache, whose snapshots/REV/NAME are symlinks to ../../blobs/HASH of the
// same repository.
inline void require_inside(const std::filesystem::path& dir, const std::filesystem::path& p) {
    namespace fs = std::filesystem;
    if (io::resolves_inside(p, dir)) return;
    std::error_code ec;
    const fs::path real = fs::canonical(dir, ec);
    if (!ec && real.parent_path().filename() == "snapshots" && io::resolves_inside(p, real.parent_path().parent_path() / "blobs"))
        return;
    const fs::path target = fs::weakly_canonical(p, ec);
    fail(p.string(), ": resolves to ", ec ? std::string("?") : target.string(), ", outside the folder ", dir.string(),
         " (a symlink out of the model folder)");
}

// The shard files of the folder, in order (relative names). With an index, `wanted` (optional)
// receives which shard each tensor is listed in.
inline std::vector<std::string> shard_files(const std::filesystem::path& dir, std::vector<std::pair<std::string, std::string>>* wanted) {
    namespace fs = std::filesystem;
    const fs::path index = dir / "model.safetensors.index.json";
    std::vector<std::string> files;
    if (fs::exists(index) || fs::is_symlink(index)) {
        require_inside(dir, index);
        const std::string text = io::hfc_detail::read_text(index, std::size_t(256) << 20);
        const io::json::value root = io::json::parse(text, index.string(), 16, std::size_t(1) << 24);
        const io::json::value* wm = root.is_object() ? root.find("weight_map") : nullptr;
        if (!wm || !wm->is_object()) fail(index.string(), ": no 'weight_map' object");
        std::set<std::string> seen;
        for (std::size_t k = 0; k < wm->size(); ++k) {
            const std::string& name = wm->keys[k];
            const io::json::value& v = wm->items[k];
            if (!v.is_string() || v.s.empty()) fail(index.string(), ": weight_map['", name, "'] is not a file name");
            const fs::path rel(v.s);
            bool safe = !rel.is_absolute();
            for (const auto& part : rel) safe = safe && part != "..";
            if (!safe) fail(index.string(), ": weight_map['", name, "'] = '", v.s, "' points outside the folder");
            if (wanted) wanted->emplace_back(name, v.s);
            if (seen.insert(v.s).second) files.push_back(v.s);
        }
    } else if (fs::exists(dir / "model.safetensors") || fs::is_symlink(dir / "model.safetensors")) {
        files.push_back("model.safetensors");
    } else {
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
        std::sort(files.begin(), files.end());
        if (files.empty())
            fail(dir.string(), ": no model.safetensors.index.json, model.safetensors or *.safetensors (not an HF model folder?)");
    }
    return files;
}

inline void open_shards(hf_folder& f, std::map<std::string, located, std::less<>>& all) {
    namespace fs = std::filesystem;
    std::vector<std::pair<std::string, std::string>> wanted;  // tensor -> shard file
    const std::vector<std::string> files = shard_files(f.dir, &wanted);
    std::map<std::string, std::size_t> shard_of;
    for (const auto& name : files) {
        const fs::path p = f.dir / name;
        // The error_code form: a name the file system refuses (e.g. longer than NAME_MAX) is a
        // bad index, one clover::error, not a filesystem_error escaping (fuzz_hf_index found it).
        std::error_code ec;
        const bool there = fs::exists(p, ec);
        if (ec) fail(p.string(), ": shard listed in model.safetensors.index.json cannot be looked up (", ec.message(), ")");
        if (!there) fail(p.string(), ": shard listed in model.safetensors.index.json is missing");
        require_inside(f.dir, p);
        shard_of[name] = f.shards.size();
        f.shards.push_back(std::make_unique<io::safetensors_file>(p));
    }
    if (!wanted.empty()) {
        for (const auto& [name, file] : wanted) {
            const auto& sh = *f.shards[shard_of[file]];
            const io::st_tensor* t = sh.find(name);
            if (!t) fail(sh.path(), ": tensor '", name, "' listed in model.safetensors.index.json is not in this shard");
            all.emplace(name, located{t, &sh.path()});
        }
    } else {
        for (const auto& sh : f.shards)
            for (const auto& t : sh->tensors())
                if (!all.emplace(t.name, located{&t, &sh->path()}).second)
                    fail(sh->path(), ": tensor '", t.name, "' is also in another shard");
    }
}

inline std::vector<std::int64_t> squeezed(std::vector<std::int64_t> s) {
    std::erase(s, std::int64_t(1));
    return s;
}

inline std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

struct planner {
    hf_folder& f;
    const std::map<std::string, located, std::less<>>& all;
    std::set<std::string> used;

    const located* find(const std::string& name) const {
        auto it = all.find(name);
        return it == all.end() ? nullptr : &it->second;
    }
    // The tensor, its dtype and shape checked. hf_shape: PyTorch order. Vectors compare
    // squeezed shapes (conv1d [C, 1, K] is [C, K]).
    const io::st_tensor* take(const std::string& name, const std::vector<std::int64_t>& hf_shape, bool vector, bool required) {
        const located* l = find(name);
        if (!l) {
            if (required) fail(f.dir.string(), ": missing tensor '", name, "' (expected shape ", shape_str(hf_shape), ")");
            return nullptr;
        }
        used.insert(name);
        const io::st_tensor& t = *l->t;
        const bool ok_type = t.type && (*t.type == dtype::f32 || *t.type == dtype::f16 || *t.type == dtype::bf16 ||
                                        (vector && *t.type == dtype::f64));
        if (!ok_type)
            fail(*l->shard, ": tensor '", name, "' has dtype ", t.dtype_name, "; expected BF16, F16 or F32", vector ? " (or F64)" : "");
        const bool ok_shape = vector ? squeezed(t.shape) == squeezed(hf_shape) : t.shape == hf_shape;
        if (!ok_shape)
            fail(*l->shard, ": tensor '", name, "' has shape ", t.shape_string(), ", expected ", shape_str(hf_shape),
                 " (from config.json)");
        return &t;
    }

    planned_tensor& add(std::string gguf, std::vector<std::int64_t> ne, bool vector, value_op op, std::vector<row_src> parts,
                        const std::string& hf_name) {
        planned_tensor pt;
        pt.name = std::move(gguf);
        pt.ne = std::move(ne);
        pt.vector = vector;
        pt.op = op;
        pt.parts = std::move(parts);
        pt.hf_name = hf_name;
        std::int64_t r = 0;
        for (const auto& p : pt.parts) {
            pt.starts.push_back(r);
            r += p.nrows;
        }
        if (r != pt.nrows()) fail(f.dir.string(), ": internal: rows of '", pt.name, "' do not add up");
        f.tensors.push_back(std::move(pt));
        return f.tensors.back();
    }
    // A whole HF tensor as one GGUF tensor (ne = reversed HF shape, or the given ne for vectors).
    planned_tensor* whole(const std::string& hf_name, const std::string& gguf, std::vector<std::int64_t> ne, bool vector,
                          value_op op = value_op::none, bool required = true) {
        std::vector<std::int64_t> hf_shape(ne.rbegin(), ne.rend());
        const io::st_tensor* t = take(hf_name, hf_shape, vector, required);
        if (!t) return nullptr;
        std::int64_t rows = 1;
        for (std::size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
        return &add(gguf, std::move(ne), vector, op, {{t, 0, rows}}, hf_name);
    }
    const io::st_tensor* take_any(const std::vector<std::string>& names, const std::vector<std::int64_t>& hf_shape, bool vector,
                                  bool required, std::string* chosen) {
        for (const auto& n : names)
            if (find(n)) {
                *chosen = n;
                return take(n, hf_shape, vector, true);
            }
        if (required) fail(f.dir.string(), ": missing tensor '", names.front(), "' (expected shape ", shape_str(hf_shape), ")");
        return nullptr;
    }
};

}  // namespace hf_detail

// Opens and plans the folder. Throws clover::error naming the file and tensor on bad input.
inline std::shared_ptr<const hf_folder> open_hf(const std::filesystem::path& dir, const hf_options& opt = {}) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) fail(dir.string(), ": not a folder (an HF model folder holds config.json and *.safetensors)");
    auto fp = std::make_shared<hf_folder>();
    hf_folder& f = *fp;
    f.dir = dir;
    if (fs::exists(dir / "config.json") || fs::is_symlink(dir / "config.json")) hf_detail::require_inside(dir, dir / "config.json");
    f.cfg = io::read_hf_config(dir);
    const io::hf_config& c = f.cfg;
    std::map<std::string, hf_detail::located, std::less<>> all;
    hf_detail::open_shards(f, all);
    hf_detail::planner pl{f, all, {}};

    // Where the text model's tensors live.
    std::string base;
    bool found = false;
    for (const char* p : {"model.language_model.", "language_model.model.", "model.", ""})
        if (pl.find(std::string(p) + "embed_tokens.weight")) { base = p; found = true; break; }
    if (!found) fail(dir.string(), ": no embed_tokens.weight (tried model.language_model., language_model.model., model. and no prefix)");

    const std::int64_t E = c.hidden, hd = c.head_dim, nq = c.n_head * hd, nkv = c.n_head_kv * hd;
    const std::int64_t Hv = c.v_heads, C = c.conv_channels(), K = c.conv_kernel, inner = Hv * c.dv;
    const std::int64_t X = c.n_expert, F = c.n_ff_exp, Fs = c.n_ff_shexp;
    f.heads = {c.qk_heads, c.v_heads, c.dk, c.dv};
    bool clover = c.clover;
    for (const auto& [name, l] : all)
        if (name.find("conv_right_weight") != std::string::npos || name.find("bd_softmax_") != std::string::npos) clover = true;
    f.arch = clover ? "clover_moe" : "qwen35moe";

    const io::st_tensor* emb = all.find(base + "embed_tokens.weight")->second.t;
    if (emb->shape.size() != 2 || emb->shape[1] != E)
        fail(*all.find(base + "embed_tokens.weight")->second.shard, ": tensor '", base, "embed_tokens.weight' has shape ",
             emb->shape_string(), ", expected [vocab_size, ", E, "]");
    const std::int64_t V = emb->shape[0];
    if (V != c.vocab) fail(c.source, ": vocab_size ", c.vocab, " but ", base, "embed_tokens.weight has ", V, " rows");

    using hf_detail::planner;
    pl.whole(base + "embed_tokens.weight", "token_embd.weight", {E, V}, false);
    pl.whole(base + "norm.weight", "output_norm.weight", {E}, true, value_op::plus_one);
    if (!c.tie) {
        std::string chosen;
        const io::st_tensor* t = pl.take_any({"lm_head.weight", base + "lm_head.weight", "language_model.lm_head.weight"}, {V, E},
                                             false, true, &chosen);
        pl.add("output.weight", {E, V}, false, value_op::none, {{t, 0, V}}, chosen);
    }
    for (std::int64_t il = 0; il < c.n_layer; ++il) {
        const std::string h = base + "layers." + std::to_string(il) + ".";
        const std::string g = "blk." + std::to_string(il) + ".";
        pl.whole(h + "input_layernorm.weight", g + "attn_norm.weight", {E}, true, value_op::plus_one);
        pl.whole(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {E}, true, value_op::plus_one);
        if (!c.recurrent[std::size_t(il)]) {
            pl.whole(h + "self_attn.q_proj.weight", g + "attn_q.weight", {E, 2 * nq}, false);
            pl.whole(h + "self_attn.k_proj.weight", g + "attn_k.weight", {E, nkv}, false);
            pl.whole(h + "self_attn.v_proj.weight", g + "attn_v.weight", {E, nkv}, false);
            pl.whole(h + "self_attn.o_proj.weight", g + "attn_output.weight", {nq, E}, false);
            pl.whole(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {hd}, true, value_op::plus_one);
            pl.whole(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {hd}, true, value_op::plus_one);
        } else {
            const std::string a = h + "linear_attn.";
            auto gdn = [&](planned_tensor* pt, const char* suffix) {
                if (pt) pt->perm = io::v_perm_of(suffix, f.heads);
            };
            gdn(pl.whole(a + "in_proj_qkv.weight", g + "attn_qkv.weight", {E, C}, false), "attn_qkv.weight");
            gdn(pl.whole(a + "in_proj_z.weight", g + "attn_gate.weight", {E, inner}, false), "attn_gate.weight");
            gdn(pl.whole(a + "in_proj_b.weight", g + "ssm_beta.weight", {E, Hv}, false), "ssm_beta.weight");
            gdn(pl.whole(a + "in_proj_a.weight", g + "ssm_alpha.weight", {E, Hv}, false), "ssm_alpha.weight");
            gdn(pl.whole(a + "conv1d.weight", g + "ssm_conv1d.weight", {K, C}, true), "ssm_conv1d.weight");
            gdn(pl.whole(a + "dt_bias", g + "ssm_dt.bias", {Hv}, true), "ssm_dt.bias");
            gdn(pl.whole(a + "A_log", g + "ssm_a", {Hv}, true, value_op::neg_exp), "ssm_a");
            pl.whole(a + "norm.weight", g + "ssm_norm.weight", {c.dv}, true);  // plain RMSNorm: no +1
            gdn(pl.whole(a + "out_proj.weight", g + "ssm_out.weight", {inner, E}, false), "ssm_out.weight");
            // Block diffusion (Clover); absent tensors leave the file causal-only.
            auto bd = [&](const char* hf, const std::string& gg, std::vector<std::int64_t> ne, const char* suffix) {
                for (std::string n : {a + hf, a + hf + ".weight"})
                    if (pl.find(n)) { gdn(pl.whole(n, gg, std::move(ne), true), suffix); return; }
            };
            bd("conv_right_weight", g + "ssm_conv1d_right.weight", {K - 1, C}, "ssm_conv1d_right.weight");
            bd("bd_softmax_logit_scale", g + "ssm_bd_logit_scale", {Hv}, "ssm_bd_logit_scale");
            bd("bd_softmax_history_bias", g + "ssm_bd_history_bias", {Hv}, "ssm_bd_history_bias");
            bd("bd_softmax_history_c", g + "ssm_bd_history_c", {Hv}, "ssm_bd_history_c");
        }
        // MoE.
        const std::string m = h + "mlp.";
        pl.whole(m + "gate.weight", g + "ffn_gate_inp.weight", {E, X}, false);
        std::string packed;
        for (std::string n : {m + "experts.gate_up_proj", m + "experts.gate_up_proj.weight"})
            if (pl.find(n)) packed = n;
        if (!packed.empty()) {
            const io::st_tensor* gu = pl.take(packed, {X, 2 * F, E}, false, true);
            if (opt.split_packed_experts) {
                std::vector<row_src> gate, up;
                for (std::int64_t e = 0; e < X; ++e) {
                    gate.push_back({gu, e * 2 * F, F});
                    up.push_back({gu, e * 2 * F + F, F});
                }
                pl.add(g + "ffn_gate_exps.weight", {E, F, X}, false, value_op::none, std::move(gate), packed);
                pl.add(g + "ffn_up_exps.weight", {E, F, X}, false, value_op::none, std::move(up), packed);
            } else {
                pl.add(g + "ffn_gate_up_exps.weight", {E, 2 * F, X}, false, value_op::none, {{gu, 0, X * 2 * F}}, packed);
            }
            std::string chosen;
            const io::st_tensor* dn = pl.take_any({m + "experts.down_proj", m + "experts.down_proj.weight"}, {X, E, F}, false, true, &chosen);
            pl.add(g + "ffn_down_exps.weight", {F, E, X}, false, value_op::none, {{dn, 0, X * E}}, chosen);
        } else {
            // Per-expert tensors: experts.N.{gate,up,down}_proj.weight, or experts.N.gate_up_proj.weight.
            const std::string e0 = m + "experts.0.";
            const bool fused = pl.find(e0 + "gate_up_proj.weight") != nullptr;
            if (!fused && !pl.find(e0 + "gate_proj.weight"))
                fail(dir.string(), ": missing tensor '", m, "experts.gate_up_proj' (packed experts) or '", e0,
                     "gate_proj.weight' (one tensor per expert)");
            std::vector<row_src> gate, up, down;
            for (std::int64_t e = 0; e < X; ++e) {
                const std::string p = m + "experts." + std::to_string(e) + ".";
                if (fused) {
                    const io::st_tensor* t = pl.take(p + "gate_up_proj.weight", {2 * F, E}, false, true);
                    gate.push_back({t, 0, F});
                    up.push_back({t, F, F});
                } else {
                    gate.push_back({pl.take(p + "gate_proj.weight", {F, E}, false, true), 0, F});
                    up.push_back({pl.take(p + "up_proj.weight", {F, E}, false, true), 0, F});
                }
                down.push_back({pl.take(p + "down_proj.weight", {E, F}, false, true), 0, E});
            }
            auto same_type = [&](const std::vector<row_src>& parts) {
                for (const auto& p : parts)
                    if (p.t->type != parts.front().t->type)
                        fail(dir.string(), ": the per-expert tensors of layer ", il, " mix dtypes (", parts.front().t->dtype_name, ", ",
                             p.t->dtype_name, ")");
            };
            same_type(gate);
            same_type(up);
            same_type(down);
            if (opt.split_packed_experts) {
                pl.add(g + "ffn_gate_exps.weight", {E, F, X}, false, value_op::none, std::move(gate), e0 + "gate_proj.weight");
                pl.add(g + "ffn_up_exps.weight", {E, F, X}, false, value_op::none, std::move(up), e0 + "up_proj.weight");
            } else {
                std::vector<row_src> gu;  // per expert: its gate rows, then its up rows
                for (std::int64_t e = 0; e < X; ++e) {
                    gu.push_back(gate[std::size_t(e)]);
                    gu.push_back(up[std::size_t(e)]);
                }
                same_type(gu);
                pl.add(g + "ffn_gate_up_exps.weight", {E, 2 * F, X}, false, value_op::none, std::move(gu), e0 + "gate_proj.weight");
            }
            pl.add(g + "ffn_down_exps.weight", {F, E, X}, false, value_op::none, std::move(down), e0 + "down_proj.weight");
        }
        if (Fs > 0) {
            pl.whole(m + "shared_expert.gate_proj.weight", g + "ffn_gate_shexp.weight", {E, Fs}, false);
            pl.whole(m + "shared_expert.up_proj.weight", g + "ffn_up_shexp.weight", {E, Fs}, false);
            pl.whole(m + "shared_expert.down_proj.weight", g + "ffn_down_shexp.weight", {Fs, E}, false);
            pl.whole(m + "shared_expert_gate.weight", g + "ffn_gate_inp_shexp.weight", {E}, true);
        }
    }

    // What nothing maps: skipped quietly when outside the text model, named when inside it.
    for (const auto& [name, l] : all) {
        if (pl.used.count(name)) continue;
        const bool text = name.starts_with(base) && !name.starts_with(base + "visual.") && !base.empty();
        const bool skip = name.starts_with("mtp.") || name.starts_with("model.mtp.") || name.find(".mtp.") != std::string::npos ||
                          name.find("visual") != std::string::npos || name.find("vision") != std::string::npos ||
                          (!base.empty() && !text) || name.find("rotary_emb.inv_freq") != std::string::npos;
        if (skip) ++f.n_skipped;
        else f.unused.push_back(name);
    }
    if (!f.unused.empty() && opt.warn) {
        std::string list;
        for (std::size_t i = 0; i < f.unused.size() && i < 5; ++i) list += (i ? ", " : "") + f.unused[i];
        opt.warn(dir.string() + ": " + std::to_string(f.unused.size()) + " tensor(s) not used by this loader: " + list +
                 (f.unused.size() > 5 ? ", ..." : ""));
    }

    io::gguf_writer w;
    io::put_gguf_metadata(c, f.arch, w);
    const std::int64_t mask = opt.extra_keys ? opt.extra_keys(f.dir, f.cfg.bos, f.cfg.eos, w, V, opt.warn) : -1;
    for (const auto& kv : w.metadata()) f.has_tokenizer = f.has_tokenizer || kv.first == "tokenizer.ggml.tokens";
    if (f.arch == "clover_moe" && !c.mask_token_id && mask >= 0) w.set_u32("clover_moe.diffusion.mask_token_id", std::uint32_t(mask));
    f.metadata = w.metadata();
    return fp;
}

// The folder as a virtual GGUF file (see the top of this header).
// extra_keys: see metadata_hook (clover::load_hf / clover::open pass the tokenizer's).
inline std::shared_ptr<const io::gguf_file> load_hf(const std::filesystem::path& dir, warn_fn warn = nullptr,
                                                    metadata_hook extra_keys = {}) {
    std::shared_ptr<const hf_folder> folder = open_hf(dir, {.split_packed_experts = false, .warn = warn, .extra_keys = std::move(extra_keys)});
    struct keep {
        std::shared_ptr<const hf_folder> folder;
        std::deque<std::vector<std::byte>> owned;
    };
    auto k = std::make_shared<keep>();
    k->folder = folder;
    std::vector<io::gguf_tensor> ts;
    ts.reserve(folder->tensors.size());
    for (const planned_tensor& pt : folder->tensors) {
        io::gguf_tensor g;
        g.name = pt.name;
        g.n_dims = int(pt.ne.size());
        for (std::size_t d = 0; d < pt.ne.size(); ++d) g.ne[d] = pt.ne[d];
        const io::st_tensor& src = *pt.parts.front().t;
        if (pt.vector) {
            std::vector<float> v = vector_values(pt);
            auto& buf = k->owned.emplace_back(v.size() * 4);
            std::memcpy(buf.data(), v.data(), buf.size());
            g.type = dtype::f32;
            g.data = buf.data();
        } else if (pt.parts.size() == 1 && reinterpret_cast<std::uintptr_t>(pt.row(0)) % src.elem_size == 0) {
            g.type = pt.src_type();  // a view into the mapped shard
            g.data = pt.row(0);
        } else {
            // Stacked per-expert tensors, or a shard whose offsets break the element alignment.
            const std::size_t rb = pt.src_row_bytes();
            auto& buf = k->owned.emplace_back(rb * std::size_t(pt.nrows()));
            for (std::int64_t r = 0; r < pt.nrows(); ++r) std::memcpy(buf.data() + std::size_t(r) * rb, pt.row(r), rb);
            g.type = pt.src_type();
            g.data = buf.data();
        }
        ts.push_back(std::move(g));
    }
    io::gguf_writer w;
    for (const auto& [key, v] : folder->metadata) w.set(key, v);
    w.set_string(folder->arch + ".gdn.v_head_order", "grouped");
    return std::make_shared<const io::gguf_file>(dir.string(), w.metadata(), std::move(ts), k);
}

// The files of an HF folder that loading it reads (those present): config.json, the index, the
// shards, the tokenizer files. What a writer must not replace (io/atomic_file.hpp).
inline std::vector<io::file_identity> input_files(const std::filesystem::path& dir) {
    std::vector<io::file_identity> ids;
    auto add = [&](const std::filesystem::path& p) {
        if (auto id = io::identity_of(p)) ids.push_back(*id);
    };
    for (const char* name : {"config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
        add(dir / name);
    try {
        for (const auto& s : hf_detail::shard_files(dir, nullptr)) add(dir / s);
    } catch (const clover::error&) {
        // No readable shard list: then no shard was read either.
    }
    return ids;
}

}  // namespace clover::hf
