// plan_state.hpp: where a vmm heap's current epoch stands with its planned layout. Its one owner
// is the heap's PlanCursor (vmm_plans.hpp); the fast path reads it through
// StreamState::plan_state (allocator_state.hpp), so an allocation of a heap that follows a plan
// asks the segment source for its planned block, and any other goes to the free index.
#pragma once

#include <cstdint>

namespace tensorpool::detail {

enum class PlanState : std::uint8_t {
  recording,  // no plan for this epoch: served online (free index, held pages), recorded
  completed,  // every step of the plan was served; any more requests are served online
  departed,   // a request the plan did not foresee came: online for the rest of the epoch
  // The states from here on make the fast path ask the segment source first (plan_asks_source):
  following,   // every request so far was the plan's next step: the next one is served at its offset
  laying_out,  // the plan's pages are to be laid out from the heap's start once the stream's work
               // that used them is done (an event): checked at the epoch's first request
};

/// Whether an allocation of a heap in state `s` asks the segment source first.
constexpr bool plan_asks_source(PlanState s) noexcept { return s >= PlanState::following; }

}  // namespace tensorpool::detail
