// cuda_common.cpp: CUDA error checks, the device guard and the process-wide shutdown state.
//
// Invariant: once g_shutdown is true it stays true (outside tests), and no backend calls CUDA
// after it has observed it.
#include "cuda_common.hpp"

#include "driver_api.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

namespace tensorpool {

namespace {
std::atomic<bool> g_shutdown{false};

void on_process_exit() noexcept { g_shutdown.store(true); }

std::string describe(const char* call, std::size_t bytes, int device, const char* name,
                     const char* text) {
  std::string msg = std::string(call);
  if (bytes != 0) msg += "(" + format_bytes(bytes) + ")";
  msg += " failed on CUDA device " + std::to_string(device) + ": " + name + " (" + text + ")";
  return msg;
}
}  // namespace

bool cuda_runtime_alive() noexcept { return !g_shutdown.load(); }

namespace cuda_detail {

void mark_cuda_shutdown() noexcept { g_shutdown.store(true); }
void reset_cuda_shutdown_for_testing() noexcept { g_shutdown.store(false); }

void register_exit_hook() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(&on_process_exit); });
}

void throw_runtime_error(cudaError_t err, const char* call, int device, std::size_t bytes) {
  // Clear the last error: it has been reported here and must not resurface on a later call.
  (void)cudaGetLastError();
  const std::string msg =
      describe(call, bytes, device, cudaGetErrorName(err), cudaGetErrorString(err));
  if (err == cudaErrorCudartUnloading) {
    mark_cuda_shutdown();
    throw ShutdownError(msg);
  }
  throw DeviceError(msg);
}

void throw_driver_error(CUresult err, const char* call, int device, std::size_t bytes) {
  const char* name = nullptr;
  const char* text = nullptr;
  const DriverApi& api = driver();  // loaded: a driver call has just returned `err`
  if (api.get_error_name(err, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA_ERROR_UNKNOWN";
  if (api.get_error_string(err, &text) != CUDA_SUCCESS || text == nullptr) text = "unrecognized error";
  const std::string msg = describe(call, bytes, device, name, text);
  if (err == CUDA_ERROR_DEINITIALIZED) {
    mark_cuda_shutdown();
    throw ShutdownError(msg);
  }
  throw DeviceError(msg);
}

bool check_alloc(cudaError_t err, const char* call, int device, std::size_t bytes) {
  if (err == cudaSuccess) return true;
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
    return false;
  }
  throw_runtime_error(err, call, device, bytes);
}

bool check_driver_alloc(CUresult err, const char* call, int device, std::size_t bytes) {
  if (err == CUDA_SUCCESS) return true;
  if (err == CUDA_ERROR_OUT_OF_MEMORY) return false;
  throw_driver_error(err, call, device, bytes);
}

DeviceGuard::DeviceGuard(int device, bool bind_context) {
  check(cudaGetDevice(&previous_), "cudaGetDevice", device);
  if (previous_ == device && !bind_context) return;
  check(cudaSetDevice(device), "cudaSetDevice", device);
  restore_ = previous_ != device;
}

DeviceGuard::~DeviceGuard() {
  if (!restore_) return;
  // A destructor cannot report: if restoring fails, leave no last error behind either.
  if (cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace cuda_detail
}  // namespace tensorpool
