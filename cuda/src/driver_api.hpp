// driver_api.hpp: the CUDA driver functions the backends call (CudaVmmBackend's virtual memory,
// error names), reached through the runtime on first use (cudaGetDriverEntryPointByVersion,
// as PyTorch does) instead of linked. No library of cuda/ then needs libcuda.so.1 to load: on a
// host without an NVIDIA driver, the simulated backend works and a real device fails with a
// DeviceError when it is first used.
#pragma once

#include <cuda.h>

namespace tensorpool::cuda_detail {

/// The driver's entry points, with the signatures of the cuda.h the library was compiled with.
struct DriverApi {
  decltype(&::cuGetErrorName) get_error_name;
  decltype(&::cuGetErrorString) get_error_string;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDeviceGetAttribute) device_get_attribute;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity;
  decltype(&::cuMemAddressReserve) mem_address_reserve;
  decltype(&::cuMemAddressFree) mem_address_free;
  decltype(&::cuMemCreate) mem_create;
  decltype(&::cuMemRelease) mem_release;
  decltype(&::cuMemMap) mem_map;
  decltype(&::cuMemUnmap) mem_unmap;
  decltype(&::cuMemSetAccess) mem_set_access;
};

/// The entry points, looked up once per process (thread-safe). Throws DeviceError naming the
/// function the runtime could not find and why (no driver, or one older than the toolkit);
/// the next call tries again.
const DriverApi& driver();

}  // namespace tensorpool::cuda_detail
