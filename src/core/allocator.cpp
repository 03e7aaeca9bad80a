// allocator.cpp: the hot paths. A cached allocate is: round, lock, find in the stream's free
// index (O(1)), maybe split, insert into the pointer map, count. A deallocate is: lock, erase from
// the pointer map, coalesce with free neighbours, insert into the free index, count. Everything
// that talks to the device is out of line in allocator_slow.cpp.
#include <chrono>

#include "core/allocator_impl.hpp"
#include "tensorpool/size_classes.hpp"

#define TP_UNLIKELY(x) __builtin_expect(!!(x), 0)

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
const Config& Allocator::config() const noexcept { return impl_->config(); }
DeviceBackend& Allocator::device() const noexcept { return impl_->device(); }

// --- hot paths ------------------------------------------------------------------------------

void* Allocator::Impl::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  Lock lock(mutex_);
  ++counters_.alloc_calls;
  const std::size_t size = bytes <= kMaxAllocationSize ? round_size(bytes) : kMaxAllocationSize;
  if (TP_UNLIKELY(pending_total_ != 0)) process_events();
  StreamState& ss = state_for(stream);
  const Pool pool = size <= config_.small_size ? Pool::small : Pool::large;
  Block* b = bytes <= kMaxAllocationSize ? find_cached(ss, pool, size) : nullptr;
  if (TP_UNLIKELY(b == nullptr)) b = allocate_slow(ss, pool, size, bytes, lock);
  b = take(b, size, bytes);
  if (TP_UNLIKELY(b->segment->owner != &ss)) add_use(b, stream);  // taken from another stream
  if (TP_UNLIKELY(has_observers_)) notify(EventType::alloc, b->addr, bytes, b->size, stream);
  debug_check();
  return reinterpret_cast<void*>(b->addr);
}

void Allocator::Impl::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  Lock lock(mutex_);
  const auto addr = reinterpret_cast<Address>(ptr);
  Block* b = live_.erase(addr);
  if (TP_UNLIKELY(b == nullptr)) throw_bad_pointer(addr, "free");
  ++counters_.free_calls;
  account_free(b->segment->pool, static_cast<std::int64_t>(b->size),
               static_cast<std::int64_t>(b->requested));
  if (TP_UNLIKELY(has_observers_))
    notify(EventType::free_requested, b->addr, b->requested, b->size, b->segment->owner->stream);
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
  if (TP_UNLIKELY(has_observers_)) notify(EventType::record_stream, b->addr, b->requested, b->size, stream);
  debug_check();
}

// --- helpers --------------------------------------------------------------------------------

StreamState& Allocator::Impl::state_for(Stream stream) {
  if (last_state_ != nullptr && last_stream_ == stream) return *last_state_;
  return state_for_slow(stream);
}

StreamState& Allocator::Impl::state_for_slow(Stream stream) {
  auto& slot = streams_[stream];
  if (!slot) slot = std::make_unique<StreamState>(stream);
  last_stream_ = stream;
  last_state_ = slot.get();
  return *slot;
}

Block* Allocator::Impl::find_cached(StreamState& ss, Pool pool, std::size_t size) const noexcept {
  if (pool == Pool::small) return ss.index[detail::kSmallIndex].find(size);
  if (TP_UNLIKELY(is_oversize_request(size))) {
    Block* b = ss.index[detail::kOversizeIndex].find(size);
    return b != nullptr && b->size - size <= config_.oversize_slack ? b : nullptr;
  }
  return ss.index[detail::kLargeIndex].find(size);
}

// Removes free block b from its index and hands out its first `size` bytes.
Block* Allocator::Impl::take(Block* b, std::size_t size, std::size_t requested) {
  Segment* seg = b->segment;
  seg->index->remove(b);
  const std::size_t rest = b->size - size;
  const std::size_t min_rest =
      seg->pool == Pool::small ? kMinBlockSize : config_.min_split_remainder;
  if (!seg->oversize && rest >= min_rest) split(b, size);
  b->state = BlockState::allocated;
  b->requested = requested;
  live_.insert(b->addr, b);
  account_alloc(seg->pool, static_cast<std::int64_t>(b->size), static_cast<std::int64_t>(requested));
  return b;
}

// Cuts free block b (not in any index) after `size` bytes; the free remainder goes to the index.
void Allocator::Impl::split(Block* b, std::size_t size) { b->segment->index->insert(split_raw(b, size)); }

// b's user is done with it and no stream event is outstanding: make it reusable.
void Allocator::Impl::release_block(Block* b) {
  Segment* seg = b->segment;
  account_inactive(seg->pool, static_cast<std::int64_t>(b->size));
  if (TP_UNLIKELY(has_observers_))
    notify(EventType::free_completed, b->addr, b->requested, b->size, seg->owner->stream);
  b->state = BlockState::free;
  b->requested = 0;
  b = coalesce(b);
  seg->index->insert(b);
}

// Merges free block b (not in any index) with free neighbours; returns the merged block.
Block* Allocator::Impl::coalesce(Block* b) {
  Segment* seg = b->segment;
  if (Block* p = b->prev; p != nullptr && p->state == BlockState::free && p->mapped == b->mapped) {
    seg->index->remove(p);
    b = p;
    absorb_next(b);
  }
  if (Block* n = b->next; n != nullptr && n->state == BlockState::free && n->mapped == b->mapped) {
    seg->index->remove(n);
    absorb_next(b);
  }
  return b;
}

void Allocator::Impl::notify(EventType type, Address addr, std::size_t requested, std::size_t size,
                             Stream stream) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  const AllocatorEvent e{type, addr, requested, size, stream,
                         static_cast<std::uint64_t>(
                             std::chrono::duration_cast<std::chrono::nanoseconds>(now).count())};
  for (const auto& [id, observer] : observers_) observer->on_event(e);
}

}  // namespace tensorpool
