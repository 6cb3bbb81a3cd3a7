#pragma once
// What a converter changes between an HF checkpoint and the canonical GGUF form
// (architecture.md §3.4–3.5), in one place so that the HF loader, `clover convert`,
// `clover gguf patch` and the tests use the very same floating-point expressions.
//
// Values: zero-centred RMSNorm weights w become 1 + w (all norms but the GDN output norm);
// A_log becomes ssm_a = −exp(A_log).
//
// V-head order of the Gated DeltaNet tensors: HF checkpoints are "grouped": V head h = g·r + j
// pairs with QK head g (r = V heads per QK head). Canonical GGUF files are "tiled": slot
// p = j·n_qk + g pairs with QK head p mod n_qk. The per-head math is the same; only which rows
// (or columns) hold which head differs. v_perm_of says which part of each GDN tensor is V-head
// indexed; v_permute_tensor moves it between the two orders.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "clover/core/dtype.hpp"
#include "clover/core/error.hpp"
#include "clover/quant/rows.hpp"

namespace clover::io {

inline float canonical_norm(float w_zero_centred) { return 1.0f + w_zero_centred; }
inline float canonical_ssm_a(float a_log) { return -std::exp(a_log); }
// The inverses, for writing HF-style or vendor-style files from canonical ones (tests).
inline float zero_centred_norm(float w) { return w - 1.0f; }
inline float a_log_of(float ssm_a) { return std::log(-ssm_a); }

enum class v_order : std::uint8_t { tiled, grouped };

struct gdn_head_dims {
    std::int64_t qk_heads = 1, v_heads = 1, dk = 1, dv = 1;
};

enum class v_axis : std::uint8_t { none, rows, cols };

// A V-head-indexed slice: along `axis`, elements [first, first + v_heads·head_dim) are
// v_heads blocks of head_dim, one per head.
struct v_perm {
    v_axis axis = v_axis::none;
    std::int64_t first = 0;
    std::int64_t head_dim = 1;
    explicit operator bool() const { return axis != v_axis::none; }
};

// By GGUF tensor name within a GDN layer (the part after "blk.N."). Rows are ggml rows (ne[1]
// and up), columns are ne[0]. Tensors not listed (ssm_norm: shared by all heads) have none.
inline v_perm v_perm_of(std::string_view suffix, const gdn_head_dims& d) {
    const std::int64_t qk = 2 * d.qk_heads * d.dk;  // the Q and K channels come first
    if (suffix == "attn_qkv.weight") return {v_axis::rows, qk, d.dv};
    if (suffix == "ssm_conv1d.weight" || suffix == "ssm_conv1d_right.weight") return {v_axis::rows, qk, d.dv};
    if (suffix == "attn_gate.weight") return {v_axis::rows, 0, d.dv};
    if (suffix == "ssm_beta.weight" || suffix == "ssm_alpha.weight") return {v_axis::rows, 0, 1};
    if (suffix == "ssm_out.weight") return {v_axis::cols, 0, d.dv};
    if (suffix == "ssm_a" || suffix == "ssm_dt.bias" || suffix == "ssm_bd_logit_scale" || suffix == "ssm_bd_history_bias" ||
        suffix == "ssm_bd_history_c")
        return {v_axis::cols, 0, 1};  // 1-D: one row of v_heads elements
    return {};
}

// The head that lands in slot p when rewriting into order `to` (from the other order).
inline std::int64_t v_source_head(std::int64_t p, v_order to, const gdn_head_dims& d) {
    const std::int64_t r = d.v_heads / d.qk_heads;
    return to == v_order::tiled ? (p % d.qk_heads) * r + p / d.qk_heads  // slot j·n_qk + g ← head g·r + j
                                : (p % r) * d.qk_heads + p / r;           // head g·r + j ← slot j·n_qk + g
}

// Index along the permuted axis: destination index o reads source index v_source_index(o).
inline std::int64_t v_source_index(const v_perm& pm, std::int64_t o, v_order to, const gdn_head_dims& d) {
    if (!pm || o < pm.first || o >= pm.first + d.v_heads * pm.head_dim) return o;
    const std::int64_t q = o - pm.first;
    return pm.first + v_source_head(q / pm.head_dim, to, d) * pm.head_dim + q % pm.head_dim;
}

// Permutes the columns of one f32 row (cols axis). src and dst must not alias.
inline void v_permute_cols_f32(const v_perm& pm, const float* src, float* dst, std::int64_t n, v_order to, const gdn_head_dims& d) {
    for (std::int64_t o = 0; o < n; ++o) dst[o] = src[v_source_index(pm, o, to, d)];
}

// Rewrites a whole tensor of ggml shape ne (type t, bytes src) into dst (same size) in order
// `to`. Rows move as bytes (any type). Columns move as bytes when each head's span is whole
// blocks; otherwise they are dequantised, moved and quantised again, which is lossless for
// F32/F16/BF16 only — a block-quantised tensor whose heads split blocks is refused.
inline void v_permute_tensor(const v_perm& pm, dtype t, const std::int64_t* ne, std::span<const std::byte> src,
                             std::span<std::byte> dst, v_order to, const gdn_head_dims& d, std::string_view name) {
    const auto tr = *traits_of(t);
    const std::int64_t ne0 = ne[0], nrows = ne[1] * ne[2] * ne[3];
    const std::size_t rb = std::size_t(ne0 / tr.block) * tr.block_bytes;
    if (src.size() != rb * std::size_t(nrows) || dst.size() != src.size())
        fail("v-head reorder of '", name, "': ", src.size(), " bytes for shape ", ne0, " x ", nrows);
    if (!pm) { std::memcpy(dst.data(), src.data(), src.size()); return; }
    const std::int64_t span = pm.axis == v_axis::rows ? nrows : ne0;
    if (pm.first + d.v_heads * pm.head_dim > span)
        fail("v-head reorder of '", name, "': ", d.v_heads, " heads of ", pm.head_dim, " from ", pm.first, " do not fit in ", span);
    if (pm.axis == v_axis::rows) {
        for (std::int64_t o = 0; o < nrows; ++o)
            std::memcpy(dst.data() + std::size_t(o) * rb, src.data() + std::size_t(v_source_index(pm, o, to, d)) * rb, rb);
        return;
    }
    if (pm.first % tr.block == 0 && pm.head_dim % tr.block == 0) {
        const std::size_t hb = std::size_t(pm.head_dim / tr.block) * tr.block_bytes;
        const std::size_t b0 = std::size_t(pm.first / tr.block) * tr.block_bytes;
        for (std::int64_t r = 0; r < nrows; ++r) {
            const std::byte* s = src.data() + std::size_t(r) * rb;
            std::byte* o = dst.data() + std::size_t(r) * rb;
            std::memcpy(o, s, rb);
            for (std::int64_t p = 0; p < d.v_heads; ++p)
                std::memcpy(o + b0 + std::size_t(p) * hb, s + b0 + std::size_t(v_source_head(p, to, d)) * hb, hb);
        }
        return;
    }
    if (tr.block != 1 || !quant::is_supported_weight(t))
        fail("'", name, "' is stored as ", tr.name, " with V heads of ", pm.head_dim,
             " columns that split its blocks: reordering them would need re-quantisation");
    std::vector<float> a(static_cast<std::size_t>(ne0)), b(static_cast<std::size_t>(ne0));
    for (std::int64_t r = 0; r < nrows; ++r) {
        quant::dequantize_row(t, src.data() + std::size_t(r) * rb, a.data(), ne0);
        v_permute_cols_f32(pm, a.data(), b.data(), ne0, to, d);
        quant::quantize_row(t, b.data(), dst.data() + std::size_t(r) * rb, ne0);
    }
}

}  // namespace clover::io
