// conformance.hpp: what the replay-target conformance suite (test_conformance.cpp) runs against.
// A test binary that compiles the suite defines conformance_targets(): the replay tests list
// every name in target_names() (conformance_registry.cpp); tests/cuda lists "cub-real", the real
// CUB allocator over the CUDA-runtime test double, which is not in the registry.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "tensorpool/replay/target.hpp"

namespace tensorpool::replay::testing {

struct ConformanceTarget {
  TargetDescriptor descriptor;
  /// Builds the target for options.device; called once per device of a replay.
  std::function<std::unique_ptr<ReplayTarget>(const TargetOptions&)> make;
  /// Called before each check or replay with the capacity its devices get: resets whatever the
  /// target runs on outside its own object (the CUDA-runtime test double). Optional.
  std::function<void(std::size_t capacity)> prepare;
};

/// Defined once per test binary that compiles the suite.
std::vector<ConformanceTarget> conformance_targets();

}  // namespace tensorpool::replay::testing
