// memory_map.cpp: the figures a memory map gives (memory_map.hpp).
#include "tensorpool/replay/memory_map.hpp"

#include <algorithm>

namespace tensorpool::replay {

std::size_t MemoryMap::mapped_bytes() const noexcept {
  std::size_t total = 0;
  for (const MapSegment& s : segments)
    for (const MapBlock& b : s.blocks)
      if (b.mapped) total += b.size;
  return total;
}

std::size_t MemoryMap::allocated_bytes() const noexcept {
  std::size_t total = 0;
  for (const MapSegment& s : segments)
    for (const MapBlock& b : s.blocks)
      if (b.state == BlockState::allocated) total += b.size;
  return total;
}

std::size_t MemoryMap::largest_free_block() const noexcept {
  std::size_t largest = 0;
  for (const MapSegment& s : segments)
    for (const MapBlock& b : s.blocks)
      if (b.mapped && b.state == BlockState::free) largest = std::max(largest, b.size);
  return largest;
}

}  // namespace tensorpool::replay
