#pragma once
// The server's counters and their Prometheus text (GET /metrics, version 0.0.4): requests, tokens,
// the prefix cache, KV pages, the batched steps (rows per step, segments the fair share left for
// a later step) and the operator's cost limits in force (step budget, block and draft caps, the
// progress rule and the requests it cut back).
#include <algorithm>
#include <cstdint>
#include <string>

#include "clover/decode/engine.hpp"
#include "clover/server/protocol.hpp"

namespace clover::server {

// The engine's counters (requests, tokens, the prefix cache, KV pages, the batched steps) and
// the HTTP side's.
struct counters : decode::engine_stats {
    std::int64_t rejected = 0;   // 4xx / 503 answers to completion requests
    bool busy = false;           // running > 0
};

inline std::string metrics_text(const counters& c, const options& o) {
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, std::int64_t v) {
        out += std::string("# HELP clover_") + name + " " + help + "\n# TYPE clover_" + name + " " + type + "\nclover_" + name + " " +
               std::to_string(v) + "\n";
    };
    metric("requests_total", "counter", "Completion requests accepted into the queue.", c.requests);
    metric("requests_completed_total", "counter", "Generations that ran to their end.", c.completed);
    metric("requests_cancelled_total", "counter", "Generations stopped or skipped because the client went away.", c.cancelled);
    metric("requests_rejected_total", "counter", "4xx and 503 answers to completion requests.", c.rejected);
    metric("requests_running", "gauge", "Requests generating now (batched together).", c.running);
    metric("requests_queued", "gauge", "Requests waiting for a place in the batch.", c.queued);
    metric("requests_running_peak", "gauge", "The most requests that ever generated together.", c.peak_running);
    metric("prompt_tokens_total", "counter", "Prompt tokens computed by finished generations.", c.prompt_tokens);
    metric("generated_tokens_total", "counter", "Tokens produced by finished generations.", c.generated_tokens);
    metric("prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prefix cache instead of computed.", c.cached_tokens);
    metric("prefix_cache_hits_total", "counter", "Requests that resumed from a cached prefix.", c.cache.hits);
    metric("prefix_cache_lookups_total", "counter", "Requests that looked in the prefix cache.", c.cache.lookups);
    metric("prefix_cache_entries", "gauge", "Resume points (GDN checkpoints) the prefix cache holds.", c.cache.entries);
    metric("prefix_cache_evicted_total", "counter", "Resume points evicted (least recently used first).", c.cache.evicted);
    metric("prefix_cache_bytes", "gauge", "Bytes the prefix cache holds (KV pages and GDN states).", std::int64_t(c.cache.bytes));
    metric("prefix_cache_budget_bytes", "gauge", "The prefix cache's budget (--cache-ram).", std::int64_t(c.cache.budget));
    metric("kv_pages_used", "gauge", "KV pages in use by requests and the prefix cache.", c.kv_pages);
    metric("kv_page_bytes", "gauge", "Bytes of one KV page (every attention layer, K and V).", c.kv_page_bytes);
    metric("steps_total", "counter", "Batched passes run (one per step).", c.steps.steps);
    metric("step_rows_total", "counter", "Rows of every batched pass; over steps_total, the rows per step.", c.steps.rows);
    metric("step_rows_max", "gauge", "The most rows one step has held.", c.steps.max_rows);
    metric("segments_deferred_total", "counter",
           "Generating requests' passes left for a later step by the fair share or the step budget.", c.steps.deferred);
    metric("step_rows_limit", "gauge", "Rows per step (--batch-tokens); a larger single segment runs alone.", o.batch_tokens);
    metric("block_limit", "gauge", "Largest diffusion block a request may ask for (--max-block, at most --batch-tokens).",
           std::min(o.max_block, o.batch_tokens));
    metric("draft_limit", "gauge", "Largest speculative block a request may ask for (--max-draft, at most --batch-tokens).",
           std::min(o.max_draft, o.batch_tokens));
    metric("progress_rows_per_token_limit", "gauge",
           "Progress rule: a block costing more rows per decided token halves the request's block (0: off).", o.max_rows_per_token);
    metric("requests_cut_back_total", "counter", "Finished requests whose block the progress rule halved.", c.cut_back);
    return out;
}

}  // namespace clover::server
