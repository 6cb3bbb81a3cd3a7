#pragma once
// The bound weights of the hybrid MoE decoder that qwen35moe and clover_moe share: token
// embedding; per layer a pre-norm, a token mixer of the layer's kind, a post-norm and a sparse
// MoE; final norm and LM head. A layer's kind is the type its mixer holds: the architecture
// header decides it once, at binding, and the model visits it (model::forward).
#include <deque>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "clover/io/gguf.hpp"
#include "clover/layers/gated_attention.hpp"
#include "clover/layers/gated_deltanet.hpp"
#include "clover/layers/sparse_moe.hpp"
#include "clover/schema/weights.hpp"
#include "clover/tensor/weight.hpp"

namespace clover {

// Every token-mixer kind a supported architecture has. Each alternative names the layer that
// runs it (W::layer<V>), so visiting needs no case per kind.
using token_mixer_weights = std::variant<layers::attention_weights, layers::gdn_weights>;

struct layer_weights {
    weight attn_norm, post_norm;  // [n_embd] f32: before the mixer, before the MoE
    token_mixer_weights mixer;
    layers::moe_weights moe;
};

struct model_weights {
    std::shared_ptr<const io::gguf_file> file;
    weight tok_embd;     // [n_vocab, n_embd]
    weight output_norm;  // [n_embd] f32
    weight output;       // [n_vocab, n_embd] (token_embd when the file ties them)
    std::vector<layer_weights> layers;
    std::deque<std::vector<float>> owned;  // f32 copies of small vectors (deque: stable addresses)
    // Block diffusion: whether the architecture has its tensors at all (clover_moe), and the
    // names of those the file lacks.
    bool diffusion_tensors = false;
    std::vector<std::string> missing_diffusion;

    bool has_diffusion() const { return diffusion_tensors && missing_diffusion.empty(); }
    // The matrices only products read (weight_memory::products): every layer's, and the LM
    // head unless it is the token embedding (whose rows are looked up).
    std::vector<weight*> products() {
        std::vector<weight*> out;
        for (layer_weights& l : layers) {
            std::visit([&](auto& m) { m.products(out); }, l.mixer);
            l.moe.products(out);
        }
        if (output.data != tok_embd.data) out.push_back(&output);
        return out;
    }
    weight_binder binder() { return {*file, owned}; }
};

}  // namespace clover
