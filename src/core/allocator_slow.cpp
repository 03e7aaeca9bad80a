// allocator_slow.cpp: everything that talks to the device: new segments, stream events, the
// out-of-memory ladder, empty_cache, and construction/destruction.
//
// The ladder for a request the stream's cache cannot serve:
//   1. collect frees whose stream events have completed, search again;
//   2. a new segment from the device (within the memory limit);
//   3. (cross_stream_reuse) a free block cached for another stream, after an event wait;
//   4. free-memory callbacks (lock released), then search and grow again;
//   5. wait for every pending free, search again; return every free segment to the device,
//      grow again;
//   6. OutOfMemoryError.
#include <algorithm>
#include <string>

#include "core/allocator_impl.hpp"
#include "core/util.hpp"
#include "core/logging.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

using detail::hex;
using detail::round_up;

using detail::Block;
using detail::Segment;
using detail::StreamState;

Allocator::Impl::Impl(std::shared_ptr<DeviceBackend> device, Config config)
    : device_(std::move(device)), config_(std::move(config)) {
  if (!device_) throw UsageError("tensorpool: Allocator needs a device backend (got nullptr)");
  config_.validate();
  props_ = device_->properties();
  if (vmm()) {
    vm_ = device_->virtual_memory();
    if (vm_ == nullptr)
      throw ConfigError("tensorpool config: mode:vmm needs a device with virtual memory; " + props_.name +
                        " has none");
    page_ = vm_->page_size();
    config_.max_split_size = 0;  // every block of a heap can be split
  }
  limit_ = config_.effective_limit(props_.capacity);
  detail::log().debug("allocator on {} ({}), config {}", props_.name, format_bytes(props_.capacity),
                      config_.to_string());
}

Allocator::Impl::~Impl() {
  if (!device_->alive()) return;  // process teardown: the driver reclaims everything
  try {
    synchronize_pending();
    if (live_.size() != 0)
      detail::log().info("allocator on {} destroyed with {} blocks still allocated", props_.name,
                         live_.size());
    if (vmm()) {
      device_->synchronize_device();  // no kernel may still touch pages about to be unmapped
      destroy_heaps();
    }
    for (auto& [addr, seg] : segments_) {
      if (!seg->heap) device_->free_segment(reinterpret_cast<void*>(seg->addr), seg->size, seg->owner->stream);
      for (Block* b = seg->first; b != nullptr;) {
        Block* next = b->next;
        block_pool_.release(b);
        b = next;
      }
    }
    segments_.clear();
    for (DeviceEvent e : event_pool_) device_->destroy_event(e);
  } catch (const std::exception& e) {
    detail::log().error("allocator teardown on {}: {}", props_.name, e.what());
  }
}

// --- the ladder -----------------------------------------------------------------------------

Block* Allocator::Impl::allocate_slow(StreamState& ss, Pool pool, std::size_t size,
                                      std::size_t bytes, Lock& lock) {
  if (bytes > kMaxAllocationSize || size > props_.capacity) throw_oom(ss.stream, bytes, size, lock);
  if (pending_total_ != 0) {
    process_events();
    if (Block* b = find_cached(ss, pool, size)) return b;
  }
  if (Block* b = new_segment(ss, pool, size)) return b;
  if (config_.cross_stream_reuse)
    if (Block* b = steal_from_other_stream(ss, pool, size)) return b;
  ++counters_.retries;
  if (!free_callbacks_.empty() && run_free_memory_callbacks(size, lock))
    if (Block* b = find_or_grow(ss, pool, size)) return b;
  if (pending_total_ != 0) {
    synchronize_pending();
    if (Block* b = find_cached(ss, pool, size)) return b;
  }
  if (release_free_segments() != 0)
    if (Block* b = new_segment(ss, pool, size)) return b;
  throw_oom(ss.stream, bytes, size, lock);
}

Block* Allocator::Impl::find_or_grow(StreamState& ss, Pool pool, std::size_t size) {
  if (pending_total_ != 0) process_events();
  if (Block* b = find_cached(ss, pool, size)) return b;
  return new_segment(ss, pool, size);
}

std::size_t Allocator::Impl::segment_size_for(Pool pool, std::size_t size,
                                             bool oversize) const noexcept {
  const std::size_t g = props_.segment_granularity;
  if (pool == Pool::small) return round_up(config_.small_segment_size, g);
  if (!oversize && size < config_.large_segment_size / 2)
    return round_up(config_.large_segment_size, g);
  return round_up(size, g);
}

// A new segment for a request of `size`; its one free block is in the index. nullptr when the
// device or the memory limit says no. Falls back to a segment of exactly the request's size
// when the policy's larger segment does not fit.
Block* Allocator::Impl::new_segment(StreamState& ss, Pool pool, std::size_t size) {
  if (vmm()) return grow_heap(ss, pool, size);
  const bool oversize = pool == Pool::large && is_oversize_request(size);
  const std::size_t preferred = segment_size_for(pool, size, oversize);
  if (Block* b = try_segment(ss, pool, oversize, preferred)) return b;
  const std::size_t exact = round_up(size, props_.segment_granularity);
  if (exact < preferred) return try_segment(ss, pool, oversize, exact);
  return nullptr;
}

Block* Allocator::Impl::try_segment(StreamState& ss, Pool pool, bool oversize, std::size_t bytes) {
  const auto reserved = static_cast<std::size_t>(total_stats_[Metric::reserved_bytes].current);
  if (limit_ != 0 && reserved + bytes > limit_) return nullptr;
  void* ptr = device_->allocate_segment(bytes, ss.stream);  // DeviceError propagates, state intact
  if (ptr == nullptr) {
    ++counters_.upstream_alloc_failures;
    return nullptr;
  }
  auto seg = std::make_unique<Segment>();
  seg->addr = reinterpret_cast<Address>(ptr);
  seg->size = bytes;
  seg->owner = &ss;
  seg->pool = pool;
  seg->oversize = oversize;
  const int kind = pool == Pool::small ? detail::kSmallIndex
                   : oversize          ? detail::kOversizeIndex
                                       : detail::kLargeIndex;
  seg->index = &ss.index[kind];
  Block* b = block_pool_.acquire();
  b->addr = seg->addr;
  b->size = bytes;
  b->segment = seg.get();
  seg->first = b;
  seg->index->insert(b);
  segments_.emplace(seg->addr, std::move(seg));
  ++counters_.upstream_allocs;
  add_stat(Metric::reserved_bytes, pool, static_cast<std::int64_t>(bytes));
  add_stat(Metric::segments, pool, 1);
  if (has_observers_) notify(EventType::segment_alloc, b->addr, 0, bytes, ss.stream);
  return b;
}

// A free block cached for another stream. The requesting stream waits (on the device, not the
// host) for the owner stream's work so far; the block stays the owner's and records the
// requesting stream as a user, so its eventual free waits for that stream too.
Block* Allocator::Impl::steal_from_other_stream(StreamState& ss, Pool pool, std::size_t size) {
  for (auto& [stream, other] : streams_) {
    if (other.get() == &ss) continue;
    Block* b = find_cached(*other, pool, size);
    if (b == nullptr) continue;
    DeviceEvent e = 0;
    try {
      e = acquire_event();
      device_->record_event(e, other->stream);
      device_->stream_wait_event(ss.stream, e);
    } catch (const DeviceError& err) {  // the ladder goes on without cross-stream reuse
      if (e != 0) release_event(e);
      detail::log().warn("cross-stream reuse skipped: {}", err.what());
      return nullptr;
    }
    release_event(e);  // a wait captures the event's state when it is enqueued
    ++counters_.events_recorded;
    ++counters_.stream_waits;
    return b;
  }
  return nullptr;
}

void Allocator::Impl::add_use(Block* b, Stream stream) {
  if (stream == b->segment->owner->stream) return;
  if (b->uses == nullptr) b->uses = new std::vector<Stream>();
  if (std::find(b->uses->begin(), b->uses->end(), stream) == b->uses->end())
    b->uses->push_back(stream);
}

bool Allocator::Impl::run_free_memory_callbacks(std::size_t size, Lock& lock) {
  const auto callbacks = free_callbacks_;  // copies: callbacks may add or remove hooks
  lock.unlock();
  bool freed = false;
  try {
    for (const auto& [id, cb] : callbacks) freed = cb(size) || freed;
  } catch (...) {
    lock.lock();
    throw;
  }
  lock.lock();
  return freed;
}

std::size_t Allocator::Impl::largest_free_block() const noexcept {
  std::size_t largest = 0;
  for (const auto& [stream, ss] : streams_)
    for (const auto& index : ss->index)
      if (const Block* b = index.largest()) largest = std::max(largest, b->size);
  return largest;
}

void Allocator::Impl::throw_oom(Stream stream, std::size_t bytes, std::size_t size, Lock& lock) {
  OutOfMemoryInfo info;
  info.requested = bytes;
  info.rounded = size;
  info.stream = stream;
  info.device = props_.ordinal;
  info.capacity = props_.capacity;
  info.device_free = device_->free_memory();
  info.reserved = static_cast<std::size_t>(total_stats_[Metric::reserved_bytes].current);
  info.allocated = static_cast<std::size_t>(total_stats_[Metric::allocated_bytes].current);
  info.reserved_unallocated = info.reserved - info.allocated;
  info.largest_free_block = largest_free_block();
  info.memory_limit = limit_;
  ++counters_.ooms;
  if (has_observers_) notify(EventType::oom, 0, bytes, size, stream);
  const OutOfMemoryError error(info);
  detail::log().info("{}", error.what());
  const auto observers = oom_observers_;
  lock.unlock();
  for (const auto& [id, observer] : observers) observer(info);
  throw error;
}

// --- stream events --------------------------------------------------------------------------

DeviceEvent Allocator::Impl::acquire_event() {
  if (!event_pool_.empty()) {
    const DeviceEvent e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  return device_->create_event();
}

// b was freed by its user but other streams used it: record an event on each; the block is
// reusable once all have completed. If an event cannot be made, fall back to synchronizing that
// stream, so a device fault never loses a block or throws from a free.
void Allocator::Impl::defer_free(Block* b) {
  b->state = BlockState::pending_free;
  for (const Stream s : *b->uses) {
    try {
      const DeviceEvent e = acquire_event();
      try {
        device_->record_event(e, s);
      } catch (...) {
        release_event(e);
        throw;
      }
      ++counters_.events_recorded;
      state_for(s).pending.push_back({e, b});
      ++b->pending_events;
      ++pending_total_;
    } catch (const DeviceError& err) {
      detail::log().warn("event for a cross-stream free failed ({}); synchronizing stream {}",
                         err.what(), s);
      device_->synchronize_stream(s);
      ++counters_.syncs;
    }
  }
  delete b->uses;
  b->uses = nullptr;
  if (b->pending_events == 0) release_block(b);
}

void Allocator::Impl::process_events() {
  for (auto& [stream, ss] : streams_) {
    auto& q = ss->pending;
    while (!q.empty() && device_->query_event(q.front().event)) {
      const detail::PendingFree pe = q.front();
      q.pop_front();
      release_event(pe.event);
      --pending_total_;
      if (--pe.block->pending_events == 0) release_block(pe.block);
    }
  }
}

void Allocator::Impl::synchronize_pending() {
  for (auto& [stream, ss] : streams_) {
    auto& q = ss->pending;
    while (!q.empty()) {
      const detail::PendingFree pe = q.front();
      device_->synchronize_event(pe.event);
      ++counters_.syncs;
      q.pop_front();
      release_event(pe.event);
      --pending_total_;
      if (--pe.block->pending_events == 0) release_block(pe.block);
    }
  }
}

// --- returning memory -----------------------------------------------------------------------

std::size_t Allocator::Impl::release_free_segments() {
  if (vmm()) {
    std::size_t keep = 0;
    reclaim_free_chunks(Pool::small, keep);
    reclaim_free_chunks(Pool::large, keep);
    return release_cached_chunks();
  }
  std::size_t released = 0;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment* seg = (it++)->second.get();  // advance first: free_segment erases
    if (seg->is_free()) {
      released += seg->size;
      free_segment(seg);
    }
  }
  return released;
}

void Allocator::Impl::free_segment(Segment* seg) {
  device_->free_segment(reinterpret_cast<void*>(seg->addr), seg->size, seg->owner->stream);
  Block* b = seg->first;
  seg->index->remove(b);
  block_pool_.release(b);
  ++counters_.upstream_frees;
  add_stat(Metric::reserved_bytes, seg->pool, -static_cast<std::int64_t>(seg->size));
  add_stat(Metric::segments, seg->pool, -1);
  if (has_observers_) notify(EventType::segment_free, seg->addr, 0, seg->size, seg->owner->stream);
  segments_.erase(seg->addr);
}

void Allocator::Impl::empty_cache() {
  Lock lock(mutex_);
  synchronize_pending();
  std::size_t released = 0;
  if (vmm()) {  // keeps up to vmm_reserve bytes of free pages mapped
    std::size_t keep = config_.vmm_reserve;
    reclaim_free_chunks(Pool::small, keep);
    reclaim_free_chunks(Pool::large, keep);
    released = release_cached_chunks();
  } else {
    released = release_free_segments();
  }
  if (has_observers_) notify(EventType::empty_cache, 0, 0, released, kDefaultStream);
  debug_check();
}

void Allocator::Impl::set_memory_limit(std::size_t bytes) {
  Lock lock(mutex_);
  limit_ = bytes;
}

std::size_t Allocator::Impl::memory_limit() const {
  Lock lock(mutex_);
  return limit_;
}

// --- hooks ----------------------------------------------------------------------------------

HookId Allocator::Impl::add_observer(std::shared_ptr<Observer> observer) {
  if (!observer) throw UsageError("tensorpool: add_observer(nullptr)");
  Lock lock(mutex_);
  observers_.emplace_back(next_hook_, std::move(observer));
  has_observers_ = true;
  return next_hook_++;
}

HookId Allocator::Impl::add_oom_observer(OomObserver observer) {
  if (!observer) throw UsageError("tensorpool: add_oom_observer with an empty function");
  Lock lock(mutex_);
  oom_observers_.emplace_back(next_hook_, std::move(observer));
  return next_hook_++;
}

HookId Allocator::Impl::add_free_memory_callback(FreeMemoryCallback callback) {
  if (!callback) throw UsageError("tensorpool: add_free_memory_callback with an empty function");
  Lock lock(mutex_);
  free_callbacks_.emplace_back(next_hook_, std::move(callback));
  return next_hook_++;
}

bool Allocator::Impl::remove_hook(HookId id) {
  Lock lock(mutex_);
  auto drop = [id](auto& list) {
    return std::erase_if(list, [id](const auto& entry) { return entry.first == id; }) != 0;
  };
  const bool removed = drop(observers_) || drop(oom_observers_) || drop(free_callbacks_);
  has_observers_ = !observers_.empty();
  return removed;
}

// --- misuse ---------------------------------------------------------------------------------

void Allocator::Impl::throw_bad_pointer(Address addr, const char* operation) const {
  const std::string what = std::string("tensorpool: ") + operation + " of " + hex(addr) + ": ";
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin() || addr >= std::prev(it)->second->end())
    throw UsageError(what + "pointer was not allocated by this allocator (device " + props_.name +
                     ")");
  const Segment& seg = *std::prev(it)->second;
  const Block* b = seg.first;
  while (b->addr + b->size <= addr) b = b->next;
  if (b->addr != addr)
    throw UsageError(what + "pointer lies inside the block at " + hex(b->addr) + " (offset " +
                     std::to_string(addr - b->addr) + "), not at its start");
  if (b->state == BlockState::pending_free)
    throw UsageError(what + "double free: the block was already freed and waits for stream events");
  throw UsageError(what + "double free: the block (" + format_bytes(b->size) + ") is already free");
}

}  // namespace tensorpool
