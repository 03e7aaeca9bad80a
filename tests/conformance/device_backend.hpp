// tests/conformance/device_backend.hpp: the DeviceBackend conformance suite. One set of checks
// of the contract written in include/tensorpool/device.hpp (segments, events, streams, virtual
// memory where a backend has it), run against every backend in the tree: SimulatedDevice
// (tests/core), each CUDA backend on the CUDA-runtime test double (tests/cuda, also built
// against the real runtime with TENSORPOOL_CUDA_REAL_TESTS) and the recording device of the
// differential test (tests/reliability). A new backend gets the whole suite from one TEST_CASE
// that calls check_device_backend with a factory for it.
#pragma once

#include <functional>
#include <memory>

#include "tensorpool/device.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::conformance {

/// One backend under test and what the suite needs to drive its streams.
struct BackendUnderTest {
  std::shared_ptr<DeviceBackend> backend;
  /// A new stream of the backend's device (not the default stream), valid while this lives.
  std::function<Stream()> new_stream;
  /// Completes the work submitted to `stream` so far, as the GPU eventually does on its own.
  std::function<void(Stream)> finish;
  /// Recorded work stays incomplete until finish() or a synchronize call (simulated devices,
  /// the test double in manual mode); the checks of "not complete yet" run only then.
  bool work_stays_pending = true;
  /// The out-of-memory checks may fill three quarters of the capacity (false for host memory
  /// on a real machine).
  bool may_fill_device = true;
  /// Runs after each check (for CUDA: no runtime error left pending). Optional.
  std::function<void()> after_each;
};

/// Makes a fresh backend; called once per check.
using BackendFactory = std::function<BackendUnderTest()>;

/// `backend` driven through the streams of `sim` (the device it is, or forwards to): new streams
/// from create_stream, finish by complete_stream, work pending unless sim completes it at once.
BackendUnderTest over_simulated_device(std::shared_ptr<DeviceBackend> backend,
                                       std::shared_ptr<SimulatedDevice> sim, EventMode mode);

/// Runs every check of the contract, each in its own Catch2 SECTION, on backends from `make`.
/// Call it from one TEST_CASE per backend.
void check_device_backend(const BackendFactory& make);

}  // namespace tensorpool::conformance
