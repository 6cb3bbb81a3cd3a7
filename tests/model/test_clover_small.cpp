// The bundled model (models/clover-small.gguf) against its PyTorch reference
// (tools/train/clover_ref.py): commit-pass and preview-pass logits on the fixed inputs the
// reference wrote to tests/data/clover_small/cases.json, within the fixture's tolerance relative
// to max |logit|. Then the decoder contract on a real model: speculative == AR on 20 prompts.
#include <doctest/doctest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include <clover/clover.hpp>

#include "../common/test_util.hpp"

using namespace clover;

namespace {

const std::string data_dir = std::string(CLOVER_TEST_DATA) + "/clover_small";
const std::string model_path = std::string(CLOVER_SOURCE_DIR) + "/models/clover-small.gguf";

std::vector<float> read_f32(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f.good(), path << ": missing fixture");
    std::vector<char> b((std::istreambuf_iterator<char>(f)), {});
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

std::vector<token> ids_of(const nlohmann::json& a) {
    std::vector<token> v;
    for (const auto& x : a) v.push_back(x.get<token>());
    return v;
}

}  // namespace

TEST_CASE("bundled Clover model: commit and preview logits equal the PyTorch reference") {
    std::ifstream f(data_dir + "/cases.json");
    REQUIRE(f.good());
    const auto doc = nlohmann::json::parse(f);
    const float tol = doc.value("tolerance", 1e-4f);
    model<variants::from_file> m(load(model_path), {2});
    REQUIRE(m.n_vocab() == doc["n_vocab"].get<std::int64_t>());
    REQUIRE(m.hp().mask_token_id == doc["mask_token_id"].get<std::int64_t>());
    for (const auto& c : doc["cases"]) {
        const std::string name = c["name"];
        CAPTURE(name);
        const auto expected = read_f32(data_dir + "/" + c["logits"].get<std::string>());
        std::vector<float> ours, tmp;
        if (c["kind"] == "commit") {
            auto ids = ids_of(c["ids"]);
            auto s = m.new_session({.ctx = std::int64_t(ids.size())});
            m.commit(s, ids, logits_rows::all, ours);
        } else {
            auto prefix = ids_of(c["prefix"]), block = ids_of(c["block"]);
            auto s = m.new_session({.ctx = std::int64_t(prefix.size() + block.size())});
            m.commit(s, prefix, logits_rows::none, tmp);
            m.preview(s, block, c["coreset"].get<std::int64_t>(), ours);
        }
        REQUIRE(ours.size() == expected.size());
        const float rel = testutil::max_abs_diff(ours.data(), expected.data(), ours.size()) / testutil::max_abs(expected);
        MESSAGE(name << ": max |diff| / max |logit| = " << rel);
        CHECK(rel <= tol);
    }
}

TEST_CASE("bundled Clover model: self-speculative greedy == AR greedy on 20 prompts") {
    model<variants::from_file> m(load(model_path), {2});
    std::ifstream f(data_dir + "/cases.json");
    const auto doc = nlohmann::json::parse(f);
    const auto base = ids_of(doc["cases"][2]["ids"]);  // 48 real tokens of held-out text
    decode::generate_options o;
    o.max_tokens = 48;
    o.ignore_eos = true;
    for (int p = 0; p < 20; ++p) {
        CAPTURE(p);
        std::vector<token> prompt(base.begin() + p, base.begin() + p + 8 + p % 13);
        std::vector<token> a, b;
        auto s1 = m.new_session({.ctx = 256});
        decode::generate<decode::ar>(m, s1, prompt, o, [&](token t) { a.push_back(t); return true; });
        auto s2 = m.new_session({.ctx = 256});
        decode::generate(m, s2, prompt, o, [&](token t) { b.push_back(t); return true; }, decode::self_speculative{.block = 16});
        CHECK(a == b);
    }
}
