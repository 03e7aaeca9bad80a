// cuda_malloc_rule.hpp: what a cudaMalloc of a given size holds on the device, as the replay
// models charge it (dependency-free, so the GPU run's probe, cuda/gpu/call_costs.cpp, compares
// the device with the very same rule).
#pragma once

#include <cstddef>

namespace tensorpool::replay::model {

/// A request of 2 MiB or more takes whole 2 MiB pages; a smaller one is packed with others into
/// shared pages by the driver, modelled as 512-byte rounding (at least 512 B). (The CUDA-runtime
/// double's cudaMalloc follows the same rule when its granularity is 512 B.) The GPU run measures
/// what cudaMalloc really holds (malloc-footprint.json).
inline constexpr std::size_t cuda_malloc_bytes(std::size_t bytes) noexcept {
  constexpr std::size_t kPage = std::size_t{2} << 20;
  constexpr std::size_t kGranule = 512;
  const std::size_t unit = bytes >= kPage ? kPage : kGranule;
  return (bytes == 0 ? 1 : bytes + unit - 1) / unit * unit;
}

}  // namespace tensorpool::replay::model
