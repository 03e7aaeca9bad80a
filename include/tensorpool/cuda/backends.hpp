// tensorpool/cuda/backends.hpp: DeviceBackends on the CUDA runtime and driver APIs.
//
// Four backends, one device each, all usable under the caching Allocator:
//   CudaAsyncBackend       segments from cudaMallocFromPoolAsync on a dedicated cudaMemPool_t,
//                          freed with cudaFreeAsync on the segment's stream;
//   CudaMallocBackend      plain cudaMalloc / cudaFree;
//   CudaVmmBackend         driver-API virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap,
//                          cuMemSetAccess), which also is the device's VirtualMemory;
//   CudaPinnedHostBackend  cudaHostAlloc / cudaFreeHost: pinned host staging buffers, reused in
//                          stream order like device blocks (record_stream on the copy stream).
//
//   auto backend = tensorpool::make_cuda_backend(tensorpool::CudaBackendKind::async_pool, 0);
//   tensorpool::Allocator alloc(backend);
//   void* p = alloc.allocate(64 << 20, tensorpool::to_stream(my_cuda_stream));
//
// Streams are cudaStream_t cast to tensorpool::Stream (0 is the default stream; cudaStreamLegacy
// and cudaStreamPerThread pass through unchanged), events are cudaEvent_t cast to DeviceEvent (see
// tensorpool/cuda/interop.hpp). This header does not include the CUDA headers.
//
// Rules every backend follows:
//  - every CUDA call is checked; out of memory clears the runtime's last error and makes
//    allocate_segment / create_physical return nullptr / 0 (the allocator's OOM ladder runs);
//    any other error throws DeviceError naming the call, the error and the device;
//  - every call runs with the backend's device current (an RAII guard restores the caller's);
//  - once the process is exiting or CUDA reports that it is shutting down, alive() is false and
//    nothing calls CUDA any more (frees become no-ops: the driver reclaims everything);
//  - backends are thread-safe, so one may be shared by several allocators;
//  - a stream must outlive the segments allocated on it (call Allocator::empty_cache() before
//    destroying a stream): free_segment uses the segment's stream.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "tensorpool/device.hpp"

namespace tensorpool {

enum class CudaBackendKind : std::uint8_t { async_pool, malloc, vmm, pinned_host };
const char* to_string(CudaBackendKind kind) noexcept;

/// What the four backends share: the device ordinal, properties, free memory, the stream and
/// event primitives (events come from a per-backend pool created with cudaEventDisableTiming)
/// and the shutdown check.
class CudaBackend : public DeviceBackend {
 public:
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  int device() const noexcept { return device_; }
  const DeviceProperties& properties() const noexcept override { return props_; }
  std::size_t free_memory() override;

  DeviceEvent create_event() override;
  /// Returns the event to the backend's pool (it is destroyed with the backend).
  void destroy_event(DeviceEvent event) override;
  void record_event(DeviceEvent event, Stream stream) override;
  bool query_event(DeviceEvent event) override;
  void synchronize_event(DeviceEvent event) override;
  void stream_wait_event(Stream stream, DeviceEvent event) override;
  void synchronize_stream(Stream stream) override;
  bool query_stream(Stream stream) override;
  void synchronize_device() override;
  /// cudaStreamIsCapturing: active or invalidated.
  bool is_capturing(Stream stream) override;

  /// Contents (sleep with Contents::keep): cudaMemcpy after the work queued so far, and pinned
  /// host memory (cudaHostAlloc).
  bool holds_contents() const noexcept override { return true; }
  void copy_to_host(void* dst, Address src, std::size_t bytes) override;
  void copy_to_device(Address dst, const void* src, std::size_t bytes) override;
  void* allocate_host(std::size_t bytes) override;
  void free_host(void* ptr, std::size_t bytes) noexcept override;

  bool alive() const noexcept override;

  /// Events waiting in the pool for reuse.
  std::size_t pooled_events() const;

 protected:
  /// Validates `device` and reads its properties; `kind` goes into properties().name.
  CudaBackend(int device, const char* kind);

  const int device_;
  DeviceProperties props_;

 private:
  mutable std::mutex events_mutex_;
  std::vector<DeviceEvent> event_pool_;
};

/// Stream-ordered segments from a dedicated memory pool (release threshold UINT64_MAX, so the
/// driver keeps what we free instead of trimming behind our back; free_segment trims explicitly
/// so that empty_cache really returns memory to the device).
class CudaAsyncBackend final : public CudaBackend {
 public:
  explicit CudaAsyncBackend(int device = 0);
  ~CudaAsyncBackend() override;

  void* allocate_segment(std::size_t bytes, Stream stream) override;
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override;

  /// The cudaMemPool_t segments come from.
  void* memory_pool() const noexcept { return pool_; }

 private:
  void* pool_ = nullptr;
};

/// cudaMalloc / cudaFree. free_segment waits for the segment's stream first (cudaFree's own
/// implicit synchronization is not a documented guarantee).
class CudaMallocBackend final : public CudaBackend {
 public:
  explicit CudaMallocBackend(int device = 0);

  void* allocate_segment(std::size_t bytes, Stream stream) override;
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override;
};

/// The driver's virtual memory management. A segment is one reserved range with one physical
/// allocation mapped over all of it, readable and writable from the device. Unmapping is not
/// stream-ordered: free_segment synchronizes the segment's stream first; unmap(), like
/// cuMemUnmap, expects its caller to have waited for the work that used the range.
class CudaVmmBackend final : public CudaBackend, public VirtualMemory {
 public:
  explicit CudaVmmBackend(int device = 0);
  /// Releases segments still held (the allocator normally returned them all).
  ~CudaVmmBackend() override;

  void* allocate_segment(std::size_t bytes, Stream stream) override;
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override;

  VirtualMemory* virtual_memory() noexcept override { return this; }
  /// cuMemGetAllocationGranularity (minimum) of the device.
  std::size_t page_size() const noexcept override { return page_; }
  Address reserve_address_range(std::size_t bytes, std::size_t alignment) override;
  void release_address_range(Address base, std::size_t bytes) override;
  PhysicalHandle create_physical(std::size_t bytes) override;
  void release_physical(PhysicalHandle handle) override;
  void map(Address addr, std::size_t bytes, PhysicalHandle handle) override;
  void unmap(Address addr, std::size_t bytes) override;
  bool maps_parts() const noexcept override { return true; }
  /// cuMemMap with an offset into the handle, then cuMemSetAccess.
  void map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) override;

  /// Segments currently allocated through allocate_segment.
  std::size_t live_segments() const;

 private:
  struct Segment {
    std::size_t bytes;
    PhysicalHandle handle;
  };
  /// map() that reports out of memory as false instead of throwing.
  bool try_map(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset = 0);
  void unmap_unsynchronized(Address addr, std::size_t bytes);
  void release_segment(Address base, const Segment& seg);

  std::size_t page_ = 0;  // set once by the constructor
  mutable std::mutex segments_mutex_;
  std::map<Address, Segment> segments_;  // live segments by base address
};

/// Pinned host memory (cudaHostAllocPortable) for staging buffers; streams and events are those
/// of `device`, the device the copies run on. capacity 0: the machine's physical memory.
class CudaPinnedHostBackend final : public CudaBackend {
 public:
  explicit CudaPinnedHostBackend(int device = 0, std::size_t capacity = 0);

  /// capacity minus what this backend holds, bounded by the host's available memory.
  std::size_t free_memory() override;
  void* allocate_segment(std::size_t bytes, Stream stream) override;
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override;

  /// Bytes of pinned memory this backend holds.
  std::size_t held_bytes() const noexcept { return held_.load(); }

 private:
  std::atomic<std::size_t> held_{0};
};

/// A backend of `kind` for device ordinal `device`.
std::shared_ptr<CudaBackend> make_cuda_backend(CudaBackendKind kind, int device = 0);

/// Number of CUDA devices (0 when there is no driver or no device).
int cuda_device_count() noexcept;

/// False once the process is exiting (an atexit hook registered when the first backend is
/// made, after CUDA initialised, so it runs before CUDA's own teardown) or once a CUDA call has
/// reported that the runtime or driver is shutting down. Every backend's alive() returns this.
/// (Tests simulate the shutdown through cuda/src/cuda_shutdown.hpp.)
bool cuda_runtime_alive() noexcept;

}  // namespace tensorpool
