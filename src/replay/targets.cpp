// targets.cpp: the registry of replay targets.
#include <functional>
#include <utility>

#include "replay/models.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::replay {

namespace {
using Factory = std::function<std::unique_ptr<ReplayTarget>(const TargetOptions&)>;
const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> r = {
      {"tensorpool", make_tensorpool_target},
      {"tensorpool-vmm", make_tensorpool_vmm_target},
      {"pytorch", make_pytorch_target},
      {"pytorch-expandable", make_pytorch_expandable_target},
      {"cub", make_cub_target},
      {"raw", make_raw_target},
  };
  return r;
}
}  // namespace

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry()) names.push_back(name);
  return names;
}

std::unique_ptr<ReplayTarget> make_target(const std::string& name, const TargetOptions& options) {
  for (const auto& [n, factory] : registry())
    if (n == name) return factory(options);
  std::string known;
  for (const auto& n : target_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("unknown allocator '" + name + "'; known allocators: " + known);
}

std::vector<std::string> exporting_target_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry())
    if (factory(TargetOptions{})->record_history()) names.push_back(name);
  return names;
}

UpstreamCounts upstream_of(const SimulatedDevice& device) {
  const DeviceCounters c = device.counters();
  return {c.segment_allocs + c.physical_creates, c.segment_frees + c.physical_releases,
          c.maps, c.unmaps, c.syncs(), c.modelled_ns};
}

}  // namespace tensorpool::replay
