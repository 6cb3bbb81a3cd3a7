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
