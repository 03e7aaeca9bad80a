// The test double's controls, exported with C linkage from libtensorpool_torch_double.so (the
// PyTorch library built on the CUDA-runtime test double, for tests only), so that a test that
// dlopen()s the library drives the same double the library allocates from.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "tensorpool/tensorpool.h"
#include "testing/control.hpp"

namespace dbl = tensorpool::cuda_double;

extern "C" {

/// Fresh devices (before the first allocation): `devices` of `capacity` bytes, work completing
/// only when told (complete_all) unless `immediate`.
TENSORPOOL_API void tensorpool_testing_reset(int devices, size_t capacity, int immediate) {
  dbl::Options o;
  o.device_count = devices;
  o.device.capacity = capacity;
  o.event_mode = immediate != 0 ? tensorpool::EventMode::immediate : tensorpool::EventMode::manual;
  dbl::reset(o);
}

/// A new stream on `device` (the caller's current device is restored); nullptr on failure.
TENSORPOOL_API void* tensorpool_testing_create_stream(int device) {
  int current = 0;
  cudaStream_t stream = nullptr;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) return nullptr;
  const cudaError_t err = cudaStreamCreate(&stream);
  cudaSetDevice(current);
  return err == cudaSuccess ? static_cast<void*>(stream) : nullptr;
}

/// Completes the work of every stream.
TENSORPOOL_API void tensorpool_testing_complete_all(void) { dbl::complete_all(); }

/// Recorded events whose work has not completed.
TENSORPOOL_API size_t tensorpool_testing_incomplete_events(void) { return dbl::incomplete_events(); }

/// Bytes the double has handed out on `device`.
TENSORPOOL_API size_t tensorpool_testing_used_bytes(int device) { return dbl::used_bytes(device); }

}  // extern "C"
