// device.cpp: the out-of-line members of the device seam (include/tensorpool/device.hpp): the
// defaults a backend inherits (no virtual memory; alive until told otherwise; no contents to copy,
// host memory from operator new; a stream queried through an event) and the
// destructors, which anchor the two interfaces' vtables in this one file.
#include "tensorpool/device.hpp"

#include <new>
#include <string>

#include "tensorpool/errors.hpp"

namespace tensorpool {

VirtualMemory::~VirtualMemory() = default;

bool VirtualMemory::maps_parts() const noexcept { return false; }

void VirtualMemory::map_part(Address, std::size_t, PhysicalHandle, std::size_t) {
  throw DeviceError("this device's virtual memory maps physical allocations only whole");
}

DeviceBackend::~DeviceBackend() = default;

VirtualMemory* DeviceBackend::virtual_memory() noexcept { return nullptr; }

bool DeviceBackend::alive() const noexcept { return true; }

bool DeviceBackend::holds_contents() const noexcept { return false; }

bool DeviceBackend::is_capturing(Stream) { return false; }

bool DeviceBackend::query_stream(Stream stream) {
  const DeviceEvent e = create_event();
  bool done = false;
  try {
    record_event(e, stream);
    done = query_event(e);
  } catch (...) {
    destroy_event(e);
    throw;
  }
  destroy_event(e);
  return done;
}

void DeviceBackend::copy_to_host(void*, Address, std::size_t) {
  throw DeviceError("tensorpool: device " + properties().name + " cannot copy its memory to the host");
}

void DeviceBackend::copy_to_device(Address, const void*, std::size_t) {
  throw DeviceError("tensorpool: device " + properties().name + " cannot copy host memory to it");
}

void* DeviceBackend::allocate_host(std::size_t bytes) { return ::operator new(bytes, std::nothrow); }

void DeviceBackend::free_host(void* ptr, std::size_t) noexcept { ::operator delete(ptr); }

}  // namespace tensorpool
