// allocator.cpp: the public API (forwarded to Impl) and the fast path. A cached allocate is:
// round, lock, find in the stream's free index (O(1)), maybe split, insert into the pointer map,
// count (in vmm mode, a heap that follows a planned layout names the block instead of the index,
// and each heap records its blocks in its EpochLog). A deallocate is: lock, erase from the pointer
// map, coalesce with free neighbours, insert into the free index, count. Anything that talks to
// the device is out of line: the OOM ladder (oom_ladder.cpp), stream events
// (stream_events.cpp), the segment source.
#include "core/allocator_impl.hpp"
#include "core/epoch_log.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

using detail::Block;
using detail::Segment;
using detail::StreamState;

// --- public API: forwards to Impl -----------------------------------------------------------

Allocator::Allocator(std::shared_ptr<DeviceBackend> device)
    : Allocator(std::move(device), Config::from_env()) {}
Allocator::Allocator(std::shared_ptr<DeviceBackend> device, Config config)
    : impl_(std::make_unique<Impl>(std::move(device), std::move(config))) {}
Allocator::~Allocator() = default;

void* Allocator::allocate(std::size_t bytes, Stream stream) { return impl_->allocate(bytes, stream); }
void Allocator::deallocate(void* ptr) { impl_->deallocate(ptr); }
void Allocator::record_stream(void* ptr, Stream stream) { impl_->record_stream(ptr, stream); }
void Allocator::empty_cache() { impl_->empty_cache(); }
void Allocator::set_memory_limit(std::size_t bytes) { impl_->set_memory_limit(bytes); }
std::size_t Allocator::memory_limit() const { return impl_->memory_limit(); }
Stats Allocator::stats() const { return impl_->stats(); }
MemoryUsage Allocator::usage() const { return impl_->usage(); }
void Allocator::reset_peaks() { impl_->reset_peaks(); }
FragmentationReport Allocator::fragmentation() const { return impl_->fragmentation(); }
Snapshot Allocator::snapshot() const { return impl_->snapshot(); }
void Allocator::check_invariants() const { impl_->check_invariants(); }
HookId Allocator::add_observer(std::shared_ptr<Observer> o) { return impl_->add_observer(std::move(o)); }
HookId Allocator::add_oom_observer(OomObserver o) { return impl_->add_oom_observer(std::move(o)); }
HookId Allocator::add_free_memory_callback(FreeMemoryCallback c) {
  return impl_->add_free_memory_callback(std::move(c));
}
bool Allocator::remove_hook(HookId id) { return impl_->remove_hook(id); }
const Config& Allocator::config() const noexcept { return impl_->state().config; }
DeviceBackend& Allocator::device() const noexcept { return *impl_->state().device; }

// --- the fast path --------------------------------------------------------------------------

// b, free and in no index, becomes the user's (defined first: inlined into both of its callers).
TP_ALWAYS_INLINE void Allocator::Impl::hand_out(Block* b, std::size_t requested) {
  Segment* seg = b->segment;
  b->state = BlockState::allocated;
  b->requested = requested;
  live_.insert(b->addr, b);
  counters.on_alloc(seg->pool, static_cast<std::int64_t>(b->size), static_cast<std::int64_t>(requested));
  if (TP_UNLIKELY(seg->epoch != nullptr)) seg->epoch->on_alloc(b, seg->addr);
}

void* Allocator::Impl::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  Lock lock(mutex_);
  counters.count(&Stats::alloc_calls);
  const std::size_t size = bytes <= kMaxAllocationSize ? round_size(bytes) : kMaxAllocationSize;
  if (TP_UNLIKELY(pending_total_ != 0)) process_events();
  StreamState& ss = streams.get(stream);
  const Pool pool = size <= config.small_size ? Pool::small : Pool::large;
  Block* b = nullptr;
  if (TP_UNLIKELY(ss.follows_plan(pool)) && (b = source_->take_planned(ss, pool, size)) != nullptr) {
    hand_out(b, bytes);
  } else {
    b = bytes <= kMaxAllocationSize ? find_cached(ss, pool, size) : nullptr;
    if (TP_UNLIKELY(b == nullptr)) b = allocate_slow(ss, pool, size, bytes, lock);
    b = take(b, size, bytes);
  }
  if (TP_UNLIKELY(b->segment->owner != &ss)) add_use(b, stream);  // taken from another stream
  if (TP_UNLIKELY(hooks.observed())) hooks.notify(EventType::alloc, b->addr, bytes, b->size, stream);
  debug_check();
  return reinterpret_cast<void*>(b->addr);
}

void Allocator::Impl::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  Lock lock(mutex_);
  const auto addr = reinterpret_cast<Address>(ptr);
  Block* b = live_.erase(addr);
  if (TP_UNLIKELY(b == nullptr)) throw_bad_pointer(addr, "free");
  counters.count(&Stats::free_calls);
  counters.on_free(b->segment->pool, static_cast<std::int64_t>(b->size),
                   static_cast<std::int64_t>(b->requested));
  if (TP_UNLIKELY(hooks.observed()))
    hooks.notify(EventType::free_requested, b->addr, b->requested, b->size, b->segment->owner->stream);
  if (TP_UNLIKELY(b->uses != nullptr)) {
    defer_free(b);
  } else {
    release_block(b);
  }
  debug_check();
}

void Allocator::Impl::record_stream(void* ptr, Stream stream) {
  Lock lock(mutex_);
  const auto addr = reinterpret_cast<Address>(ptr);
  Block* b = live_.find(addr);
  if (b == nullptr) throw_bad_pointer(addr, "record_stream");
  add_use(b, stream);
  if (TP_UNLIKELY(hooks.observed())) hooks.notify(EventType::record_stream, b->addr, b->requested, b->size, stream);
  debug_check();
}

// --- helpers --------------------------------------------------------------------------------

StreamState& detail::StreamTable::get_slow(Stream stream) {
  auto& slot = map_[stream];
  if (!slot) slot = std::make_unique<StreamState>(stream);
  last_stream_ = stream;
  last_state_ = slot.get();
  return *slot;
}

Block* Allocator::Impl::find_cached(StreamState& ss, Pool pool, std::size_t size) const noexcept {
  if (pool == Pool::small) return ss.index[detail::kSmallIndex].find(size);
  if (TP_UNLIKELY(is_oversize_request(size))) {
    Block* b = ss.index[detail::kOversizeIndex].find(size);
    return b != nullptr && b->size - size <= config.oversize_slack ? b : nullptr;
  }
  return ss.index[detail::kLargeIndex].find(size);
}

// Removes free block b from its index and hands out its first `size` bytes; the free remainder
// of a split goes back to the index.
Block* Allocator::Impl::take(Block* b, std::size_t size, std::size_t requested) {
  Segment* seg = b->segment;
  seg->index->remove(b);
  const std::size_t rest = b->size - size;
  const std::size_t min_rest = seg->pool == Pool::small ? kMinBlockSize : config.min_split_remainder;
  if (!seg->oversize && rest >= min_rest) seg->index->insert(blocks.split_at(b, size));
  hand_out(b, requested);
  return b;
}

// b's user is done with it and no stream event is outstanding: make it reusable.
void Allocator::Impl::release_block(Block* b) {
  Segment* seg = b->segment;
  counters.on_inactive(seg->pool, static_cast<std::int64_t>(b->size));
  if (TP_UNLIKELY(hooks.observed()))
    hooks.notify(EventType::free_completed, b->addr, b->requested, b->size, seg->owner->stream);
  b->state = BlockState::free;
  b->requested = 0;
  const bool heap_emptied = TP_UNLIKELY(seg->epoch != nullptr) && seg->epoch->on_release(b);
  b = coalesce(b);
  // A vmm heap with nothing allocated any more: it may hold its pages and plan the next epoch
  // (vmm_heaps.cpp, end_epoch()).
  if (TP_UNLIKELY(heap_emptied) && (b = source_->end_epoch(b)) == nullptr) return;
  seg->index->insert(b);
}

}  // namespace tensorpool
