// model_support.hpp: small helpers shared by the models of foreign allocators ("pytorch", "cub",
// "rmm-pool", "rmm-arena"): rounding, the simulated device of a cudaMalloc-based model, the
// description of an out-of-memory failure and a per-stream record of host synchronizations
// (internal to tensorpool::replay, header-only). Their settings are read with
// the core's key:value reader (tensorpool/key_values.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "replay/models/cuda_malloc_rule.hpp"  // cuda_malloc_bytes: what "raw" and "cub" charge
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::replay::model {

inline constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

/// What an OutOfMemoryError reports about a model over `device` that failed a request of `requested`
/// bytes (`rounded` after rounding) on `stream`, holding `reserved` bytes of which `allocated` are
/// in live blocks. largest_free_block and memory_limit are left to the caller (0: none).
inline OutOfMemoryInfo oom_info(SimulatedDevice& device, std::size_t requested, std::size_t rounded,
                                Stream stream, std::size_t reserved, std::size_t allocated) {
  OutOfMemoryInfo info;
  info.requested = requested;
  info.rounded = rounded;
  info.stream = stream;
  info.device = device.properties().ordinal;
  info.capacity = device.properties().capacity;
  info.device_free = device.free_memory();
  info.reserved = reserved;
  info.allocated = allocated;
  info.reserved_unallocated = reserved - allocated;
  return info;
}

/// Adds `bytes` of free cached memory on `stream` to info.cached_per_stream (kept in ascending
/// stream order) and raises largest_free_block to `block` if larger.
inline void add_cached(OutOfMemoryInfo& info, Stream stream, std::size_t bytes, std::size_t block) {
  info.largest_free_block = std::max(info.largest_free_block, block);
  if (bytes == 0) return;
  auto& v = info.cached_per_stream;
  auto it = std::lower_bound(v.begin(), v.end(), stream,
                             [](const StreamCachedBytes& c, Stream s) { return c.stream < s; });
  if (it == v.end() || it->stream != stream) it = v.insert(it, StreamCachedBytes{stream, 0});
  it->bytes += bytes;
}

/// The map of `segments` (in address order, blocks empty) tiled by `pieces` (live and free ranges
/// of the model, in any order, together covering every segment exactly): each piece is cut where
/// it crosses a segment boundary (a model's free range may span two upstream blocks).
inline MemoryMap tile_segments(std::vector<MapSegment> segments, std::vector<MapBlock> pieces) {
  std::sort(pieces.begin(), pieces.end(),
            [](const MapBlock& a, const MapBlock& b) { return a.address < b.address; });
  auto piece = pieces.begin();
  for (MapSegment& s : segments) {
    const Address end = s.address + s.size;
    while (piece != pieces.end() && piece->address < end) {
      MapBlock b = *piece;
      if (b.address + b.size <= end) {
        ++piece;
      } else {  // the rest stays for the next segment
        b.size = end - b.address;
        piece->address = end;
        piece->size -= b.size;
      }
      s.blocks.push_back(b);
    }
  }
  return MemoryMap{std::move(segments)};
}

/// The simulated device of a model of a cudaMalloc-based allocator: no virtual memory, segments
/// and addresses in multiples of `granularity`, the target's capacity, ordinal and cost model.
inline SimulatedDeviceOptions malloc_device_options(const TargetOptions& o, const char* name,
                                                   std::size_t granularity) {
  SimulatedDeviceOptions d;
  d.name = name;
  d.ordinal = o.device;
  d.capacity = o.capacity;
  d.segment_granularity = granularity;
  d.alignment = granularity;
  d.supports_virtual_memory = false;
  d.cost_model = o.cost_model;
  return d;
}

/// cudaFree of a segment: the memory goes back to the device, and the host waits for the device
/// to be idle first (CUDA's documented behaviour), counted as a host synchronization.
inline void cuda_free(SimulatedDevice& device, void* segment, std::size_t bytes, Stream stream) {
  device.free_segment(segment, bytes, stream);
  device.synchronize_device();
}

/// Counts host synchronizations per stream, so that work "recorded" on a stream at some moment
/// can later be asked whether it completed: it did once the host synchronized that stream after
/// the moment. Replays have no device clock; stream_sync events are the only completion signal.
class StreamClock {
 public:
  /// The mark to remember when recording work on `stream` now.
  std::uint64_t mark(Stream stream) const {
    const auto it = syncs_.find(stream);
    return device_syncs_ + (it == syncs_.end() ? 0 : it->second);
  }
  void synchronized(Stream stream) { ++syncs_[stream]; }
  /// The host waited for the whole device (cudaFree, cudaDeviceSynchronize): every stream.
  void synchronized_all() { ++device_syncs_; }
  /// True when `stream` was synchronized after mark() returned `m`.
  bool completed(Stream stream, std::uint64_t m) const { return mark(stream) > m; }

 private:
  std::unordered_map<Stream, std::uint64_t> syncs_;
  std::uint64_t device_syncs_ = 0;
};

}  // namespace tensorpool::replay::model
