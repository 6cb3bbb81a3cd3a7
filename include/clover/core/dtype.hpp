#pragma once
// Element types of weights as GGUF/ggml numbers them. Sizes are needed for every type a file may
// hold (so `gguf info` can describe any file); compute kernels exist for a subset (quant/).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace clover {

enum class dtype : std::uint32_t {
    f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
    q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15,
    iq2_xxs = 16, iq2_xs = 17, iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22,
    iq4_xs = 23, i8 = 24, i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30,
    tq1_0 = 34, tq2_0 = 35, mxfp4 = 39,
};

struct dtype_traits {
    std::string_view name;
    std::uint32_t block;        // elements per block
    std::uint32_t block_bytes;  // bytes per block
};

// nullopt for ids this build does not know (a file with one is rejected by name).
constexpr std::optional<dtype_traits> traits_of(dtype t) {
    switch (t) {
        case dtype::f32: return dtype_traits{"F32", 1, 4};
        case dtype::f16: return dtype_traits{"F16", 1, 2};
        case dtype::bf16: return dtype_traits{"BF16", 1, 2};
        case dtype::f64: return dtype_traits{"F64", 1, 8};
        case dtype::i8: return dtype_traits{"I8", 1, 1};
        case dtype::i16: return dtype_traits{"I16", 1, 2};
        case dtype::i32: return dtype_traits{"I32", 1, 4};
        case dtype::i64: return dtype_traits{"I64", 1, 8};
        case dtype::q4_0: return dtype_traits{"Q4_0", 32, 18};
        case dtype::q4_1: return dtype_traits{"Q4_1", 32, 20};
        case dtype::q5_0: return dtype_traits{"Q5_0", 32, 22};
        case dtype::q5_1: return dtype_traits{"Q5_1", 32, 24};
        case dtype::q8_0: return dtype_traits{"Q8_0", 32, 34};
        case dtype::q8_1: return dtype_traits{"Q8_1", 32, 36};
        case dtype::q2_k: return dtype_traits{"Q2_K", 256, 84};
        case dtype::q3_k: return dtype_traits{"Q3_K", 256, 110};
        case dtype::q4_k: return dtype_traits{"Q4_K", 256, 144};
        case dtype::q5_k: return dtype_traits{"Q5_K", 256, 176};
        case dtype::q6_k: return dtype_traits{"Q6_K", 256, 210};
        case dtype::q8_k: return dtype_traits{"Q8_K", 256, 292};
        case dtype::iq2_xxs: return dtype_traits{"IQ2_XXS", 256, 66};
        case dtype::iq2_xs: return dtype_traits{"IQ2_XS", 256, 74};
        case dtype::iq3_xxs: return dtype_traits{"IQ3_XXS", 256, 98};
        case dtype::iq1_s: return dtype_traits{"IQ1_S", 256, 50};
        case dtype::iq4_nl: return dtype_traits{"IQ4_NL", 32, 18};
        case dtype::iq3_s: return dtype_traits{"IQ3_S", 256, 110};
        case dtype::iq2_s: return dtype_traits{"IQ2_S", 256, 82};
        case dtype::iq4_xs: return dtype_traits{"IQ4_XS", 256, 136};
        case dtype::iq1_m: return dtype_traits{"IQ1_M", 256, 56};
        case dtype::tq1_0: return dtype_traits{"TQ1_0", 256, 54};
        case dtype::tq2_0: return dtype_traits{"TQ2_0", 256, 66};
        case dtype::mxfp4: return dtype_traits{"MXFP4", 32, 17};
    }
    return std::nullopt;
}

constexpr std::string_view dtype_name(dtype t) {
    auto tr = traits_of(t);
    return tr ? tr->name : std::string_view{"unknown"};
}

inline std::optional<dtype> dtype_from_name(std::string_view s) {
    for (std::uint32_t i = 0; i < 40; ++i) {
        auto tr = traits_of(static_cast<dtype>(i));
        if (!tr) continue;
        std::string_view n = tr->name;
        if (n.size() != s.size()) continue;
        bool eq = true;
        for (std::size_t k = 0; k < n.size(); ++k) {
            char a = n[k], b = s[k];
            if (b >= 'a' && b <= 'z') b = char(b - 'a' + 'A');
            if (a != b) { eq = false; break; }
        }
        if (eq) return static_cast<dtype>(i);
    }
    return std::nullopt;
}

}  // namespace clover
