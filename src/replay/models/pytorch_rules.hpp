// pytorch_rules.hpp: the rules shared by the two models of PyTorch's CUDA caching allocator,
// "pytorch" (native cudaMalloc segments, pytorch_model.cpp) and "pytorch-expandable" (expandable
// segments, pytorch_expandable_model.cpp): PyTorch's size constants, the rounding of requests,
// the pools, the max_split_size rules of the best-fit search and the settings both models accept
// (internal to tensorpool::replay, header-only).
#pragma once

#include <bit>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "replay/models/model_support.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::replay::pytorch_rules {

// PyTorch's constants (documented in its CUDA semantics notes and visible in every snapshot).
inline constexpr std::size_t kMinBlockSize = 512;        // every block size is a multiple of this
inline constexpr std::size_t kSmallSize = 1 * MiB;       // rounded requests <= this: small pool
inline constexpr std::size_t kSmallBuffer = 2 * MiB;     // the size of every small-pool segment
inline constexpr std::size_t kLargeBuffer = 20 * MiB;    // segment of large requests < 10 MiB
inline constexpr std::size_t kMinLargeAlloc = 10 * MiB;  // from here a segment is the request,
inline constexpr std::size_t kRoundLarge = 2 * MiB;      // ... rounded up to this

struct Settings {
  std::size_t max_split_size = model::kUnlimited;  // blocks >= this are never split ("oversize")
  std::size_t divisions = 0;                       // roundup_power2_divisions; 0 or 1: off
};

/// The settings keys both models accept (PyTorch's PYTORCH_CUDA_ALLOC_CONF names).
inline const std::vector<std::string>& settings_keys() {
  static const std::vector<std::string> keys = {"max_split_size", "max_split_size_mb",
                                                "roundup_power2_divisions", "expandable_segments"};
  return keys;
}

/// Parses the conf of a model (errors name `origin`). `expandable` is the mode that model
/// implements: an expandable_segments key, when present, must agree with it (the other mode is the
/// other model).
inline Settings parse_settings(std::string_view conf, std::string_view origin, bool expandable) {
  Settings s;
  for (const KeyValue& e : parse_key_values(conf, origin)) {
    if (e.key == "max_split_size") {
      s.max_split_size = size_or_none(origin, e).value_or(model::kUnlimited);
    } else if (e.key == "max_split_size_mb") {
      s.max_split_size = static_cast<std::size_t>(whole_number(origin, e, 0, 1ULL << 40)) * MiB;
    } else if (e.key == "roundup_power2_divisions") {
      s.divisions = static_cast<std::size_t>(whole_number(origin, e, 0, 1ULL << 20));
      if (s.divisions > 1 && !std::has_single_bit(s.divisions))
        throw_bad_value(origin, e, "a power of two");
    } else if (e.key == "expandable_segments") {
      if (bool_value(origin, e) != expandable)
        throw_bad_value(origin, e, expandable
                                       ? "true (for native segments use the pytorch model)"
                                       : "false (for expandable segments use pytorch-expandable)");
    } else {
      throw_unknown_key(origin, e, settings_keys());
    }
  }
  // PyTorch refuses max_split_size_mb <= 20: a 20 MiB segment must stay splittable.
  if (s.max_split_size != model::kUnlimited && s.max_split_size <= kLargeBuffer)
    throw ConfigError(std::string(origin) + ": max_split_size must be above 20 MiB, got " +
                      std::to_string(s.max_split_size));
  return s;
}

/// A request rounded up to a multiple of 512 B (at least 512 B); with `divisions` > 1, sizes above
/// divisions * 512 B go to the next of `divisions` equal steps between two powers of two.
inline std::size_t round_size(std::size_t bytes, std::size_t divisions) noexcept {
  if (bytes <= kMinBlockSize) return kMinBlockSize;
  if (divisions > 1 && bytes > kMinBlockSize * divisions) {
    const std::size_t floor = std::bit_floor(bytes);
    if (floor == bytes) return bytes;
    return round_up(bytes, floor / divisions);  // floor / divisions >= 512, a power of two
  }
  return round_up(bytes, kMinBlockSize);
}

/// The pool of a rounded request.
inline Pool pool_of(std::size_t rounded) noexcept {
  return rounded <= kSmallSize ? Pool::small : Pool::large;
}

/// The max_split_size rules of the best-fit search: may the smallest free block that fits, of
/// `block` bytes, serve a rounded request of `size`? Every later candidate is larger, so a "no"
/// ends the search.
inline bool may_serve(std::size_t block, std::size_t size, std::size_t max_split) noexcept {
  if (size < max_split && block >= max_split) return false;       // keep oversize blocks whole
  if (size >= max_split && block - size >= kLargeBuffer) return false;  // too wasteful
  return true;
}

}  // namespace tensorpool::replay::pytorch_rules
