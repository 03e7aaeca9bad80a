// nvtx.cpp: the NVTX annotations of tensorpool/cuda/nvtx.hpp: a DeviceBackend wrapper that turns
// device calls into ranges and segments into NVTX heaps, and an Observer for the OOM and
// empty_cache marks and the per-block regions. Everything goes to one "tensorpool" domain; the
// NVTX calls are no-ops (an indirect call each) until a tool attaches.
#include "tensorpool/cuda/nvtx.hpp"

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "tensorpool/errors.hpp"

namespace tensorpool {

namespace {

// --- the domain and its registered strings ---------------------------------------------------

enum Message : int { kSegmentAlloc, kSegmentFree, kMap, kUnmap, kCreatePhysical, kReleasePhysical,
                     kReserve, kRelease, kOom, kEmptyCache, kNumMessages };
constexpr const char* kMessageText[kNumMessages] = {
    "segment alloc", "segment free", "map", "unmap", "physical create", "physical release",
    "reserve address range", "release address range", "OOM", "empty_cache"};
// ARGB: allocation green, release blue, failures red.
constexpr std::uint32_t kMessageColor[kNumMessages] = {
    0xFF2E9E44, 0xFF2F6FD6, 0xFF55B86B, 0xFF5C8DE0, 0xFF2E9E44, 0xFF2F6FD6,
    0xFF8A8A8A, 0xFF8A8A8A, 0xFFD62F2F, 0xFFE0A030};

struct Domain {
  nvtxDomainHandle_t handle = nullptr;
  nvtxStringHandle_t messages[kNumMessages] = {};

  static const Domain& get() {
    static const Domain d = [] {
      Domain out;
      out.handle = nvtxDomainCreateA("tensorpool");
      for (int i = 0; i < kNumMessages; ++i) out.messages[i] = nvtxDomainRegisterStringA(out.handle, kMessageText[i]);
      return out;
    }();
    return d;
  }
};

nvtxEventAttributes_t attributes(Message m, std::uint64_t payload) {
  const Domain& d = Domain::get();
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = kMessageColor[m];
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = payload;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = d.messages[m];
  return a;
}

/// A range on the calling thread for the lifetime of the object (nothing when !on).
class Range {
 public:
  Range(bool on, Message m, std::uint64_t bytes) : on_(on) {
    if (!on_) return;
    const nvtxEventAttributes_t a = attributes(m, bytes);
    nvtxDomainRangePushEx(Domain::get().handle, &a);
  }
  ~Range() {
    if (on_) nvtxDomainRangePop(Domain::get().handle);
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool on_;
};

void mark(Message m, std::uint64_t payload) {
  const nvtxEventAttributes_t a = attributes(m, payload);
  nvtxDomainMarkEx(Domain::get().handle, &a);
}

// --- heaps and regions -----------------------------------------------------------------------

/// The NVTX heaps of one backend: a segment (fixed mode) or a reserved range (vmm mode) each.
class Heaps {
 public:
  void add(Address base, std::size_t bytes) {
    const nvtxMemVirtualRangeDesc_t range{bytes, reinterpret_cast<const void*>(base)};
    nvtxMemHeapDesc_t desc{};
    desc.extCompatID = NVTX_EXT_COMPATID_MEM;
    desc.structSize = sizeof desc;
    desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
    desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    desc.typeSpecificDescSize = sizeof range;
    desc.typeSpecificDesc = &range;
    const nvtxMemHeapHandle_t heap = nvtxMemHeapRegister(Domain::get().handle, &desc);
    std::lock_guard<std::mutex> lock(mutex_);
    heaps_[base] = Heap{bytes, heap};
  }
  /// Unregistering a heap drops its regions too.
  void remove(Address base) {
    nvtxMemHeapHandle_t heap = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = heaps_.find(base);
      if (it == heaps_.end()) return;
      heap = it->second.handle;
      heaps_.erase(it);
    }
    nvtxMemHeapUnregister(Domain::get().handle, heap);
  }
  /// A region for the block [addr, addr + bytes) in the heap that holds it.
  void add_region(Address addr, std::size_t bytes) {
    nvtxMemHeapHandle_t heap = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = heaps_.upper_bound(addr);
      if (it == heaps_.begin()) return;
      --it;
      if (addr - it->first >= it->second.bytes) return;
      heap = it->second.handle;
    }
    const nvtxMemVirtualRangeDesc_t range{bytes, reinterpret_cast<const void*>(addr)};
    nvtxMemRegionsRegisterBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof batch;
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.heap = heap;
    batch.regionCount = 1;
    batch.regionDescElementSize = sizeof range;
    batch.regionDescElements = &range;
    nvtxMemRegionsRegister(Domain::get().handle, &batch);
  }
  static void remove_region(Address addr) {
    nvtxMemRegionRef_t ref{};
    ref.pointer = reinterpret_cast<const void*>(addr);
    nvtxMemRegionsUnregisterBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof batch;
    batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
    batch.refCount = 1;
    batch.refElementSize = sizeof ref;
    batch.refElements = &ref;
    nvtxMemRegionsUnregister(Domain::get().handle, &batch);
  }

 private:
  struct Heap {
    std::size_t bytes;
    nvtxMemHeapHandle_t handle;
  };
  std::mutex mutex_;  // the backend may be shared by allocators
  std::map<Address, Heap> heaps_;  // by base address; they do not overlap
};

// --- the backend wrapper ---------------------------------------------------------------------

/// The virtual-memory calls of a wrapped backend, with their ranges; reserved ranges are heaps.
class NvtxVirtualMemory final : public VirtualMemory {
 public:
  NvtxVirtualMemory(VirtualMemory& inner, bool ranges, Heaps* heaps)
      : inner_(inner), ranges_(ranges), heaps_(heaps) {}

  std::size_t page_size() const noexcept override { return inner_.page_size(); }
  Address reserve_address_range(std::size_t bytes, std::size_t alignment) override {
    const Range r(ranges_, kReserve, bytes);
    const Address base = inner_.reserve_address_range(bytes, alignment);
    if (base != 0 && heaps_ != nullptr) heaps_->add(base, bytes);
    return base;
  }
  void release_address_range(Address base, std::size_t bytes) override {
    const Range r(ranges_, kRelease, bytes);
    if (heaps_ != nullptr) heaps_->remove(base);
    inner_.release_address_range(base, bytes);
  }
  PhysicalHandle create_physical(std::size_t bytes) override {
    const Range r(ranges_, kCreatePhysical, bytes);
    return inner_.create_physical(bytes);
  }
  void release_physical(PhysicalHandle handle) override {
    const Range r(ranges_, kReleasePhysical, 0);
    inner_.release_physical(handle);
  }
  void map(Address addr, std::size_t bytes, PhysicalHandle handle) override {
    const Range r(ranges_, kMap, bytes);
    inner_.map(addr, bytes, handle);
  }
  void unmap(Address addr, std::size_t bytes) override {
    const Range r(ranges_, kUnmap, bytes);
    inner_.unmap(addr, bytes);
  }
  bool maps_parts() const noexcept override { return inner_.maps_parts(); }
  void map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) override {
    const Range r(ranges_, kMap, bytes);
    inner_.map_part(addr, bytes, handle, offset);
  }

 private:
  VirtualMemory& inner_;  // the wrapped backend's, alive as long as it is
  const bool ranges_;
  Heaps* const heaps_;    // null unless nvtx_mem
};

class NvtxBackend final : public DeviceBackend {
 public:
  NvtxBackend(std::shared_ptr<DeviceBackend> inner, bool ranges, bool memory)
      : inner_(std::move(inner)), ranges_(ranges), memory_(memory) {
    if (VirtualMemory* vm = inner_->virtual_memory())
      vm_.emplace(*vm, ranges_, memory_ ? &heaps_ : nullptr);
  }

  Heaps* heaps() noexcept { return memory_ ? &heaps_ : nullptr; }

  const DeviceProperties& properties() const noexcept override { return inner_->properties(); }
  std::size_t free_memory() override { return inner_->free_memory(); }

  void* allocate_segment(std::size_t bytes, Stream stream) override {
    const Range r(ranges_, kSegmentAlloc, bytes);
    void* p = inner_->allocate_segment(bytes, stream);
    if (p != nullptr && memory_) heaps_.add(reinterpret_cast<Address>(p), bytes);
    return p;
  }
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override {
    const Range r(ranges_, kSegmentFree, bytes);
    if (memory_) heaps_.remove(reinterpret_cast<Address>(ptr));
    inner_->free_segment(ptr, bytes, stream);
  }

  DeviceEvent create_event() override { return inner_->create_event(); }
  void destroy_event(DeviceEvent event) override { inner_->destroy_event(event); }
  void record_event(DeviceEvent event, Stream stream) override { inner_->record_event(event, stream); }
  bool query_event(DeviceEvent event) override { return inner_->query_event(event); }
  void synchronize_event(DeviceEvent event) override { inner_->synchronize_event(event); }
  void stream_wait_event(Stream stream, DeviceEvent event) override { inner_->stream_wait_event(stream, event); }
  void synchronize_stream(Stream stream) override { inner_->synchronize_stream(stream); }
  bool query_stream(Stream stream) override { return inner_->query_stream(stream); }
  bool is_capturing(Stream stream) override { return inner_->is_capturing(stream); }
  void synchronize_device() override { inner_->synchronize_device(); }

  bool holds_contents() const noexcept override { return inner_->holds_contents(); }
  void copy_to_host(void* dst, Address src, std::size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
  void copy_to_device(Address dst, const void* src, std::size_t bytes) override {
    inner_->copy_to_device(dst, src, bytes);
  }
  void* allocate_host(std::size_t bytes) override { return inner_->allocate_host(bytes); }
  void free_host(void* ptr, std::size_t bytes) noexcept override { inner_->free_host(ptr, bytes); }

  VirtualMemory* virtual_memory() noexcept override { return vm_ ? &*vm_ : nullptr; }

  bool alive() const noexcept override { return inner_->alive(); }

 private:
  const std::shared_ptr<DeviceBackend> inner_;
  const bool ranges_;
  const bool memory_;
  Heaps heaps_;
  std::optional<NvtxVirtualMemory> vm_;  // set when inner_ has virtual memory
};

// --- the observer ----------------------------------------------------------------------------

class NvtxObserver final : public Observer {
 public:
  NvtxObserver(bool marks, Heaps* heaps) : marks_(marks), heaps_(heaps) {}

  void on_event(const AllocatorEvent& e) noexcept override {
    switch (e.type) {
      case EventType::alloc:
        if (heaps_ != nullptr) heaps_->add_region(e.address, e.requested);
        break;
      case EventType::free_completed:
        if (heaps_ != nullptr) Heaps::remove_region(e.address);
        break;
      case EventType::oom:
        if (marks_) mark(kOom, e.requested);
        break;
      case EventType::empty_cache:
        if (marks_) mark(kEmptyCache, e.size);
        break;
      default: break;
    }
  }

 private:
  const bool marks_;
  Heaps* const heaps_;  // null unless nvtx_mem; owned by the allocator's NvtxBackend
};

}  // namespace

std::shared_ptr<DeviceBackend> with_nvtx(std::shared_ptr<DeviceBackend> device, const Config& config) {
  if (!config.nvtx && !config.nvtx_mem) return device;
  if (!device) throw UsageError("tensorpool::with_nvtx: no device");
  return std::make_shared<NvtxBackend>(std::move(device), config.nvtx, config.nvtx_mem);
}

HookId attach_nvtx(Allocator& alloc) {
  const Config& c = alloc.config();
  if (!c.nvtx && !c.nvtx_mem) return 0;
  Heaps* heaps = nullptr;
  if (c.nvtx_mem) {
    auto* backend = dynamic_cast<NvtxBackend*>(&alloc.device());
    if (backend == nullptr || backend->heaps() == nullptr) {
      throw UsageError("tensorpool::attach_nvtx: nvtx_mem:on needs the allocator's device to come "
                       "from with_nvtx() with nvtx_mem:on (its segments are the NVTX heaps)");
    }
    heaps = backend->heaps();
  }
  return alloc.add_observer(std::make_shared<NvtxObserver>(c.nvtx, heaps));
}

bool nvtx_tool_attached() noexcept { return Domain::get().handle != nullptr; }

}  // namespace tensorpool
