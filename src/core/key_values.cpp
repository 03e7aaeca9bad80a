// key_values.cpp: splitting "key:value,..." lists and reading their typed values, with errors
// that name the origin, the key, the value and what was expected (see key_values.hpp).
#include "tensorpool/key_values.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

#include "tensorpool/errors.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool {

namespace {

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string prefixed(std::string_view origin, const std::string& message) {
  return std::string(origin) + ": " + message;
}

}  // namespace

std::vector<KeyValue> parse_key_values(std::string_view text, std::string_view origin) {
  std::vector<KeyValue> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, end - pos);
    if (!trim(item).empty()) {
      const std::size_t colon = item.find(':');
      const std::string_view key = colon == std::string_view::npos ? "" : trim(item.substr(0, colon));
      if (key.empty())
        throw ConfigError(prefixed(origin, "item '" + std::string(trim(item)) + "' at character " +
                                               std::to_string(pos + 1) +
                                               " is not of the form key:value"));
      out.push_back({std::string(key), std::string(trim(item.substr(colon + 1))), pos + 1});
    }
    pos = end + 1;
  }
  return out;
}

std::vector<std::string> keys_of(std::string_view text, std::string_view origin) {
  std::vector<std::string> keys;
  for (KeyValue& kv : parse_key_values(text, origin)) keys.push_back(std::move(kv.key));
  return keys;
}

void throw_bad_value(std::string_view origin, const KeyValue& item, std::string_view expected) {
  throw ConfigError(prefixed(origin, "bad value '" + item.value + "' for key '" + item.key +
                                         "': expected " + std::string(expected)));
}

void throw_unknown_key(std::string_view origin, const KeyValue& item,
                       const std::vector<std::string>& known) {
  throw ConfigError(prefixed(origin, "unknown key '" + item.key + "'; known keys: " +
                                         (known.empty() ? std::string("none") : join(known))));
}

std::string join(const std::vector<std::string>& words, std::string_view separator) {
  std::string out;
  for (const std::string& w : words) {
    if (!out.empty()) out += separator;
    out += w;
  }
  return out;
}

std::size_t size_value(std::string_view origin, const KeyValue& item) {
  std::size_t out = 0;
  if (!parse_bytes(item.value, out))
    throw_bad_value(origin, item, "a size such as 512, 64KiB, 20MiB or 1.5GiB");
  return out;
}

std::optional<std::size_t> size_or_none(std::string_view origin, const KeyValue& item) {
  if (item.value == "none" || item.value == "unlimited") return std::nullopt;
  std::size_t out = 0;
  if (!parse_bytes(item.value, out))
    throw_bad_value(origin, item, "a size such as 512MiB or 2GiB, or 'none'");
  return out;
}

namespace {
// "a number from 1 to 4" with the bounds as short as they print.
std::string fmt_range(double lo, double hi) {
  const auto text = [](double v) {
    std::string t = std::to_string(v);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t;
  };
  return "a number from " + text(lo) + " to " + text(hi) + " (digits and a '.')";
}
}  // namespace

std::uint64_t whole_number(std::string_view origin, const KeyValue& item, std::uint64_t lo,
                           std::uint64_t hi) {
  std::uint64_t out = 0;
  const char* first = item.value.data();
  const char* last = first + item.value.size();
  const bool digits = !item.value.empty() &&
                      item.value.find_first_not_of("0123456789") == std::string::npos;
  const auto [end, ec] = std::from_chars(first, last, out);
  if (!digits || ec != std::errc{} || end != last || out < lo || out > hi) {
    throw_bad_value(origin, item,
                    hi == std::numeric_limits<std::uint64_t>::max()
                        ? "a whole number of at least " + std::to_string(lo)
                        : "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return out;
}

double decimal_number(std::string_view origin, const KeyValue& item, double lo, double hi) {
  double out = 0.0;
  const char* first = item.value.data();
  const char* last = first + item.value.size();
  const bool plain = !item.value.empty() &&
                     item.value.find_first_not_of("0123456789.") == std::string::npos;
  const auto [end, ec] = std::from_chars(first, last, out, std::chars_format::fixed);
  if (!plain || ec != std::errc{} || end != last || !(out >= lo) || !(out <= hi))
    throw_bad_value(origin, item, fmt_range(lo, hi));
  return out;
}

bool bool_value(std::string_view origin, const KeyValue& item) {
  const std::string& v = item.value;
  if (v == "true" || v == "True" || v == "1" || v == "on" || v == "yes") return true;
  if (v == "false" || v == "False" || v == "0" || v == "off" || v == "no") return false;
  throw_bad_value(origin, item, "true or false");
}

}  // namespace tensorpool
