// capi/stats_figures.hpp (internal): figures of an allocator that only a walk of its snapshot
// gives (statistics PyTorch reports that tensorpool does not track as it goes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "tensorpool/stats.hpp"

namespace tensorpool::capi {

struct SnapshotFigures {
  struct Bytes {
    std::size_t bytes = 0;
    std::size_t blocks = 0;
  };
  Bytes inactive_split[kNumPools];  // free mapped blocks in segments that hold used blocks
  Bytes inactive_split_all;
  std::int64_t oversize_segments = 0;
  std::int64_t oversize_allocations = 0;       // allocated blocks in oversize segments
  std::map<Stream, Bytes> cached_by_stream;     // free mapped blocks, by segment stream
};

SnapshotFigures snapshot_figures(const Snapshot& snapshot);

}  // namespace tensorpool::capi
