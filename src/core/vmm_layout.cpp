// vmm_layout.cpp: the pages a vmm heap's plan needs, put in place before the plan is followed.
//
// A plan serves its requests at offsets from the heap's start up to its height, so those pages
// must be mapped. map_plan() makes them so: for an empty heap by laying the heap's chunks out
// again from its start (lay_out()), for a step epoch (nothing moves under its base) by trading
// the holes under the base for the chunks above the plan's height (trade_pages_above()). Pages
// move only once the work the heap's stream queued on them is done: at once when a query of the
// stream says so, else behind an event, at the next epoch's first request (finish_layout(), one
// synchronization at most). So these calls come where an epoch ends (the free that empties the
// heap, or step()) or at the next epoch's first request; holes left below a plan's height with
// nothing above it are mapped as its steps reach them instead (map_planned(), vmm_epochs.cpp).
// docs/vmm.md, "Planned layouts" and "Steps".
#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "core/logging.hpp"
#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

// Makes [start, start + height) of the empty heap mapped (and held), if the physical memory
// the heap and the cache hold can (or, after an epoch that remapped idle pages, with what it
// lacks created: affords_layout()): when it is not already, every chunk of the heap is unmapped
// and chunks are mapped back from the heap's start, its own and the cached ones (then new ones),
// until the plan's height is covered. The pages move only once the work the heap's stream queued
// on them is done (never a wait here): the layout is made at once if a query of the stream says
// so, else an event is recorded, and it is made at the next epoch's first request, after a
// synchronization if the event has not completed by then (finish_layout()). A heap whose pages
// empty_cache() cycles gets its plan's pages in fresh, larger chunks instead (rechunks()).
Layout VmmHeaps::map_plan(Heap& heap, std::size_t height) {
  // Lent pages (vmm_stitch.cpp) are neither the program's nor free: no layout moves around them.
  if (!heap.lent.empty()) return Layout::impossible;
  if (rechunks(heap, height)) return lay_out(heap, height, Chunks::fresh) ? Layout::ready : Layout::impossible;
  // Holes below the height and no chunk above it (empty_cache() or a reclaim unmapped pages in
  // place): the epoch maps the holes as its steps reach them (map_planned()), nothing moves.
  if (heap.mapped_prefix >= height || heap.mapped_end <= heap.segment->addr + height) return Layout::ready;
  // Here the heap has holes below the height and chunks above it. A step epoch's base
  // (vmm_steps.cpp): nothing moves under it, and what lies above the height goes
  // only once the plan repeats, so mapping the holes and keeping the chunks would hold both until
  // then (up to 1.5 GiB above the online peak on the loops of docs/benchmarks.md, "Steps found
  // from the requests"): the holes are traded for the chunks above where trade_pages_above()
  // allows, else the plan is not followed and the step runs online, with the pages it has.
  if (heap.epoch.live != 0) return trade_pages_above(heap, height);
  if (!affords_layout(heap, height)) return Layout::impossible;
  if (st_.capture_underway()) return Layout::impossible;  // no device call during a capture
  const Layout deferred = defer_until_work_done(heap, PendingLayout::whole_heap, height);
  if (deferred != Layout::ready) return deferred;
  return lay_out(heap, height) ? Layout::ready : Layout::impossible;
}

// Whether the pages can move now (ready: the stream's work on them is done, a query says so);
// else an event is recorded and the heap waits to make `what` at its next epoch's first request
// (finish_layout(): waiting), or the event failed and the plan is not followed (impossible).
Layout VmmHeaps::defer_until_work_done(Heap& heap, PendingLayout what, std::size_t height) {
  try {
    if (const DeviceEvent pending = event_pending_on(heap); pending != 0) {
      heap.layout_event = pending;
      heap.pending_layout = what;
      heap.trade_height = height;
      return Layout::waiting;
    }
  } catch (const DeviceError& err) {  // no layout, no plan: the heap runs unplanned
    log().warn("vmm: an event before moving a planned heap's pages failed: {}", err.what());
    return Layout::impossible;
  }
  return Layout::ready;
}

// map_plan() for a step epoch whose heap has holes below the plan's height (an idle remap or
// empty_cache() took pages from beside its base) and chunks above it. The holes are traded for
// the pages above the height when they come to no more than those pages (the heap then holds no
// more than before) and either to at most a growth step (what the step's own growth maps
// online), or the step just ended remapped idle pages of the heap online (a synchronization,
// which the next step run online from these pages makes again: the trade costs calls in step()
// once, and no synchronization). When the work the heap's stream queued so far is done (a query
// of the stream, never a wait), the chunks wholly above the height are unmapped and mapped into
// the holes where they fit (no new memory), the rest released, and the one across the height cut
// to it (trim_chunk_at()). Else (a device behind the host) a small trade is made at once: the holes
// are mapped now and the chunks above released behind an event once the plan is followed
// (give_back_above_plan()); a large one, which would hold both for a whole step, waits for the
// work and is made at the next step's first request (trade_after_work()). The plan's pages are
// then in place, and the calls come in step() (or in that request), none later in the step. Larger
// holes are left in a step that did not remap: trading them cost the warm passes of loops whose
// steps run online quietly (docs/benchmarks.md, "Small holes under a step's base"). A predicted
// step (Heap::predicting) trades whatever the holes are: the pages above go into them and what
// they still lack is created, as its step would map it when it reaches the holes; refused, it ran
// online from those pages, remapping idle ones and leaving holes again, step after step (CS336
// small, autocast at context 1024: 1.0328 of what it requested with 2 synchronizations from the
// third step, 1.0093 with none planned). Not in a heap that keeps its pages (it grew again after
// a give-back), nor during a capture. O(the heap's blocks below the height).
Layout VmmHeaps::trade_pages_above(Heap& heap, std::size_t height) {
  if (heap.keeps_pages || st_.capture_underway()) return Layout::impossible;
  const Address top = heap.segment->addr + height;
  const std::size_t holes = hole_bytes_below(heap, top);
  const std::size_t wholly_above = chunk_bytes_from(heap, top);
  const ChunkAcross cut = chunk_across(heap, top);
  const std::size_t across = cut.free != nullptr ? cut.chunk.end() - top : 0;
  const bool small = holes <= growth_step(heap.pool());
  const bool refused = (!small && !heap.remapped_idle) || holes > wholly_above + across;
  if (refused && !heap.predicting) return Layout::impossible;
  const bool work_done = stream_work_done(heap);
  if (!work_done && (!small || holes > wholly_above)) return trade_after_work(heap, height);
  if (!work_done) return map_holes(heap, heap.segment->first, top, top, height) ? Layout::ready : Layout::impossible;
  return trade_now(heap, height);
}

// The trade, the stream's work on the pages done. A growth past the plan from here on keeps its
// pages (no trade again).
Layout VmmHeaps::trade_now(Heap& heap, std::size_t height) {
  const Layout moved = move_pages_into_holes(heap, height);
  if (moved == Layout::ready) heap.gave_back = true;
  return moved;
}

// A trade of pages above the plan's height for the holes under a step epoch's base that must wait
// for the work the stream queued on them (a device behind the host): an event is recorded, and
// the next step's first request makes the trade (finish_layout()), after a synchronization if
// the work is still not done, as for the layout of an emptied heap. Refused instead, the step
// runs online from the pages it has, remapping idle ones (a synchronization too), and a step run
// online is never planned within the pages it holds (take_turn()): on such a device the loop ran
// online from then on, synchronizing every few steps (docs/benchmarks.md, "A trade that waits for
// the device").
Layout VmmHeaps::trade_after_work(Heap& heap, std::size_t height) {
  const Layout deferred = defer_until_work_done(heap, PendingLayout::pages_above, height);
  if (deferred != Layout::ready) return deferred;
  return trade_now(heap, height);  // the work is done after all
}

// Once the stream's work on the heap's pages is done (trade_pages_above() for a step epoch,
// lay_out() for an empty heap): the chunks above the plan's height are unmapped into the cache
// and mapped into the holes below it where they fit (two calls each, no new memory), what the
// holes do not take is released, what they still lack is created, and the chunk across the
// height is cut to it. If the holes cannot be mapped, what was moved stays cached.
Layout VmmHeaps::move_pages_into_holes(Heap& heap, std::size_t height) {
  const Address top = heap.segment->addr + height;
  std::vector<PhysicalHandle> moved;
  try {
    drop_event(heap.give_back_event);
    moved = cache_above(heap, top);
  } catch (const DeviceError& e) {  // the heap stays consistent: what was not unmapped stays mapped
    log().warn("vmm: unmapping the pages above a plan failed: {}", e.what());
    return Layout::impossible;
  }
  const bool mapped = map_holes(heap, heap.segment->first, top, top, height);
  if (!mapped) return Layout::impossible;  // the chunks not mapped again stay cached, for the epoch online
  try {
    release_if_cached(moved);
    trim_chunk_at(heap, top, StreamWork::done);  // the stream's work is done: asked just now
  } catch (const DeviceError& e) {  // what was not released stays mapped or cached, accounted for
    log().warn("vmm: releasing the pages above a plan failed: {}", e.what());
  }
  return Layout::ready;
}

// Whether lay_out() moves only the pages above `height` into the holes below it, leaving the
// chunks below where they are (two calls per chunk moved, a few for what the holes still lack),
// rather than unmapping and mapping back every chunk of the heap (two calls per chunk: 4,000 on a
// 3B training step whose first run remapped idle pages to its top): when those pages (the chunks
// wholly above the height, the part of the one across it) and the pool's cached chunks cover the
// holes, or when the heap lacks pages for the height anyway (what is lacking is created either
// way).
bool VmmHeaps::moves_only_pages_above(const Heap& heap, std::size_t height) const noexcept {
  const Address top = heap.segment->addr + height;
  const ChunkAcross cut = chunk_across(heap, top);  // its pages may be held: `free` not asked
  const std::size_t across = cut.chunk.end() > top ? cut.chunk.end() - top : 0;
  return hole_bytes_below(heap, top) <= chunk_bytes_from(heap, top) + across + cached_.bytes(heap.pool()) ||
         !holds_pages_for(heap, height);
}

// The bytes below `top` that no chunk maps.
std::size_t VmmHeaps::hole_bytes_below(const Heap& heap, Address top) const noexcept {
  std::size_t holes = 0;
  for (const Block* x = heap.segment->first; x != nullptr && x->addr < top; x = x->next)
    if (!x->mapped) holes += std::min<Address>(x->addr + x->size, top) - x->addr;
  return holes;
}

// The bytes of the heap's chunks that start at or above `top`.
std::size_t VmmHeaps::chunk_bytes_from(const Heap& heap, Address top) const noexcept {
  std::size_t bytes = 0;
  for (auto it = heap.chunks.lower_bound(top); it != heap.chunks.end(); ++it) bytes += it->second.size;
  return bytes;
}

// The chunk that holds `top` and reaches above it, and the free block that covers it (then
// trim_chunk_at() may cut it there); `free` null when there is no such chunk or no such block.
VmmHeaps::ChunkAcross VmmHeaps::chunk_across(const Heap& heap, Address top) const noexcept {
  const auto it = heap.chunks.upper_bound(top);
  if (it == heap.chunks.begin()) return {};
  const Chunk& c = std::prev(it)->second;
  if (c.end() <= top || c.addr >= top) return {};
  return {c, free_block_over(heap, c)};
}

// Maps the holes from block x on that begin below `end`, each from its start up to `top` (the
// pages up to `end` at least), in chunks of a planned growth for a plan `request` bytes high
// (new_chunk_size()). False when a mapping failed or fell short: the heap stays consistent, with
// what was mapped.
bool VmmHeaps::map_holes(Heap& heap, Block* x, Address end, Address top, std::size_t request) {
  const Address needed_end = round_up(end, page_);
  while (x != nullptr && x->addr < end) {
    Block* next = x->next;
    if (!x->mapped) {
      const std::size_t bytes = std::min<Address>(x->addr + x->size, top) - x->addr;
      Mapped mapped;
      try {
        mapped = map_into(heap, {.hole = x,
                                 .bytes = bytes,
                                 .need = std::min<std::size_t>(needed_end - x->addr, bytes),
                                 .request = request,
                                 .block_end = x->addr + bytes,
                                 .growth = Growth::plan,
                                 .limit = top});
      } catch (const DeviceError& e) {  // the heap stays consistent; the plan goes unfollowed
        log().warn("vmm: mapping the holes under a plan failed: {}", e.what());
        return false;
      }
      if (!mapped.complete) return false;
      next = mapped.block->next;
    }
    x = next;
  }
  return true;
}

// Whether map_plan() may lay out a plan `height` bytes high in the empty heap: with the physical
// memory the heap and the cache hold; or, after an epoch that remapped idle pages of the heap
// (Heap::remapped_idle: a synchronization each time, which a repeat run online from the held
// pages makes again), by creating what they lack, up to the height that epoch's own layout
// reached (a bound its plans keep: that layout is one of the planner's candidates): memory
// instead of a synchronization per repeat, as PyTorch's allocator keeps its segments.
bool VmmHeaps::affords_layout(const Heap& heap, std::size_t height) const noexcept {
  return holds_pages_for(heap, height) || (heap.remapped_idle && height <= heap.epoch.high);
}

// Whether the heap's chunks and the cached ones of its pool cover `height` bytes.
bool VmmHeaps::holds_pages_for(const Heap& heap, std::size_t height) const noexcept {
  return heap.chunk_bytes + cached_.bytes(heap.pool()) >= height;
}

// map_plan() once the stream's work on the heap's pages is done. When the pages above the height
// cover the holes below it (moves_only_pages_above()), only those move (move_pages_into_holes(),
// then held). Else unmap everything (the heap is empty: every chunk lies under a free block), so
// the heap is one unmapped hole as when it was made, and map it again from its start: with the
// chunks it had and the cached ones, or, for Chunks::fresh, with new chunks of a planned growth's
// size once those are released.
bool VmmHeaps::lay_out(Heap& heap, std::size_t height, Chunks chunks) {
  if (!heap.lent.empty()) return false;  // the heap is not empty (vmm_stitch.cpp)
  if (chunks == Chunks::reuse && moves_only_pages_above(heap, height)) {
    if (move_pages_into_holes(heap, height) != Layout::ready) return false;
    hold_all(heap, nullptr);
    return true;
  }
  try {
    release_held(heap);
    reclaim_heap(heap, 0, StreamWork::done);
    if (chunks == Chunks::fresh) release_chunks(cached_.take_all(heap.pool()));
    Block* hole = heap.segment->first;
    if (hole->mapped || hole->state != BlockState::free) return false;
    Placement where{.hole = hole, .bytes = height, .need = height};
    if (chunks == Chunks::fresh) {
      where.request = height;
      where.growth = Growth::plan;
    }
    const Mapped mapped = map_into(heap, where);
    if (mapped.block == nullptr) return false;
    heap.index().remove(mapped.block);
    heap.held.hold(mapped.block, heap.blocks());
    return mapped.complete;
  } catch (const DeviceError& e) {  // the heap stays consistent, partly mapped; no plan then
    log().warn("vmm: laying out the pages of a planned heap failed: {}", e.what());
    return false;
  }
}

// Whether map_plan() lays the plan's pages out afresh, in chunks of planned_chunk_size(): when
// empty_cache() released pages of the heap in the epoch that ends (cycles_pages: a program that
// empties its cache in its steps does again), every chunk under free pages costs four calls per
// step (unmap and release there, create and map when the step needs the pages again), and the
// heap has more chunks than those would make (those an unplanned growth made, sized for the
// requests and for the fit, vmm_pages.cpp). Costs two calls per chunk now and two per new one,
// and no new memory: only when the heap and the cache hold the plan's height, and never a wait
// (the stream's work on the pages is done already: stream_work_done()).
bool VmmHeaps::rechunks(const Heap& heap, std::size_t height) {
  if (!heap.cycles_pages || heap.epoch.live != 0 || st_.capture_underway()) return false;
  if (!holds_pages_for(heap, height)) return false;
  const std::size_t planned = planned_chunk_size(height);
  return heap.chunks.size() > (height + planned - 1) / planned && stream_work_done(heap);
}

// Whether the work queued on the heap's stream so far has completed (DeviceBackend::query_stream:
// never a wait). False if the device refuses the query.
bool VmmHeaps::stream_work_done(const Heap& heap) {
  try {
    return st_.device->query_stream(heap.stream());
  } catch (const DeviceError& err) {
    log().warn("vmm: querying a heap's stream failed: {}", err.what());
    return false;
  }
}

// 0 when the work queued on the heap's stream so far has completed (a query, never a wait), else
// an event recorded now after it, for the caller to query later and give back. Throws the
// device's error with no event left behind.
DeviceEvent VmmHeaps::event_pending_on(const Heap& heap) {
  if (st_.device->query_stream(heap.stream())) return 0;
  DeviceEvent e = st_.device->create_event();
  try {
    st_.device->record_event(e, heap.stream());
  } catch (const DeviceError&) {
    drop_event(e);
    throw;
  }
  st_.counters.count(&Stats::events_recorded);
  return e;
}

// At the first request of an epoch waiting to lay its plan's pages out: the event is given back
// and the pages move, after a synchronization of the stream if its work on them has not
// completed yet. That allocation is the only one that waits, once per layout: a device that runs
// behind the host has rarely done an epoch's work by the next epoch's first request, and an epoch
// run without its plan instead grows and remaps pages (synchronizing too), and its end asks for
// the same layout again, which is then late again (docs/benchmarks.md, "A device that runs behind
// the host"). A whole layout is only made in an empty heap: a block another stream took from it
// meanwhile (oom_ladder.cpp) drops the plan for this epoch. A step epoch's trade
// (trade_after_work()) moves only free pages around its live base.
bool VmmHeaps::finish_layout(Heap& heap) {
  PlanCursor& cursor = heap.cursor;
  if (st_.capture_underway()) {  // no event query during a capture: the plan waits an epoch
    abandon_layout(heap);
    return false;
  }
  const DeviceEvent e = std::exchange(heap.layout_event, 0);
  const bool trade = heap.pending_layout == PendingLayout::pages_above;
  const bool may_move = trade || heap.epoch.live == 0;
  bool done = false;
  try {
    done = st_.device->query_event(e);
    st_.device->destroy_event(e);
    if (!done && may_move) {
      st_.device->synchronize_stream(heap.stream());
      st_.counters.count(&Stats::syncs);
      done = true;
    }
  } catch (const DeviceError& err) {
    log().warn("vmm: the event of a planned heap's layout failed: {}", err.what());
  }
  const bool moved = done && may_move &&
                     (trade ? trade_now(heap, heap.trade_height) == Layout::ready
                            : lay_out(heap, cursor.plan()->height));
  if (moved) {
    cursor.follow_again();
    return true;
  }
  cursor.record();
  return false;
}

// A layout that waits is given up: its event back, no plan for the epoch.
void VmmHeaps::abandon_layout(Heap& heap) {
  drop_event(heap.layout_event);
  heap.cursor.record();
}

}  // namespace tensorpool::detail
