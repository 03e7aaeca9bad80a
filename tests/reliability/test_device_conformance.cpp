// tests/reliability/test_device_conformance.cpp: the recording device of the differential and
// fault tests through the DeviceBackend conformance suite (tests/conformance): what it forwards
// to the simulated device must still meet the contract, with and without virtual memory.
#include <catch2/catch.hpp>

#include <memory>

#include "conformance/device_backend.hpp"
#include "reliability/recording_device.hpp"

using namespace tensorpool;
using conformance::BackendUnderTest;
using reliability::RecordingDevice;

namespace {

BackendUnderTest recording(SimulatedDeviceOptions options) {
  auto sim = std::make_shared<SimulatedDevice>(options);
  return conformance::over_simulated_device(std::make_shared<RecordingDevice>(sim), sim,
                                            options.event_mode);
}

}  // namespace

TEST_CASE("conformance: RecordingDevice meets the DeviceBackend contract", "[conformance]") {
  conformance::check_device_backend([] { return recording({}); });
}

TEST_CASE("conformance: RecordingDevice over a device without virtual memory", "[conformance]") {
  conformance::check_device_backend([] {
    BackendUnderTest t = recording({.supports_virtual_memory = false});
    REQUIRE(t.backend->virtual_memory() == nullptr);
    return t;
  });
}
