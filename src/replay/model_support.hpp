// model_support.hpp: small helpers shared by the models of foreign allocators ("pytorch", "cub"):
// parsing TargetOptions::conf ("key:value,..."), counter arithmetic, rounding, the description of
// an out-of-memory failure and a per-stream record of host synchronizations (internal to
// tensorpool::replay, header-only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::replay::model {

inline constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

inline constexpr std::size_t round_up(std::size_t value, std::size_t multiple) noexcept {
  return (value + multiple - 1) / multiple * multiple;
}

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

struct ConfEntry {
  std::string key;
  std::string value;
};

/// Splits "key:value,key:value" (blanks around keys and values ignored, empty items skipped).
/// Throws ConfigError naming `target` for an item without ':' or without a value.
inline std::vector<ConfEntry> parse_conf(std::string_view conf, std::string_view target) {
  std::vector<ConfEntry> out;
  while (!conf.empty()) {
    const std::size_t comma = conf.find(',');
    const std::string_view item = trim(conf.substr(0, comma));
    conf = comma == std::string_view::npos ? std::string_view{} : conf.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos || trim(item.substr(colon + 1)).empty())
      throw ConfigError(std::string(target) + " conf: expected 'key:value', got '" +
                        std::string(item) + "'");
    out.push_back({std::string(trim(item.substr(0, colon))), std::string(trim(item.substr(colon + 1)))});
  }
  return out;
}

[[noreturn]] inline void bad_conf_value(std::string_view target, const ConfEntry& e,
                                        std::string_view expected) {
  throw ConfigError(std::string(target) + " conf: bad value '" + e.value + "' for key '" + e.key +
                    "': expected " + std::string(expected));
}

[[noreturn]] inline void unknown_conf_key(std::string_view target, const ConfEntry& e,
                                          std::string_view known) {
  throw ConfigError(std::string(target) + " conf: unknown key '" + e.key + "'; known keys: " +
                    std::string(known));
}

/// A size ("512", "20MiB", ...; see parse_bytes), or kUnlimited for "none"/"unlimited" when
/// `allow_unlimited`.
inline std::size_t conf_size(std::string_view target, const ConfEntry& e, bool allow_unlimited) {
  if (allow_unlimited && (e.value == "none" || e.value == "unlimited")) return kUnlimited;
  std::size_t out = 0;
  if (!parse_bytes(e.value, out))
    bad_conf_value(target, e, allow_unlimited ? "a size such as 512, 4KiB or 2MiB, or 'none'"
                                              : "a size such as 512, 4KiB or 2MiB");
  return out;
}

/// A non-negative integer no larger than `max`.
inline std::uint64_t conf_uint(std::string_view target, const ConfEntry& e, std::uint64_t max) {
  if (e.value.empty() || e.value.find_first_not_of("0123456789") != std::string::npos ||
      e.value.size() > 18)
    bad_conf_value(target, e, "a non-negative integer");
  const std::uint64_t v = std::stoull(e.value);
  if (v > max) bad_conf_value(target, e, "an integer <= " + std::to_string(max));
  return v;
}

/// What an OutOfMemoryError reports about a model over `device` that failed a request of `requested`
/// bytes (`rounded` after rounding) on `stream`, holding `reserved` bytes of which `allocated` are
/// in live blocks. largest_free_block and memory_limit are left to the caller (0: none).
inline OutOfMemoryInfo oom_info(SimulatedDevice& device, std::size_t requested, std::size_t rounded,
                                Stream stream, std::size_t reserved, std::size_t allocated) {
  OutOfMemoryInfo info;
  info.requested = requested;
  info.rounded = rounded;
  info.stream = stream;
  info.device = device.properties().ordinal;
  info.capacity = device.properties().capacity;
  info.device_free = device.free_memory();
  info.reserved = reserved;
  info.allocated = allocated;
  info.reserved_unallocated = reserved - allocated;
  return info;
}

/// The simulated device of a model of a cudaMalloc-based allocator: no virtual memory, segments
/// and addresses in multiples of `granularity`, the target's capacity, ordinal and cost model.
inline SimulatedDeviceOptions malloc_device_options(const TargetOptions& o, const char* name,
                                                   std::size_t granularity) {
  SimulatedDeviceOptions d;
  d.name = name;
  d.ordinal = o.device;
  d.capacity = o.capacity;
  d.segment_granularity = granularity;
  d.alignment = granularity;
  d.supports_virtual_memory = false;
  d.cost_model = o.cost_model;
  return d;
}

/// Counts host synchronizations per stream, so that work "recorded" on a stream at some moment
/// can later be asked whether it completed: it did once the host synchronized that stream after
/// the moment. Replays have no device clock; stream_sync events are the only completion signal.
class StreamClock {
 public:
  /// The mark to remember when recording work on `stream` now.
  std::uint64_t mark(Stream stream) const {
    const auto it = syncs_.find(stream);
    return device_syncs_ + (it == syncs_.end() ? 0 : it->second);
  }
  void synchronized(Stream stream) { ++syncs_[stream]; }
  /// The host waited for the whole device (cudaFree, cudaDeviceSynchronize): every stream.
  void synchronized_all() { ++device_syncs_; }
  /// True when `stream` was synchronized after mark() returned `m`.
  bool completed(Stream stream, std::uint64_t m) const { return mark(stream) > m; }

 private:
  std::unordered_map<Stream, std::uint64_t> syncs_;
  std::uint64_t device_syncs_ = 0;
};

}  // namespace tensorpool::replay::model
