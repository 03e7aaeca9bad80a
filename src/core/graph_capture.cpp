// graph_capture.cpp: CUDA graph capture. Between begin_capture(stream) and end_capture(stream),
// every allocation on that stream comes from the graph's pool (graph_pools.hpp), whose ranges
// were allocated before the capture began, so that the capture never asks the device for memory
// and never synchronizes: a request the pool cannot serve throws GraphPoolExhaustedError. A
// pool's blocks are kept from every other stream until release_graph() and their own frees, after
// which its ranges are freed like any block. While any capture is underway the fast path steps
// aside (allocations and frees take the exclusive mode), no event is queried or recorded, and
// empty_cache, sleep and wake refuse. See docs/graphs.md.
#include <algorithm>
#include <map>
#include <string>

#include "core/allocator_impl.hpp"
#include "core/util.hpp"
#include "tensorpool/size_classes.hpp"

namespace tensorpool {

using detail::GraphPoolRec;
using detail::hex;

namespace {

std::string stream_name(Stream stream) { return "stream " + hex(stream); }

}  // namespace

GraphPool Allocator::Impl::begin_capture(Stream stream, std::size_t reserve) {
  Lock lock(shards);
  if (reserve == 0)
    throw UsageError("tensorpool: begin_capture(" + stream_name(stream) +
                     ", 0): a new graph pool needs a reserve (the bytes its capture may hold at once)");
  if (const GraphPoolRec* busy = graphs.capturing(stream))
    throw UsageError("tensorpool: begin_capture: " + stream_name(stream) + " is already captured into graph pool " +
                     std::to_string(busy->id) + " (end_capture first)");
  GraphPoolRec& pool = graphs.create();
  try {
    reserve_range(pool, stream, reserve, lock);
  } catch (...) {
    graphs.erase(pool.id);  // nothing reserved: as if never made
    throw;
  }
  graphs.start_capture(stream, pool);
  if (hooks.observed()) hooks.notify(EventType::capture_begin, pool.id, 0, reserve, stream);
  debug_check();
  return GraphPool{pool.id};
}

void Allocator::Impl::begin_capture(Stream stream, GraphPool which, std::size_t more) {
  Lock lock(shards);
  GraphPoolRec* pool = graphs.find(which.id);
  if (pool == nullptr || pool->released)
    throw UsageError("tensorpool: begin_capture: graph pool " + std::to_string(which.id) +
                     (pool == nullptr ? " does not exist" : " was released (release_graph)"));
  if (const GraphPoolRec* busy = graphs.capturing(stream))
    throw UsageError("tensorpool: begin_capture: " + stream_name(stream) + " is already captured into graph pool " +
                     std::to_string(busy->id) + " (end_capture first)");
  if (more != 0) reserve_range(*pool, stream, more, lock);
  graphs.start_capture(stream, *pool);
  if (hooks.observed()) hooks.notify(EventType::capture_begin, pool->id, 0, more, stream);
  debug_check();
}

void Allocator::Impl::end_capture(Stream stream) {
  Lock lock(shards);
  const GraphPoolRec* pool = graphs.capturing(stream);
  if (pool == nullptr)
    throw UsageError("tensorpool: end_capture: " + stream_name(stream) +
                     " is not captured into a graph pool (begin_capture was not called for it)");
  const std::uint64_t id = pool->id;
  graphs.end_capture(stream);
  if (hooks.observed()) hooks.notify(EventType::capture_end, id, 0, 0, stream);
  if (!capture_underway()) {
    // The last capture ended: the frees that waited get their events, and those already done
    // (their streams idle) are released now rather than at some later allocation outside a
    // capture, which back-to-back captures would keep from ever coming.
    record_deferred_events();
    if (pending_total_ != 0) process_events();
  }
  debug_check();
}

void Allocator::Impl::release_graph(GraphPool which) {
  Lock lock(shards);
  GraphPoolRec* pool = graphs.find(which.id);
  if (pool == nullptr || pool->released)
    throw UsageError("tensorpool: release_graph: graph pool " + std::to_string(which.id) +
                     (pool == nullptr ? " does not exist" : " was released already"));
  if (!pool->capturing.empty())
    throw UsageError("tensorpool: release_graph: graph pool " + std::to_string(which.id) + " still serves " +
                     stream_name(pool->capturing.front()) + " (end_capture first)");
  pool->released = true;
  if (hooks.observed()) hooks.notify(EventType::graph_release, pool->id, 0, 0, kDefaultStream);
  give_back_if_done(*pool);
  debug_check();
}

std::vector<GraphPoolInfo> Allocator::Impl::graph_pools() const {
  Lock lock(shards);
  return graphs.infos();
}

// Before the capture: `bytes` more for the pool, as one block of the stream under the graph
// pools' tag (its own heap in vmm mode). The block's `uses` is set (empty) so that the fast path
// never frees it: a free of its address goes to the pool (deallocate_exclusive).
void Allocator::Impl::reserve_range(GraphPoolRec& pool, Stream stream, std::size_t bytes, Lock& lock) {
  if (device->is_capturing(stream))
    throw UsageError("tensorpool: begin_capture: " + stream_name(stream) + " is being captured already; reserving " +
                     format_bytes(bytes) + " now would ask the device for memory inside the capture. Call "
                     "begin_capture before cudaStreamBeginCapture (or join a pool with nothing more to reserve)");
  static const detail::TagId tag = detail::intern_tag(detail::kGraphPoolsTag);
  // Observers see the range as an allocation of its own (under the tag), held until the pool
  // goes; the blocks cut from it are not events (a replay holds the reserve for the graph).
  const auto addr = reinterpret_cast<Address>(allocate_locked(bytes, {stream, tag}, lock));
  Block* b = find_live(addr);
  b->uses = new std::vector<Stream>();
  graphs.add_range(pool, addr, b->size);
}

void* Allocator::Impl::allocate_captured(GraphPoolRec& pool, std::size_t bytes, Stream stream) {
  counters.count(&Stats::alloc_calls);
  const std::size_t size = bytes <= kMaxAllocationSize ? round_size(bytes) : kMaxAllocationSize;
  const std::optional<Address> at = pool.space.take(size);
  if (!at) throw_graph_pool_exhausted(pool, bytes, size, stream);
  pool.live.emplace(*at, size);
  pool.allocated += size;
  pool.peak_allocated = std::max(pool.peak_allocated, pool.allocated);
  pool.capture_peak = std::max(pool.capture_peak, pool.allocated);
  debug_check();
  return reinterpret_cast<void*>(*at);
}

void Allocator::Impl::throw_graph_pool_exhausted(const GraphPoolRec& pool, std::size_t bytes, std::size_t size,
                                                 Stream stream) {
  counters.count(&Stats::ooms);
  // What the capture holds at once with this request, and a reserve that serves it whatever the
  // pool's free space is cut into: the pool's, plus this request.
  const std::size_t needed = std::max(pool.capture_peak, pool.allocated + size);
  const std::size_t suggested = round_up(pool.reserved + size, 2 * MiB);
  // The pool's figures, not the device's (nothing asks the device during a capture).
  const OutOfMemoryInfo info{.requested = bytes, .rounded = size, .stream = stream, .device = props.ordinal,
                             .capacity = props.capacity, .device_free = 0, .reserved = pool.reserved,
                             .allocated = pool.allocated, .reserved_unallocated = pool.reserved - pool.allocated,
                             .largest_free_block = pool.space.largest(), .memory_limit = limit,
                             .cached_per_stream = {}};
  throw GraphPoolExhaustedError(
      info,
      "tensorpool: out of memory in CUDA graph pool " + std::to_string(pool.id) + " while " + stream_name(stream) +
          " is captured: " + format_bytes(bytes) + " (rounded to " + format_bytes(size) +
          ") does not fit. The pool reserves " + format_bytes(pool.reserved) + ", of which " +
          format_bytes(pool.allocated) + " are allocated and the largest free piece is " +
          format_bytes(pool.space.largest()) +
          ". A capture never asks the device for memory: reserve at least " + format_bytes(suggested) +
          " for this graph (begin_capture's reserve: the pool's and this request; its requests so far, "
          "this one included, hold " + format_bytes(needed) + " at once)",
      pool.id, suggested);
}

bool Allocator::Impl::free_captured(Address addr) {
  GraphPoolRec* pool = graphs.owner_of(addr);
  if (pool == nullptr) return false;
  const auto it = pool->live.find(addr);
  if (it == pool->live.end())
    throw UsageError("tensorpool: free of " + hex(addr) + ": the address lies in graph pool " +
                     std::to_string(pool->id) + " but is not one of its live blocks (a double free, or "
                     "a pointer inside a block)");
  counters.count(&Stats::free_calls);
  pool->space.give_back(addr, it->second);
  pool->allocated -= it->second;
  pool->live.erase(it);
  give_back_if_done(*pool);
  return true;
}

// A released pool with no live block: its ranges are freed like any block (into the cache of
// their stream and tag), and the pool is forgotten.
void Allocator::Impl::give_back_if_done(GraphPoolRec& pool) {
  if (!pool.released || !pool.live.empty()) return;
  const std::map<Address, std::size_t> ranges = pool.space.ranges();
  graphs.erase(pool.id);
  for (const auto& [addr, bytes] : ranges) {
    Block* b = find_live(addr);
    delete b->uses;  // empty: only there to keep the fast path away
    b->uses = nullptr;
    deallocate_locked(b);
  }
}

void Allocator::Impl::refuse_while_capturing(const char* operation) const {
  if (!capture_underway()) return;
  graphs.for_each([&](const GraphPoolRec& pool) {
    if (pool.capturing.empty()) return;
    throw UsageError(std::string("tensorpool: ") + operation + " while " + stream_name(pool.capturing.front()) +
                     " is captured into graph pool " + std::to_string(pool.id) +
                     " would call the device or synchronize; end_capture first");
  });
}

void detail::AllocatorState::refuse_if_captured(Stream stream) const {
  if (!device->is_capturing(stream)) return;
  throw UsageError("tensorpool: allocation on " + stream_name(stream) +
                   ", which the device says is being captured into a CUDA graph: growing would ask "
                   "the device for memory inside the capture. Call begin_capture(stream, reserve) "
                   "before cudaStreamBeginCapture");
}

}  // namespace tensorpool
