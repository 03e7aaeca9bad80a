// tensorpool/trace/empty_cache.hpp: finds the empty_cache() calls of a recorded run in its
// segment events and marks them with Op::empty_cache events, so that a replay can make the same
// call (ReplayTarget::empty_cache) at the same point.
//
// PyTorch's snapshots do not record empty_cache() itself, only its effect: a run of consecutive
// segment_free events (of one device), each of a segment that holds no live block, with no oom
// event right before or right after it and not followed at once by a segment_alloc. PyTorch's
// out-of-memory path also frees cached segments: when cudaMalloc fails it releases them and
// retries (a segment_alloc follows) or gives up (an oom follows). Each run that is neither gets
// one empty_cache event inserted just before it. An empty_cache() followed at once by a new
// segment is therefore not found. Expandable segments unmap pages instead; segment_unmap runs are
// left alone.
#pragma once

#include <cstddef>

#include "tensorpool/trace/event.hpp"

namespace tensorpool::trace {

/// Inserts an empty_cache event before each run described above; returns how many. A trace that
/// already has empty_cache events is left unchanged (returns 0).
std::size_t mark_empty_cache_calls(Trace& trace);

}  // namespace tensorpool::trace
