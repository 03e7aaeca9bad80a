// subcommands.hpp: the subcommands of the tensorpool CLI, one small type each (subcommands.cpp):
// it declares its options on its own CLI::App, checks what was given (check()) and runs
// (run(), calling the command's implementation: commands.cpp, fit.cpp, plan.cpp, ...).
//
// Exit codes (main.cpp): 0 success; 1 a bad or unreadable input file (the message names the file
// and the offset or line); 2 bad arguments. check() throws CLI::ValidationError, UsageError or
// ConfigError for bad arguments (2) and InputError for a bad input file it reads early (1);
// run() throws ConfigError for a setting the device cannot hold (2) and anything else for a bad
// input (1).
#pragma once

#include <memory>
#include <stdexcept>
#include <vector>

namespace CLI {
class App;
}

namespace tensorpool::cli {

/// An input file check() read and found bad (exit 1, as in run()).
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Subcommand {
 public:
  explicit Subcommand(CLI::App* app) : app_(app) {}
  virtual ~Subcommand() = default;
  Subcommand(const Subcommand&) = delete;
  Subcommand& operator=(const Subcommand&) = delete;

  /// The user asked for this one.
  bool chosen() const;
  /// Checks the arguments given, before any input is read.
  virtual void check() {}
  virtual int run() = 0;

 protected:
  CLI::App* app_;  // owned by the parent App
};

/// Adds every subcommand to `app`, in the order `--help` lists them.
std::vector<std::unique_ptr<Subcommand>> add_subcommands(CLI::App& app);

}  // namespace tensorpool::cli
