// SimulatedDevice: a bookkeeping-only device with deterministic streams, events and faults.
//
// Invariants:
//  - used_ == sum of live segment sizes + sum of live physical handle sizes;
//  - a stream's events complete in record order: completed <= submitted;
//  - an event is done when its stream's completed >= its seq; a stream that waited on another
//    (stream_wait_event) cannot complete past the wait point before the other stream reaches
//    the awaited seq (complete_to enforces it transitively);
//  - mappings_ never overlap, and each lies inside a reserved range.
#include "tensorpool/simulated_device.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/util.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool {

using detail::hex;

namespace {
[[noreturn]] void no_vm(const DeviceProperties& props, const char* what) {
  throw DeviceError("SimulatedDevice " + props.name + " has no virtual memory (" + what + ")");
}
}  // namespace

// --- SimulatedDevice ------------------------------------------------------------------------

SimulatedDevice::SimulatedDevice(SimulatedDeviceOptions options) : options_(std::move(options)) {
  props_.name = options_.name;
  props_.ordinal = options_.ordinal;
  props_.capacity = options_.capacity;
  props_.segment_granularity = options_.segment_granularity;
  props_.alignment = options_.alignment;
  if (props_.segment_granularity == 0 || props_.alignment == 0 || options_.vm_page_size == 0)
    throw DeviceError("SimulatedDevice: granularity, alignment and page size must be non-zero");
  // A distinctive, never-dereferenced base per device ordinal.
  next_address_ = (Address{0x7e00} + static_cast<Address>(options_.ordinal)) << 32;
  streams_[kDefaultStream];
}

SimulatedDevice::~SimulatedDevice() = default;

std::size_t SimulatedDevice::available() const {
  const std::size_t in_use = used_ + external_;
  return in_use >= props_.capacity ? 0 : props_.capacity - in_use;
}

std::size_t SimulatedDevice::free_memory() {
  std::lock_guard lock(mutex_);
  return available();
}

bool SimulatedDevice::take_fault(FaultSite site, std::size_t bytes) {
  auto& countdown = fault_countdown_[static_cast<int>(site)];
  bool fail = false;
  if (countdown != 0 && --countdown == 0) fail = true;
  if (fail_above_ != 0 && bytes > fail_above_ &&
      (site == FaultSite::segment_alloc || site == FaultSite::physical_create))
    fail = true;
  if (fail) ++counters_.faults_injected;
  return fail;
}

// The modelled cost of one call: the device's cost model's, or the default model's.
void SimulatedDevice::charge(CostedCall call, std::size_t bytes) {
  const CostModel& model = options_.cost_model ? *options_.cost_model : CostModel::standard();
  counters_.modelled_ns += model.cost(call, bytes);
}

Address SimulatedDevice::bump(std::size_t bytes, std::size_t alignment) {
  const std::size_t align = std::max(alignment, props_.segment_granularity);
  const Address base = (next_address_ + align - 1) / align * align;
  // Leave a one-granule gap so that adjacent segments are never contiguous by accident.
  next_address_ = base + bytes + props_.segment_granularity;
  return base;
}

void* SimulatedDevice::allocate_segment(std::size_t bytes, Stream) {
  std::lock_guard lock(mutex_);
  if (bytes == 0 || bytes % props_.segment_granularity != 0)
    throw DeviceError("SimulatedDevice: segment size " + std::to_string(bytes) +
                      " is not a positive multiple of the granularity");
  charge(CostedCall::segment_alloc, bytes);
  if (take_fault(FaultSite::segment_alloc, bytes) || bytes > available()) {
    ++counters_.segment_alloc_failures;
    return nullptr;
  }
  const Address a = bump(bytes, props_.alignment);
  segments_.emplace(a, bytes);
  used_ += bytes;
  ++counters_.segment_allocs;
  return reinterpret_cast<void*>(a);
}

void SimulatedDevice::free_segment(void* ptr, std::size_t bytes, Stream) {
  std::lock_guard lock(mutex_);
  const auto a = reinterpret_cast<Address>(ptr);
  auto it = segments_.find(a);
  if (it == segments_.end() || it->second != bytes)
    throw DeviceError("SimulatedDevice: free_segment(" + hex(a) + ", " + std::to_string(bytes) +
                      ") does not match a live segment");
  used_ -= bytes;
  segments_.erase(it);
  ++counters_.segment_frees;
  charge(CostedCall::segment_free, bytes);
}

// --- streams and events ---------------------------------------------------------------------

Stream SimulatedDevice::create_stream() {
  std::lock_guard lock(mutex_);
  const Stream s = next_stream_++;
  streams_[s];
  return s;
}

SimulatedDevice::StreamState& SimulatedDevice::stream_state(Stream stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end())
    throw DeviceError("SimulatedDevice: unknown stream " + std::to_string(stream));
  return it->second;
}

SimulatedDevice::EventState& SimulatedDevice::event_state(DeviceEvent event, const char* what) {
  auto it = events_.find(event);
  if (it == events_.end())
    throw DeviceError(std::string("SimulatedDevice: ") + what + " on unknown event " +
                      std::to_string(event));
  return it->second;
}

bool SimulatedDevice::event_done(const EventState& e) const {
  if (e.seq == 0) return true;
  return streams_.at(e.stream).completed >= e.seq;
}

void SimulatedDevice::complete_to(Stream stream, std::uint64_t seq) {
  StreamState& s = stream_state(stream);
  // To its end, a stream's work includes the waits enqueued after its last record, as
  // cudaStreamSynchronize waits for them too.
  const bool to_end = seq >= s.submitted;
  if (s.completed >= seq && !(to_end && !s.waits.empty())) return;
  // Work after a wait point depends on the awaited stream: complete that first. The waits due are
  // taken out before, so that streams waiting for each other at their ends do not recurse.
  std::vector<StreamState::Wait> due;
  std::erase_if(s.waits, [&](const StreamState::Wait& w) {
    if (w.at >= seq && !to_end) return false;
    due.push_back(w);
    return true;
  });
  for (const auto& w : due) complete_to(w.stream, w.seq);
  s.completed = std::max(s.completed, std::min(seq, s.submitted));
}

DeviceEvent SimulatedDevice::create_event() {
  std::lock_guard lock(mutex_);
  if (take_fault(FaultSite::event_create, 0))
    throw DeviceError("SimulatedDevice: event creation failed (injected fault)");
  const DeviceEvent e = next_event_++;
  events_[e];
  ++counters_.events_created;
  return e;
}

void SimulatedDevice::destroy_event(DeviceEvent event) {
  std::lock_guard lock(mutex_);
  event_state(event, "destroy_event");
  events_.erase(event);
  ++counters_.events_destroyed;
}

void SimulatedDevice::record_event(DeviceEvent event, Stream stream) {
  std::lock_guard lock(mutex_);
  EventState& e = event_state(event, "record_event");
  StreamState& s = stream_state(stream);
  e.stream = stream;
  e.seq = ++s.submitted;
  ++counters_.events_recorded;
  if (options_.event_mode == EventMode::immediate) complete_to(stream, e.seq);
}

bool SimulatedDevice::query_event(DeviceEvent event) {
  std::lock_guard lock(mutex_);
  ++counters_.event_queries;
  if (take_fault(FaultSite::event_query, 0))
    throw DeviceError("SimulatedDevice: event query failed (injected fault)");
  return event_done(event_state(event, "query_event"));
}

void SimulatedDevice::synchronize_event(DeviceEvent event) {
  std::lock_guard lock(mutex_);
  ++counters_.event_syncs;
  const EventState e = event_state(event, "synchronize_event");
  if (e.seq != 0) complete_to(e.stream, e.seq);
}

void SimulatedDevice::stream_wait_event(Stream stream, DeviceEvent event) {
  std::lock_guard lock(mutex_);
  ++counters_.stream_waits;
  const EventState e = event_state(event, "stream_wait_event");
  StreamState& s = stream_state(stream);
  if (e.seq == 0 || event_done(e) || e.stream == stream) return;
  // Nothing on `stream` submitted after this point completes before the event's work.
  s.waits.push_back({s.submitted, e.stream, e.seq});
}

void SimulatedDevice::synchronize_stream(Stream stream) {
  std::lock_guard lock(mutex_);
  ++counters_.stream_syncs;
  complete_to(stream, stream_state(stream).submitted);
}

// Done when every event recorded on the stream has completed: the stream's work is what events
// were recorded after (user work included).
bool SimulatedDevice::query_stream(Stream stream) {
  std::lock_guard lock(mutex_);
  ++counters_.stream_queries;
  if (take_fault(FaultSite::stream_query, 0))
    throw DeviceError("SimulatedDevice: stream query failed (injected fault)");
  const StreamState& s = stream_state(stream);
  // Its waits are work too: a stream that waits for an event not yet done is not done.
  return s.completed >= s.submitted && std::all_of(s.waits.begin(), s.waits.end(), [&](const StreamState::Wait& w) {
           return streams_.at(w.stream).completed >= w.seq;
         });
}

void SimulatedDevice::synchronize_device() {
  std::lock_guard lock(mutex_);
  ++counters_.device_syncs;
  for (auto& [id, s] : streams_) complete_to(id, s.submitted);
}

void SimulatedDevice::complete_event(DeviceEvent event) {
  std::lock_guard lock(mutex_);
  const EventState e = event_state(event, "complete_event");
  if (e.seq != 0) complete_to(e.stream, e.seq);
}

void SimulatedDevice::complete_stream(Stream stream) {
  std::lock_guard lock(mutex_);
  complete_to(stream, stream_state(stream).submitted);
}

void SimulatedDevice::complete_all() {
  std::lock_guard lock(mutex_);
  for (auto& [id, s] : streams_) complete_to(id, s.submitted);
}

std::size_t SimulatedDevice::incomplete_events() const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (const auto& [id, e] : events_) n += event_done(e) ? 0 : 1;
  return n;
}

void SimulatedDevice::set_event_mode(EventMode mode) {
  std::lock_guard lock(mutex_);
  options_.event_mode = mode;
  if (mode == EventMode::immediate)
    for (auto& [id, s] : streams_) complete_to(id, s.submitted);
}

// --- virtual memory -------------------------------------------------------------------------

VirtualMemory* SimulatedDevice::virtual_memory() noexcept {
  return options_.supports_virtual_memory ? this : nullptr;
}

Address SimulatedDevice::reserve_address_range(std::size_t bytes, std::size_t alignment) {
  std::lock_guard lock(mutex_);
  if (!options_.supports_virtual_memory) no_vm(props_, "reserve");
  if (bytes == 0 || bytes % options_.vm_page_size != 0)
    throw DeviceError("SimulatedDevice: address range size " + std::to_string(bytes) +
                      " is not a positive multiple of the page size");
  const Address a = bump(bytes, std::max(alignment, options_.vm_page_size));
  ranges_.emplace(a, bytes);
  ++counters_.address_reserves;
  return a;
}

void SimulatedDevice::release_address_range(Address base, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = ranges_.find(base);
  if (it == ranges_.end() || it->second != bytes)
    throw DeviceError("SimulatedDevice: release_address_range(" + hex(base) + ") does not match a reservation");
  auto m = mappings_.lower_bound(base);
  if (m != mappings_.end() && m->first < base + bytes)
    throw DeviceError("SimulatedDevice: releasing address range " + hex(base) + " that still has mappings");
  ranges_.erase(it);
  ++counters_.address_releases;
}

PhysicalHandle SimulatedDevice::create_physical(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (!options_.supports_virtual_memory) no_vm(props_, "create");
  if (bytes == 0 || bytes % options_.vm_page_size != 0)
    throw DeviceError("SimulatedDevice: physical size " + std::to_string(bytes) +
                      " is not a positive multiple of the page size");
  charge(CostedCall::physical_create, bytes);
  if (take_fault(FaultSite::physical_create, bytes) || bytes > available()) {
    ++counters_.segment_alloc_failures;
    return 0;
  }
  const PhysicalHandle h = next_physical_++;
  physical_.emplace(h, bytes);
  used_ += bytes;
  ++counters_.physical_creates;
  return h;
}

void SimulatedDevice::release_physical(PhysicalHandle handle) {
  std::lock_guard lock(mutex_);
  auto it = physical_.find(handle);
  if (it == physical_.end())
    throw DeviceError("SimulatedDevice: release_physical of unknown handle " + std::to_string(handle));
  if (auto m = mapped_handles_.find(handle); m != mapped_handles_.end())
    throw DeviceError("SimulatedDevice: releasing physical handle " + std::to_string(handle) +
                      " that is still mapped at " + hex(m->second));
  used_ -= it->second;
  charge(CostedCall::physical_release, it->second);
  physical_.erase(it);
  contents_.erase(handle);
  ++counters_.physical_releases;
}

void SimulatedDevice::map(Address addr, std::size_t bytes, PhysicalHandle handle) {
  std::lock_guard lock(mutex_);
  auto ph = physical_.find(handle);
  if (ph == physical_.end() || ph->second != bytes)
    throw DeviceError("SimulatedDevice: map of " + std::to_string(bytes) +
                      " bytes with unknown or differently sized handle " + std::to_string(handle));
  // Stricter than CUDA, to catch a caller that maps a handle twice by mistake: a whole handle is
  // mapped at one place at a time (map_part() says otherwise on purpose).
  if (auto m = mapped_handles_.find(handle); m != mapped_handles_.end())
    throw DeviceError("SimulatedDevice: physical handle " + std::to_string(handle) +
                      " is already mapped at " + hex(m->second));
  add_mapping(addr, bytes, handle, 0);
}

void SimulatedDevice::map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) {
  std::lock_guard lock(mutex_);
  auto ph = physical_.find(handle);
  if (ph == physical_.end())
    throw DeviceError("SimulatedDevice: map_part with unknown handle " + std::to_string(handle));
  const std::size_t page = options_.vm_page_size;
  if (bytes == 0 || bytes % page != 0 || offset % page != 0 || addr % page != 0 || offset > ph->second ||
      bytes > ph->second - offset)
    throw DeviceError("SimulatedDevice: map_part of " + std::to_string(bytes) + " bytes from offset " +
                      std::to_string(offset) + " of handle " + std::to_string(handle) + " (" +
                      std::to_string(ph->second) + " bytes) at " + hex(addr) +
                      ": expected whole pages of " + std::to_string(page) + " bytes within the handle");
  add_mapping(addr, bytes, handle, offset);
}

void SimulatedDevice::add_mapping(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) {
  auto r = ranges_.upper_bound(addr);
  if (r == ranges_.begin() || addr + bytes > std::prev(r)->first + std::prev(r)->second)
    throw DeviceError("SimulatedDevice: map at " + hex(addr) + " is outside every reserved range");
  auto next = mappings_.lower_bound(addr);
  const bool overlaps_next = next != mappings_.end() && next->first < addr + bytes;
  const bool overlaps_prev =
      next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > addr;
  if (overlaps_next || overlaps_prev)
    throw DeviceError("SimulatedDevice: map at " + hex(addr) + " overlaps an existing mapping");
  charge(CostedCall::map, bytes);
  if (take_fault(FaultSite::map, bytes))
    throw DeviceError("SimulatedDevice: map failed (injected fault)");
  mappings_.emplace(addr, Mapping{bytes, handle, offset});
  mapped_handles_.emplace(handle, addr);
  mapped_ += bytes;
  ++counters_.maps;
}

void SimulatedDevice::unmap(Address addr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = mappings_.find(addr);
  if (it == mappings_.end() || it->second.bytes != bytes)
    throw DeviceError("SimulatedDevice: unmap(" + hex(addr) + ", " + std::to_string(bytes) +
                      ") does not match a mapping");
  auto [first, last] = mapped_handles_.equal_range(it->second.handle);
  for (auto m = first; m != last; ++m)
    if (m->second == addr) {
      mapped_handles_.erase(m);
      break;
    }
  mappings_.erase(it);
  mapped_ -= bytes;
  ++counters_.unmaps;
  charge(CostedCall::unmap, bytes);
}

// --- contents (back_memory) -----------------------------------------------------------------

template <class F>
void SimulatedDevice::for_each_mapped(Address addr, std::size_t bytes, F&& f) {
  if (!options_.back_memory)
    throw DeviceError("SimulatedDevice: " + props_.name + " holds no contents (SimulatedDeviceOptions::back_memory)");
  for (Address at = addr; at < addr + bytes;) {
    auto m = mappings_.upper_bound(at);
    if (m == mappings_.begin() || (--m)->first + m->second.bytes <= at)
      throw DeviceError("SimulatedDevice: copy of " + hex(at) + ", which is not mapped");
    std::vector<unsigned char>& bytes_of = contents_[m->second.handle];
    if (bytes_of.empty()) bytes_of.assign(physical_.at(m->second.handle), 0);
    const std::size_t into_mapping = at - m->first;
    const std::size_t n = std::min(addr + bytes - at, m->second.bytes - into_mapping);
    f(bytes_of, m->second.offset + into_mapping, n, at - addr);
    at += n;
  }
}

void SimulatedDevice::copy_to_host(void* dst, Address src, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  auto* out = static_cast<unsigned char*>(dst);
  for_each_mapped(src, bytes, [&](std::vector<unsigned char>& page, std::size_t offset, std::size_t n, std::size_t done) {
    std::memcpy(out + done, page.data() + offset, n);
  });
}

void SimulatedDevice::copy_to_device(Address dst, const void* src, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const auto* in = static_cast<const unsigned char*>(src);
  for_each_mapped(dst, bytes, [&](std::vector<unsigned char>& page, std::size_t offset, std::size_t n, std::size_t done) {
    std::memcpy(page.data() + offset, in + done, n);
  });
}

// --- controls and inspection ----------------------------------------------------------------

void SimulatedDevice::set_external_usage(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  external_ = bytes;
}

void SimulatedDevice::set_capturing(Stream stream, bool capturing) {
  std::lock_guard lock(mutex_);
  if (capturing) {
    capturing_.insert(stream);
  } else {
    capturing_.erase(stream);
  }
}

bool SimulatedDevice::is_capturing(Stream stream) {
  std::lock_guard lock(mutex_);
  return capturing_.contains(stream);
}

void SimulatedDevice::fail_nth(FaultSite site, std::uint64_t n) {
  std::lock_guard lock(mutex_);
  fault_countdown_[static_cast<int>(site)] = n;
}

void SimulatedDevice::fail_allocations_above(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  fail_above_ = bytes;
}

DeviceCounters SimulatedDevice::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

std::size_t SimulatedDevice::used_bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

std::size_t SimulatedDevice::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return mapped_;
}

}  // namespace tensorpool
