// plan_state.hpp: where a vmm heap's current epoch stands with its planned layout. Its one owner
// is the heap's PlanCursor (vmm_plans.hpp); the fast path reads it through
// StreamState::plan_state (allocator_state.hpp), so an allocation of a heap that follows a plan
// asks the segment source for its planned block, and any other goes to the free index.
#pragma once

#include <cstdint>

namespace tensorpool::detail {

enum class PlanState : std::uint8_t {
  recording,  // no plan for this epoch: served online (free index, held pages), recorded
  following,  // every request so far was the plan's next step: the next one is served at its offset
  completed,  // every step of the plan was served; any more requests are served online
  departed,   // a request the plan did not foresee came: online for the rest of the epoch
};

}  // namespace tensorpool::detail
