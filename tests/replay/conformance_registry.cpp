// conformance_registry.cpp: the replay-target conformance suite runs against every target in the
// registry (target_names()), built by make_target.
#include "conformance.hpp"

namespace tensorpool::replay::testing {

std::vector<ConformanceTarget> conformance_targets() {
  std::vector<ConformanceTarget> out;
  for (const TargetDescriptor& d : target_descriptors())
    out.push_back({d, [name = d.name](const TargetOptions& o) { return make_target(name, o); }, {}});
  return out;
}

}  // namespace tensorpool::replay::testing
