// oom_ladder.cpp: what an allocation goes through when its stream's cache cannot serve it.
//
// The ladder:
//   1. collect frees whose stream events have completed, search again; a request that all the
//      ladder could yield would not serve then fails at once, keeping the cache (out_of_reach(),
//      where what a release gives back is free at once: vmm);
//   2. grow: room from the segment source (within the memory limit); but first, where that
//      growth would synchronize a stream by choice (vmm: remapping idle pages), a block of this
//      stream whose free waits for other streams, after waits on the device (cross_stream_reuse;
//      reuse_pending(), stream_events.cpp);
//   3. (cross_stream_reuse) a free block cached for another stream, after an event wait;
//   4. free-memory callbacks (lock released), then search and grow again;
//   5. (cross_stream_reuse) a block of this stream whose free waits for other streams, after waits
//      on the device; then wait for every pending free, search again; give every cached byte the
//      source holds back to the device, grow again;
//   6. OutOfMemoryError, after telling the OOM observers (lock released).
#include <algorithm>
#include <map>

#include "core/allocator_impl.hpp"
#include "core/logging.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

using detail::Block;
using detail::StreamState;

Block* Allocator::Impl::allocate_slow(StreamState& ss, Pool pool, std::size_t size,
                                      std::size_t bytes, Lock& lock) {
  if (bytes > kMaxAllocationSize || size > props.capacity) throw_oom(ss.stream, bytes, size, lock);
  // While a stream is captured, the ladder neither queries events nor synchronizes (CUDA refuses
  // both during a capture); it may still grow for a stream that is not captured.
  const bool capturing = capture_underway();
  if (pending_total_ != 0 && !capturing) {
    process_events();
    if (Block* b = find_cached(ss, pool, size)) return b;
  }
  if (!capturing && out_of_reach(ss.stream, size)) throw_oom(ss.stream, bytes, size, lock);
  if (Block* b = waited_for_instead_of_sync(ss, pool, size)) return b;
  if (Block* b = source_->grow(ss, pool, size)) return b;
  if (config.cross_stream_reuse)
    if (Block* b = steal_from_other_stream(ss, pool, size)) return b;
  counters.count(&Stats::retries);
  if (!hooks.free_memory_callbacks().empty() && run_free_memory_callbacks(size, lock))
    if (Block* b = find_or_grow(ss, pool, size)) return b;
  if (capturing) throw_oom(ss.stream, bytes, size, lock);
  if (pending_total_ != 0) {
    if (config.cross_stream_reuse)
      if (Block* b = reuse_pending(ss, pool, size)) return b;
    synchronize_pending();
    if (Block* b = find_cached(ss, pool, size)) return b;
  }
  if (source_->release(detail::ReleaseGoal::everything) != 0)
    if (Block* b = source_->grow(ss, pool, size)) return b;
  throw_oom(ss.stream, bytes, size, lock);
}

// Whether no step of the ladder could serve `size` bytes: they exceed what the device has free
// (within the memory limit) and every reserved byte that no live block holds (free, held,
// pending and cached: all that a reclaim, a wait and a release could yield) together. Those steps
// unmap, synchronize and release, and the next request maps and creates again, so a program that
// goes on after the error (a replay below its fit, a server that drops a request) would move
// pages and synchronize at every refused request (tensorpool-vmm, where the pytorch model does
// not: docs/benchmarks.md, "Requests beyond reach refused at once"). Only where a release frees
// memory at once (vmm): a stream-ordered pool may serve a new segment from memory whose free a
// stream has not reached yet, which the device's free memory does not count. Never with
// free-memory callbacks, which may free live blocks. The device is asked only for a request
// that needs memory created, and only once the stream is known not to be captured into a graph
// (UsageError, as the growth would raise: no call but that question during a capture).
bool Allocator::Impl::out_of_reach(Stream stream, std::size_t size) const {
  if (source_->releases() != detail::Release::at_once || !hooks.free_memory_callbacks().empty()) return false;
  const std::size_t reserved = counters.reserved();
  const std::size_t live = allocated_with_pages();
  const std::size_t yield = reserved > live ? reserved - live : 0;
  if (size <= yield) return false;
  refuse_if_captured(stream);
  return size - yield > room_left();
}

// Step 2's first try: a growth that would synchronize a stream to move idle memory (a host wait
// for everything the stream queued) is not made if a block of this stream whose free waits for
// other streams' events serves the request once the stream waits for those events on the device
// (no host wait). A device behind the host has rarely finished those streams' work by the next
// request: an FSDP/ZeRO-3 all-gather buffer, used on a communication stream, is freed while the
// next layer's gather is queued, and the next buffer of its size finds it pending
// (docs/benchmarks.md, "Pending blocks reused after a wait on the device"). A growth that makes
// memory without a synchronization is preferred: the wait can hold the stream behind the other
// streams' later work, which PyTorch's allocator (growing instead) never does.
Block* Allocator::Impl::waited_for_instead_of_sync(StreamState& ss, Pool pool, std::size_t size) {
  if (pending_total_ == 0 || !config.cross_stream_reuse || capture_underway()) return nullptr;
  if (!source_->growth_synchronizes(ss, pool, size)) return nullptr;
  return reuse_pending(ss, pool, size);
}

// Bytes of live blocks that have pages: allocated, but for asleep blocks (sleep(): no pages).
std::size_t Allocator::Impl::allocated_with_pages() const {
  const auto allocated = static_cast<std::size_t>(shards.total_current(Metric::allocated_bytes));
  const std::size_t asleep = source_->asleep().asleep_allocated;
  return allocated > asleep ? allocated - asleep : 0;
}

Block* Allocator::Impl::find_or_grow(StreamState& ss, Pool pool, std::size_t size) {
  if (pending_total_ != 0 && !capture_underway()) process_events();
  if (Block* b = find_cached(ss, pool, size)) return b;
  return source_->grow(ss, pool, size);
}

// A free block cached for another stream. The requesting stream waits (on the device, not the
// host) for the owner stream's work so far; the block stays the owner's and records the
// requesting stream as a user, so its eventual free waits for that stream too.
Block* Allocator::Impl::steal_from_other_stream(StreamState& ss, Pool pool, std::size_t size) {
  for (auto& [stream, other] : streams) {
    if (other.get() == &ss) continue;
    Block* b = find_cached(*other, pool, size);
    if (b == nullptr) continue;
    DeviceEvent e = 0;
    try {
      e = acquire_event();
      device->record_event(e, other->stream);
      device->stream_wait_event(ss.stream, e);
    } catch (const DeviceError& err) {  // the ladder goes on without cross-stream reuse
      if (e != 0) release_event(e);
      detail::log().warn("cross-stream reuse skipped: {}", err.what());
      return nullptr;
    }
    release_event(e);  // a wait captures the event's state when it is enqueued
    counters.count(&Stats::events_recorded);
    counters.count(&Stats::stream_waits);
    return b;
  }
  return nullptr;
}

bool Allocator::Impl::run_free_memory_callbacks(std::size_t size, Lock& lock) {
  const auto callbacks = hooks.free_memory_callbacks();  // a copy: callbacks may add or remove hooks
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
  for (const auto& [stream, ss] : streams)
    for (const auto& index : ss->index)
      if (const Block* b = index.largest()) largest = std::max(largest, b->size);
  return largest;
}

// Free bytes in each stream's indexes (mapped free blocks only: unmapped address space is not
// cached memory; a stream's tagged states count with it), in ascending stream order.
std::vector<StreamCachedBytes> Allocator::Impl::cached_per_stream() const {
  std::map<Stream, std::size_t> per_stream;
  for (const auto& [key, ss] : streams) {
    std::size_t bytes = 0;
    for (const auto& index : ss->index) bytes += index.bytes();
    if (bytes != 0) per_stream[ss->stream] += bytes;
  }
  std::vector<StreamCachedBytes> out;
  for (const auto& [stream, bytes] : per_stream) out.push_back({stream, bytes});
  return out;
}

void Allocator::Impl::throw_oom(Stream stream, std::size_t bytes, std::size_t size, Lock& lock) {
  OutOfMemoryInfo info;
  info.requested = bytes;
  info.rounded = size;
  info.stream = stream;
  info.device = props.ordinal;
  info.capacity = props.capacity;
  info.device_free = device->free_memory();
  info.reserved = counters.reserved();
  info.allocated = static_cast<std::size_t>(shards.total_current(Metric::allocated_bytes));
  // Asleep blocks (sleep()) are allocated without pages: only the awake ones use reserved memory.
  info.reserved_unallocated = info.reserved - allocated_with_pages();
  info.largest_free_block = largest_free_block();
  info.memory_limit = limit;
  info.cached_per_stream = cached_per_stream();
  info.page_size = source_->page_size();
  counters.count(&Stats::ooms);
  if (hooks.observed()) hooks.notify(EventType::oom, 0, bytes, size, stream);
  const OutOfMemoryError error(info);
  detail::log().info("{}", error.what());
  const auto observers = hooks.oom_observers();  // a copy, called without the lock
  lock.unlock();
  for (const auto& [id, observer] : observers) observer(info);
  throw error;
}

}  // namespace tensorpool
