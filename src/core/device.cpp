// device.cpp: the out-of-line members of the device seam (include/tensorpool/device.hpp): the
// defaults a backend inherits (no virtual memory; alive until told otherwise) and the
// destructors, which anchor the two interfaces' vtables in this one file.
#include "tensorpool/device.hpp"

namespace tensorpool {

VirtualMemory::~VirtualMemory() = default;

DeviceBackend::~DeviceBackend() = default;

VirtualMemory* DeviceBackend::virtual_memory() noexcept { return nullptr; }

bool DeviceBackend::alive() const noexcept { return true; }

}  // namespace tensorpool
