// commands.hpp: the subcommands of the tensorpool CLI.
#pragma once

#include <string>
#include <vector>

#include "tensorpool/types.hpp"

namespace tensorpool::cli {

/// Options shared by replay and compare.
struct RunOptions {
  std::string trace;
  std::vector<std::string> allocators;
  std::size_t capacity = 80 * GiB;
  std::string conf;  // tensorpool's Config for the tensorpool allocator
  int device = -1;
  int warmup = 0;  // passes over the window before the measured one
  bool attempt_ooms = false;  // ReplayOptions::attempt_ooms
  bool json = false;
};

int cmd_info(const std::string& trace, bool json);
int cmd_replay(const RunOptions& options);
int cmd_compare(const RunOptions& options);
int cmd_convert(const std::string& in, const std::string& out, bool allow_truncated);
int cmd_generate(const std::string& out, const std::string& options);
int cmd_demo(bool json);

}  // namespace tensorpool::cli
