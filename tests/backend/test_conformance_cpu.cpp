// The conformance table (conformance_table.hpp) on backend::cpu: every primitive over every
// segment mix, weight type and odd shape, fast mode against exact mode, each segment alone
// against the batch (bit for bit where the backend promises row-exactness), and against the
// scalar float64 references where a row has one.
#include <doctest/doctest.h>

#include <memory>

#include <clover/backend/cpu/cpu.hpp>

#include "conformance_table.hpp"
#include "cpu_io.hpp"

TEST_CASE("backend conformance table, small shapes: the CPU backend against its exact mode and the scalar references") {
    conformance::check_self(conformance::table<clover::backend::cpu>(),
                            [] { return std::make_unique<clover::backend::cpu>(clover::backend::cpu_options{.threads = 2}); });
}
