// The `clover` command (../shared/spec/cli.md). Each subcommand lives in a cmd_*.hpp; errors
// from the library arrive as clover::error and are printed as one line.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cmd_bench.hpp"
#include "cmd_convert.hpp"
#include "cmd_gguf.hpp"
#include "cmd_model.hpp"
#include "cmd_run.hpp"
#include "cmd_serve.hpp"
#include "cmd_tokenize.hpp"

int main(int argc, char** argv) {
    CLI::App app{"clover: Clover-35B-A3B and Qwen3.5/3.6 hybrid MoE inference"};
    app.require_subcommand(1);
    clover::cli::add_model_commands(app);
    clover::cli::add_gguf_commands(app);
    clover::cli::add_convert_commands(app);
    clover::cli::add_bench_commands(app);
    clover::cli::add_run_commands(app);
    clover::cli::add_serve_commands(app);
    clover::cli::add_tokenize_commands(app);
    try {
        std::string names;
        bool known = false;
        for (const auto* c : app.get_subcommands({})) {
            names += (names.empty() ? "" : ", ") + c->get_name();
            known = known || (argc > 1 && c->get_name() == argv[1]);
        }
        if (argc > 1 && argv[1][0] != '-' && !known) {
            std::fprintf(stderr, "error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
            return 2;
        }
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    } catch (const clover::cli::quiet_exit& e) {
        return e.code;
    } catch (const clover::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
