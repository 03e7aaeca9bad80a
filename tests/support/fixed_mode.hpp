// tests/support/fixed_mode.hpp: fixed segments on the simulated device, for the tests of that mode.
//
// mode:auto (the default) takes vmm on a device with virtual memory, which the simulated device
// has; tests of what fixed segments do (the mode of the cudaMalloc and cudaMallocAsync backends)
// ask for it with this.
#pragma once

#include <cstdint>
#include <memory>

#include "tensorpool/allocator.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::testing {

/// `c` with mode:fixed where it leaves the mode to the device.
inline Config fixed_mode(Config c = {}) {
  if (c.mode == Mode::automatic) c.mode = Mode::fixed;
  return c;
}

/// A simulated device and an allocator with fixed segments on it: where the tests of that mode
/// start.
struct FixedModeAllocator {
  explicit FixedModeAllocator(Config c = {}, SimulatedDeviceOptions o = {})
      : device(std::make_shared<SimulatedDevice>(o)), alloc(device, fixed_mode(c)) {}
  std::shared_ptr<SimulatedDevice> device;
  Allocator alloc;
  std::int64_t cur(Metric m) const { return alloc.stats().total[m].current; }
};

}  // namespace tensorpool::testing
