#pragma once
// The generation loops: generate_many runs a fixed set of sequences together (at most
// max_active at a time, in job order) on a batch_runner; generate is the one-sequence case.
// The engine (engine.hpp: a queue, admission, the prefix cache) keeps a runner of its own and
// adds requests as they come; servers and the clover command drive it.
#include <cstdint>
#include <functional>
#include <span>

#include "clover/decode/runner.hpp"

namespace clover::decode {

/// Runs jobs together, at most max_active at a time (0: all), in job order: one batched pass per
/// step over every active sequence's next segment (a prompt chunk, a decode row, a preview block
/// or verify rows). Decoder may be one policy or a std::variant of policies. Every job is checked
/// before any starts. exact: every row computed as it would be alone.
template <class Model, class Decoder>
void generate_many(Model& m, std::span<sequence_job<Decoder>> jobs, std::int64_t max_active = 0, bool exact = false) {
    batch_runner<Model, Decoder> run(m, 0, exact);
    for (auto& j : jobs) run.check(j);
    const std::size_t cap = max_active > 0 ? std::size_t(max_active) : jobs.size();
    std::size_t next = 0;
    while (next < jobs.size() && run.size() < cap) run.add(jobs[next++]);
    while (!run.empty()) {
        run.step();
        while (next < jobs.size() && run.size() < cap) run.add(jobs[next++]);
    }
}

/// Generates after `prompt` in session s with decoder `dec` (default-constructed: its default
/// settings); returns the statistics. on_token(id) is called for every generated token; returning
/// false stops generation.
template <class Decoder, class Model>
    requires decoder_policy_for<Decoder, Model>
generate_stats generate(Model& m, session& s, std::span<const token> prompt, const generate_options& o,
                        const std::function<bool(token)>& on_token, Decoder dec = {}) {
    sequence_job<Decoder> j;
    j.s = &s;
    j.prompt = prompt;
    j.o = &o;
    j.on_token = on_token;
    j.dec = dec;
    generate_many(m, std::span(&j, 1));
    return j.stats;
}

}  // namespace clover::decode
