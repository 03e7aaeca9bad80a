// targets.cpp: the registry of replay targets: their descriptors, checking settings without
// building a target, building one, and sharing one settings list among several.
#include <utility>

#include "replay/models/models.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"

namespace tensorpool::replay {

namespace {

const std::vector<TargetEntry>& registry() {
  static const std::vector<TargetEntry> r = {
      tensorpool_entry(), tensorpool_vmm_entry(), pytorch_entry(), pytorch_expandable_entry(),
      cub_entry(),        rmm_pool_entry(),       rmm_arena_entry(), raw_entry()};
  return r;
}

const TargetEntry& entry(const std::string& name) {
  for (const TargetEntry& e : registry())
    if (e.descriptor.name == name) return e;
  throw UsageError("unknown allocator '" + name + "'; known allocators: " + join(target_names()));
}

// "tensorpool: a, b; raw: none" for the targets `names`.
std::string settings_of(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) {
    const TargetDescriptor& d = describe_target(n);
    out += (out.empty() ? "" : "; ") + n + ": " + (d.settings.empty() ? "none" : join(d.settings));
  }
  return out;
}

}  // namespace

bool TargetDescriptor::takes(const std::string& key) const {
  for (const std::string& s : settings)
    if (s == key) return true;
  return false;
}

const std::vector<TargetDescriptor>& target_descriptors() {
  static const std::vector<TargetDescriptor> d = [] {
    std::vector<TargetDescriptor> out;
    for (const TargetEntry& e : registry()) out.push_back(e.descriptor);
    return out;
  }();
  return d;
}

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const TargetEntry& e : registry()) names.push_back(e.descriptor.name);
  return names;
}

const TargetDescriptor& describe_target(const std::string& name) { return entry(name).descriptor; }

void validate_target(const std::string& name, std::string_view conf, std::string_view origin) {
  const TargetEntry& e = entry(name);
  e.check_settings(conf, origin.empty() ? name + " conf" : std::string(origin));
}

std::unique_ptr<ReplayTarget> make_target(const std::string& name, const TargetOptions& options) {
  return entry(name).make(options);
}

std::vector<std::string> share_conf(const std::vector<std::string>& names, std::string_view conf,
                                    std::string_view origin) {
  const std::vector<KeyValue> items = parse_key_values(conf, origin);
  std::vector<std::string> out;
  bool taken = false;
  for (const std::string& n : names) {
    const TargetDescriptor& d = describe_target(n);
    bool all = true;
    for (const KeyValue& kv : items) all = all && d.takes(kv.key);
    out.push_back(all ? std::string(conf) : std::string());
    if (all && !items.empty()) {
      validate_target(n, conf, std::string(origin) + " for " + n);
      taken = true;
    }
  }
  if (items.empty() || taken) return out;
  for (const KeyValue& kv : items) {
    bool anyone = false;
    for (const std::string& n : names) anyone = anyone || describe_target(n).takes(kv.key);
    if (!anyone)
      throw ConfigError(std::string(origin) + ": unknown key '" + kv.key + "' for " + join(names) +
                        "; settings they take: " + settings_of(names));
  }
  throw ConfigError(std::string(origin) + ": no allocator of " + join(names) +
                    " takes every key of '" + std::string(conf) + "'; settings they take: " +
                    settings_of(names));
}

std::vector<std::string> exporting_target_names() {
  std::vector<std::string> names;
  for (const TargetEntry& e : registry())
    if (e.descriptor.exports) names.push_back(e.descriptor.name);
  return names;
}

void require_export(const std::string& name) {
  if (describe_target(name).exports) return;
  throw UsageError("allocator '" + name + "' cannot export a snapshot (it records no history); "
                   "allocators that can: " + join(exporting_target_names()));
}

UpstreamCounts upstream_of(const SimulatedDevice& device) {
  const DeviceCounters c = device.counters();
  return {c.segment_allocs + c.physical_creates, c.segment_frees + c.physical_releases,
          c.maps, c.unmaps, c.syncs(), c.modelled_ns};
}

}  // namespace tensorpool::replay
