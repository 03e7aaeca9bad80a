// tests/cuda/harness.hpp: what the CUDA backend tests share. The same test sources build against
// the test double (default) and, with TENSORPOOL_CUDA_REAL_TESTS, against the real runtime; the
// harness hides the difference: Env resets the double (or cleans up on real hardware) and
// finish() completes a stream's work (the double's control API, or cudaStreamSynchronize).
#pragma once

#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>

#include "cuda_shutdown.hpp"  // cuda/src: the shutdown state, reset between tests
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/cuda/interop.hpp"
#include "tensorpool/tensorpool.hpp"

#ifndef TENSORPOOL_CUDA_REAL_TESTS
#define TENSORPOOL_CUDA_REAL_TESTS 0
#endif
#if !TENSORPOOL_CUDA_REAL_TESTS
#include "testing/control.hpp"
#endif

namespace tpcuda {

using namespace tensorpool;

inline constexpr bool kReal = TENSORPOOL_CUDA_REAL_TESTS != 0;
inline constexpr std::array<CudaBackendKind, 4> kAllKinds = {
    CudaBackendKind::async_pool, CudaBackendKind::malloc, CudaBackendKind::vmm,
    CudaBackendKind::pinned_host};

/// Runs the rest of the test case once for each backend kind (a Catch2 generator: each run is a
/// fresh pass through the test case), naming the kind in every failure message.
#define TP_EACH_BACKEND_KIND(kind)                                                       \
  const ::tensorpool::CudaBackendKind kind = GENERATE(from_range(::tpcuda::kAllKinds)); \
  INFO("backend " << ::tensorpool::to_string(kind))

/// Fails the test unless a runtime call succeeded.
#define TP_CUDA_OK(call) REQUIRE((call) == cudaSuccess)

/// One test's world. On the double: `devices` fresh devices of `capacity` bytes, manual events.
/// On real hardware: the current device is 0 and no error is pending, before and after.
class Env {
 public:
  explicit Env(int devices = 1, std::size_t capacity = 16 * GiB) {
    cuda_detail::reset_cuda_shutdown_for_testing();
#if TENSORPOOL_CUDA_REAL_TESTS
    (void)devices;
    (void)capacity;
    TP_CUDA_OK(cudaSetDevice(0));
    (void)cudaGetLastError();
#else
    cuda_double::Options o;
    o.device_count = devices;
    o.device.capacity = capacity;
    cuda_double::reset(o);
#endif
  }
  ~Env() {
    cuda_detail::reset_cuda_shutdown_for_testing();
#if TENSORPOOL_CUDA_REAL_TESTS
    (void)cudaDeviceSynchronize();
    (void)cudaSetDevice(0);
#else
    cuda_double::simulate_driver_shutdown(false);
#endif
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
};

/// A stream created on the current device, destroyed with the object. Declare streams before
/// the allocator that uses them: a stream must outlive the segments allocated on it.
class CudaStream {
 public:
  CudaStream() { TP_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaStream() {
    if (cuda_runtime_alive()) (void)cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const noexcept { return stream_; }
  Stream id() const noexcept { return to_stream(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

/// Completes (double) or waits for (real) the work submitted to `stream`.
inline void finish(cudaStream_t stream) {
#if TENSORPOOL_CUDA_REAL_TESTS
  TP_CUDA_OK(cudaStreamSynchronize(stream));
#else
  cuda_double::complete_stream(stream);
#endif
}
inline void finish(const CudaStream& s) { finish(s.get()); }

/// The runtime's pending error for this thread, without clearing it.
inline cudaError_t pending_error() {
#if TENSORPOOL_CUDA_REAL_TESTS
  return cudaPeekAtLastError();
#else
  return cuda_double::last_error();
#endif
}

inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) (void)cudaGetLastError();
  return n;
}

/// An allocator with the default settings (TENSORPOOL_CONF is not consulted).
inline std::unique_ptr<Allocator> make_allocator(std::shared_ptr<DeviceBackend> backend,
                                                 Config config = {}) {
  return std::make_unique<Allocator>(std::move(backend), std::move(config));
}

inline Address address(const void* p) { return reinterpret_cast<Address>(p); }

/// The runtime/driver call that allocates a segment for each backend (as the double records it).
inline const char* alloc_api(CudaBackendKind kind) {
  switch (kind) {
    case CudaBackendKind::async_pool: return "cudaMallocFromPoolAsync";
    case CudaBackendKind::malloc: return "cudaMalloc";
    case CudaBackendKind::vmm: return "cuMemCreate";
    case CudaBackendKind::pinned_host: return "cudaHostAlloc";
  }
  return "";
}

}  // namespace tpcuda
