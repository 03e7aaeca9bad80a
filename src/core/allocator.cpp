// allocator.cpp: the public API (forwarded to Impl) and the fast path. A cached allocate is:
// round, find the stream in a thread-local cache, lock its shard (shards.hpp), find in the
// stream's free index (O(1)), maybe split, insert into the pointer map, count (in vmm mode, a heap
// that follows a planned layout names the block instead of the index, and each heap records its
// blocks in its EpochLog). A deallocate is: lock the shard of the thread's last stream, erase from
// its pointer map, coalesce with free neighbours, insert into the free index, count. Whatever else
// a call needs (a stream never seen on this thread, a block of another shard, growth, events,
// observers, an epoch's end, a new peak) takes the exclusive mode and runs the same steps there.
// Anything that talks to the device is out of line: the OOM ladder (oom_ladder.cpp), stream
// events (stream_events.cpp), the segment source.
#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

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
void Allocator::step() { impl_->step(); }
namespace {

// The blocks of a tag used before (UsageError for a name no allocation was ever made under).
detail::Sleepers tagged(std::string_view tag, const char* operation) {
  const detail::TagId id = detail::find_tag(tag);
  if (id == 0)
    throw UsageError(std::string("tensorpool: ") + operation + "('" + std::string(tag) +
                     "'): no allocation was ever made under that tag");
  return {.all = false, .tag = id};
}

}  // namespace

SleepReport Allocator::sleep(Contents contents) { return impl_->sleep({}, contents); }
SleepReport Allocator::sleep(std::string_view tag, Contents contents) {
  return impl_->sleep(tagged(tag, "sleep"), contents);
}
void Allocator::wake() { impl_->wake({}); }
void Allocator::wake(std::string_view tag) { impl_->wake(tagged(tag, "wake")); }
SleepReport Allocator::asleep() const { return impl_->asleep(); }
bool Allocator::is_asleep(const void* ptr) const { return impl_->is_asleep(ptr); }
GraphPool Allocator::begin_capture(Stream stream, std::size_t reserve) { return impl_->begin_capture(stream, reserve); }
void Allocator::begin_capture(Stream stream, GraphPool pool, std::size_t more) {
  impl_->begin_capture(stream, pool, more);
}
void Allocator::end_capture(Stream stream) { impl_->end_capture(stream); }
void Allocator::release_graph(GraphPool pool) { impl_->release_graph(pool); }
std::vector<GraphPoolInfo> Allocator::graph_pools() const { return impl_->graph_pools(); }
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

namespace {

// The streams (with tags) this thread used last, most recent first, each with the id of its
// allocator (ids are never reused, so an entry of a destroyed allocator never matches).
struct StreamCacheEntry {
  std::uint64_t allocator = 0;
  Stream stream = kDefaultStream;
  detail::TagId tag = 0;
  StreamState* state = nullptr;
};
constexpr std::size_t kStreamCacheEntries = 8;  // as many as the shards: a thread on up to eight streams stays on the fast path
// One thread-local object: the fast path reaches the cache and the tag with one TLS access.
struct ThreadState {
  std::array<StreamCacheEntry, kStreamCacheEntries> streams;
  detail::TagId tag = 0;  // the innermost Tag scope of this thread (0: none)
};
thread_local ThreadState tls;

// This thread, for Block::freed_by: an address no other running thread has (the fast path
// has it at hand already).
TP_ALWAYS_INLINE const void* this_thread() noexcept { return &tls; }

std::atomic<std::uint64_t> next_allocator_id{1};

}  // namespace

detail::TagId detail::exchange_thread_tag(TagId tag) noexcept { return std::exchange(tls.tag, tag); }

std::uint64_t Allocator::Impl::new_id() noexcept { return next_allocator_id.fetch_add(1, std::memory_order_relaxed); }

TP_ALWAYS_INLINE StreamState* Allocator::Impl::cached_stream(Stream stream) const noexcept {
  return cached_stream({stream, tls.tag});
}

TP_ALWAYS_INLINE StreamState* Allocator::Impl::cached_stream(detail::StreamKey key) const noexcept {
  const StreamCacheEntry& e = tls.streams[0];
  if (TP_LIKELY(e.allocator == id_ && e.stream == key.stream && e.tag == key.tag)) return e.state;
  for (std::size_t i = 1; i < kStreamCacheEntries; ++i) {
    if (tls.streams[i].allocator == id_ && tls.streams[i].stream == key.stream && tls.streams[i].tag == key.tag) {
      std::rotate(tls.streams.begin(), tls.streams.begin() + static_cast<std::ptrdiff_t>(i),
                  tls.streams.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return tls.streams[0].state;
    }
  }
  return nullptr;
}

// The stream this thread used last with this allocator (where its frees look first), or null.
TP_ALWAYS_INLINE StreamState* Allocator::Impl::last_stream() const noexcept {
  for (const StreamCacheEntry& e : tls.streams)
    if (e.allocator == id_) return e.state;
  return nullptr;
}

// Puts ss first in this thread's cache: moved there if it is in it (cached_stream() does that),
// else added, the least recently used entry dropped.
void Allocator::Impl::remember_stream(StreamState& ss) const noexcept {
  if (cached_stream(detail::StreamKey{ss.stream, ss.tag}) != nullptr) return;
  std::rotate(tls.streams.begin(), tls.streams.end() - 1, tls.streams.end());
  tls.streams[0] = {id_, ss.stream, ss.tag, &ss};
}

// What a request of `size` bytes gets of free block b: `size` bytes when the rest is worth a
// block of its own, else all of b.
TP_ALWAYS_INLINE std::size_t Allocator::Impl::handed_size(const Block* b, std::size_t size) const noexcept {
  const Segment* seg = b->segment;
  const std::size_t min_rest = seg->pool == Pool::small ? kMinBlockSize : config.min_split_remainder;
  return !seg->oversize && b->size - size >= min_rest ? size : b->size;
}

// b, free and in no index, becomes the user's (defined first: inlined into both of its callers).
TP_ALWAYS_INLINE void Allocator::Impl::hand_out(Block* b, std::size_t requested) {
  Segment* seg = b->segment;
  detail::Shard& shard = shard_of(seg);
  b->state = BlockState::allocated;
  b->requested = requested;
  b->from_seam = false;  // take_from_seam() sets it after
  shard.live.insert(b->addr, b);
  shard.counters.on_alloc(seg->pool, static_cast<std::int64_t>(b->size), static_cast<std::int64_t>(requested));
  b->born = ++shard.handed_out[static_cast<int>(seg->pool)];
  if (TP_UNLIKELY(seg->epoch != nullptr)) seg->epoch->on_alloc(b, seg->addr);
  // vmm_find_steps: every allocation of the stream, in heaps that record their epochs or not.
  if (StreamState& owner = *seg->owner; TP_UNLIKELY(owner.step_finder != nullptr)) {
    const PoolStats& in_use = shard.counters.stats().total;
    if (owner.step_finder->on_alloc(b->size, static_cast<std::uint64_t>(in_use[Metric::allocated_bytes].current),
                                    static_cast<std::uint64_t>(in_use[Metric::allocations].current)))
      owner.step_due = true;
  }
}

void* Allocator::Impl::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  if (StreamState* ss = cached_stream(stream); TP_LIKELY(ss != nullptr && bytes <= kMaxAllocationSize)) {
    Block* b = nullptr;
    {
      const std::lock_guard<detail::FutexLock> guard(ss->shard->lock);
      b = allocate_cached(*ss, round_size(bytes), bytes);
    }
    if (TP_LIKELY(b != nullptr)) {
      debug_check_unlocked();
      return reinterpret_cast<void*>(b->addr);
    }
  }
  return allocate_exclusive(bytes, stream);
}

// Under ss's shard's lock: a block cached for ss that keeps the shard below its ceilings, handed
// out; else nullptr, and nothing has changed but a plan the stream departed from and the shard's
// seam, merged (the exclusive path then serves the request as it would have).
TP_ALWAYS_INLINE Block* Allocator::Impl::allocate_cached(StreamState& ss, std::size_t size, std::size_t bytes) {
  if (TP_UNLIKELY(pending_total_ != 0 || hooks.observed() || capture_underway() || ss.step_due)) return nullptr;
  detail::Shard& shard = *ss.shard;
  const Pool pool = size <= config.small_size ? Pool::small : Pool::large;
  const auto requested = static_cast<std::int64_t>(bytes);
  if (TP_UNLIKELY(shard.seam != nullptr))
    if (Block* b = take_from_seam(ss, pool, size, bytes)) return b;
  if (TP_UNLIKELY(ss.follows_plan(pool))) {
    if (!ss.plan_ready(pool) || !shard.fits(pool, static_cast<std::int64_t>(size), requested)) return nullptr;
    if (Block* b = source_->take_planned(ss, pool, size, detail::PlannedPages::mapped_only)) {
      shard.counters.count(&Stats::alloc_calls);
      hand_out(b, bytes);
      return b;
    }
    if (ss.follows_plan(pool)) return nullptr;  // the step's pages are to be mapped: exclusive path
  }
  Block* b = find_cached(ss, pool, size);
  if (TP_UNLIKELY(b == nullptr)) return nullptr;
  const std::size_t handed = handed_size(b, size);
  if (TP_UNLIKELY(!shard.fits(pool, static_cast<std::int64_t>(handed), requested))) return nullptr;
  shard.counters.count(&Stats::alloc_calls);
  return take(b, handed, bytes, FreeFrom::index);
}

// Under ss's shard's lock, which has a seam (shards.hpp): its lower twin, handed out whole, when
// the request asks for its size on its stream and keeps the shard below its ceilings; else
// nullptr, with the seam merged first (what every other request finds).
TP_ALWAYS_INLINE Block* Allocator::Impl::take_from_seam(StreamState& ss, Pool pool, std::size_t size,
                                                       std::size_t bytes) {
  detail::Shard& shard = *ss.shard;
  Block* lower = shard.seam;
  const detail::FreeIndex& index = ss.index[pool == Pool::small ? detail::kSmallIndex : detail::kLargeIndex];
  if (lower->size != size || lower->segment->index != &index || ss.follows_plan(pool) ||
      !shard.fits(pool, static_cast<std::int64_t>(size), static_cast<std::int64_t>(bytes))) {
    shard.close_seam();
    return nullptr;
  }
  shard.seam = nullptr;
  shard.counters.count(&Stats::alloc_calls);
  Block* b = take(lower, size, bytes, FreeFrom::index);
  b->from_seam = true;
  return b;
}

void* Allocator::Impl::allocate_exclusive(std::size_t bytes, Stream stream) {
  Lock lock(shards);
  if (TP_UNLIKELY(capture_underway()))
    if (detail::GraphPoolRec* pool = graphs.capturing(stream)) return allocate_captured(*pool, bytes, stream);
  return allocate_in(bytes, {stream, tls.tag}, lock);
}

void* Allocator::Impl::allocate_locked(std::size_t bytes, detail::StreamKey key, Lock& lock) {
  return allocate_in(bytes, key, lock);
}

TP_ALWAYS_INLINE void* Allocator::Impl::allocate_in(std::size_t bytes, detail::StreamKey key, Lock& lock) {
  const Stream stream = key.stream;
  counters.count(&Stats::alloc_calls);
  const std::size_t size = bytes <= kMaxAllocationSize ? round_size(bytes) : kMaxAllocationSize;
  if (TP_UNLIKELY(pending_total_ != 0) && !capture_underway()) process_events();  // queries: not during a capture
  StreamState& ss = streams.get(key);
  shards.favour(ss.shard);
  remember_stream(ss);
  if (TP_UNLIKELY(ss.step_due)) step_found(ss);
  const Pool pool = size <= config.small_size ? Pool::small : Pool::large;
  Block* b = nullptr;
  if (TP_UNLIKELY(ss.follows_plan(pool)) &&
      (b = source_->take_planned(ss, pool, size, detail::PlannedPages::map_holes)) != nullptr) {
    hand_out(b, bytes);
  } else {
    b = bytes <= kMaxAllocationSize ? find_cached(ss, pool, size) : nullptr;
    FreeFrom from = FreeFrom::index;
    if (TP_UNLIKELY(b == nullptr)) {
      b = allocate_slow(ss, pool, size, bytes, lock);
      from = FreeFrom::growth;
    }
    b = take(b, handed_size(b, size), bytes, from);
  }
  if (TP_UNLIKELY(b->segment->owner != &ss)) add_use(b, stream);  // taken from another stream
  if (TP_UNLIKELY(hooks.observed())) hooks.notify(EventType::alloc, b->addr, bytes, b->size, stream, ss.tag);
  debug_check();
  return reinterpret_cast<void*>(b->addr);
}

void Allocator::Impl::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<Address>(ptr);
  if (StreamState* ss = last_stream(); TP_LIKELY(ss != nullptr)) {
    bool done = false;
    {
      const std::lock_guard<detail::FutexLock> guard(ss->shard->lock);
      done = free_cached(*ss->shard, addr);
    }
    if (TP_LIKELY(done)) {
      debug_check_unlocked();
      return;
    }
  }
  deallocate_exclusive(addr);
}

// Under the shard's lock: frees the block at addr if the shard maps it and the free needs no
// stream event, no observer and no end of an epoch outside its heap (true); else changes nothing
// but the shard's seam, merged as the exclusive mode would (false).
TP_ALWAYS_INLINE bool Allocator::Impl::free_cached(detail::Shard& shard, Address addr) {
  if (TP_UNLIKELY(hooks.observed())) return false;
  Block* b = shard.live.erase(addr);
  if (TP_UNLIKELY(b == nullptr)) return false;
  // First: what follows looks at b's neighbours and heap, where the seam may lie.
  if (TP_UNLIKELY(shard.seam != nullptr)) shard.close_seam();
  const Segment* seg = b->segment;
  if (TP_UNLIKELY(b->uses != nullptr || b->asleep ||
                  (seg->epoch != nullptr && seg->epoch->one_live() && !epoch_ends_in_heap(*seg->epoch, b)))) {
    shard.live.insert(addr, b);  // back as it was: the exclusive mode frees it
    return false;
  }
  shard.counters.count(&Stats::free_calls);
  shard.counters.on_free(seg->pool, static_cast<std::int64_t>(b->size), static_cast<std::int64_t>(b->requested));
  release_cached(shard, b);
  return true;
}

// b's user is done with it and no stream event is outstanding: counted, free, and released in its
// heap's epoch record. Whether that left the heap with nothing allocated.
TP_ALWAYS_INLINE bool Allocator::Impl::mark_free(Block* b) {
  Segment* seg = b->segment;
  count_free_completed(b);
  b->state = BlockState::free;
  b->requested = 0;
  return TP_UNLIKELY(seg->epoch != nullptr) && seg->epoch->on_release(b, seg->addr);
}

// The fast path's release_block() (the free that empties a heap takes release_block() itself, for
// the epoch's end): b merges with its free neighbours, or is kept apart from a free twin as the
// shard's new seam where keeps_apart() says so (shards.hpp; free_cached() merged the old one).
TP_ALWAYS_INLINE void Allocator::Impl::release_cached(detail::Shard& shard, Block* b) {
  Segment* seg = b->segment;
  if (TP_UNLIKELY(seg->epoch != nullptr) && seg->epoch->one_live()) {  // the free ends the heap's epoch
    release_block(b);
    return;
  }
  mark_free(b);  // not the heap's last block: its epoch goes on
  const bool below = merges_with(b->prev, b);
  const bool above = merges_with(b->next, b);
  if (TP_UNLIKELY(below != above) && keeps_apart(b, below ? b->prev : b->next)) {
    seg->index->insert(b);
    shard.seam = below ? b->prev : b;
  } else {
    b = merge_neighbours(b, below, above);
    seg->index->insert(b);
  }
  b->freed_by = this_thread();
}

// Whether b, being freed, stays apart from `twin`, the only free block it would merge with: the
// twin has b's size, and another thread freed it, or b came from a seam (the two threads' blocks
// still take turns).
TP_ALWAYS_INLINE bool Allocator::Impl::keeps_apart(const Block* b, const Block* twin) noexcept {
  return twin->size == b->size &&
         (b->from_seam || (twin->freed_by != nullptr && twin->freed_by != this_thread()));
}

// b is the last block allocated in its heap: whether its free ends the epoch inside the heap
// (SegmentSource::epoch_end_of()). If so the answer is left in the heap's record for end_epoch(),
// which the free reaches under the same lock; an end elsewhere is not left (the exclusive path
// asks again).
bool Allocator::Impl::epoch_ends_in_heap(detail::EpochLog& log, const Block* b) const {
  const detail::EpochEnd end = source_->epoch_end_of(b);
  if (end == detail::EpochEnd::elsewhere) return false;
  log.end_known = end;
  return true;
}

void Allocator::Impl::deallocate_exclusive(Address addr) {
  Lock lock(shards);
  // First the graph pools: a pool's first block starts where the range it lies in does.
  if (TP_UNLIKELY(!graphs.empty()) && free_captured(addr)) {
    debug_check();
    return;
  }
  Block* b = find_live(addr);
  if (TP_UNLIKELY(b == nullptr)) throw_bad_pointer(addr, "free");
  free_block(b);
}

void Allocator::Impl::deallocate_locked(Block* b) { free_block(b); }

// b, allocated, is freed: counted, and released now or once the streams that used it are done.
TP_ALWAYS_INLINE void Allocator::Impl::free_block(Block* b) {
  detail::Shard& shard = shard_of(b->segment);
  shard.live.erase(b->addr);
  counters.count(&Stats::free_calls);
  shard.counters.on_free(b->segment->pool, static_cast<std::int64_t>(b->size),
                         static_cast<std::int64_t>(b->requested));
  if (TP_UNLIKELY(hooks.observed()))
    hooks.notify(EventType::free_requested, b->addr, b->requested, b->size, b->segment->owner->stream);
  if (TP_UNLIKELY(b->asleep)) {
    forget_asleep(b);
  } else if (TP_UNLIKELY(b->uses != nullptr)) {
    defer_free(b);
  } else {
    release_block(b);
  }
  debug_check();
}

void Allocator::Impl::record_stream(void* ptr, Stream stream) {
  const detail::Shards::View view(shards);  // a stream of use changes no counter
  const auto addr = reinterpret_cast<Address>(ptr);
  // A graph pool's blocks are reused in the order of the graph's captures, whatever the streams
  // that use them: nothing to record.
  if (TP_UNLIKELY(in_graph_pool(addr))) return;
  Block* b = find_live(addr);
  if (b == nullptr) throw_bad_pointer(addr, "record_stream");
  if (b->asleep)
    throw UsageError("tensorpool: record_stream on block " + detail::hex(addr) +
                     ", which is asleep (sleep() took its pages; wake() first)");
  add_use(b, stream);
  if (TP_UNLIKELY(hooks.observed())) hooks.notify(EventType::record_stream, b->addr, b->requested, b->size, stream);
  debug_check();
}

// --- helpers --------------------------------------------------------------------------------

StreamState& detail::StreamTable::get_slow(StreamKey key) {
  auto& slot = map_[key];
  if (!slot) {
    slot = std::make_unique<StreamState>(key, shards_.next_for_stream());
    if (find_steps_) slot->step_finder = std::make_unique<StepFinder>();
  }
  last_key_ = key;
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

// Removes free block b from its index and hands out its first `handed` bytes (handed_size()), or
// its last ones where the request replaces a kept neighbour (replaces_kept_neighbour()); the free
// remainder of a split goes back to the index. Inline: called, it cost the cached pair 21 to 29
// instructions of saved registers (docs/benchmarks.md, "The pair's counters, written out").
TP_ALWAYS_INLINE Block* Allocator::Impl::take(Block* b, std::size_t handed, std::size_t requested, FreeFrom from) {
  Segment* seg = b->segment;
  seg->index->remove(b);
  if (handed < b->size) {
    if (TP_UNLIKELY(seg->vmm != nullptr && from == FreeFrom::index && replaces_kept_neighbour(b, handed))) {
      Block* top = blocks_of(seg).split_at(b, b->size - handed);
      seg->index->insert(b);
      b = top;
    } else {
      seg->index->insert(blocks_of(seg).split_at(b, handed));
    }
  }
  hand_out(b, requested);
  return b;
}

// Whether a request of `handed` bytes, served from free block b of a vmm heap's large pool, is
// the successor of an output the program keeps over a step: the live block just below b has its
// size and is older than the live set (handed out more allocations ago than the pool now has
// live blocks: whatever was made beside it has been freed since, so it is not one of a run of
// blocks made together, as layers' weights or activations are), b is the heap's top mapped
// block, and the request is at least the pool's growth step (1/vmm_growth_divisor of what it
// holds, at most vmm_max_growth: a per-layer tensor is smaller; its twins, a weight and its
// gradient or checkpoints of equal size, are not replacements). PyTorch's loop makes its logits
// while the previous step's are alive and frees those right after (`logits = model(x)`). Served
// from b's start, the new block would sit between the old one and the free pages, and the old
// one's pages would become a hole that the next, larger requests (the loss's upcast) cannot use:
// the heap grows or remaps every step. Served from b's end, the old block's pages join the free
// ones below the new block once it is freed.
bool Allocator::Impl::replaces_kept_neighbour(const Block* b, std::size_t handed) const noexcept {
  const Segment* seg = b->segment;
  const Block* below = b->prev;
  if (seg->pool != Pool::large || below == nullptr || below->size != handed ||
      below->state != BlockState::allocated || (b->next != nullptr && b->next->mapped) ||
      handed < least_kept_output())
    return false;
  const detail::Shard& shard = shard_of(seg);
  const int large = static_cast<int>(Pool::large);
  const std::int64_t live = shard.counters.stats().pool[large][Metric::allocations].current;
  return shard.handed_out[large] - below->born > static_cast<std::uint64_t>(std::max<std::int64_t>(live, 0));
}

// The growth share of the large pool (VmmHeaps::growth_step()) from what the fast path may read:
// the pool's reserved bytes, which only the exclusive mode writes. growth_step() itself also
// sums the heaps' held pages, which an epoch that ends in place changes under one shard's lock.
std::size_t Allocator::Impl::least_kept_output() const noexcept {
  return growth_share(counters.reserved(Pool::large));
}

// b's user is done with it and no stream event is outstanding: make it reusable.
void Allocator::Impl::release_block(Block* b) {
  Segment* seg = b->segment;
  const bool heap_emptied = mark_free(b);
  b = coalesce(b);
  b->freed_by = this_thread();
  // A vmm heap with nothing allocated any more: it may hold its pages and plan the next epoch
  // (vmm_heaps.cpp, end_epoch()).
  if (TP_UNLIKELY(heap_emptied) && (b = source_->end_epoch(b)) == nullptr) return;
  seg->index->insert(b);
}

}  // namespace tensorpool
