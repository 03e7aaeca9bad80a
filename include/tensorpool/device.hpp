// tensorpool/device.hpp: the one narrow seam between the caching allocator and a device.
//
// A DeviceBackend hands out segments of device address space with physical memory behind them,
// reports capacity and free memory, and provides the stream/event primitives the allocator needs
// for stream-ordered reuse. Optionally (supports_virtual_memory) it also exposes the virtual
// memory flavour: reserve address ranges, create physical pages, map/unmap them.
//
// Implementations: SimulatedDevice (simulated_device.hpp, any capacity, no GPU), and in cuda/ the
// cudaMallocAsync, cudaMalloc, driver-API virtual memory and pinned-host backends.
//
// Contract:
//  - allocate_segment returns nullptr when the device is out of memory (the allocator then runs
//    its OOM ladder) and throws DeviceError for any other failure;
//  - the allocator calls a backend while holding its own lock, from one thread at a time per
//    allocator; backends shared between allocators must be thread-safe themselves;
//  - a backend never calls back into the allocator.
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
  bool supports_virtual_memory = false;
  std::size_t vm_page_size = 2 * MiB;      // physical page granularity of the VM flavour

  static constexpr std::size_t kDefaultAlignment = 512;
};

/// A physical memory allocation of the virtual-memory flavour (CUmemGenericAllocationHandle).
using PhysicalHandle = std::uint64_t;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const DeviceProperties& properties() const noexcept = 0;
  /// Free device memory as the device reports it (other processes' use included).
  virtual std::size_t free_memory() = 0;

  // --- segments ----------------------------------------------------------------------------
  /// `bytes` is a multiple of segment_granularity. nullptr: out of memory.
  virtual void* allocate_segment(std::size_t bytes, Stream stream) = 0;
  virtual void free_segment(void* ptr, std::size_t bytes, Stream stream) = 0;

  // --- streams and events ------------------------------------------------------------------
  virtual Event create_event() = 0;
  virtual void destroy_event(Event event) = 0;
  /// Captures the work submitted to `stream` so far.
  virtual void record_event(Event event, Stream stream) = 0;
  /// True once the captured work has completed (an event never recorded is complete).
  virtual bool query_event(Event event) = 0;
  /// Blocks the host until the captured work has completed.
  virtual void synchronize_event(Event event) = 0;
  /// Makes future work on `stream` wait for the event's captured work, without blocking the host.
  virtual void stream_wait_event(Stream stream, Event event) = 0;
  virtual void synchronize_stream(Stream stream) = 0;
  virtual void synchronize_device() = 0;

  // --- virtual memory flavour (only when properties().supports_virtual_memory) ---------------
  /// Reserves `bytes` of address space (multiple of vm_page_size). 0: no address space left.
  virtual Address reserve_address_range(std::size_t bytes, std::size_t alignment);
  virtual void release_address_range(Address base, std::size_t bytes);
  /// Creates `bytes` (multiple of vm_page_size) of physical memory. 0: out of memory.
  virtual PhysicalHandle create_physical(std::size_t bytes);
  virtual void release_physical(PhysicalHandle handle);
  /// Maps the whole of `handle` at [addr, addr + bytes) and makes it accessible from the device.
  virtual void map(Address addr, std::size_t bytes, PhysicalHandle handle);
  virtual void unmap(Address addr, std::size_t bytes);

  /// False once the process is exiting and the driver may be gone: the allocator then stops
  /// returning memory upstream (the process teardown reclaims it).
  virtual bool alive() const noexcept { return true; }
};

}  // namespace tensorpool
