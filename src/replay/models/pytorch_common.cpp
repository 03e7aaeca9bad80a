// pytorch_common.cpp: the machinery shared by the two models of PyTorch's CUDA caching allocator
// (see pytorch_common.hpp).

#include "replay/models/pytorch_common.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "tensorpool/errors.hpp"

namespace tensorpool::replay::pytorch_common {

SimulatedDeviceOptions device_options(const TargetOptions& o, const char* device_name) {
  SimulatedDeviceOptions d;
  d.name = device_name;
  d.ordinal = o.device;
  d.capacity = o.capacity;
  d.segment_granularity = pytorch_rules::kRoundLarge;  // every PyTorch segment is a multiple of 2 MiB
  d.cost_model = o.cost_model;
  return d;
}

Pool seed_pool(const trace::TraceEvent& seed) noexcept {
  return (seed.flags & trace::kFlagSmallPool) != 0 ? Pool::small : Pool::large;
}

CachingModel::CachingModel(const TargetOptions& options, const char* name, bool expandable,
                           const SimulatedDeviceOptions& device)
    : name_(name),
      conf_(options.conf),
      history_entries_(options.history_entries),
      settings_(pytorch_rules::parse_settings(options.conf, std::string(name) + " conf", expandable)),
      device_(device) {}

UpstreamCounts CachingModel::upstream() const {
  UpstreamCounts u = upstream_of(device_) - baseline_;
  u.syncs += event_syncs_;
  return u;
}

// --- allocation ---------------------------------------------------------------------------

void* CachingModel::allocate(std::size_t bytes, Stream stream) {
  process_pending();
  // Beyond any device: fail before the rounding arithmetic could overflow.
  if (bytes > device_.properties().capacity) throw_oom(bytes, bytes, stream);
  const std::size_t size = round_size(bytes);
  const Pool pool = pytorch_rules::pool_of(size);
  Block* b = find_free(pool, stream, size);
  if (b == nullptr) b = grow(pool, stream, size);
  if (b == nullptr) throw_oom(bytes, size, stream);
  take(b, size)->requested = bytes;
  note(EventType::alloc, b->addr, bytes, b->size, stream);
  return reinterpret_cast<void*>(b->addr);
}

// The best-fit candidate, removed from the free set; nullptr when it is missing or ruled out by
// max_split_size (every later candidate is larger, so only the first one matters). A free block
// at the edge of the mapped space ranks by what it can grow to: the search moves past it to the
// next larger free block of the stream that can grow less, so interior blocks are reused before
// the edge (qwen3-0.6b-varlen-expandable: an 11.75 MiB request took an interior 47 MiB block
// rather than the 12.6 MiB free edge). Native segments have no unmapped space: there every block
// ranks by its size and the search stays on the first candidate.
Block* CachingModel::find_free(Pool pool, Stream stream, std::size_t size) {
  auto& set = free_set(pool);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  for (auto next = std::next(it); next != set.end() && (*next)->stream == stream &&
                                  growable_size(*next) < growable_size(*it);
       ++next)
    it = next;
  Block* b = *it;
  if (!pytorch_rules::may_serve(b->size, size, settings_.max_split_size)) return nullptr;
  set.erase(it);
  return b;
}

// Marks `b` (in no set) allocated for `size` bytes, splitting off the tail if worth it.
Block* CachingModel::take(Block* b, std::size_t size) {
  if (should_split(*b, size)) free_set(b->pool).insert(split_at(b, size));
  b->allocated = true;
  allocated_ += b->size;
  return b;
}

Block* CachingModel::new_block(Address addr, std::size_t size, Stream stream, Pool pool,
                               Segment* segment, bool mapped) {
  auto owned = std::make_unique<Block>();
  Block* b = owned.get();
  b->addr = addr;
  b->size = size;
  b->stream = stream;
  b->pool = pool;
  b->segment = segment;
  b->mapped = mapped;
  blocks_.emplace(addr, std::move(owned));
  return b;
}

// Cuts `b` (in no set) in two at `offset`; returns the new upper part (same kind, in no set).
Block* CachingModel::split_at(Block* b, std::size_t offset) {
  Block* rest = new_block(b->addr + offset, b->size - offset, b->stream, b->pool, b->segment,
                          b->mapped);
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = offset;
  return rest;
}

[[noreturn]] void CachingModel::throw_oom(std::size_t bytes, std::size_t size, Stream stream) {
  OutOfMemoryInfo info = model::oom_info(device_, bytes, size, trace_stream(stream), reserved_, allocated_);
  for (const auto& set : free_)
    for (const Block* b : set) model::add_cached(info, trace_stream(b->stream), b->size, b->size);
  note(EventType::oom, 0, bytes, size, stream);
  if (history_) history_->on_oom(info);
  throw OutOfMemoryError(info);
}

// --- freeing ------------------------------------------------------------------------------

void CachingModel::deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  const auto it = blocks_.find(reinterpret_cast<Address>(ptr));
  if (it == blocks_.end() || !it->second->allocated)
    throw UsageError(std::string(name_) + ": deallocate of a pointer that is not allocated");
  Block* b = it->second.get();
  b->allocated = false;
  allocated_ -= b->size;
  note(EventType::free_requested, b->addr, b->requested, b->size, b->stream);
  if (b->uses.empty()) {
    complete_free(b);
    return;
  }
  // PyTorch records an event on each stream that used the block; the block is reusable once
  // all of them completed.
  b->pending = true;
  b->marks.clear();
  for (Stream s : b->uses) b->marks.push_back(clock_.mark(s));
  pending_.push_back(b);
}

void CachingModel::record_stream(void* ptr, Stream stream) {
  const auto it = blocks_.find(reinterpret_cast<Address>(ptr));
  if (it == blocks_.end() || !it->second->allocated)
    throw UsageError(std::string(name_) + ": record_stream on a pointer that is not allocated");
  Block* b = it->second.get();
  if (stream == trace_stream(b->stream)) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
}

// Merges the free block `b` (in no set) with its free neighbours (never with unmapped space) and
// returns the result, now in its free set.
Block* CachingModel::free_block(Block* b) {
  if (b->prev != nullptr && b->prev->is_free()) b = absorb(b->prev, b);
  if (b->next != nullptr && b->next->is_free()) b = absorb(b, b->next);
  free_set(b->pool).insert(b);
  return b;
}

// Merges `high` into its lower neighbour `low`, of the same kind; the survivor keeps its address
// (its key in blocks_) and is in no set: both are taken out first, as their keys change.
Block* CachingModel::absorb(Block* low, Block* high) {
  unindex(low);
  unindex(high);
  low->size += high->size;
  low->next = high->next;
  if (low->next != nullptr) low->next->prev = low;
  blocks_.erase(high->addr);
  return low;
}

// Frees the pending blocks whose other streams have all been synchronized since the free.
void CachingModel::process_pending() {
  if (pending_.empty()) return;
  std::vector<Block*> still;
  for (Block* b : pending_) {
    bool done = true;
    for (std::size_t i = 0; i < b->uses.size() && done; ++i)
      done = clock_.completed(b->uses[i], b->marks[i]);
    if (!done) {
      still.push_back(b);
      continue;
    }
    b->pending = false;
    b->uses.clear();
    b->marks.clear();
    complete_free(b);
  }
  pending_.swap(still);
}

// The host waits for every outstanding event (PyTorch does before releasing cached memory).
void CachingModel::complete_all_pending() {
  std::vector<Block*> all;
  all.swap(pending_);
  for (Block* b : all) {
    event_syncs_ += b->uses.size();  // one event per stream that used the block
    b->pending = false;
    b->uses.clear();
    b->marks.clear();
    complete_free(b);
  }
}

Block* CachingModel::complete_free(Block* b) {
  note(EventType::free_completed, b->addr, b->requested, b->size, b->stream);
  b->requested = 0;
  return free_block(b);
}

// --- snapshot export ----------------------------------------------------------------------

void CachingModel::start_history() {
  if (!history_) history_ = std::make_shared<trace::pytorch::HistoryRecorder>(history_entries_);
}

Stream CachingModel::pool_stream(Stream stream, std::string_view tag) {
  const auto key = std::make_pair(stream, std::string(tag));
  if (auto it = pool_streams_.find(key); it != pool_streams_.end()) return it->second;
  const Stream s = kPoolStreams + pool_stream_of_.size();
  pool_stream_of_.push_back(stream);
  pool_streams_.emplace(key, s);
  return s;
}

Stream CachingModel::trace_stream(Stream s) const {
  return s >= kPoolStreams ? pool_stream_of_[static_cast<std::size_t>(s - kPoolStreams)] : s;
}

void CachingModel::note(EventType type, Address addr, std::size_t requested, std::size_t size,
                        Stream stream) {
  if (!history_) return;
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  history_->on_event(AllocatorEvent{type, addr, requested, size, trace_stream(stream),
                                    static_cast<std::uint64_t>(
                                        std::chrono::duration_cast<std::chrono::nanoseconds>(now).count())});
}

namespace {

BlockState state_of(const Block& b) noexcept {
  return b.allocated ? BlockState::allocated : b.pending ? BlockState::pending_free : BlockState::free;
}

}  // namespace

// Segments are chains of address neighbours: `visit(head)` for each chain's first block, in
// address order.
template <typename Visit>
void CachingModel::for_each_segment(Visit&& visit) const {
  std::vector<const Block*> heads;
  for (const auto& [addr, owned] : blocks_)
    if (owned->prev == nullptr) heads.push_back(owned.get());
  std::sort(heads.begin(), heads.end(), [](const Block* a, const Block* b) { return a->addr < b->addr; });
  for (const Block* head : heads) visit(head);
}

trace::pytorch::DeviceMemory CachingModel::memory_state() const {
  trace::pytorch::DeviceMemory m;
  for_each_segment([&](const Block* head) {
    SegmentInfo s;
    s.address = head->addr;
    s.stream = trace_stream(head->stream);
    s.pool = head->pool;
    s.heap = head->segment != nullptr;  // "pytorch-expandable": mapped runs are what shows
    for (const Block* b = head; b != nullptr; b = b->next) {
      BlockInfo info;
      info.address = b->addr;
      info.size = b->size;
      info.mapped = b->mapped;
      info.state = state_of(*b);
      info.requested = info.state == BlockState::free ? 0 : b->requested;
      s.size += b->size;
      s.blocks.push_back(info);
    }
    m.state.segments.push_back(std::move(s));
  });
  if (history_) m.history = history_->entries();
  return m;
}

std::optional<MemoryMap> CachingModel::memory_map() const {
  MemoryMap m;
  for_each_segment([&](const Block* head) {
    MapSegment s{head->addr, 0, trace_stream(head->stream), head->segment != nullptr, {}};
    for (const Block* b = head; b != nullptr; b = b->next) {
      s.size += b->size;
      s.blocks.push_back(MapBlock{b->addr, b->size, state_of(*b), b->mapped, trace_stream(b->stream), 0, 0});
    }
    m.segments.push_back(std::move(s));
  });
  return m;
}

// --- seeding ------------------------------------------------------------------------------

// The free block `f` cut to start at `x` and taken out of its free set (a free part before x
// stays free); nullptr when `f` is missing, not free, or does not hold [x, x + size).
Block* CachingModel::carve_free(Block* f, Address x, std::size_t size) {
  if (f == nullptr || !f->is_free() || x + size > f->addr + f->size) return nullptr;
  auto& set = free_set(f->pool);
  set.erase(f);
  if (x == f->addr) return f;
  Block* at = split_at(f, x - f->addr);
  set.insert(f);
  return at;
}

std::optional<CachingModel::SeededPlace> CachingModel::seeded_place(std::uint64_t addr) const {
  auto it = seeds_.upper_bound(addr);
  if (it == seeds_.begin()) return std::nullopt;
  --it;
  const auto [start, length] = it->second;
  const std::uint64_t offset = addr - it->first;
  if (offset >= length) return std::nullopt;
  return SeededPlace{start, length, offset};
}

// Keeps the device calls made since `before` (seeding) out of upstream().
void CachingModel::exclude_from_window(const UpstreamCounts& before) {
  baseline_ += upstream_of(device_) - before;
}

}  // namespace tensorpool::replay::pytorch_common
