// driver_api.hpp: the CUDA driver functions the backends call (CudaVmmBackend's virtual memory,
// error names), reached through the runtime on first use (cudaGetDriverEntryPointByVersion,
// as PyTorch does) instead of linked. No library of cuda/ then needs libcuda.so.1 to load: on a
// host without an NVIDIA driver, the simulated backend works and a real device fails with a
// DeviceError when it is first used.
#pragma once

#include <cuda.h>

namespace tensorpool::cuda_detail {

/// Every driver function the backends call, as X(member of DriverApi, the driver's name). The
/// CUDA-runtime test double answers its lookups from the same list (cuda/testing/stream_api.cpp).
#define TP_DRIVER_FUNCTIONS(X)                                  \
  X(get_error_name, cuGetErrorName)                             \
  X(get_error_string, cuGetErrorString)                         \
  X(device_get, cuDeviceGet)                                    \
  X(device_get_attribute, cuDeviceGetAttribute)                 \
  X(mem_get_allocation_granularity, cuMemGetAllocationGranularity) \
  X(mem_address_reserve, cuMemAddressReserve)                   \
  X(mem_address_free, cuMemAddressFree)                         \
  X(mem_create, cuMemCreate)                                    \
  X(mem_release, cuMemRelease)                                  \
  X(mem_map, cuMemMap)                                          \
  X(mem_unmap, cuMemUnmap)                                      \
  X(mem_set_access, cuMemSetAccess)

/// The driver's entry points, with the signatures of the cuda.h the library was compiled with.
struct DriverApi {
#define TP_DRIVER_MEMBER(member, symbol) decltype(&::symbol) member;
  TP_DRIVER_FUNCTIONS(TP_DRIVER_MEMBER)
#undef TP_DRIVER_MEMBER
};

/// The entry points, looked up once per process (thread-safe). Throws DeviceError naming the
/// function the runtime could not find and why (no driver, or one older than the toolkit);
/// the next call tries again.
const DriverApi& driver();

}  // namespace tensorpool::cuda_detail
