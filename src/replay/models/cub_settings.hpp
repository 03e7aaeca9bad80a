// cub_settings.hpp: the settings of CUB's CachingDeviceAllocator as the "cub" model and the real
// CUB target ("cub-real", cuda/replay/) both read them from TargetOptions::conf, so the two
// always run with the same allocator (internal to tensorpool::replay; defined in cub_model.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/types.hpp"

namespace tensorpool::replay::model {

/// The arguments of CUB's constructor that takes bins. With no key set they are those of its
/// default constructor; any bin key selects the bins constructor, whose max_cached_bytes
/// defaults to no limit (kUnlimited) unless given.
struct CubSettings {
  unsigned bin_growth = 8;
  unsigned min_bin = 3;
  unsigned max_bin = 7;
  std::size_t max_cached_bytes = 6 * MiB - 1;  // (8^7) * 3 - 1, per CUB's documentation
};

/// bin_growth, min_bin, max_bin, max_cached_bytes.
const std::vector<std::string>& cub_settings_keys();

/// Throws ConfigError naming `origin` for a malformed list, an unknown key, a bad value, and bins
/// CUB cannot hold (bin_growth < 2, min_bin > max_bin, bin_growth^max_bin beyond 64 bits).
CubSettings parse_cub_settings(std::string_view conf, std::string_view origin);

}  // namespace tensorpool::replay::model
