// tensorpool/key_values.hpp: the one reader of "key:value,key:value" settings lists, shared by
// Config (TENSORPOOL_CONF), the settings of the replay targets and the trace generator's options.
//
// Syntax: items separated by ','; each item is `key:value`, split at its first ':'; blanks
// (spaces, tabs) around keys and values are ignored; empty items are skipped. A value may be
// empty ("key:"): what a key accepts is for its reader to say.
//
// Every error is a ConfigError whose message starts with the list's origin (the place it came
// from: "TENSORPOOL_CONF", "pytorch conf", "--options", ...) and names the item:
//   ORIGIN: item 'x' at character 7 is not of the form key:value
//   ORIGIN: bad value 'lots' for key 'max_split_size': expected a size such as 512, ...
//   ORIGIN: unknown key 'bogus'; known keys: a, b, c
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tensorpool {

/// One item of a list.
struct KeyValue {
  std::string key;          // without surrounding blanks; never empty
  std::string value;        // without surrounding blanks; may be empty
  std::size_t column = 0;   // 1-based character of the item in the list
};

/// Splits `text`; throws ConfigError for an item without ':' or without a key.
std::vector<KeyValue> parse_key_values(std::string_view text, std::string_view origin);

/// The keys of `text`, in order (duplicates kept); throws what parse_key_values throws.
std::vector<std::string> keys_of(std::string_view text, std::string_view origin);

[[noreturn]] void throw_bad_value(std::string_view origin, const KeyValue& item,
                                  std::string_view expected);
/// `known`: the accepted keys, listed in the message.
[[noreturn]] void throw_unknown_key(std::string_view origin, const KeyValue& item,
                                    const std::vector<std::string>& known);

/// "a, b, c".
std::string join(const std::vector<std::string>& words, std::string_view separator = ", ");

// Readers of typed values: each returns the value or calls throw_bad_value() saying what it
// expected.

/// A byte count (see parse_bytes: 512, 64KiB, 20MiB, 1.5GiB, 2GB).
std::size_t size_value(std::string_view origin, const KeyValue& item);
/// A byte count, or "none"/"unlimited" (nullopt).
std::optional<std::size_t> size_or_none(std::string_view origin, const KeyValue& item);
/// A whole number in [lo, hi], digits only (it counts something: no size suffixes).
std::uint64_t whole_number(std::string_view origin, const KeyValue& item, std::uint64_t lo,
                           std::uint64_t hi);
/// A decimal number in [lo, hi], digits and at most one '.' ("1.25", "3").
double decimal_number(std::string_view origin, const KeyValue& item, double lo, double hi);
/// true/True/1/on/yes or false/False/0/off/no.
bool bool_value(std::string_view origin, const KeyValue& item);

}  // namespace tensorpool
