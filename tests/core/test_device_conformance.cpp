// tests/core/test_device_conformance.cpp: SimulatedDevice through the DeviceBackend
// conformance suite (tests/conformance), with and without virtual memory, and with work that
// completes at once.
#include <catch2/catch.hpp>

#include <memory>

#include "conformance/device_backend.hpp"
#include "tensorpool/simulated_device.hpp"

using namespace tensorpool;
using conformance::BackendUnderTest;

namespace {

BackendUnderTest simulated(SimulatedDeviceOptions options) {
  auto sim = std::make_shared<SimulatedDevice>(options);
  return conformance::over_simulated_device(sim, sim, options.event_mode);
}

}  // namespace

TEST_CASE("conformance: SimulatedDevice meets the DeviceBackend contract", "[conformance]") {
  conformance::check_device_backend([] { return simulated({}); });
}

TEST_CASE("conformance: SimulatedDevice without virtual memory", "[conformance]") {
  conformance::check_device_backend([] {
    BackendUnderTest t = simulated({.supports_virtual_memory = false});
    REQUIRE(t.backend->virtual_memory() == nullptr);
    return t;
  });
}

TEST_CASE("conformance: SimulatedDevice whose work completes at once", "[conformance]") {
  conformance::check_device_backend([] {
    return simulated({.capacity = 4 * GiB, .vm_page_size = 4 * MiB, .event_mode = EventMode::immediate});
  });
}
