// Config: parsing TENSORPOOL_CONF-style "key:value" lists and validating the result.
#include "tensorpool/config.hpp"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "tensorpool/errors.hpp"
#include "tensorpool/size_classes.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool {

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char* expected) {
  throw ConfigError("tensorpool config: bad value '" + std::string(value) + "' for key '" +
                    std::string(key) + "': expected " + expected);
}

std::size_t size_value(std::string_view key, std::string_view value) {
  std::size_t out = 0;
  if (!parse_bytes(std::string(value), out))
    bad_value(key, value, "a size such as 512, 64KiB, 20MiB or 1.5GiB");
  return out;
}

// A size that may also be "none" (0).
std::size_t optional_size_value(std::string_view key, std::string_view value) {
  if (value == "none" || value == "0") return 0;
  std::size_t out = 0;
  if (!parse_bytes(std::string(value), out))
    bad_value(key, value, "a size such as 512MiB or 2GiB, or 'none'");
  return out;
}

// A whole number in [lo, hi] (no suffixes: it counts something, it is not a size).
std::size_t count_value(std::string_view key, std::string_view value, std::size_t lo, std::size_t hi) {
  std::size_t out = 0;
  const bool digits = !value.empty() && value.size() <= 9 && value.find_first_not_of("0123456789") == std::string_view::npos;
  if (digits) out = std::stoul(std::string(value));
  if (!digits || out < lo || out > hi) {
    const std::string expected = "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
    bad_value(key, value, expected.c_str());
  }
  return out;
}

bool bool_value(std::string_view key, std::string_view value) {
  if (value == "true" || value == "1" || value == "on" || value == "yes") return true;
  if (value == "false" || value == "0" || value == "off" || value == "no") return false;
  bad_value(key, value, "true or false");
}

void set_limit(Config& c, std::string_view key, std::string_view value) {
  c.memory_limit_bytes = 0;
  c.memory_limit_fraction = 0.0;
  if (value == "none") return;
  if (value.find_first_not_of("0123456789.") == std::string_view::npos &&
      value.find('.') != std::string_view::npos) {
    char* end = nullptr;
    const std::string s(value);
    const double f = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || !(f > 0.0) || f > 1.0)
      bad_value(key, value, "a fraction of the capacity in (0, 1], a size, or 'none'");
    c.memory_limit_fraction = f;
    return;
  }
  std::size_t bytes = 0;
  if (!parse_bytes(std::string(value), bytes) || bytes == 0)
    bad_value(key, value, "a size such as 40GiB, a fraction of the capacity such as 0.9, or 'none'");
  c.memory_limit_bytes = bytes;
}

struct KeyHandler {
  const char* key;
  std::function<void(Config&, std::string_view, std::string_view)> set;
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
       [](Config& c, auto k, auto v) { c.max_split_size = optional_size_value(k, v); },
       [](const Config& c) { return size_text(c.max_split_size); }},
      {"oversize_slack", [](Config& c, auto k, auto v) { c.oversize_slack = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.oversize_slack); }},
      {"small_size", [](Config& c, auto k, auto v) { c.small_size = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.small_size); }},
      {"small_segment_size",
       [](Config& c, auto k, auto v) { c.small_segment_size = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.small_segment_size); }},
      {"large_segment_size",
       [](Config& c, auto k, auto v) { c.large_segment_size = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.large_segment_size); }},
      {"min_split_remainder",
       [](Config& c, auto k, auto v) { c.min_split_remainder = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.min_split_remainder); }},
      {"mode",
       [](Config& c, auto k, auto v) {
         if (v == "fixed") c.mode = Mode::fixed;
         else if (v == "vmm") c.mode = Mode::vmm;
         else bad_value(k, v, "fixed or vmm");
       },
       [](const Config& c) { return std::string(c.mode == Mode::vmm ? "vmm" : "fixed"); }},
      {"vmm_reserve", [](Config& c, auto k, auto v) { c.vmm_reserve = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.vmm_reserve); }},
      {"vmm_idle_limit", [](Config& c, auto k, auto v) { c.vmm_idle_limit = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.vmm_idle_limit); }},
      {"vmm_max_growth", [](Config& c, auto k, auto v) { c.vmm_max_growth = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.vmm_max_growth); }},
      {"vmm_growth_divisor",
       [](Config& c, auto k, auto v) { c.vmm_growth_divisor = count_value(k, v, 1, 1u << 20); },
       [](const Config& c) { return std::to_string(c.vmm_growth_divisor); }},
      {"vmm_max_chunk", [](Config& c, auto k, auto v) { c.vmm_max_chunk = size_value(k, v); },
       [](const Config& c) { return std::to_string(c.vmm_max_chunk); }},
      {"vmm_idle_divisor",
       [](Config& c, auto k, auto v) { c.vmm_idle_divisor = count_value(k, v, 1, 1u << 20); },
       [](const Config& c) { return std::to_string(c.vmm_idle_divisor); }},
      {"cross_stream_reuse",
       [](Config& c, auto k, auto v) { c.cross_stream_reuse = bool_value(k, v); },
       [](const Config& c) { return std::string(c.cross_stream_reuse ? "true" : "false"); }},
      {"nvtx", [](Config& c, auto k, auto v) { c.nvtx = bool_value(k, v); },
       [](const Config& c) { return std::string(c.nvtx ? "true" : "false"); }},
      {"nvtx_mem", [](Config& c, auto k, auto v) { c.nvtx_mem = bool_value(k, v); },
       [](const Config& c) { return std::string(c.nvtx_mem ? "true" : "false"); }},
  };
  return h;
}

std::string known_keys() {
  std::string s;
  for (const auto& h : handlers()) s += (s.empty() ? "" : ", ") + std::string(h.key);
  return s;
}

}  // namespace

const std::vector<std::string>& Config::keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> out;
    for (const auto& h : handlers()) out.emplace_back(h.key);
    return out;
  }();
  return k;
}

void Config::set(std::string_view key, std::string_view value) {
  const std::string k = trim(key);
  const std::string v = trim(value);
  for (const auto& h : handlers()) {
    if (k == h.key) {
      if (v.empty()) bad_value(k, v, "a value after ':'");
      h.set(*this, k, v);
      return;
    }
  }
  throw ConfigError("tensorpool config: unknown key '" + k + "'; known keys: " + known_keys());
}

void Config::apply(std::string_view text, std::string_view origin) {
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(pos, end - pos);
    if (!trim(item).empty()) {
      const std::size_t colon = item.find(':');
      if (colon == std::string_view::npos)
        throw ConfigError(std::string(origin) + ": item '" + trim(item) + "' at character " +
                          std::to_string(pos + 1) + " is not of the form key:value");
      try {
        set(item.substr(0, colon), item.substr(colon + 1));
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(origin) + ": " + e.what());
      }
    }
    pos = end + 1;
  }
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
