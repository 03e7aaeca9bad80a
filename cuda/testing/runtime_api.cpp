// testing/runtime_api.cpp: the test double's runtime-API functions that take no stream (device
// management, errors, memory, pools, events, stream creation), with the exact signatures of
// cuda_runtime_api.h.
#include <algorithm>
#include <cstring>

#include "testing/state.hpp"

using namespace tensorpool;
using namespace tensorpool::cuda_double::detail;
using tensorpool::cuda_double::DeviceOptions;

namespace {

template <class Map>
auto find_handle(Map& map, const void* handle) {
  return map.find(reinterpret_cast<std::uintptr_t>(handle));
}

// A new allocation of `size` on `dev` (-1: pinned host), rounded to the simulated granularity.
cudaError_t allocate(State& s, int dev, std::size_t size, AllocKind kind, void** out) {
  if (out == nullptr) return cudaErrorInvalidValue;
  *out = nullptr;
  if (size == 0) return cudaSuccess;
  SimulatedDevice& sim = device(s, dev);
  // The driver's rule (DeviceOptions::malloc_granularity): from 2 MiB up, whole 2 MiB pages.
  const std::size_t granularity = dev >= 0 && size >= kSegmentGranularity
                                      ? kSegmentGranularity
                                      : sim.properties().segment_granularity;
  const std::size_t bytes = round_up(size, granularity);
  void* p = sim.allocate_segment(bytes, kDefaultStream);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  const int region = dev == -1 ? kHostRegion : dev;
  const Address user = to_user(region, reinterpret_cast<Address>(p));
  s.allocations.emplace(user, Allocation{dev, bytes, kind});
  *out = reinterpret_cast<void*>(user);
  return cudaSuccess;
}

// Frees an allocation whose kind is host (`host`) or one of the device kinds (!`host`).
cudaError_t release(State& s, void* ptr, bool host) {
  if (ptr == nullptr) return cudaSuccess;
  auto it = s.allocations.find(reinterpret_cast<Address>(ptr));
  if (it == s.allocations.end() || (it->second.kind == AllocKind::host) != host)
    return cudaErrorInvalidValue;
  const Allocation a = it->second;
  const int region = host ? kHostRegion : a.device;
  device(s, a.device).free_segment(reinterpret_cast<void*>(to_sim(region, it->first)), a.bytes, 0);
  s.allocations.erase(it);
  return cudaSuccess;
}

cudaError_t create_event(State& s, cudaEvent_t* event, unsigned flags) {
  if (event == nullptr) return cudaErrorInvalidValue;
  const int dev = current_device(s);
  const std::uintptr_t h = new_handle(s, kEventTag);
  s.events.emplace(h, EventRec{dev, device(s, dev).create_event(), flags});
  *event = reinterpret_cast<cudaEvent_t>(h);
  return cudaSuccess;
}

cudaError_t create_stream(State& s, cudaStream_t* stream) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  const int dev = current_device(s);
  const std::uintptr_t h = new_handle(s, kStreamTag);
  s.streams.emplace(h, StreamRec{dev, device(s, dev).create_stream()});
  *stream = reinterpret_cast<cudaStream_t>(h);
  return cudaSuccess;
}

#define TP_ERROR_NAMES(X)                                                   \
  X(cudaSuccess, "no error")                                                \
  X(cudaErrorInvalidValue, "invalid argument")                              \
  X(cudaErrorMemoryAllocation, "out of memory")                             \
  X(cudaErrorInitializationError, "initialization error")                   \
  X(cudaErrorCudartUnloading, "driver shutting down")                       \
  X(cudaErrorNoDevice, "no CUDA-capable device is detected")                \
  X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                       \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")              \
  X(cudaErrorNotReady, "device not ready")                                  \
  X(cudaErrorIllegalAddress, "an illegal memory access was encountered")    \
  X(cudaErrorLaunchFailure, "unspecified launch failure")                   \
  X(cudaErrorNotSupported, "operation not supported")                       \
  X(cudaErrorIllegalState, "the operation cannot be performed in the present state") \
  X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing") \
  X(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture") \
  X(cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread") \
  X(cudaErrorUnknown, "unknown error")

}  // namespace

extern "C" {

// --- errors ---------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGetLastError(void) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  record_call(s, "cudaGetLastError");
  if (s.shutdown) return cudaErrorCudartUnloading;
  const cudaError_t err = last_error(s);
  last_error(s) = cudaSuccess;
  return err;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  record_call(s, "cudaPeekAtLastError");
  return s.shutdown ? cudaErrorCudartUnloading : last_error(s);
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define TP_CASE(e, text) \
  case e: return #e;
    TP_ERROR_NAMES(TP_CASE)
#undef TP_CASE
    default: return "cudaErrorUnknown";
  }
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  switch (error) {
#define TP_CASE(e, text) \
  case e: return text;
    TP_ERROR_NAMES(TP_CASE)
#undef TP_CASE
    default: return "unrecognized error code";
  }
}

// --- devices --------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  return runtime_call("cudaGetDeviceCount", [&](State& s) {
    if (count == nullptr) return cudaErrorInvalidValue;
    *count = static_cast<int>(s.devices.size());
    return *count == 0 ? cudaErrorNoDevice : cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaGetDevice(int* dev) {
  return runtime_call("cudaGetDevice", [&](State& s) {
    if (dev == nullptr) return cudaErrorInvalidValue;
    *dev = current_device(s);
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaSetDevice(int dev) {
  return runtime_call("cudaSetDevice", [&](State& s) {
    if (!valid_device(s, dev)) return cudaErrorInvalidDevice;
    current_device(s) = dev;
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int dev) {
  return runtime_call("cudaGetDeviceProperties", [&](State& s) {
    if (prop == nullptr) return cudaErrorInvalidValue;
    if (!valid_device(s, dev)) return cudaErrorInvalidDevice;
    const DeviceOptions& o = device_options(s.options, dev);
    *prop = cudaDeviceProp{};
    std::strncpy(prop->name, o.name.c_str(), sizeof prop->name - 1);
    prop->totalGlobalMem = device(s, dev).properties().capacity;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int dev) {
  return runtime_call("cudaDeviceGetAttribute", [&](State& s) {
    if (value == nullptr) return cudaErrorInvalidValue;
    if (!valid_device(s, dev)) return cudaErrorInvalidDevice;
    switch (attr) {
      case cudaDevAttrMemoryPoolsSupported: *value = s.options.memory_pools_supported ? 1 : 0; break;
      case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
      default: *value = 0; break;
    }
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  return runtime_call("cudaDeviceSynchronize", [&](State& s) {
    device(s, current_device(s)).synchronize_device();
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  return runtime_call("cudaMemGetInfo", [&](State& s) {
    if (free == nullptr || total == nullptr) return cudaErrorInvalidValue;
    SimulatedDevice& sim = device(s, current_device(s));
    *free = sim.free_memory();
    *total = sim.properties().capacity;
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  return runtime_call("cudaDriverGetVersion", [&](State& s) {
    if (version == nullptr) return cudaErrorInvalidValue;
    *version = s.options.driver_version;
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  return runtime_call("cudaRuntimeGetVersion", [&](State& s) {
    if (version == nullptr) return cudaErrorInvalidValue;
    *version = s.options.runtime_version;
    return cudaSuccess;
  });
}

// --- memory ---------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t size) {
  return runtime_call("cudaMalloc", [&](State& s) {
    return allocate(s, current_device(s), size, AllocKind::device, ptr);
  });
}

cudaError_t CUDARTAPI cudaFree(void* ptr) {
  return runtime_call("cudaFree", [&](State& s) {
    // cudaFree waits for the device to be idle.
    device(s, current_device(s)).synchronize_device();
    return release(s, ptr, false);
  });
}

cudaError_t CUDARTAPI cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  return runtime_call("cudaHostAlloc",
                      [&](State& s) { return allocate(s, -1, size, AllocKind::host, ptr); });
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  return runtime_call("cudaFreeHost", [&](State& s) {
    s.host_contents.erase(reinterpret_cast<Address>(ptr));
    return release(s, ptr, true);
  });
}

// --- memory pools ---------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  return runtime_call("cudaMemPoolCreate", [&](State& s) {
    if (pool == nullptr || props == nullptr || props->allocType != cudaMemAllocationTypePinned ||
        props->location.type != cudaMemLocationTypeDevice)
      return cudaErrorInvalidValue;
    if (!valid_device(s, props->location.id)) return cudaErrorInvalidDevice;
    const std::uintptr_t h = new_handle(s, kPoolTag);
    s.pools.emplace(h, PoolRec{props->location.id});
    *pool = reinterpret_cast<cudaMemPool_t>(h);
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaMemPoolDestroy(cudaMemPool_t pool) {
  return runtime_call("cudaMemPoolDestroy", [&](State& s) {
    // Outstanding allocations stay valid until freed, as with CUDA.
    return s.pools.erase(reinterpret_cast<std::uintptr_t>(pool)) != 0 ? cudaSuccess
                                                                       : cudaErrorInvalidValue;
  });
}

cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  return runtime_call("cudaMemPoolSetAttribute", [&](State& s) {
    auto it = find_handle(s.pools, pool);
    if (it == s.pools.end() || value == nullptr) return cudaErrorInvalidValue;
    if (attr == cudaMemPoolAttrReleaseThreshold)
      it->second.release_threshold = *static_cast<const std::uint64_t*>(value);
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
  return runtime_call("cudaMemPoolTrimTo", [&](State& s) {
    return find_handle(s.pools, pool) != s.pools.end() ? cudaSuccess : cudaErrorInvalidValue;
  });
}

// --- events ---------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  return runtime_call("cudaEventCreate", [&](State& s) { return create_event(s, event, 0); });
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return runtime_call("cudaEventCreateWithFlags",
                      [&](State& s) { return create_event(s, event, flags); });
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  return runtime_call("cudaEventDestroy", [&](State& s) {
    auto it = find_handle(s.events, event);
    if (it == s.events.end()) return cudaErrorInvalidResourceHandle;
    device(s, it->second.device).destroy_event(it->second.sim);
    s.events.erase(it);
    return cudaSuccess;
  });
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  return runtime_call("cudaEventQuery", [&](State& s) {
    auto it = find_handle(s.events, event);
    if (it == s.events.end()) return cudaErrorInvalidResourceHandle;
    return device(s, it->second.device).query_event(it->second.sim) ? cudaSuccess
                                                                     : cudaErrorNotReady;
  });
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  return runtime_call("cudaEventSynchronize", [&](State& s) {
    auto it = find_handle(s.events, event);
    if (it == s.events.end()) return cudaErrorInvalidResourceHandle;
    device(s, it->second.device).synchronize_event(it->second.sim);
    return cudaSuccess;
  });
}

// --- streams --------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* stream) {
  return runtime_call("cudaStreamCreate", [&](State& s) { return create_stream(s, stream); });
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  return runtime_call("cudaStreamCreateWithFlags", [&](State& s) { return create_stream(s, stream); });
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  return runtime_call("cudaStreamDestroy", [&](State& s) {
    return s.streams.erase(reinterpret_cast<std::uintptr_t>(stream)) != 0
               ? cudaSuccess
               : cudaErrorInvalidResourceHandle;
  });
}

// --- graphs ---------------------------------------------------------------------------------

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  return runtime_call("cudaGraphDestroy", [&](State& s) {
    return s.graphs.erase(reinterpret_cast<std::uintptr_t>(graph)) != 0 ? cudaSuccess
                                                                         : cudaErrorInvalidValue;
  });
}

}  // extern "C"
