// main.cpp: the tensorpool command-line tool: parse, then the chosen subcommand checks its
// arguments and runs (subcommands.hpp), and every error becomes its exit code and one message.
//
// Exit codes: 0 success; 1 a bad or unreadable input file (the message names the file and the
// offset or line); 2 bad arguments (unknown allocator, bad size, bad --conf, ...).
#include <CLI/CLI.hpp>

#include <iostream>

#include "subcommands.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/version.hpp"

using namespace tensorpool;

namespace {

constexpr int kBadInput = 1;
constexpr int kBadArguments = 2;

int error(const std::exception& e, int code) {
  std::cerr << "tensorpool: error: " << e.what() << "\n";
  return code;
}

int check_and_run(cli::Subcommand& command) {
  try {
    command.check();
  } catch (const cli::InputError& e) {
    return error(e, kBadInput);
  } catch (const CLI::ValidationError& e) {
    return error(e, kBadArguments);
  } catch (const Error& e) {  // UsageError, ConfigError
    return error(e, kBadArguments);
  }
  try {
    return command.run();
  } catch (const ConfigError& e) {  // a setting the --capacity device cannot hold (rmm-arena's arena_size)
    return error(e, kBadArguments);
  } catch (const std::exception& e) {
    return error(e, kBadInput);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensorpool: a GPU caching allocator, its trace tools and allocator comparisons"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tensorpool " TENSORPOOL_VERSION);
  const auto commands = cli::add_subcommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kBadArguments;
  }
  for (const auto& command : commands)
    if (command->chosen()) return check_and_run(*command);
  return kBadArguments;  // require_subcommand(1) leaves none unchosen
}
