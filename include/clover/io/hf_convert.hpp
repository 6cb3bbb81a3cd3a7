#pragma once
// `clover convert HF_DIR -o OUT.gguf [--type ...]`: an HF folder (io/hf_model.hpp) into a
// canonical qwen35moe / clover_moe GGUF, the block-diffusion tensors included.
//
// Canonical means what llama.cpp's converter writes (architecture.md §3.3–3.5): the value
// transformations of io/canonical_form.hpp, V heads permuted into the tiled order, packed
// experts split into ffn_gate_exps / ffn_up_exps, vectors (norms, conv taps, A, dt, gates,
// diffusion scalars) and the router ffn_gate_inp in F32, the other matrices in the chosen type.
// The output says `{arch}.gdn.v_head_order = "tiled"` so `gguf info` can state it.
//
// Streaming: the writer fills one tensor at a time straight from the mapped shards, so memory
// stays bounded by the largest tensor (the embedding). Rows are converted on all cores.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "clover/core/error.hpp"
#include "clover/io/canonical_form.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/io/hf_model.hpp"
#include "clover/quant/rows.hpp"

namespace clover::hf {

struct convert_options {
    std::string type = "auto";  // auto (each matrix keeps its dtype) | f32 | f16 | bf16 | q8_0 | q4_k | q4_k_m
    int threads = 0;            // 0: all cores
    warn_fn warn = nullptr;
    metadata_hook extra_keys = {};  // the tokenizer's keys (clover::convert_hf passes them)
    // After each tensor: tensors written, tensors in all, bytes written, bytes in all.
    std::function<void(std::size_t, std::size_t, std::uint64_t, std::uint64_t)> progress = {};
};

struct convert_result {
    std::string arch;
    std::size_t n_tensors = 0, n_fallback = 0;  // fallback: rows not a whole number of blocks → F32
    std::uint64_t bytes = 0;
    double seconds = 0;
};

namespace conv_detail {

inline void parallel_rows(std::int64_t n, std::int64_t work_per_row, int threads, const std::function<void(std::int64_t, std::int64_t)>& fn) {
    int t = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
    if (n * work_per_row < (1 << 20) || t == 1) { fn(0, n); return; }
    t = int(std::min<std::int64_t>(t, n));
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errs(static_cast<std::size_t>(t));
    for (int k = 0; k < t; ++k)
        pool.emplace_back([&, k] {
            try {
                fn(n * k / t, n * (k + 1) / t);
            } catch (...) {
                errs[std::size_t(k)] = std::current_exception();
            }
        });
    for (auto& th : pool) th.join();
    for (auto& e : errs)
        if (e) std::rethrow_exception(e);
}

// Drops our mapping's pages of [p, p + n) once a tensor is written: they stay in the page
// cache, but the process's resident size stays near one tensor instead of the whole model.
inline void release(const std::byte* p, std::size_t n) {
    const auto page = std::uintptr_t(::sysconf(_SC_PAGESIZE));
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p) / page * page;
    const std::uintptr_t b = (reinterpret_cast<std::uintptr_t>(p) + n + page - 1) / page * page;
    if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

// llama.cpp's use_more_bits (Q4_K_M keeps some attn_v / ffn_down tensors in Q6_K).
inline bool more_bits(std::int64_t i, std::int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

inline std::int64_t layer_of(const std::string& name) {
    if (!name.starts_with("blk.")) return -1;
    return std::atoll(name.c_str() + 4);
}

}  // namespace conv_detail

inline constexpr const char* convert_types[] = {"auto", "f32", "f16", "bf16", "q8_0", "q4_k", "q4_k_m"};

// The GGUF type of one planned tensor for the requested output type. attn_ordinal: the index of
// this attention layer among the attention layers (Q4_K_M's attn_v rule).
inline dtype output_type(const planned_tensor& pt, const std::string& type, const hf_folder& f, std::int64_t attn_ordinal) {
    if (pt.vector) return dtype::f32;
    const bool router = pt.name.ends_with("ffn_gate_inp.weight");  // llama.cpp's converter keeps it F32
    dtype t = dtype::f32;
    if (type == "auto") return pt.src_type();
    if (type == "f32" || router) return dtype::f32;
    if (type == "f16") t = dtype::f16;
    else if (type == "bf16") t = dtype::bf16;
    else if (type == "q8_0") t = dtype::q8_0;
    else if (type == "q4_k") t = dtype::q4_k;
    else if (type == "q4_k_m") {
        std::int64_t n_attn = 0;
        for (bool r : f.cfg.recurrent) n_attn += !r;
        t = dtype::q4_k;
        if (pt.name == "output.weight") t = dtype::q6_k;
        else if (pt.name.ends_with("attn_v.weight") && conv_detail::more_bits(attn_ordinal, n_attn)) t = dtype::q6_k;
        else if ((pt.name.ends_with("ffn_down_exps.weight") || pt.name.ends_with("ffn_down_shexp.weight")) &&
                 conv_detail::more_bits(conv_detail::layer_of(pt.name), f.cfg.n_layer))
            t = dtype::q6_k;
    } else {
        fail("convert: --type '", type, "' is not one of auto, f32, f16, bf16, q8_0, q4_k, q4_k_m");
    }
    // Rows that are not whole blocks: Q8_0 where that fits, else F32 (llama.cpp falls back too).
    const std::int64_t ne0 = pt.ne[0];
    if (ne0 % std::int64_t(traits_of(t)->block) != 0) t = ne0 % 32 == 0 ? dtype::q8_0 : dtype::f32;
    return t;
}

inline convert_result convert(const std::filesystem::path& dir, const std::filesystem::path& out, const convert_options& o = {}) {
    const auto t0 = std::chrono::steady_clock::now();
    if (std::find(std::begin(convert_types), std::end(convert_types), o.type) == std::end(convert_types))
        fail("convert: --type '", o.type, "' is not one of auto, f32, f16, bf16, q8_0, q4_k, q4_k_m");
    if ((o.type == "q4_k" || o.type == "q4_k_m") && !(quant::is_supported_weight(dtype::q4_k) && quant::is_supported_weight(dtype::q6_k)))
        fail("convert: --type ", o.type, " is not supported yet in this build (Q4_K/Q6_K quantisation has not landed)");
    std::shared_ptr<const hf_folder> fp = open_hf(dir, {.split_packed_experts = true, .warn = o.warn, .extra_keys = o.extra_keys});
    const hf_folder& f = *fp;
    convert_result res;
    res.arch = f.arch;

    io::gguf_writer w;
    for (const auto& [key, v] : f.metadata) w.set(key, v);
    w.set_string(f.arch + ".gdn.v_head_order", "tiled");
    std::uint32_t ftype = 0;
    if (o.type == "f16") ftype = 1;
    else if (o.type == "bf16") ftype = 32;
    else if (o.type == "q8_0") ftype = 7;
    else if (o.type == "q4_k") ftype = 14;
    else if (o.type == "q4_k_m") ftype = 15;
    else if (o.type == "auto") {
        const dtype t = f.tensors.front().src_type();  // the embedding's
        ftype = t == dtype::bf16 ? 32 : t == dtype::f16 ? 1 : 0;
    }
    w.set_u32("general.file_type", ftype);

    const io::gdn_head_dims heads = f.heads;
    std::vector<std::uint64_t> sizes;
    std::int64_t attn_ordinal = -1;
    for (const planned_tensor& pt : f.tensors) {
        if (pt.name.ends_with("attn_v.weight")) ++attn_ordinal;
        const dtype t = output_type(pt, o.type, f, std::max<std::int64_t>(attn_ordinal, 0));
        if (!pt.vector && o.type != "auto" && o.type != "f32" && t == dtype::f32 && !pt.name.ends_with("ffn_gate_inp.weight"))
            ++res.n_fallback;
        const planned_tensor* p = &pt;
        const int threads = o.threads;
        w.add_tensor(pt.name, t, pt.ne, [p, t, heads, threads](std::span<std::byte> dst) {
            const planned_tensor& pt = *p;
            const std::int64_t ne0 = pt.ne[0], nrows = pt.nrows();
            const std::size_t orb = quant::row_bytes(t, ne0);
            const io::v_perm perm = pt.perm;
            if (pt.vector) {
                const std::vector<float> v = vector_values(pt);
                std::vector<float> row(static_cast<std::size_t>(ne0));
                for (std::int64_t r = 0; r < nrows; ++r) {
                    const std::int64_t sr = perm.axis == io::v_axis::rows ? io::v_source_index(perm, r, io::v_order::tiled, heads) : r;
                    const float* s = v.data() + sr * ne0;
                    if (perm.axis == io::v_axis::cols) io::v_permute_cols_f32(perm, s, row.data(), ne0, io::v_order::tiled, heads);
                    else std::copy_n(s, ne0, row.data());
                    quant::quantize_row(t, row.data(), dst.data() + std::size_t(r) * orb, ne0);
                }
                return;
            }
            const dtype st = pt.src_type();
            conv_detail::parallel_rows(nrows, ne0, threads, [&](std::int64_t r0, std::int64_t r1) {
                std::vector<float> a(static_cast<std::size_t>(ne0)), b(static_cast<std::size_t>(ne0));
                for (std::int64_t r = r0; r < r1; ++r) {
                    const std::int64_t sr = perm.axis == io::v_axis::rows ? io::v_source_index(perm, r, io::v_order::tiled, heads) : r;
                    const std::byte* src = pt.row(sr);
                    std::byte* d = dst.data() + std::size_t(r) * orb;
                    if (perm.axis != io::v_axis::cols && st == t) {
                        std::memcpy(d, src, orb);
                        continue;
                    }
                    quant::dequantize_row(st, src, a.data(), ne0);
                    if (perm.axis == io::v_axis::cols) {
                        io::v_permute_cols_f32(perm, a.data(), b.data(), ne0, io::v_order::tiled, heads);
                        a.swap(b);
                    }
                    quant::quantize_row(t, a.data(), d, ne0);
                }
            });
            for (const row_src& part : pt.parts)
                conv_detail::release(part.t->data + std::size_t(part.row0) * pt.src_row_bytes(), std::size_t(part.nrows) * pt.src_row_bytes());
        });
        sizes.push_back(w.tensors().back().nbytes);
    }
    std::uint64_t total = 0;
    for (auto s : sizes) total += s;
    std::uint64_t done = 0;
    // Never over a file of the folder (config.json, a shard, ...): refused before anything is written.
    w.write(
        out,
        [&](std::size_t i, std::size_t n) {
            done += sizes[i - 1];
            if (o.progress) o.progress(i, n, done, total);
        },
        input_files(dir));
    if (res.n_fallback && o.warn)
        o.warn("convert: " + std::to_string(res.n_fallback) + " tensor(s) have rows that are not whole blocks of the chosen type; kept in F32");
    res.n_tensors = sizes.size();
    res.bytes = total;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

}  // namespace clover::hf
