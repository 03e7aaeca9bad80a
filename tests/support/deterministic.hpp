// tests/support/deterministic.hpp: configurations whose device calls are the same on every run.
//
// With vmm_planner:background (the default) a heap's plan arrives when the planner thread has
// made it, so which epoch first follows it, and the device calls before, depend on timing. Tests
// that count device calls, compare with a reference model or replay a live run use the
// synchronous planner, as the replay targets do; the background planner has tests of its own
// (test_vmm_planner.cpp) and runs in the stress tests.
#pragma once

#include <string_view>

#include "tensorpool/config.hpp"

namespace tensorpool::testing {

/// `text` applied over a default whose vmm epochs are planned by the free that ends them.
inline Config deterministic_config(std::string_view text, std::string_view origin = "test config") {
  Config c;
  c.vmm_planner = PlannerMode::synchronous;
  c.apply(text, origin);
  return c;
}

}  // namespace tensorpool::testing
