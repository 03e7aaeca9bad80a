// tensorpool/replay/memory_map.hpp: a replay target's memory at one moment, as segments tiled by
// blocks, each block with the stream that holds it and, once the engine has filled it in, the
// trace's allocation site of what lives there. What `tensorpool report` draws as the segment and
// block map (at the peak of reserved bytes, and at the first out-of-memory error).
//
// Unlike trace::pytorch::DeviceMemory (a PyTorch snapshot, what `tensorpool export` writes), a
// block names its own stream: in RMM's resources a free range belongs to a stream's free list,
// not to the segment it lies in, and the global arena's free space belongs to no stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::replay {

/// The stream of a block that no stream holds (free space of RMM's global arena).
inline constexpr Stream kNoStream = std::numeric_limits<Stream>::max();

struct MapBlock {
  Address address = 0;
  std::size_t size = 0;
  BlockState state = BlockState::free;
  bool mapped = true;            // false: address space without physical pages (reserves nothing)
  Stream stream = kDefaultStream;  // the trace's stream id, or kNoStream
  std::size_t requested = 0;     // the trace's request, for a block that holds a live allocation
  std::uint32_t label = 0;       // the trace's label of that allocation (0: none, or not live)
};

struct MapSegment {
  Address address = 0;
  std::size_t size = 0;         // address space, mapped or not
  Stream stream = kDefaultStream;  // the stream it was made for (kNoStream: shared by all)
  bool heap = false;            // a virtual-memory range, partly mapped (vmm, expandable segments)
  std::vector<MapBlock> blocks;  // in address order, tiling [address, address + size) exactly
};

/// Invariant (checked by the replay-target conformance suite): segments are in address order and
/// do not overlap; blocks tile their segment; the mapped bytes of all blocks are what the target
/// holds from its device, but for physical pages a target caches unmapped (they have no address).
struct MemoryMap {
  std::vector<MapSegment> segments;

  std::size_t mapped_bytes() const noexcept;
  std::size_t allocated_bytes() const noexcept;  // blocks in state allocated
  /// The largest mapped free block: the most one request can get without new device memory.
  std::size_t largest_free_block() const noexcept;
};

/// A core allocator snapshot as a map: each block takes its segment's stream. `stream_id` turns
/// the allocator's stream handles into the trace's ids.
template <typename StreamId>
MemoryMap map_of_snapshot(const Snapshot& snapshot, StreamId&& stream_id) {
  MemoryMap m;
  m.segments.reserve(snapshot.segments.size());
  for (const SegmentInfo& s : snapshot.segments) {
    MapSegment seg{s.address, s.size, stream_id(s.stream), s.heap, {}};
    seg.blocks.reserve(s.blocks.size());
    for (const BlockInfo& b : s.blocks)
      seg.blocks.push_back(MapBlock{b.address, b.size, b.state, b.mapped, seg.stream, 0, 0});
    m.segments.push_back(std::move(seg));
  }
  return m;
}

}  // namespace tensorpool::replay
