// testing/driver_api.cpp: the test double's driver-API functions (errors, devices, virtual
// memory management), with the exact signatures of cuda.h.
//
// Reservations come from one process-wide simulated address space; physical memory is charged
// to the simulated device named in the allocation properties; mappings and access rights are
// tracked here. A handle released while mapped keeps its memory until its last unmap (CUDA's
// rule).
#include <algorithm>

#include "testing/state.hpp"

using namespace tensorpool;
using namespace tensorpool::cuda_double::detail;

namespace {

#define TP_DRIVER_ERRORS(X)                                          \
  X(CUDA_SUCCESS, "no error")                                        \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                    \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                       \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")              \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")             \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")            \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")            \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered") \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")          \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")             \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

const char* driver_error_name(CUresult e) {
  switch (e) {
#define TP_CASE(e, text) \
  case e: return #e;
    TP_DRIVER_ERRORS(TP_CASE)
#undef TP_CASE
    default: return nullptr;
  }
}

const char* driver_error_string(CUresult e) {
  switch (e) {
#define TP_CASE(e, text) \
  case e: return text;
    TP_DRIVER_ERRORS(TP_CASE)
#undef TP_CASE
    default: return nullptr;
  }
}

// The device an allocation property names, or -1 when it is not a valid pinned device one.
int property_device(const State& s, const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(s, prop->location.id))
    return -1;
  return prop->location.id;
}

std::size_t granularity(const State& s, int dev) {
  return device_options(s.options, dev).vm_granularity;
}

// The reservation containing [ptr, ptr + size), if any.
bool inside_reservation(const State& s, Address ptr, std::size_t size) {
  auto r = s.reservations.upper_bound(ptr);
  if (r == s.reservations.begin()) return false;
  --r;
  return ptr + size <= r->first + r->second;
}

// Mappings overlapping [ptr, ptr + size): all of them lie wholly inside, and they cover it.
bool exactly_covered(const State& s, Address ptr, std::size_t size) {
  Address next = ptr;
  auto it = s.mappings.lower_bound(ptr);
  if (it != s.mappings.begin() && std::prev(it)->first + std::prev(it)->second.bytes > ptr)
    return false;  // a mapping straddles the start
  for (; it != s.mappings.end() && it->first < ptr + size; ++it) {
    if (it->first != next || it->first + it->second.bytes > ptr + size) return false;
    next = it->first + it->second.bytes;
  }
  return next == ptr + size;
}

void free_physical(State& s, std::uint64_t handle) {
  auto it = s.physical.find(handle);
  device(s, it->second.device).release_physical(it->second.sim);
  s.physical.erase(it);
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    record_call(s, "cuGetErrorName");
  }
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = driver_error_name(error);
  return *str != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    record_call(s, "cuGetErrorString");
  }
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *str = driver_error_string(error);
  return *str != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* dev, int ordinal) {
  return driver_call("cuDeviceGet", [&](State& s) {
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  return driver_call("cuDeviceGetAttribute", [&](State& s) {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    *value = attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED && s.options.vmm_supported;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* result, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags) {
  return driver_call("cuMemGetAllocationGranularity", [&](State& s) {
    const int dev = property_device(s, prop);
    if (result == nullptr || dev < 0) return CUDA_ERROR_INVALID_VALUE;
    *result = granularity(s, dev);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr,
                                     unsigned long long) {
  return driver_call("cuMemAddressReserve", [&](State& s) {
    if (ptr == nullptr || size == 0 || size % kSegmentGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
    const Address sim = s.va->reserve_address_range(size, alignment);
    const Address user = to_user(kVaRegion, sim);
    s.reservations.emplace(user, size);
    *ptr = static_cast<CUdeviceptr>(user);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return driver_call("cuMemAddressFree", [&](State& s) {
    const auto user = static_cast<Address>(ptr);
    auto it = s.reservations.find(user);
    if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    auto m = s.mappings.lower_bound(user);
    if (m != s.mappings.end() && m->first < user + size) return CUDA_ERROR_INVALID_VALUE;  // mapped
    s.va->release_address_range(to_sim(kVaRegion, user), size);
    s.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  return driver_call("cuMemCreate", [&](State& s) {
    const int dev = property_device(s, prop);
    if (handle == nullptr || dev < 0 || flags != 0 || size == 0 || size % granularity(s, dev) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    const PhysicalHandle sim = device(s, dev).create_physical(size);
    if (sim == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    const std::uint64_t h = kPhysicalTag | s.next_id++;
    s.physical.emplace(h, PhysicalRec{dev, sim, size, false, 0, {}});
    *handle = h;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return driver_call("cuMemRelease", [&](State& s) {
    auto it = s.physical.find(handle);
    if (it == s.physical.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
    it->second.released = true;
    if (it->second.maps == 0) free_physical(s, handle);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return driver_call("cuMemMap", [&](State& s) {
    auto ph = s.physical.find(handle);
    const auto user = static_cast<Address>(ptr);
    if (ph == s.physical.end() || ph->second.released || flags != 0 || size == 0 ||
        offset > ph->second.bytes || size > ph->second.bytes - offset || !inside_reservation(s, user, size))
      return CUDA_ERROR_INVALID_VALUE;
    const std::size_t page = granularity(s, ph->second.device);
    if (size % page != 0 || offset % page != 0 || user % page != 0) return CUDA_ERROR_INVALID_VALUE;
    auto next = s.mappings.lower_bound(user);
    const bool overlaps = (next != s.mappings.end() && next->first < user + size) ||
                          (next != s.mappings.begin() &&
                           std::prev(next)->first + std::prev(next)->second.bytes > user);
    if (overlaps) return CUDA_ERROR_INVALID_VALUE;
    s.mappings.emplace(user, MappingRec{size, handle, std::vector<unsigned>(s.devices.size(), 0), offset});
    ++ph->second.maps;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return driver_call("cuMemUnmap", [&](State& s) {
    const auto user = static_cast<Address>(ptr);
    if (size == 0 || !exactly_covered(s, user, size)) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = s.mappings.lower_bound(user); it != s.mappings.end() && it->first < user + size;) {
      auto ph = s.physical.find(it->second.handle);
      if (--ph->second.maps == 0 && ph->second.released) free_physical(s, ph->first);
      it = s.mappings.erase(it);
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                size_t count) {
  return driver_call("cuMemSetAccess", [&](State& s) {
    const auto user = static_cast<Address>(ptr);
    if (desc == nullptr || count == 0 || size == 0 || !exactly_covered(s, user, size))
      return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < count; ++i)
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(s, desc[i].location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    for (auto it = s.mappings.lower_bound(user); it != s.mappings.end() && it->first < user + size; ++it)
      for (std::size_t i = 0; i < count; ++i)
        it->second.access[static_cast<std::size_t>(desc[i].location.id)] = desc[i].flags;
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
