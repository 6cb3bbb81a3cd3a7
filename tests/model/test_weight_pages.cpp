// The CPU backend's weights in huge pages (cpu_options::huge_pages, io/huge_pages.hpp): a model
// that moves the shared file map into huge pages leaves another model on the same file running,
// and both give the logits of the file map bit for bit.
#include <doctest/doctest.h>

#include <cstring>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace weight_pages_test {
const std::string bundled_path = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";

std::vector<float> logits_at(model<variants::from_file>& m, const std::vector<token>& ids) {
    auto s = m.new_session({.ctx = std::int64_t(ids.size())});
    std::vector<float> out;
    m.commit(s, ids, logits_rows::all, out);
    return out;
}
}  // namespace weight_pages_test
using namespace weight_pages_test;

TEST_CASE("weights in huge pages: same logits, and a model on the same map keeps running") {
    const auto file = load(bundled_path);
    const std::vector<token> ids{3, 17, 101, 5, 64, 9, 250, 33, 7};
    model<variants::from_file> mapped(file, {.threads = 2, .huge_pages = false});
    CHECK(mapped.backend().weights_placement() == "weights mapped in place");
    CHECK(!file->map().in_huge_pages());
    const std::vector<float> want = logits_at(mapped, ids);

    const std::byte* before = file->map().data();
    model<variants::from_file> moved(file, {.threads = 2});  // huge_pages by default
    const std::string plan = io::huge_page_plan(file->map().size(), io::read_memory_outlook());
    if (plan.empty()) {
        CHECK(moved.backend().weights_placement() == "weights in huge pages");
        CHECK(file->map().in_huge_pages());
    } else {
        CHECK(moved.backend().weights_placement() == "weights mapped in place: " + plan);
        MESSAGE("this machine keeps the file map: " << plan);
    }
    CHECK(file->map().data() == before);  // every weight pointer is still good

    const std::vector<float> again = logits_at(mapped, ids), other = logits_at(moved, ids);
    REQUIRE(again.size() == want.size());
    REQUIRE(other.size() == want.size());
    CHECK(std::memcmp(again.data(), want.data(), want.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(other.data(), want.data(), want.size() * sizeof(float)) == 0);
}

// A Q8_0 / Q4_K_M file large enough for huge pages: the first model rearranges its product
// matrices into 16-row groups, a second model of the same file reads them the same way (bit for
// bit), and a model of a second map of the file, which keeps the file's layout, gives the same
// greedy tokens and logits within rounding (the two summation orders: equal on the Q8_0 file,
// within 1e-6 on the Q4_K_M one when written).
TEST_CASE("rearranged weights: a second model of the file agrees bit for bit, the file's layout within rounding") {
    for (const bool q4_k_m : {false, true}) {
        CAPTURE(q4_k_m);
        synth::spec s;
        s.preset = q4_k_m ? "rearrange-q4km" : "rearrange-q8";
        s.n_vocab = 600; s.n_embd = 256; s.n_layer = 4; s.interval = 2;
        s.n_head = 2; s.n_head_kv = 1; s.head_dim = 128; s.n_rot = 32; s.sections = {6, 5, 5, 0};
        s.ssm_conv = 4; s.ssm_d_state = 32; s.ssm_n_group = 4; s.ssm_dt_rank = 8; s.ssm_d_inner = 256;
        s.n_expert = 16; s.n_expert_used = 2; s.n_ff_exp = 256; s.n_ff_shexp = 256;
        s.type = q4_k_m ? dtype::q4_k : dtype::q8_0;
        s.q4_k_m = q4_k_m;
        const std::string path = testutil::synth_file(s.preset + ".gguf", s);
        const auto file = load(path);
        const std::vector<token> ids{3, 17, 101, 5, 64, 9, 250, 33, 7, 400, 12, 88};
        model<variants::from_file> first(file, {.threads = 2});
        const std::string plan = io::huge_page_plan(file->map().size(), io::read_memory_outlook());
        if (!plan.empty() || !backend::cpu_detail::kernels_for(s.type).repack) {
            MESSAGE("nothing is rearranged here: " << (plan.empty() ? "no 16-row kernels in this build" : plan));
            continue;
        }
        CHECK(first.backend().weights_placement().find("matrices in 16-row groups") != std::string::npos);
        const std::vector<float> want = logits_at(first, ids);
        model<variants::from_file> second(file, {.threads = 2});
        CHECK(second.backend().weights_placement() == first.backend().weights_placement());
        const std::vector<float> same = logits_at(second, ids);
        REQUIRE(same.size() == want.size());
        CHECK(std::memcmp(same.data(), want.data(), want.size() * sizeof(float)) == 0);

        model<variants::from_file> filed(load(path), {.threads = 2, .rearrange = false});
        CHECK(filed.backend().weights_placement() == "weights in huge pages");
        const std::vector<float> other = logits_at(filed, ids);
        REQUIRE(other.size() == want.size());
        CHECK(first.weights().layers[0].moe.gate_exps.layout == weight_layout::rows16);
        CHECK(filed.weights().layers[0].moe.gate_exps.layout == weight_layout::file);
        const std::int64_t V = first.n_vocab();
        for (std::size_t t = 0; t < ids.size(); ++t) {
            const float* a = want.data() + t * std::size_t(V);
            const float* b = other.data() + t * std::size_t(V);
            CHECK(std::max_element(a, a + V) - a == std::max_element(b, b + V) - b);
            CHECK(testutil::max_abs_diff(a, b, std::size_t(V)) < 1e-3f * (1 + testutil::max_abs(std::vector<float>(a, a + V))));
        }
    }
}
