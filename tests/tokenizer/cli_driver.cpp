// A front end with only the tokenize/detokenize commands, errors printed as the clover command
// prints them (one line, non-zero status).
#include <cstdio>

#include <CLI/CLI.hpp>

#include "cmd_tokenize.hpp"

int main(int argc, char** argv) {
    CLI::App app{"tokenize/detokenize"};
    app.require_subcommand(1);
    clover::cli::add_tokenize_commands(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
