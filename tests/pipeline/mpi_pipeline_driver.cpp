// The pipeline over MPI ranks, run under mpiexec by ctest (tests/pipeline/CMakeLists.txt):
//   mpi_pipeline_driver MODEL.gguf [COUNTS]
// Rank 0 drives the pipeline (COUNTS: a --layer-split value; none: an even split) and, beside it,
// the whole model of the same file; every other rank serves its stage. Rank 0 checks that the
// logits of a prefill, a decode, a preview with a coreset (where the file can), verify rows and a
// rollback are the whole model's bit for bit in exact mode, as are passes of six sequences of
// mixed kinds (cut into micro-batches that stream through the ranks), and that greedy generation
// gives the same tokens; every rank ran every micro-batch (the gathered counters). Exit status 0
// when every check held.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <clover/clover.hpp>
#include <clover/dist/mpi.hpp>
#include <clover/pipeline/pipeline.hpp>

using namespace clover;

namespace {

using rt_model = model<variants::from_file, backend::cpu>;
using rt_pipe = pipeline::pipeline<variants::from_file, backend::cpu>;

int failures = 0;

void check(bool ok, const char* what) {
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "mpi_pipeline_driver: rank 0: %s differs from the whole model\n", what);
}

std::vector<token> ids_of(std::int64_t n, std::int64_t vocab, std::uint32_t seed) {
    std::vector<token> v;
    for (std::int64_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        v.push_back(token((seed >> 8) % std::uint32_t(vocab)));
    }
    return v;
}

std::size_t c_size(const rt_pipe& p) { return p.split().size(); }

// One pass on both sides; the logits compared bit for bit.
void pass(rt_model& whole, session& a, rt_pipe& p, session& b, pass_kind k, const std::vector<token>& ids,
          std::int64_t logits, std::int64_t coreset, const char* what) {
    const pass_request ra{&a, k, ids, logits, coreset}, rb{&b, k, ids, logits, coreset};
    std::vector<float> x, y;
    whole.run(std::span(&ra, 1), x, true);
    p.run(std::span(&rb, 1), y, true);
    check(x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0, what);
}

void drive(const std::shared_ptr<const io::gguf_file>& f, dist::communicator& c, const std::vector<std::int64_t>& counts) {
    rt_model whole(f, backend::cpu_options{.threads = 1});
    rt_pipe p(f, c, {.layer_split = counts}, backend::cpu_options{.threads = 1});
    const std::int64_t V = whole.n_vocab();
    session a = whole.new_session({.ctx = 64}), b = p.new_session({.ctx = 64});
    pass(whole, a, p, b, pass_kind::commit, ids_of(9, V, 1), 9, -1, "prefill");
    pass(whole, a, p, b, pass_kind::commit, ids_of(1, V, 2), 1, -1, "decode");
    if (whole.diffusion_unavailable().empty()) {
        auto block = ids_of(4, V, 3);
        block[1] = token(whole.hp().mask_token_id);
        pass(whole, a, p, b, pass_kind::preview, block, 4, 2, "preview");
    }
    pass(whole, a, p, b, pass_kind::verify, ids_of(4, V, 4), 4, -1, "verify");
    whole.rollback(a, 2);
    p.rollback(b, 2);
    pass(whole, a, p, b, pass_kind::commit, ids_of(1, V, 5), 1, -1, "decode after rollback");

    // Six sequences per pass, of mixed kinds: micro-batches, one behind the other.
    {
        std::vector<session> ws, ps;
        for (int i = 0; i < 6; ++i) {
            ws.push_back(whole.new_session({.ctx = 64}));
            ps.push_back(p.new_session({.ctx = 64}));
        }
        const auto before = p.gather_stats();
        auto many = [&](const std::vector<pass_kind>& kinds, std::uint32_t seed, const char* what) {
            std::vector<std::vector<token>> ids;
            std::vector<pass_request> rw, rp;
            for (std::size_t i = 0; i < kinds.size(); ++i) {
                const bool pre = kinds[i] == pass_kind::preview;
                ids.push_back(ids_of(kinds[i] == pass_kind::commit && seed == 10 ? std::int64_t(3 + 2 * i) : 3, V, seed + std::uint32_t(i)));
                if (pre) ids.back()[1] = token(whole.hp().mask_token_id);
            }
            for (std::size_t i = 0; i < kinds.size(); ++i) {
                const std::int64_t lg = i == 3 ? 0 : std::int64_t(ids[i].size());  // one segment without logits
                rw.push_back({&ws[i], kinds[i], ids[i], lg, kinds[i] == pass_kind::preview ? 2 : -1});
                rp.push_back({&ps[i], kinds[i], ids[i], lg, kinds[i] == pass_kind::preview ? 2 : -1});
            }
            std::vector<float> x, y;
            whole.run(rw, x, true);
            p.run(rp, y, true);
            check(x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0, what);
        };
        const auto c = pass_kind::commit;
        many({c, c, c, c, c, c}, 10, "six prefills in one pass");
        const pass_kind pv = whole.diffusion_unavailable().empty() ? pass_kind::preview : c;
        many({c, pass_kind::verify, pv, c, pass_kind::verify, c}, 20, "six mixed segments in one pass");
        whole.rollback(ws[1], 1);
        p.rollback(ps[1], 1);
        many({c, c, c, c, c, c}, 30, "six decodes of three rows after a rollback");
        const auto after = p.gather_stats();
        for (std::size_t r = 1; r < after.size(); ++r)
            check(after[r].micro_batches - before[r].micro_batches == after[0].micro_batches - before[0].micro_batches &&
                      after[0].micro_batches - before[0].micro_batches == 3 * std::uint64_t(c_size(p)),
                  "the micro-batches every rank ran");
    }

    decode::generate_options o;
    o.max_tokens = 8;
    o.ignore_eos = true;
    const auto prompt = ids_of(5, V, 6);
    std::vector<token> want, got;
    session s = whole.new_session({.ctx = 32}), t = p.new_session({.ctx = 32});
    decode::generate<decode::ar>(whole, s, prompt, o, [&](token x) { want.push_back(x); return true; });
    decode::generate<decode::ar>(p, t, prompt, o, [&](token x) { got.push_back(x); return true; });
    check(want == got && want.size() == 8, "greedy generation");
}

}  // namespace

int main(int argc, char** argv) {
    dist::mpi_session mpi(&argc, &argv);
    dist::mpi_communicator c;
    if (argc < 2) c.abort("usage: mpi_pipeline_driver MODEL.gguf [LAYER_COUNTS]");
    try {
        const auto f = load(argv[1]);
        const std::vector<std::int64_t> counts = argc > 2 ? pipeline::parse_layer_split(argv[2]) : std::vector<std::int64_t>{};
        if (c.rank() != 0) {
            rt_model m(f, pipeline::stage_of_rank(*f, c, counts), backend::cpu_options{.threads = 1});
            const std::string why = pipeline::serve_stage(m, c);
            if (!why.empty()) std::fprintf(stderr, "clover: rank %d: %s\n", c.rank(), why.c_str());
            return why.empty() ? 0 : 1;
        }
        drive(f, c, counts);
    } catch (const std::exception& e) {
        c.abort(std::string("mpi_pipeline_driver: ") + e.what());
    }
    if (failures) c.abort(std::to_string(failures) + " check(s) failed");
    std::printf("mpi_pipeline_driver: %d ranks ok\n", c.size());
    return 0;
}
