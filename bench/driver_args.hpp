// driver_args.hpp: the arguments of the callgrind drivers (alloc_pair_driver, replay_driver,
// pair_instructions). A count is digits only, so that a driver given anything else (a typo, a
// Google Benchmark flag from a script that runs every program under bench/) says so and exits
// 2 instead of running with 0.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace tensorpool::bench {

/// The whole number `text` spells, if it is one of at least `least`.
inline std::optional<unsigned long long> count_argument(const char* text, unsigned long long least) {
  if (text == nullptr || *text < '0' || *text > '9') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < least) return std::nullopt;
  return value;
}

/// Prints what was wrong and the usage line; the driver's exit status.
inline int usage_error(const char* program, const char* usage, const char* what) {
  std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program, what, program, usage);
  return 2;
}

}  // namespace tensorpool::bench
