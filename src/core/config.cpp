// Config: the settings keys (their readers and their text), TENSORPOOL_CONF, and validating the
// result. The list syntax and its errors are key_values.cpp's.
#include "tensorpool/config.hpp"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/size_classes.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool {

namespace {

constexpr std::string_view kOrigin = "tensorpool config";

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

void set_limit(Config& c, std::string_view origin, const KeyValue& item) {
  const std::string& value = item.value;
  c.memory_limit_bytes = 0;
  c.memory_limit_fraction = 0.0;
  if (value == "none") return;
  if (value.find_first_not_of("0123456789.") == std::string::npos &&
      value.find('.') != std::string::npos) {
    char* end = nullptr;
    const double f = std::strtod(value.c_str(), &end);
    if (end != value.c_str() + value.size() || !(f > 0.0) || f > 1.0)
      throw_bad_value(origin, item, "a fraction of the capacity in (0, 1], a size, or 'none'");
    c.memory_limit_fraction = f;
    return;
  }
  std::size_t bytes = 0;
  if (!parse_bytes(value, bytes) || bytes == 0)
    throw_bad_value(origin, item,
                    "a size such as 40GiB, a fraction of the capacity such as 0.9, or 'none'");
  c.memory_limit_bytes = bytes;
}

struct KeyHandler {
  const char* key;
  std::function<void(Config&, std::string_view origin, const KeyValue&)> set;
  std::function<std::string(const Config&)> get;
};

std::string size_text(std::size_t v) { return v == 0 ? "none" : std::to_string(v); }

// A fraction in fixed notation (parse() wants a '.'), with as many digits as it takes to read
// back the same double.
std::string fraction_text(double f) {
  char buf[400];
  for (int digits = 1; digits < 340; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*f", digits, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  return buf;
}

const std::vector<KeyHandler>& handlers() {
  static const std::vector<KeyHandler> h = {
      {"memory_limit", set_limit,
       [](const Config& c) {
         if (c.memory_limit_fraction > 0.0) return fraction_text(c.memory_limit_fraction);
         return size_text(c.memory_limit_bytes);
       }},
      {"max_split_size",
       [](Config& c, auto o, const auto& kv) { c.max_split_size = size_or_none(o, kv).value_or(0); },
       [](const Config& c) { return size_text(c.max_split_size); }},
      {"oversize_slack", [](Config& c, auto o, const auto& kv) { c.oversize_slack = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.oversize_slack); }},
      {"small_size", [](Config& c, auto o, const auto& kv) { c.small_size = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.small_size); }},
      {"small_segment_size",
       [](Config& c, auto o, const auto& kv) { c.small_segment_size = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.small_segment_size); }},
      {"large_segment_size",
       [](Config& c, auto o, const auto& kv) { c.large_segment_size = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.large_segment_size); }},
      {"min_split_remainder",
       [](Config& c, auto o, const auto& kv) { c.min_split_remainder = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.min_split_remainder); }},
      {"mode",
       [](Config& c, auto o, const auto& kv) {
         if (kv.value == "fixed") c.mode = Mode::fixed;
         else if (kv.value == "vmm") c.mode = Mode::vmm;
         else if (kv.value == "auto") c.mode = Mode::automatic;
         else throw_bad_value(o, kv, "fixed, vmm or auto");
       },
       [](const Config& c) {
         return std::string(c.mode == Mode::vmm ? "vmm" : c.mode == Mode::fixed ? "fixed" : "auto");
       }},
      {"vmm_reserve", [](Config& c, auto o, const auto& kv) { c.vmm_reserve = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.vmm_reserve); }},
      {"vmm_idle_limit", [](Config& c, auto o, const auto& kv) { c.vmm_idle_limit = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.vmm_idle_limit); }},
      {"vmm_max_growth", [](Config& c, auto o, const auto& kv) { c.vmm_max_growth = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.vmm_max_growth); }},
      {"vmm_growth_divisor",
       [](Config& c, auto o, const auto& kv) { c.vmm_growth_divisor = whole_number(o, kv, 1, 1u << 20); },
       [](const Config& c) { return std::to_string(c.vmm_growth_divisor); }},
      {"vmm_max_chunk", [](Config& c, auto o, const auto& kv) { c.vmm_max_chunk = size_value(o, kv); },
       [](const Config& c) { return std::to_string(c.vmm_max_chunk); }},
      {"vmm_chunk_divisor",
       [](Config& c, auto o, const auto& kv) { c.vmm_chunk_divisor = whole_number(o, kv, 0, 1u << 20); },
       [](const Config& c) { return std::to_string(c.vmm_chunk_divisor); }},
      {"vmm_chunk_floor_divisor",
       [](Config& c, auto o, const auto& kv) { c.vmm_chunk_floor_divisor = whole_number(o, kv, 0, 1u << 30); },
       [](const Config& c) { return std::to_string(c.vmm_chunk_floor_divisor); }},
      {"vmm_plan_max_blocks",
       [](Config& c, auto o, const auto& kv) { c.vmm_plan_max_blocks = whole_number(o, kv, 0, 1u << 24); },
       [](const Config& c) { return std::to_string(c.vmm_plan_max_blocks); }},
      {"vmm_planner",
       [](Config& c, auto o, const auto& kv) {
         if (kv.value == "background") c.vmm_planner = PlannerMode::background;
         else if (kv.value == "synchronous") c.vmm_planner = PlannerMode::synchronous;
         else throw_bad_value(o, kv, "background or synchronous");
       },
       [](const Config& c) {
         return std::string(c.vmm_planner == PlannerMode::background ? "background" : "synchronous");
       }},
      {"vmm_find_steps", [](Config& c, auto o, const auto& kv) { c.vmm_find_steps = bool_value(o, kv); },
       [](const Config& c) { return std::string(c.vmm_find_steps ? "true" : "false"); }},
      {"vmm_stitch", [](Config& c, auto o, const auto& kv) { c.vmm_stitch = bool_value(o, kv); },
       [](const Config& c) { return std::string(c.vmm_stitch ? "true" : "false"); }},
      {"vmm_idle_divisor",
       [](Config& c, auto o, const auto& kv) { c.vmm_idle_divisor = whole_number(o, kv, 1, 1u << 20); },
       [](const Config& c) { return std::to_string(c.vmm_idle_divisor); }},
      {"backend",
       [](Config& c, auto o, const auto& kv) {
         if (kv.value == "async") c.backend = Backend::async;
         else if (kv.value == "malloc") c.backend = Backend::malloc;
         else if (kv.value == "vmm") c.backend = Backend::vmm;
         else if (kv.value == "simulated") c.backend = Backend::simulated;
         else throw_bad_value(o, kv, "async, malloc, vmm or simulated");
       },
       [](const Config& c) { return std::string(to_string(c.backend)); }},
      {"cross_stream_reuse",
       [](Config& c, auto o, const auto& kv) { c.cross_stream_reuse = bool_value(o, kv); },
       [](const Config& c) { return std::string(c.cross_stream_reuse ? "true" : "false"); }},
      {"nvtx", [](Config& c, auto o, const auto& kv) { c.nvtx = bool_value(o, kv); },
       [](const Config& c) { return std::string(c.nvtx ? "true" : "false"); }},
      {"nvtx_mem", [](Config& c, auto o, const auto& kv) { c.nvtx_mem = bool_value(o, kv); },
       [](const Config& c) { return std::string(c.nvtx_mem ? "true" : "false"); }},
  };
  return h;
}

}  // namespace

const char* to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::async: return "async";
    case Backend::malloc: return "malloc";
    case Backend::vmm: return "vmm";
    case Backend::simulated: return "simulated";
  }
  return "unknown";
}

const std::vector<std::string>& Config::keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> out;
    for (const auto& h : handlers()) out.emplace_back(h.key);
    return out;
  }();
  return k;
}

namespace {

// One item of a list from `origin`.
void set_item(Config& c, std::string_view origin, const KeyValue& item) {
  for (const auto& h : handlers()) {
    if (item.key == h.key) {
      if (item.value.empty()) throw_bad_value(origin, item, "a value after ':'");
      h.set(c, origin, item);
      return;
    }
  }
  throw_unknown_key(origin, item, Config::keys());
}

}  // namespace

void Config::set(std::string_view key, std::string_view value) {
  set_item(*this, kOrigin, KeyValue{trim(key), trim(value), 1});
}

void Config::apply(std::string_view text, std::string_view origin) {
  for (const KeyValue& item : parse_key_values(text, origin)) set_item(*this, origin, item);
  validate();
}

void Config::validate() const {
  auto fail = [](const std::string& what) { throw ConfigError("tensorpool config: " + what); };
  if (small_size == 0 || small_size > small_segment_size)
    fail("small_size (" + format_bytes(small_size) + ") must be in (0, small_segment_size = " +
         format_bytes(small_segment_size) + "]");
  if (small_segment_size % kMinBlockSize != 0 || large_segment_size % kMinBlockSize != 0)
    fail("segment sizes must be multiples of 512 bytes");
  if (large_segment_size < small_segment_size)
    fail("large_segment_size must be at least small_segment_size");
  if (max_split_size != 0 && max_split_size < large_segment_size)
    fail("max_split_size (" + format_bytes(max_split_size) +
         ") must be 'none' or at least large_segment_size (" + format_bytes(large_segment_size) + ")");
  if (min_split_remainder < kMinBlockSize) fail("min_split_remainder must be at least 512 bytes");
}

std::string Config::to_string() const {
  std::string s;
  for (const auto& h : handlers()) s += (s.empty() ? "" : ",") + std::string(h.key) + ":" + h.get(*this);
  return s;
}

Config Config::parse(std::string_view text, std::string_view origin) {
  Config c;
  c.apply(text, origin);
  return c;
}

Config Config::from_env() {
  const char* env = std::getenv("TENSORPOOL_CONF");
  if (env == nullptr) return Config{};
  return parse(env, "TENSORPOOL_CONF");
}

std::size_t Config::effective_limit(std::size_t capacity) const noexcept {
  if (memory_limit_fraction > 0.0)
    return static_cast<std::size_t>(static_cast<double>(capacity) * memory_limit_fraction);
  return memory_limit_bytes;
}

}  // namespace tensorpool
