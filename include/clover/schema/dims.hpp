#pragma once
// Variants are types. A static variant fixes every dimension at compile time (loops and buffers
// in the layers size themselves from constexpr values); `from_file` leaves them `dynamic`, like
// Eigen's Dynamic, so one binary runs any size of the family. `dims<V>` is the one interface
// layers read sizes through: it returns the constexpr value when the variant has one.
#include <cstdint>
#include <string>

#include "clover/core/error.hpp"
#include "clover/schema/hparams.hpp"

namespace clover {

inline constexpr std::int64_t dynamic = -1;

namespace variants {

// The real Clover-35B-A3B-Preview (and its causal base below).
struct clover_35b_a3b {
    static constexpr const char* name = "clover-35b-a3b";
    static constexpr bool diffusion = true;
    static constexpr std::int64_t n_vocab = 248320, n_embd = 2048, n_layer = 40;
    static constexpr std::int64_t n_head = 16, n_head_kv = 2, head_dim = 256, n_rot = 64;
    static constexpr std::int64_t ssm_conv = 4, ssm_d_state = 128, ssm_n_group = 16, ssm_dt_rank = 32, ssm_d_inner = 4096;
    static constexpr std::int64_t n_expert = 256, n_expert_used = 8, n_ff_exp = 512, n_ff_shexp = 512;
};

// Qwen3.6-35B-A3B (= Qwen3.5-35B-A3B): same dimensions, causal only.
struct qwen36_35b_a3b : clover_35b_a3b {
    static constexpr const char* name = "qwen3.6-35b-a3b";
    static constexpr bool diffusion = false;
};

// The `tiny` synth preset (clover gguf synth --preset tiny): small enough for unit tests,
// with every structural feature of the real model (GQA, partial rope, 2 V heads per QK head).
struct tiny {
    static constexpr const char* name = "tiny";
    static constexpr bool diffusion = true;
    static constexpr std::int64_t n_vocab = 512, n_embd = 64, n_layer = 4;
    static constexpr std::int64_t n_head = 4, n_head_kv = 2, head_dim = 32, n_rot = 8;
    static constexpr std::int64_t ssm_conv = 4, ssm_d_state = 16, ssm_n_group = 2, ssm_dt_rank = 4, ssm_d_inner = 64;
    static constexpr std::int64_t n_expert = 8, n_expert_used = 2, n_ff_exp = 32, n_ff_shexp = 32;
};

// Every dimension from the file.
struct from_file {
    static constexpr const char* name = "from-file";
    static constexpr bool diffusion = true;
    static constexpr std::int64_t n_vocab = dynamic, n_embd = dynamic, n_layer = dynamic;
    static constexpr std::int64_t n_head = dynamic, n_head_kv = dynamic, head_dim = dynamic, n_rot = dynamic;
    static constexpr std::int64_t ssm_conv = dynamic, ssm_d_state = dynamic, ssm_n_group = dynamic, ssm_dt_rank = dynamic,
                                  ssm_d_inner = dynamic;
    static constexpr std::int64_t n_expert = dynamic, n_expert_used = dynamic, n_ff_exp = dynamic, n_ff_shexp = dynamic;
};

}  // namespace variants

template <class V>
concept variant = requires {
    { V::name } -> std::convertible_to<const char*>;
    { V::diffusion } -> std::convertible_to<bool>;
    V::n_embd; V::n_layer; V::n_head; V::n_head_kv; V::head_dim; V::n_rot; V::n_vocab;
    V::ssm_conv; V::ssm_d_state; V::ssm_n_group; V::ssm_dt_rank; V::ssm_d_inner;
    V::n_expert; V::n_expert_used; V::n_ff_exp; V::n_ff_shexp;
};

// Sizes as layers see them: constexpr for a static variant, the file's value for `dynamic`.
template <variant V>
struct dims {
    const hparams* hp;

#define CLOVER_DIM(field) \
    constexpr std::int64_t field() const { \
        if constexpr (V::field != dynamic) return V::field; \
        else return hp->field; \
    }
    CLOVER_DIM(n_vocab) CLOVER_DIM(n_embd) CLOVER_DIM(n_layer) CLOVER_DIM(n_head) CLOVER_DIM(n_head_kv)
    CLOVER_DIM(head_dim) CLOVER_DIM(n_rot) CLOVER_DIM(ssm_conv) CLOVER_DIM(ssm_d_state) CLOVER_DIM(ssm_n_group)
    CLOVER_DIM(ssm_dt_rank) CLOVER_DIM(ssm_d_inner) CLOVER_DIM(n_expert) CLOVER_DIM(n_expert_used)
    CLOVER_DIM(n_ff_exp) CLOVER_DIM(n_ff_shexp)
#undef CLOVER_DIM
    // GDN naming: QK heads, V heads, key and value head sizes.
    constexpr std::int64_t qk_heads() const { return ssm_n_group(); }
    constexpr std::int64_t v_heads() const { return ssm_dt_rank(); }
    constexpr std::int64_t dk() const { return ssm_d_state(); }
    constexpr std::int64_t dv() const { return ssm_d_inner() / ssm_dt_rank(); }
    constexpr std::int64_t conv_channels() const { return 2 * qk_heads() * dk() + ssm_d_inner(); }
    const hparams& h() const { return *hp; }
};

// A file whose dimensions differ from a static variant is an error naming the dimension.
template <variant V>
void check_fits(const hparams& h, const std::string& path) {
    auto chk = [&](const char* what, std::int64_t want, std::int64_t got) {
        if (want != dynamic && want != got)
            fail(path, ": does not fit variant '", V::name, "': ", what, " is ", got, " in the file, ", want, " in the variant");
    };
    chk("embedding_length", V::n_embd, h.n_embd);
    chk("block_count", V::n_layer, h.n_layer);
    chk("attention.head_count", V::n_head, h.n_head);
    chk("attention.head_count_kv", V::n_head_kv, h.n_head_kv);
    chk("attention.key_length", V::head_dim, h.head_dim);
    chk("rope.dimension_count", V::n_rot, h.n_rot);
    chk("ssm.conv_kernel", V::ssm_conv, h.ssm_conv);
    chk("ssm.state_size", V::ssm_d_state, h.ssm_d_state);
    chk("ssm.group_count", V::ssm_n_group, h.ssm_n_group);
    chk("ssm.time_step_rank", V::ssm_dt_rank, h.ssm_dt_rank);
    chk("ssm.inner_size", V::ssm_d_inner, h.ssm_d_inner);
    chk("expert_count", V::n_expert, h.n_expert);
    chk("expert_used_count", V::n_expert_used, h.n_expert_used);
    chk("expert_feed_forward_length", V::n_ff_exp, h.n_ff_exp);
    chk("expert_shared_feed_forward_length", V::n_ff_shexp, h.n_ff_shexp);
    chk("n_vocab (token_embd rows)", V::n_vocab, h.n_vocab);
}

}  // namespace clover
