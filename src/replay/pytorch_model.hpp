// pytorch_model.hpp: what the "pytorch" replay target offers beyond the ReplayTarget interface
// (internal to tensorpool::replay; the target itself is made by make_pytorch_target()).
#pragma once

#include "tensorpool/replay/target.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::replay {

/// Replays a seed_alloc event on `target`. On the pytorch model the block is placed at the offset
/// it had in its seed segment in the recording (allocate() would pack the live blocks at the front
/// of the seeded segments instead, closing the free gaps between them, which lets the model serve
/// requests from the merged space that PyTorch could not). Falls back to
/// allocate(seed.size, seed.stream) for any other target, and for a seed that lies in no seeded
/// segment or whose place is not free. Call it after every seed_segment() of the device and
/// before any window event.
void* pytorch_seed_alloc(ReplayTarget& target, const trace::Event& seed);

}  // namespace tensorpool::replay
