// vmm_backend.cpp: CudaVmmBackend, the driver's virtual memory management as a DeviceBackend.
//
// A segment is built from the virtual-memory primitives: reserve a range, create one physical
// allocation of the same size, map it over the range and make it read-write for the device.
// Every step that fails undoes the steps before it, so a failed allocate_segment leaks nothing.
//
// Driver calls need the device's primary context current on the calling thread: every guard
// here binds it (cudaSetDevice) even when the device is already the current one.
//
// Unmapping is not stream-ordered: free_segment synchronizes the segment's stream first; the raw
// unmap() leaves that to its caller (as cuMemUnmap does).
//
// Invariant: segments_ holds exactly the segments allocate_segment handed out and
// free_segment has not taken back; each is reserved, backed by its handle and mapped.
#include <algorithm>

#include "cuda_common.hpp"
#include "driver_api.hpp"

namespace tensorpool {

using cuda_detail::as_stream;
using cuda_detail::check;
using cuda_detail::check_driver;
using cuda_detail::DeviceGuard;
using cuda_detail::driver;

namespace {
constexpr bool kBindContext = true;

CUmemAllocationProp device_allocation(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

CudaVmmBackend::CudaVmmBackend(int device) : CudaBackend(device, "cuMemMap") {
  DeviceGuard guard(device_, kBindContext);
  CUdevice dev = 0;
  check_driver(driver().device_get(&dev, device_), "cuDeviceGet", device_);
  int supported = 0;
  check_driver(
      driver().device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
      "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", device_);
  if (supported == 0)
    throw DeviceError("CUDA device " + std::to_string(device_) +
                      " does not support virtual memory management");
  const CUmemAllocationProp prop = device_allocation(device_);
  std::size_t page = 0;
  check_driver(driver().mem_get_allocation_granularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity", device_);
  if (page == 0) throw DeviceError("cuMemGetAllocationGranularity returned 0");
  page_ = page;
  props_.segment_granularity = round_up(2 * MiB, page);  // a segment is whole pages
  props_.alignment = page;
}

CudaVmmBackend::~CudaVmmBackend() {
  if (!alive()) return;
  std::lock_guard lock(segments_mutex_);
  try {
    DeviceGuard guard(device_, kBindContext);
    if (!segments_.empty()) (void)cudaDeviceSynchronize();
    for (const auto& [base, seg] : segments_) release_segment(base, seg);
  } catch (...) {  // a destructor cannot report; the driver reclaims what is left at exit
  }
  segments_.clear();
  (void)cudaGetLastError();
}

std::size_t CudaVmmBackend::live_segments() const {
  std::lock_guard lock(segments_mutex_);
  return segments_.size();
}

// --- segments -------------------------------------------------------------------------------

void* CudaVmmBackend::allocate_segment(std::size_t bytes, Stream) {
  const Address base = reserve_address_range(bytes, page_);
  if (base == 0) return nullptr;
  PhysicalHandle handle = 0;
  try {
    handle = create_physical(bytes);
    if (handle != 0 && try_map(base, bytes, handle)) {
      std::lock_guard lock(segments_mutex_);
      segments_.emplace(base, Segment{bytes, handle});
      return reinterpret_cast<void*>(base);
    }
  } catch (...) {
    if (handle != 0) release_physical(handle);
    release_address_range(base, bytes);
    throw;
  }
  // Out of memory in cuMemCreate or cuMemMap: undo and let the allocator's ladder run.
  if (handle != 0) release_physical(handle);
  release_address_range(base, bytes);
  return nullptr;
}

void CudaVmmBackend::free_segment(void* ptr, std::size_t bytes, Stream stream) {
  if (!alive()) return;
  const auto base = reinterpret_cast<Address>(ptr);
  Segment seg{};
  {
    std::lock_guard lock(segments_mutex_);
    auto it = segments_.find(base);
    if (it == segments_.end() || it->second.bytes != bytes)
      throw DeviceError("CudaVmmBackend: free_segment of " + format_bytes(bytes) +
                        " that is not a live segment");
    seg = it->second;
    segments_.erase(it);
  }
  cuda_detail::ignoring_shutdown([&] {
    DeviceGuard guard(device_, kBindContext);
    // Unmapping is not stream-ordered: the owner stream's work must be done first.
    check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize", device_);
    release_segment(base, seg);
  });
}

// Unmaps, releases and unreserves one segment whose stream work has completed.
void CudaVmmBackend::release_segment(Address base, const Segment& seg) {
  unmap_unsynchronized(base, seg.bytes);
  release_physical(seg.handle);
  release_address_range(base, seg.bytes);
}

// --- VirtualMemory -------------------------------------------------------------------------

Address CudaVmmBackend::reserve_address_range(std::size_t bytes, std::size_t alignment) {
  DeviceGuard guard(device_, kBindContext);
  CUdeviceptr ptr = 0;
  const std::size_t align = std::max(alignment, page_);
  const CUresult err = driver().mem_address_reserve(&ptr, bytes, align, 0, 0);
  if (!cuda_detail::check_driver_alloc(err, "cuMemAddressReserve", device_, bytes)) return 0;
  return static_cast<Address>(ptr);
}

void CudaVmmBackend::release_address_range(Address base, std::size_t bytes) {
  if (!alive()) return;
  cuda_detail::ignoring_shutdown([&] {
    DeviceGuard guard(device_, kBindContext);
    check_driver(driver().mem_address_free(static_cast<CUdeviceptr>(base), bytes), "cuMemAddressFree",
                 device_, bytes);
  });
}

PhysicalHandle CudaVmmBackend::create_physical(std::size_t bytes) {
  DeviceGuard guard(device_, kBindContext);
  const CUmemAllocationProp prop = device_allocation(device_);
  CUmemGenericAllocationHandle handle = 0;
  if (!cuda_detail::check_driver_alloc(driver().mem_create(&handle, bytes, &prop, 0), "cuMemCreate",
                                       device_, bytes))
    return 0;
  return static_cast<PhysicalHandle>(handle);
}

void CudaVmmBackend::release_physical(PhysicalHandle handle) {
  if (!alive()) return;
  cuda_detail::ignoring_shutdown([&] {
    DeviceGuard guard(device_, kBindContext);
    check_driver(driver().mem_release(static_cast<CUmemGenericAllocationHandle>(handle)), "cuMemRelease",
                 device_);
  });
}

bool CudaVmmBackend::try_map(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) {
  DeviceGuard guard(device_, kBindContext);
  const auto ptr = static_cast<CUdeviceptr>(addr);
  const CUresult mapped =
      driver().mem_map(ptr, bytes, offset, static_cast<CUmemGenericAllocationHandle>(handle), 0);
  if (!cuda_detail::check_driver_alloc(mapped, "cuMemMap", device_, bytes)) return false;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult granted = driver().mem_set_access(ptr, bytes, &access, 1);
  if (granted == CUDA_SUCCESS) return true;
  (void)driver().mem_unmap(ptr, bytes);  // leave the range as it was
  return cuda_detail::check_driver_alloc(granted, "cuMemSetAccess", device_, bytes);
}

void CudaVmmBackend::map(Address addr, std::size_t bytes, PhysicalHandle handle) { map_part(addr, bytes, handle, 0); }

void CudaVmmBackend::map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) {
  if (!try_map(addr, bytes, handle, offset))
    throw DeviceError("cuMemMap(" + format_bytes(bytes) + (offset != 0 ? " at offset " + format_bytes(offset) : "") +
                      ") failed on CUDA device " + std::to_string(device_) + ": out of memory");
}

// Like cuMemUnmap, not stream-ordered: the caller has made sure no work in flight uses the
// range (the allocator's vmm mode synchronizes the heap's stream before it reclaims pages).
void CudaVmmBackend::unmap(Address addr, std::size_t bytes) {
  if (!alive()) return;
  cuda_detail::ignoring_shutdown([&] { unmap_unsynchronized(addr, bytes); });
}

void CudaVmmBackend::unmap_unsynchronized(Address addr, std::size_t bytes) {
  DeviceGuard guard(device_, kBindContext);
  check_driver(driver().mem_unmap(static_cast<CUdeviceptr>(addr), bytes), "cuMemUnmap", device_, bytes);
}

}  // namespace tensorpool
