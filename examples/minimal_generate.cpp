// The smallest useful program: open a model (any size of the family), prefill ids, generate
// greedily with the AR decoder and print the ids.
//   minimal_generate MODEL.gguf 1,2,3
#include <cstdio>
#include <string>

#include <clover/clover.hpp>

int main(int argc, char** argv) try {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s MODEL.gguf ID,ID,...\n", argv[0]);
        return 2;
    }
    clover::model<clover::variants::from_file> m(clover::load(argv[1]), {.threads = 2});
    std::vector<clover::token> prompt;
    for (std::string s = argv[2], cur; char c : s + ",")
        if (c == ',') { if (!cur.empty()) prompt.push_back(std::stoi(cur)); cur.clear(); } else cur += c;
    auto s = m.new_session({.ctx = 1024});
    clover::decode::generate_options o;
    o.max_tokens = 16;
    o.ignore_eos = true;
    auto st = clover::decode::generate<clover::decode::ar>(m, s, prompt, o, [](clover::token t) {
        std::printf("%d ", t);
        return true;
    });
    std::printf("\n%s\n", st.json().c_str());
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
