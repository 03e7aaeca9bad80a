// tensorpool/device.hpp: the one narrow seam between the caching allocator and a device.
//
// A DeviceBackend hands out segments of device address space with physical memory behind them,
// reports capacity and free memory, and provides the stream/event primitives the allocator needs
// for stream-ordered reuse. A backend with virtual memory also exposes a VirtualMemory (reserve
// address ranges, create physical pages, map/unmap them) through virtual_memory(); the others
// return nullptr there.
//
// Implementations: SimulatedDevice (simulated_device.hpp, any capacity, no GPU), and in cuda/ the
// cudaMallocAsync, cudaMalloc, driver-API virtual memory and pinned-host backends.
//
// Contract:
//  - allocate_segment returns nullptr (create_physical 0) when the device is out of memory (the
//    allocator then runs its OOM ladder) and throws DeviceError for any other failure;
//  - events of one stream complete in the order they were recorded;
//  - the allocator calls a backend while holding its own lock, from one thread at a time per
//    allocator; backends shared between allocators must be thread-safe themselves;
//  - a backend never calls back into the allocator.
// tests/conformance/device_backend.cpp checks this contract on every backend in the tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorpool/types.hpp"

namespace tensorpool {

struct DeviceProperties {
  std::string name = "device";
  int ordinal = 0;
  std::size_t capacity = 0;                // total device memory, bytes
  std::size_t segment_granularity = 2 * MiB;  // every segment size is a multiple of this
  std::size_t alignment = kDefaultAlignment;  // every segment address is a multiple of this

  static constexpr std::size_t kDefaultAlignment = 512;
};

/// A physical memory allocation of VirtualMemory (a CUmemGenericAllocationHandle on CUDA).
using PhysicalHandle = std::uint64_t;

/// The virtual-memory calls of a device (the CUDA driver's cuMemAddressReserve, cuMemCreate,
/// cuMemMap + cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree). Sizes and addresses
/// are multiples of page_size(). Unmapping is not stream-ordered: the caller first waits for the
/// work that used the pages.
class VirtualMemory {
 public:
  virtual ~VirtualMemory();

  /// The physical page granularity.
  virtual std::size_t page_size() const noexcept = 0;
  /// Reserves `bytes` of address space. 0: no address space left.
  virtual Address reserve_address_range(std::size_t bytes, std::size_t alignment) = 0;
  virtual void release_address_range(Address base, std::size_t bytes) = 0;
  /// Creates `bytes` of physical memory. 0: out of memory.
  virtual PhysicalHandle create_physical(std::size_t bytes) = 0;
  /// The handle must be mapped nowhere.
  virtual void release_physical(PhysicalHandle handle) = 0;
  /// Maps the whole of `handle` at [addr, addr + bytes), inside a reserved range and over no other
  /// mapping, and makes it readable and writable from the device.
  virtual void map(Address addr, std::size_t bytes, PhysicalHandle handle) = 0;
  /// Removes the mapping made at exactly [addr, addr + bytes).
  virtual void unmap(Address addr, std::size_t bytes) = 0;

  /// Whether map_part() works here.
  virtual bool maps_parts() const noexcept;
  /// Maps the `bytes` of `handle` that start `offset` bytes into it at [addr, addr + bytes), inside
  /// a reserved range and over no other mapping, readable and writable from the device (cuMemMap
  /// with an offset). The handle may be mapped elsewhere too, whole or in part: its pages then
  /// show at each place, and release_physical() waits for every mapping to be removed.
  /// DeviceError where maps_parts() is false.
  virtual void map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset);
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend();

  virtual const DeviceProperties& properties() const noexcept = 0;
  /// Free device memory as the device reports it (other processes' use included).
  virtual std::size_t free_memory() = 0;

  // --- segments ----------------------------------------------------------------------------
  /// `bytes` is a multiple of segment_granularity. nullptr: out of memory.
  virtual void* allocate_segment(std::size_t bytes, Stream stream) = 0;
  virtual void free_segment(void* ptr, std::size_t bytes, Stream stream) = 0;

  // --- streams and events ------------------------------------------------------------------
  virtual DeviceEvent create_event() = 0;
  virtual void destroy_event(DeviceEvent event) = 0;
  /// Captures the work submitted to `stream` so far.
  virtual void record_event(DeviceEvent event, Stream stream) = 0;
  /// True once the captured work has completed (an event never recorded is complete).
  virtual bool query_event(DeviceEvent event) = 0;
  /// Blocks the host until the captured work has completed.
  virtual void synchronize_event(DeviceEvent event) = 0;
  /// Makes future work on `stream` wait for the event's captured work, without blocking the host.
  virtual void stream_wait_event(Stream stream, DeviceEvent event) = 0;
  /// Blocks the host until the work submitted to `stream` so far, its waits included, has
  /// completed (cudaStreamSynchronize).
  virtual void synchronize_stream(Stream stream) = 0;
  virtual void synchronize_device() = 0;
  /// True when the work submitted to `stream` so far, its waits on events included, has
  /// completed (cudaStreamQuery): never a wait, and nothing is submitted, so an idle stream
  /// answers true at once (an event recorded and queried at once may not have been reached yet).
  /// The default records an event and queries it.
  virtual bool query_stream(Stream stream);

  /// Whether work submitted to `stream` is being captured into a CUDA graph now (then the device
  /// must not be asked for memory or synchronized: the allocator serves such a stream from the
  /// graph pool Allocator::begin_capture reserved, and refuses to grow for it). False on a
  /// device without graphs.
  virtual bool is_capturing(Stream stream);

  // --- contents (Allocator::sleep with Contents::keep) ----------------------------------------
  /// Whether device memory holds bytes a copy can read (false: bookkeeping only, as the
  /// simulated device without backing memory; then sleep keeps nothing).
  virtual bool holds_contents() const noexcept;
  /// Copies `bytes` of device memory at `src` to host memory at `dst`, synchronously after the
  /// work queued so far (DeviceError if the backend cannot).
  virtual void copy_to_host(void* dst, Address src, std::size_t bytes);
  /// Copies `bytes` of host memory at `src` to device memory at `dst`, synchronously.
  virtual void copy_to_device(Address dst, const void* src, std::size_t bytes);
  /// Host memory to keep contents in (pinned where the device has it); nullptr when refused.
  virtual void* allocate_host(std::size_t bytes);
  virtual void free_host(void* ptr, std::size_t bytes) noexcept;

  /// The device's virtual-memory calls, or nullptr when it has none (mode:vmm needs them).
  /// The same object for the backend's lifetime.
  virtual VirtualMemory* virtual_memory() noexcept;

  /// False once the process is exiting and the driver may be gone: the allocator then stops
  /// returning memory upstream (the process teardown reclaims it).
  virtual bool alive() const noexcept;
};

}  // namespace tensorpool
