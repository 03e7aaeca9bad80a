// tensorpool/size_classes.hpp: how request sizes are rounded and binned.
//
// Rounding: every request is rounded up to a multiple of kMinBlockSize (512 B), the minimum block.
// Worst-case internal fragmentation is therefore 511 bytes per block: at most 50% for requests
// of 512 B or more (a 513 B request takes 1024 B), under 1/k for requests above k * 512 B, and
// under 0.05% for requests of 1 MiB or more. Requests below 512 B take one 512 B block.
//
// Binning (the free index): two-level segregated fits in the style of TLSF. A block size u (in
// units of 512 B) falls in bin (fl, sl): sizes below 32 units have one exact bin each (fl = 0,
// sl = u); above, every power of two [2^m, 2^(m+1)) units is split into 32 equal sub-bins
// (fl = m - 4). The relative width of a bin is at most 1/32, so the good-fit search (take any
// block from the first non-empty bin whose lower bound is >= the request) wastes at most ~3% of
// a block before it is split, and splitting returns the rest to the index.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace tensorpool {

inline constexpr std::size_t kMinBlockSize = 512;
/// Largest request the allocator accepts (larger ones raise OutOfMemoryError at once).
inline constexpr std::size_t kMaxAllocationSize = std::size_t{1} << 50;  // 1 PiB

/// Request bytes -> block bytes. Precondition: bytes <= kMaxAllocationSize.
constexpr std::size_t round_size(std::size_t bytes) noexcept {
  return bytes <= kMinBlockSize ? kMinBlockSize : (bytes + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
}

namespace bins {

inline constexpr unsigned kSubBits = 5;
inline constexpr unsigned kSub = 1u << kSubBits;  // sub-bins per first level
inline constexpr unsigned kFirstLevels = 48;      // covers kMaxAllocationSize with room to spare

struct Bin {
  unsigned fl;
  unsigned sl;
  friend constexpr bool operator==(Bin, Bin) = default;
};

/// The bin a block of `size` bytes lives in (size: a multiple of 512, >= 512).
constexpr Bin bin_of(std::size_t size) noexcept {
  const std::uint64_t u = size / kMinBlockSize;
  if (u < kSub) return {0, static_cast<unsigned>(u)};
  const unsigned m = static_cast<unsigned>(std::bit_width(u)) - 1;  // m >= kSubBits
  return {m - kSubBits + 1, static_cast<unsigned>((u >> (m - kSubBits)) - kSub)};
}

/// Smallest block size in the bin.
constexpr std::size_t bin_lower(Bin b) noexcept {
  if (b.fl == 0) return std::size_t{b.sl} * kMinBlockSize;
  const unsigned m = b.fl + kSubBits - 1;
  return (std::size_t{kSub + b.sl} << (m - kSubBits)) * kMinBlockSize;
}

/// One past the largest block size in the bin.
constexpr std::size_t bin_upper(Bin b) noexcept {
  if (b.fl == 0) return (std::size_t{b.sl} + 1) * kMinBlockSize;
  const unsigned m = b.fl + kSubBits - 1;
  return (std::size_t{kSub + b.sl + 1} << (m - kSubBits)) * kMinBlockSize;
}

/// The first bin all of whose blocks are >= size (size: a multiple of 512, >= 512).
constexpr Bin bin_ceil(std::size_t size) noexcept {
  const Bin b = bin_of(size);
  if (bin_lower(b) == size) return b;
  return bin_of(bin_upper(b));
}

}  // namespace bins
}  // namespace tensorpool
