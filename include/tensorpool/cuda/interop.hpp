// tensorpool/cuda/interop.hpp: conversions between CUDA handles and tensorpool's opaque handles.
//
// tensorpool::Stream and tensorpool::DeviceEvent are integers; on the CUDA backends they are the
// cudaStream_t / cudaEvent_t pointer values. 0 is the default stream (the legacy stream, or the
// per-thread stream in code compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM);
// cudaStreamLegacy and cudaStreamPerThread convert like any other handle.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensorpool/types.hpp"

namespace tensorpool {

inline Stream to_stream(cudaStream_t stream) noexcept {
  return static_cast<Stream>(reinterpret_cast<std::uintptr_t>(stream));
}
inline cudaStream_t to_cuda_stream(Stream stream) noexcept {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream));
}
inline DeviceEvent to_event(cudaEvent_t event) noexcept {
  return static_cast<DeviceEvent>(reinterpret_cast<std::uintptr_t>(event));
}
inline cudaEvent_t to_cuda_event(DeviceEvent event) noexcept {
  return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(event));
}

}  // namespace tensorpool
