// tensorpool/types.hpp: the small vocabulary shared by every layer (streams, events, pools, sizes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tensorpool {

/// An opaque stream handle of the device backend (a cudaStream_t cast to an integer on CUDA,
/// a small integer on the simulated device). 0 is the device's default stream.
using Stream = std::uint64_t;
inline constexpr Stream kDefaultStream = 0;

/// An opaque event handle of the device backend (a cudaEvent_t cast to an integer on CUDA). 0 is
/// never a valid event. Not to be confused with trace events (the trace layer) or the
/// allocator's own AllocatorEvent (hooks.hpp).
using DeviceEvent = std::uint64_t;

/// A device address. Addresses are never dereferenced by the allocator.
using Address = std::uintptr_t;

/// The two block pools. Small requests (<= Config::small_size) are carved from small segments,
/// everything else from large segments.
enum class Pool : std::uint8_t { small = 0, large = 1 };
inline constexpr int kNumPools = 2;
const char* to_string(Pool pool) noexcept;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
inline constexpr std::size_t GiB = 1024 * MiB;
inline constexpr std::size_t TiB = 1024 * GiB;

/// n rounded up to a multiple of `to` (to > 0).
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

/// "1.50 GiB"-style rendering of a byte count (binary units, two decimals above 1 KiB).
std::string format_bytes(std::size_t bytes);

/// Parses "512", "512B", "4KiB", "4K", "1.5GiB", "20MB" (K/M/G/T and KiB.. are binary, KB/MB/GB/TB
/// decimal). Returns false on anything else (including overflow and negative numbers).
bool parse_bytes(const std::string& text, std::size_t& out) noexcept;

}  // namespace tensorpool
