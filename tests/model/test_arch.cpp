// The architecture headers (arch/qwen35moe.hpp, arch/clover_moe.hpp, arch/registry.hpp): the
// layer pattern becomes each layer's type at binding, clover_moe adds its block-diffusion
// tensors to the GDN layers only, and an unknown architecture is named with the known ones.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include <clover/arch/registry.hpp>
#include <clover/io/gguf.hpp>
#include <clover/io/gguf_writer.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

// A copy of `src` with metadata edited by `meta` and the tensors `keep` accepts.
std::string rewrite(const std::string& src, const std::string& name, const std::function<void(io::gguf_writer&)>& meta,
                    const std::function<bool(const std::string&)>& keep = [](const std::string&) { return true; }) {
    io::gguf_file f(src);
    io::gguf_writer w;
    for (const auto& [k, v] : f.metadata())
        if (k != "general.alignment") w.set(k, v);
    meta(w);
    for (const auto& t : f.tensors())
        if (keep(t.name))
            w.add_tensor_bytes(t.name, t.type, std::vector<std::int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), {t.data, t.nbytes});
    const std::string p = testutil::tmp(name);
    w.write(p);
    return p;
}

struct bound {
    hparams h;
    model_weights w;
};
bound bind_file(const std::string& path) {
    auto f = std::make_shared<const io::gguf_file>(path);
    bound b{read_hparams(*f), {}};
    b.w = bind_weights(f, b.h);
    return b;
}

bool is_gdn(const layer_weights& L) { return std::holds_alternative<layers::gdn_weights>(L.mixer); }

using testutil::error_of;

}  // namespace

TEST_CASE("each layer's token mixer has the type the layer pattern names") {
    const std::string src = testutil::synth_file("arch_odd.gguf", testutil::odd_spec());  // attention every 2nd layer
    SUBCASE("full_attention_interval") {
        const bound b = bind_file(src);
        REQUIRE(b.w.layers.size() == 5);
        for (std::size_t i = 0; i < 5; ++i) {
            CAPTURE(i);
            CHECK(is_gdn(b.w.layers[i]) == ((i + 1) % 2 != 0));
            CHECK(b.h.recurrent[i] == is_gdn(b.w.layers[i]));
        }
    }
    SUBCASE("attention.recurrent_layers wins over the interval") {
        // The same tensors under an interval that would put attention at layer 2 only: binding
        // succeeds only if the per-layer list is the pattern read.
        const std::string p = rewrite(src, "arch_odd_rl.gguf", [](io::gguf_writer& w) {
            w.set_u32("qwen35moe.full_attention_interval", 3);
            w.set_int_array("qwen35moe.attention.recurrent_layers", io::gguf_type::boolean, {1, 0, 1, 0, 1});
        });
        const bound b = bind_file(p);
        for (std::size_t i = 0; i < 5; ++i) CHECK(is_gdn(b.w.layers[i]) == (i % 2 == 0));
        const std::string q = rewrite(src, "arch_odd_rl3.gguf", [](io::gguf_writer& w) {
            w.set_int_array("qwen35moe.attention.recurrent_layers", io::gguf_type::boolean, {1, 1, 0, 1, 1});
        });
        CHECK(error_of([&] { bind_file(q); }).find("missing tensor 'blk.1.attn_qkv.weight'") != std::string::npos);
    }
}

TEST_CASE("clover_moe binds block-diffusion tensors on its GDN layers; qwen35moe binds none") {
    const bound c = bind_file(testutil::synth_file("arch_clover_odd.gguf", testutil::clover_odd_spec()));
    CHECK(c.h.is_clover());
    CHECK(c.w.has_diffusion());
    CHECK(c.w.missing_diffusion.empty());
    for (const layer_weights& L : c.w.layers)
        if (const auto* g = std::get_if<layers::gdn_weights>(&L.mixer)) CHECK(g->has_diffusion());

    const bound q = bind_file(testutil::synth_file("arch_odd.gguf", testutil::odd_spec()));
    CHECK_FALSE(q.w.has_diffusion());
    CHECK(q.w.missing_diffusion.empty());
    for (const layer_weights& L : q.w.layers)
        if (const auto* g = std::get_if<layers::gdn_weights>(&L.mixer)) CHECK_FALSE(g->has_diffusion());
}

TEST_CASE("a clover_moe file without some block-diffusion tensors loads and names them in layer order") {
    const std::string src = testutil::synth_file("arch_clover_odd.gguf", testutil::clover_odd_spec());
    const std::string p = rewrite(src, "arch_clover_partial.gguf", [](io::gguf_writer&) {}, [](const std::string& n) {
        return n != "blk.2.ssm_conv1d_right.weight" && n != "blk.0.ssm_bd_history_c";
    });
    const bound b = bind_file(p);
    CHECK_FALSE(b.w.has_diffusion());
    CHECK(b.w.missing_diffusion == std::vector<std::string>{"blk.0.ssm_bd_history_c", "blk.2.ssm_conv1d_right.weight"});
}

TEST_CASE("an unknown or absent architecture is one error naming the supported ones") {
    const std::string src = testutil::synth_file("arch_odd.gguf", testutil::odd_spec());
    const std::string p = rewrite(src, "arch_llama.gguf", [](io::gguf_writer& w) { w.set_string("general.architecture", "llama"); });
    CHECK(error_of([&] { bind_file(p); }).find("architecture 'llama' is not supported (expected qwen35moe or clover_moe)") !=
          std::string::npos);
    const std::string none = rewrite(src, "arch_none.gguf", [](io::gguf_writer& w) { w.remove("general.architecture"); });
    CHECK(error_of([&] { bind_file(none); }).find("key not found: general.architecture") != std::string::npos);

    hparams h = read_hparams(io::gguf_file(src));
    h.arch = "llama";
    CHECK(error_of([&] { bind_weights(std::make_shared<const io::gguf_file>(src), h); })
              .find("architecture 'llama' is not supported") != std::string::npos);
}
