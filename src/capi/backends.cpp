// The DeviceBackend factory of the registry and the C API: the simulated device always, the CUDA
// backends when tensorpool is built with the CUDA toolkit (TENSORPOOL_WITH_CUDA, set by
// cuda/torch/torch.cmake on this library's objects).
#include <string>

#include "tensorpool/errors.hpp"
#include "tensorpool/registry.hpp"
#include "tensorpool/simulated_device.hpp"

#ifndef TENSORPOOL_WITH_CUDA
#define TENSORPOOL_WITH_CUDA 0
#endif
#if TENSORPOOL_WITH_CUDA
#include "tensorpool/cuda/backends.hpp"
#endif

namespace tensorpool {

bool backend_available(Backend kind) noexcept {
  return kind == Backend::simulated || TENSORPOOL_WITH_CUDA != 0;
}

std::shared_ptr<DeviceBackend> make_backend(Backend kind, int device, std::size_t simulated_capacity) {
  if (device < 0) throw UsageError("device ordinal " + std::to_string(device) + " is negative");
  if (kind == Backend::simulated) {
    return std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{
        .name = "sim" + std::to_string(device),
        .ordinal = device,
        .capacity = simulated_capacity == 0 ? kDefaultSimulatedCapacity : simulated_capacity,
        .event_mode = EventMode::immediate});
  }
#if TENSORPOOL_WITH_CUDA
  const CudaBackendKind cuda = kind == Backend::async    ? CudaBackendKind::async_pool
                               : kind == Backend::malloc ? CudaBackendKind::malloc
                                                         : CudaBackendKind::vmm;
  return make_cuda_backend(cuda, device);
#else
  throw BackendUnavailableError(std::string("backend '") + to_string(kind) +
                   "' needs tensorpool built with the CUDA toolkit; this build has only "
                   "'simulated' (set backend:simulated)");
#endif
}

}  // namespace tensorpool
