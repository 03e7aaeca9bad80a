// Byte formatting and parsing, and the names of the core enums.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "tensorpool/hooks.hpp"
#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool {

const char* to_string(Pool pool) noexcept { return pool == Pool::small ? "small" : "large"; }

const char* to_string(Metric metric) noexcept {
  switch (metric) {
    case Metric::allocated_bytes: return "allocated_bytes";
    case Metric::requested_bytes: return "requested_bytes";
    case Metric::active_bytes: return "active_bytes";
    case Metric::reserved_bytes: return "reserved_bytes";
    case Metric::allocations: return "allocations";
    case Metric::active_blocks: return "active_blocks";
    case Metric::segments: return "segments";
  }
  return "unknown";
}

const char* to_string(BlockState state) noexcept {
  switch (state) {
    case BlockState::free: return "free";
    case BlockState::allocated: return "allocated";
    case BlockState::pending_free: return "pending_free";
  }
  return "unknown";
}

const char* to_string(EventType type) noexcept {
  switch (type) {
    case EventType::alloc: return "alloc";
    case EventType::free_requested: return "free_requested";
    case EventType::free_completed: return "free_completed";
    case EventType::segment_alloc: return "segment_alloc";
    case EventType::segment_free: return "segment_free";
    case EventType::segment_map: return "segment_map";
    case EventType::segment_unmap: return "segment_unmap";
    case EventType::oom: return "oom";
    case EventType::empty_cache: return "empty_cache";
    case EventType::record_stream: return "record_stream";
    case EventType::sleep: return "sleep";
    case EventType::wake: return "wake";
    case EventType::capture_begin: return "capture_begin";
    case EventType::capture_end: return "capture_end";
    case EventType::graph_release: return "graph_release";
  }
  return "unknown";
}

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, kUnits[unit]);
  return buf;
}

namespace {

// The multiplier of a unit suffix ("" = bytes); 0 if unknown.
double unit_multiplier(std::string unit) {
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return 1.0;
  const std::string binary[] = {"k", "m", "g", "t"};
  for (int i = 0; i < 4; ++i) {
    const double mult = std::pow(1024.0, i + 1);
    if (unit == binary[i] || unit == binary[i] + "ib" || unit == binary[i] + "i") return mult;
    if (unit == binary[i] + "b") return std::pow(1000.0, i + 1);
  }
  return 0.0;
}

}  // namespace

bool parse_bytes(const std::string& text, std::size_t& out) noexcept {
  try {
    std::size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
    if (i == 0) return false;
    const std::string number = text.substr(0, i);
    if (number.find('.') != number.rfind('.')) return false;
    const double mult = unit_multiplier(text.substr(i));
    if (mult == 0.0) return false;
    if (number.find('.') == std::string::npos && mult == 1.0) {
      const unsigned long long v = std::stoull(number);  // exact for integers
      out = static_cast<std::size_t>(v);
      return true;
    }
    const double value = std::stod(number) * mult;
    if (!(value >= 0.0) || value >= 18446744073709551615.0) return false;
    out = static_cast<std::size_t>(std::llround(value));
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace tensorpool
