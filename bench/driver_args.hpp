// driver_args.hpp: the arguments of the callgrind drivers (alloc_pair_driver, replay_driver,
// pair_instructions). A count is read as a settings list's whole number is (digits only, within
// bounds: tensorpool::whole_number), so that a driver given anything else (a typo, a Google
// Benchmark flag from a script that runs every program under bench/) says so and exits 2
// instead of running with 0.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>

#include "tensorpool/key_values.hpp"

namespace tensorpool::bench {

/// The whole number in [lo, hi] that argument `name` spells; throws ConfigError naming it.
inline std::uint64_t count_argument(const char* text, const char* name, std::uint64_t lo,
                                    std::uint64_t hi = std::numeric_limits<std::uint64_t>::max()) {
  return whole_number("arguments", KeyValue{name, text, 0}, lo, hi);
}

/// Prints what was wrong and the usage line; the driver's exit status.
inline int usage_error(const char* program, const char* usage, const char* what) {
  std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program, what, program, usage);
  return 2;
}

}  // namespace tensorpool::bench
