// tests/support/fixed_mode.hpp: fixed segments on the simulated device, for the tests of that mode.
//
// mode:auto (the default) takes vmm on a device with virtual memory, which the simulated device
// has; tests of what fixed segments do (the mode of the cudaMalloc and cudaMallocAsync backends)
// ask for it with this.
#pragma once

#include "tensorpool/config.hpp"

namespace tensorpool::testing {

/// `c` with mode:fixed where it leaves the mode to the device.
inline Config fixed_mode(Config c = {}) {
  if (c.mode == Mode::automatic) c.mode = Mode::fixed;
  return c;
}

}  // namespace tensorpool::testing
