// tests/support/sim_allocator.hpp: an allocator on a simulated device in a given mode, its epochs
// planned by the free that ends them (deterministic), for the tests of sleep and of graph pools.
// The device's events complete when told (EventMode::manual) unless asked to complete at once.
#pragma once

#include <cstddef>
#include <memory>

#include "tensorpool/allocator.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::testing {

struct SimAllocator {
  explicit SimAllocator(Mode mode = Mode::vmm, std::size_t capacity = 8 * GiB, EventMode events = EventMode::manual)
      : device(std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = capacity, .event_mode = events})),
        alloc(device, [mode] {
          Config c;
          c.mode = mode;
          c.vmm_planner = PlannerMode::synchronous;
          return c;
        }()) {}
  std::shared_ptr<SimulatedDevice> device;
  Allocator alloc;
};

}  // namespace tensorpool::testing
