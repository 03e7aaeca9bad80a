// cuda_common.hpp (internal): what every CUDA backend uses around its CUDA calls: the error
// checks, the device guard, the shutdown state and handle conversions.
//
// Error policy:
//  - check*: success returns; any failure first clears the runtime's last error (so a reported
//    error is never attributed again to a later call), then throws: ShutdownError when CUDA says
//    it is shutting down (after marking the process as shut down), DeviceError otherwise;
//  - check_alloc*: like check*, but out of memory returns false instead of throwing.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuda_shutdown.hpp"
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/cuda/interop.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::cuda_detail {

/// CUDA reported cudaErrorCudartUnloading / CUDA_ERROR_DEINITIALIZED: the process is exiting.
class ShutdownError : public DeviceError {
 public:
  using DeviceError::DeviceError;
};

[[noreturn]] void throw_runtime_error(cudaError_t err, const char* call, int device,
                                      std::size_t bytes);
[[noreturn]] void throw_driver_error(CUresult err, const char* call, int device, std::size_t bytes);

/// `bytes` (0: none) is the size the call was about; it goes into the message.
inline void check(cudaError_t err, const char* call, int device, std::size_t bytes = 0) {
  if (err != cudaSuccess) throw_runtime_error(err, call, device, bytes);
}
inline void check_driver(CUresult err, const char* call, int device, std::size_t bytes = 0) {
  if (err != CUDA_SUCCESS) throw_driver_error(err, call, device, bytes);
}
/// True: success. False: out of memory, the runtime's last error cleared.
bool check_alloc(cudaError_t err, const char* call, int device, std::size_t bytes);
/// True: success. False: CUDA_ERROR_OUT_OF_MEMORY (the driver keeps no last error).
bool check_driver_alloc(CUresult err, const char* call, int device, std::size_t bytes);

/// Makes `device` current for the guard's lifetime and restores the caller's device after.
/// With bind_context the device is set even when it is already current: cudaSetDevice makes the
/// device's primary context current on this thread, which driver-API calls need.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool bind_context = false);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

/// Runs `f` (a release path) and swallows a shutdown reported during it: after shutdown there is
/// nothing left to release.
template <class F>
void ignoring_shutdown(F&& f) {
  try {
    f();
  } catch (const ShutdownError&) {
  }
}

/// Registers the process-exit hook once; call after CUDA has been initialised, so that the hook
/// runs before CUDA's own teardown (exit handlers run in reverse order of registration).
void register_exit_hook();

inline cudaStream_t as_stream(Stream s) noexcept { return to_cuda_stream(s); }
inline cudaEvent_t as_event(DeviceEvent e) noexcept { return to_cuda_event(e); }

}  // namespace tensorpool::cuda_detail
