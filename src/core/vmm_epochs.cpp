// vmm_epochs.cpp: the epochs of a vmm heap (vmm_heaps.hpp): held pages, and the planned layouts
// that serve an epoch which repeats the one before it.
//
// An epoch of a heap runs from a moment it has nothing allocated to the next; the fast path
// records its allocations (size, lifetime, offset) in the heap's EpochLog (epoch_log.hpp) and
// calls end_epoch() when the heap is left empty.
//
// Held pages: when an epoch ends, the heap's mapped memory is not put in the free index but held
// (HeldPages), and comes back a growth step at a time, without device calls, when nothing in the
// index fits (from_held()), exactly as the heap first grew from the device. Held pages are free
// memory (stats, fragmentation, snapshots say so); growth that they cannot serve, pressure and
// release() give them back to the index first. The chunks an epoch mapped above every block it
// allocated (a growth maps ahead of need) are released when the heap empties (release_never_used()).
//
// Planned layouts: the recorded epoch is planned offline (layout_plan.hpp: the lowest of the
// recorded layout, an ideal online allocator's and a packing by size), by the planner thread or, with vmm_planner:synchronous,
// in the free that ends it (vmm_planner.hpp), and stored in the heap's PlanCache under the
// signature of the epoch before it; the next epoch gets the plan stored after an epoch like the
// one that just ended, else that one's own (or the latest of its kind, while the thread plans it).
// While the epoch makes the plan's requests in order, the PlanCursor says `following` and each
// request is served at its planned offset (take_planned()), carved from held or free memory, with
// no device call and no search of the index. The plan needs the memory from the heap's start to
// its height mapped; holes there (empty_cache()) are mapped as the steps reach them
// (map_planned()); pages that lie elsewhere (remapped under pressure) are mapped back there once
// the stream's work on them is done (a query or an event, never a wait: map_plan(), at once or at
// the next epoch's first request; PlanCursor `laying_out` meanwhile). Once an epoch repeats its
// plan (or two plans take turns), or the next epoch follows the plan of one that ran from an
// empty heap to an empty heap, the chunks above the plans' heights are released, once the work
// on them is done too (give_back_above_plan()). A request the plan did not foresee departs from it
// for the rest of the epoch (the held pages serve it), and that epoch is planned afresh. A program
// that repeats its steps from an empty heap so runs them at the height its plan reaches, with no
// device call (docs/vmm.md, "Planned layouts").
//
// Step epochs (a heap that never empties, ended at step boundaries) are planned the same way,
// around their base: vmm_steps.cpp (the boundaries, the next epoch's plan, a step's mirror, whole
// runs). Laying a plan's pages out before it is followed (map_plan(), the trade of holes under a
// step's base for the pages above its plan) is vmm_layout.cpp.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/logging.hpp"
#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

// --- held pages -----------------------------------------------------------------------------

namespace {

bool starts_before(const std::pair<Address, Block*>& entry, Address addr) { return entry.first < addr; }

}  // namespace

HeldPages::Entries::iterator HeldPages::position(Address addr) noexcept {
  return std::lower_bound(blocks_.begin(), blocks_.end(), addr, starts_before);
}

Block* HeldPages::find(Address addr) const noexcept {
  const auto it = std::lower_bound(blocks_.begin(), blocks_.end(), addr, starts_before);
  return it != blocks_.end() && it->first == addr ? it->second : nullptr;
}

Block* HeldPages::hold(Block* x, BlockPool& blocks) {
  x->held = true;
  bytes_ += x->size;
  if (x->next != nullptr && x->next->held) {
    blocks_.erase(position(x->next->addr));
    blocks.absorb_next(x);
  }
  if (x->prev != nullptr && x->prev->held) {
    x = x->prev;
    blocks.absorb_next(x);
  } else {
    blocks_.insert(position(x->addr), {x->addr, x});
  }
  return x;
}

Block* HeldPages::unhold(Block* r, std::size_t bytes, BlockPool& blocks) {
  const auto it = position(r->addr);
  if (bytes < r->size) {
    Block* rest = blocks.split_at(r, bytes);
    rest->held = true;
    *it = {rest->addr, rest};  // inside r's range: the order stays
  } else {
    blocks_.erase(it);
  }
  r->held = false;
  bytes_ -= r->size;
  return r;
}

// Holds every free mapped block of the heap: `freed` (in no index; nullptr: none) and those in
// the index.
void VmmHeaps::hold_all(Heap& heap, Block* freed) {
  for (Block* x = heap.segment->first; x != nullptr; x = x->next) {
    if (x != freed && free_mapped(x)) {
      heap.index().remove(x);
      x = heap.held.hold(x, heap.blocks());
    }
  }
  if (freed != nullptr) heap.held.hold(freed, heap.blocks());
}

// Serves a request from held pages when a held block (with the free block before it) fits: as
// a growth would map (the shortfall in pages, at least a growth step), unholds the front of it
// and returns the free block it joined, in the index.
Block* VmmHeaps::from_held(Heap& heap, std::size_t size) {
  Block* r = held_block_for(heap, size);
  if (r == nullptr) return nullptr;
  const std::size_t before = free_mapped(r->prev) ? r->prev->size : 0;
  const std::size_t need = size > before ? round_up(size - before, page_) : page_;
  Block* front = heap.held.unhold(r, std::min(r->size, std::max(need, growth_step(heap.pool()))), heap.blocks());
  Block* merged = st_.coalesce(front);
  heap.index().insert(merged);
  return merged;
}

// The first held block that, with the free block before it, holds `size` bytes; nullptr if none.
Block* VmmHeaps::held_block_for(const Heap& heap, std::size_t size) const {
  for (const auto& [addr, r] : heap.held.blocks()) {
    const std::size_t before = free_mapped(r->prev) ? r->prev->size : 0;
    if (before + r->size >= size) return r;
  }
  return nullptr;
}

// Gives every held block of `pool` back to the free index (before mapping, reclaiming,
// releasing), but those of the heaps `spare` names.
void VmmHeaps::release_held(Pool pool, Spare spare) {
  for (auto& [base, heap] : heaps_)
    if (heap.pool() == pool && !(spare == Spare::following && plan_asks_source(heap.cursor.state())))
      release_held(heap);
}

void VmmHeaps::release_held(Heap& heap) {
  while (!heap.held.empty()) {
    Block* r = heap.held.blocks().begin()->second;
    Block* merged = st_.coalesce(heap.held.unhold(r, r->size, heap.blocks()));
    heap.index().insert(merged);
  }
}

// --- the end of an epoch --------------------------------------------------------------------

// b, free and coalesced (in no index), leaves its heap with nothing allocated: the epoch ends.
// A lone block that repeats goes back to the index (epoch_end_of()); else all the heap's free
// mapped memory is held (b and every free block after an unmapped hole), and the epoch just
// recorded is planned for the next one. The fast path's answer is taken as it is (asked under
// the same lock, a moment before); without one, the end asks.
Block* VmmHeaps::end_epoch(Block* b) {
  Heap& heap = heap_of(b);
  const EpochEnd known = std::exchange(heap.epoch.end_known, EpochEnd::unknown);
  const EpochEnd end = known != EpochEnd::unknown ? known : epoch_end_of(b);
  if (end == EpochEnd::to_index) {
    heap.run.restart();
    if (heap.cursor.state() != PlanState::recording) heap.cursor.record();
    // An asleep heap records on: a later free of one of its asleep blocks is counted in the
    // record (forget_asleep()), and a stopped record resumes only at a sleep or a growth.
    if (heap.asleep) {
      heap.begin_epoch();
    } else {
      heap.stop_recording();
    }
    if (heap.held.empty()) return b;  // to the free index, as any free block
    heap.held.hold(b, heap.blocks());  // a heap that keeps its pages: b and its held pages, joined
    release_held(heap);
    return nullptr;
  }
  hold_all(heap, b);
  if (!heap.epoch.at_step) heap.run_floor = 0;  // an epoch that began empty ended: no floor
  if (end == EpochEnd::held) {
    // plan_next_epoch()'s first case, with the pages in place. Nothing was mapped and left unused:
    // the epoch's blocks lay where the plan puts them, up to its height, and nothing lies above.
    st_.counters.count(&Stats::planned_epochs);
    heap.cursor.follow_again();
  } else if (heap.epoch.at_step) {
    // A step epoch emptied the heap: its record gets the base blocks it freed, and the next
    // epoch, which begins from an empty heap, is not this one around its base.
    release_never_used(heap);
    add_freed_base(heap.epoch);
    join_run(heap, RunRecord::EpochEnded::emptied);
    choose_next_plan(heap, NextBase::emptied, heap.epoch.base_signature);
  } else {
    release_never_used(heap);
    choose_next_plan(heap, NextBase::same, heap.epoch.base_signature);
  }
  heap.run.restart();  // the heap is empty: a run begins
  heap.begin_epoch();
  return nullptr;
}

// The heap just emptied: the chunks the epoch mapped above every block it held (a growth maps
// ahead of need) were never touched by a kernel, so they are unmapped and released at once, with
// no event and no wait. The next epoch that makes the same requests needs only the pages below
// (the held pages serve it as the growth did), so a repeated step holds what it uses, not what
// its first growth mapped ahead. Chunks that lay mapped when the epoch began stay: an earlier
// epoch's kernels may still use them (give_back_above_plan() waits for an event for those).
void VmmHeaps::release_never_used(Heap& heap) {
  if (!has_never_used_pages(heap) || st_.capture_underway() || !heap.sleeping.empty()) return;
  try {
    release_above(heap, never_used_from(heap));
  } catch (const DeviceError& e) {  // the heap stays consistent: what was not released stays mapped
    log().warn("vmm: releasing the pages an epoch mapped and never used failed: {}", e.what());
  }
  hold_all(heap, nullptr);  // release_above() gave the held pages back to the index
}

// The end of an epoch that does not simply repeat its plan in place: the next epoch's plan, and
// the give-back of the pages above a plan that is followed again, or followed for the first time
// after the whole run it lays out.
void VmmHeaps::choose_next_plan(Heap& heap, NextBase next_base, std::uint64_t next_base_signature) {
  // The plan this epoch followed to the end, if it did: when the next epoch follows it again, or
  // follows the plan the epoch before this one followed (two plans in turn: a step whose base
  // takes turns between two layouts), what lies above their heights can go
  // (give_back_above_plan()). An epoch that followed no plan but ran from an empty heap to an
  // empty heap, over no step boundary, is all the program did with the heap: the next epoch that
  // follows its plan is a repeat, and what lies above that plan can go too, once the work this
  // epoch queued there is done (a new event). The remainder of a run after a step boundary is
  // not: its plan lays out only its own blocks.
  std::shared_ptr<const EpochPlan> followed;
  if (heap.cursor.matched(heap.epoch.allocations())) {
    followed = heap.cursor.plan();
    st_.counters.count(&Stats::planned_epochs);
  }
  NextHeights heights;
  if (next_base != NextBase::emptied && repeats_in_place(heap)) {
    heap.cursor.follow_again();
  } else {
    heights = plan_next_epoch(heap, next_base, next_base_signature);
  }
  const EpochPlan* next = heap.cursor.plan().get();
  const bool follows = heap.cursor.state() == PlanState::following;  // with a plan: next
  const bool in_turn = follows && followed != nullptr &&
                       (next == followed.get() || next == heap.followed_before.get());
  const bool repeats_whole_run = follows && followed == nullptr && heap.epoch.empty_to_empty();
  // The next step is the other turn of this one (its kept blocks where this one's base had them,
  // next_turn()): the two plans take turns from now on, and nothing above both is used again.
  // A step that ran online gives back only what it reached or mapped itself (the top chunk is
  // its own, or every chunk above what it reached was mapped by its growths, past the block that
  // needed them): a chunk an earlier step mapped above it says the steps go higher.
  const bool takes_turns = follows && heights.turns != 0 && (followed != nullptr || pages_above_are_own(heap));
  if (next_base == NextBase::emptied) {
    // A run from the emptied heap whose every plan is stored follows them within the height of
    // the highest (the stream's work is done: run_plans()); what lies above was used by the run
    // that ended, online. Any other run keeps what the one that ended held (Heap::run_floor).
    drop_event(heap.give_back_event);
    const bool run_planned = follows && heights.run != 0;
    heap.run_floor = run_planned ? 0 : heap.mapped_end - heap.segment->addr;
    // The plan of the whole run is known: pages kept since a give-back (keeps_pages) are not
    // needed by it.
    if (run_planned && next->boundaries != 0) heap.keeps_pages = heap.gave_back = false;
    if (run_planned) give_back_above_plan(heap, heights.run);
  } else if (in_turn) {
    give_back_above_plan(heap, std::max(followed->height, next->height));
  } else if (takes_turns) {
    if (followed == nullptr) drop_event(heap.give_back_event);  // this step ran online: it may have used them
    give_back_above_plan(heap, heights.turns);
  } else if (repeats_whole_run) {
    drop_event(heap.give_back_event);  // recorded before this epoch, which may have used those pages
    give_back_above_plan(heap, next->height);
  } else {
    drop_event(heap.give_back_event);
  }
  heap.followed_before = std::move(followed);
}

// Once the next epoch follows a plan again, or follows the plan of a whole run
// (choose_next_plan()), the pages above the plan's height are never touched while the plan is
// followed: the chunks that lie entirely above it are unmapped and released once the work the
// stream queued on them is done (at once if a query of the stream says so, else an event
// recorded at the first such epoch end, queried at each; never a wait), and the one that reaches
// across it is cut to it (trim_chunk_at()), so that a repeated step holds the plan's height and
// not what its first, unplanned run mapped; the pool's chunks cached unmapped go at once
// (give_back_cached()). An epoch that departs drops the event: the pages may have been used
// again. Never below Heap::run_floor: a run that its plans do not cover reaches what the run
// before it did.
void VmmHeaps::give_back_above_plan(Heap& heap, std::size_t height) {
  height = std::max(height, heap.run_floor);
  give_back_cached(heap);
  if (heap.mapped_end <= heap.segment->addr + height || heap.keeps_pages) {
    drop_event(heap.give_back_event);
    return;
  }
  if (st_.capture_underway()) return;  // no device call during a capture
  try {
    // Done now (the stream queried here), or when an event recorded at an earlier epoch's end
    // was: the plan's blocks may have used the chunk across the height since.
    StreamWork work = StreamWork::done;
    if (heap.give_back_event == 0) {
      heap.give_back_event = event_pending_on(heap);
      if (heap.give_back_event != 0) return;  // at a later epoch's end
    } else if (!st_.device->query_event(heap.give_back_event)) {
      return;  // at a later epoch's end
    } else {
      work = StreamWork::may_run;
    }
    drop_event(heap.give_back_event);
    const std::size_t before = heap.chunk_bytes;
    release_above(heap, heap.segment->addr + height);
    trim_chunk_at(heap, heap.segment->addr + height, work);
    heap.gave_back = heap.gave_back || heap.chunk_bytes < before;
  } catch (const DeviceError& e) {  // the heap stays consistent: what was not given back stays mapped
    drop_event(heap.give_back_event);
    log().warn("vmm: giving back the pages above a plan's height failed: {}", e.what());
  }
}

// Unmaps and releases every chunk of the empty heap that starts at or above `top` and lies under
// a free block.
void VmmHeaps::release_above(Heap& heap, Address top) { release_if_cached(cache_above(heap, top)); }

// Unmaps every chunk of the empty heap that starts at or above `top` and lies under a free block
// into the cache (their places become holes); their handles. A DeviceError leaves what was not
// unmapped mapped, and what was in the cache, accounted for.
std::vector<PhysicalHandle> VmmHeaps::cache_above(Heap& heap, Address top) {
  release_held(heap);
  std::vector<Chunk> above;
  for (auto it = heap.chunks.lower_bound(top); it != heap.chunks.end(); ++it) above.push_back(it->second);
  std::vector<PhysicalHandle> cached;
  // One walk of the blocks beside the chunks (both go by address), not one from the heap's start
  // per chunk: `from` is a block at or before the next chunk. After an unmap the walk goes on
  // from the hole over the chunk (the blocks beside it may have merged into it), as
  // unstitch_free() does.
  Block* from = heap.segment->first;
  for (const Chunk& c : above) {
    if (c.stitched()) continue;  // its pages are another chunk's (vmm_stitch.cpp)
    Block* b = block_holding(from, c.addr);
    from = b;
    if (!covers_free(b, c)) continue;  // a live block lies on it: another stream's (oom_ladder.cpp)
    cache_chunk_under(heap, b, c);
    cached.push_back(c.handle);
    from = hole_holding(heap, c.addr);
  }
  return cached;
}

// The free block (in the index: nothing held) that covers chunk c, or nullptr when a live block
// lies on it (another stream took a block here, oom_ladder.cpp, and still holds it) or c is
// stitched (vmm_stitch.cpp: its pages are another chunk's).
Block* VmmHeaps::free_block_over(const Heap& heap, const Chunk& c) const noexcept {
  return c.stitched() ? nullptr : free_block_covering(heap, c);
}

// The free mapped block, not held, that covers chunk c (stitched or not), or nullptr.
Block* VmmHeaps::free_block_covering(const Heap& heap, const Chunk& c) noexcept {
  Block* b = block_holding(heap.segment->first, c.addr);
  return covers_free(b, c) ? b : nullptr;
}

// The block that holds address `at`, walking on from `from`, a block at or before it (a heap's
// blocks cover its range in address order).
Block* VmmHeaps::block_holding(Block* from, Address at) noexcept {
  while (from->addr + from->size <= at) from = from->next;
  return from;
}

// Whether b, the block that holds chunk c's start, is free, mapped and not held, and covers c.
bool VmmHeaps::covers_free(const Block* b, const Chunk& c) noexcept {
  return free_mapped(b) && b->addr + b->size >= c.end();
}

// Unmaps chunk c from under the free block b into the cache (b's pieces around it stay in the
// index, its place becomes a hole). A DeviceError leaves c mapped.
void VmmHeaps::cache_chunk_under(Heap& heap, Block* b, const Chunk& c) {
  heap.index().remove(b);
  Block* after = nullptr;
  try {
    after = unmap_chunk(heap, b, c);
  } catch (...) {  // refused before anything changed: b stays free, mapped, in the index
    heap.index().insert(b);
    throw;
  }
  if (after != nullptr) heap.index().insert(after);
}

// cache_chunk_under(), then c is released. A DeviceError leaves c mapped, or cached and
// accounted for.
void VmmHeaps::release_chunk_under(Heap& heap, Block* b, const Chunk& c) {
  cache_chunk_under(heap, b, c);
  release_if_cached({c.handle});
}

// Releases the chunks of these handles that are still in the cache (a trade mapped the others).
// A DeviceError leaves the rest cached, accounted for.
void VmmHeaps::release_if_cached(const std::vector<PhysicalHandle>& handles) {
  for (const PhysicalHandle handle : handles) {
    const std::optional<Chunk> c = cached_.take_handle(handle);
    if (!c) continue;
    try {
      release_chunk(*c);
    } catch (...) {  // still accounted for, as a cached chunk
      cached_.put(*c);
      throw;
    }
  }
}

// After release_above(heap, top): the chunk that holds `top` (a page boundary: a plan's height)
// and reaches above it, when a free block covers it, is replaced by a chunk that ends at `top`,
// so that the heap holds the plan's height and not the chunk an online growth mapped across it
// (up to vmm_max_chunk, or 1/1024 of the device past a block: chunk_floor()). Only once the
// work the heap's stream queued so far is done: `work` says so when the caller has just asked,
// else (StreamWork::may_run) the stream is queried (never a wait; if busy, a later give-back
// cuts it): the plan's blocks below `top` may have used the chunk since the give-back's event.
// Four calls, once. A DeviceError leaves a hole below `top` (mapped again when a step reaches it)
// or the old chunk.
void VmmHeaps::trim_chunk_at(Heap& heap, Address top, StreamWork work) {
  const ChunkAcross across = chunk_across(heap, top);
  if (across.free == nullptr) return;
  const Chunk c = across.chunk;
  Block* b = across.free;
  if (work == StreamWork::may_run && !stream_work_done(heap)) return;
  release_chunk_under(heap, b, c);
  const auto hole = heap.unmapped.find(c.addr);
  if (hole == heap.unmapped.end()) return;
  const std::size_t bytes = top - c.addr;
  map_into(heap, {.hole = hole->second, .bytes = bytes, .need = bytes, .request = bytes, .block_end = top,
                  .growth = Growth::plan, .limit = top});
}

// When the pages above a plan go (give_back_above_plan()), so do the chunks of the heap's pool
// cached unmapped: chiefly what lay_out() left when it mapped the plan's height from the heap's
// start (a whole run planned from its empty heap held them, 450 MiB of a GPT-2 1.5B loop's 30 GiB,
// benchmarks.md "Cached chunks given back with the pages above a plan"). No kernel can use an
// unmapped chunk (its stream's work was done before it was unmapped), so no event; another heap
// of the pool that needs pages again creates them (and a heap that grows after a give-back keeps
// its pages from then on: Heap::keeps_pages). Not during a capture.
void VmmHeaps::give_back_cached(Heap& heap) {
  if (heap.keeps_pages || st_.capture_underway() || cached_.bytes(heap.pool()) == 0) return;
  try {
    release_chunks(cached_.take_all(heap.pool()));
    heap.gave_back = true;
  } catch (const DeviceError& e) {  // what was not released stays cached, accounted for
    log().warn("vmm: releasing the chunks cached unmapped failed: {}", e.what());
  }
}

// Gives event e back (none: nothing to do).
void VmmHeaps::drop_event(DeviceEvent& e) noexcept {
  if (e == 0) return;
  try {
    st_.device->destroy_event(std::exchange(e, 0));
  } catch (const DeviceError& err) {
    log().warn("vmm: destroying an event failed: {}", err.what());
  }
}

// Inside the heap (no device call, no chunk cache, no planner): a lone block that repeats goes
// to the index (repeats_alone_trivially()); an epoch that repeats its plan, whose pages are in
// place with nothing mapped above its height, holds the heap's free pages and follows the plan
// again. Anything else ends elsewhere.
EpochEnd VmmHeaps::epoch_end_of(const Block* b) const noexcept {
  const Heap& heap = heap_of(b);
  if (repeats_alone_trivially(heap)) return EpochEnd::to_index;
  // A step epoch that empties the heap is followed by an epoch from an empty heap, not by itself.
  if (heap.epoch.at_step) return EpochEnd::elsewhere;
  return repeats_in_place_alone(heap) ? EpochEnd::held : EpochEnd::elsewhere;
}

// --- following a plan -----------------------------------------------------------------------

// The first block of the heap that reaches past the start of the step's range. The search starts
// after the block `below` when that block is still there (allocated at its planned address: a
// step's block as the cursor placed it, or a fixed block found by its address among the shard's
// live blocks), else at the heap's start.
TP_ALWAYS_INLINE Block* VmmHeaps::first_block_of(const Heap& heap, const EpochPlan::Step& step) const {
  const Address at = heap.segment->addr + step.offset;
  Block* x = heap.segment->first;
  if (step.below != PlannedLayout::kNone) {
    const EpochPlan& plan = *heap.cursor.plan();
    const bool fixed = step.below >= plan.steps.size();
    const Address anchor_at =
        heap.segment->addr + (fixed ? plan.fixed_anchors[step.below - plan.steps.size()] : plan.steps[step.below].offset);
    const Block* anchor = fixed ? AllocatorState::shard_of(heap.segment).live.find(anchor_at)
                                : heap.cursor.placed(step.below);
    if (anchor != nullptr && anchor->segment == heap.segment && anchor->addr == anchor_at &&
        anchor->state != BlockState::free && anchor->addr + anchor->size <= at)
      x = anchor->next;
  }
  while (x != nullptr && x->addr + x->size <= at) x = x->next;
  return x;
}

// The free mapped block (in the index or held) that holds the start of the step's range, or
// nullptr.
TP_ALWAYS_INLINE Block* VmmHeaps::find_planned(const Heap& heap, const EpochPlan::Step& step) const {
  Block* x = first_block_of(heap, step);
  const Address at = heap.segment->addr + step.offset;
  if (x == nullptr || x->state != BlockState::free || !x->mapped || x->addr > at) return nullptr;
  return x;
}

// The step's range carved out of the free mapped memory there, or nullptr.
TP_ALWAYS_INLINE Block* VmmHeaps::take_step(Heap& heap, const EpochPlan::Step& step) {
  Block* x = find_planned(heap, step);
  return x != nullptr ? carve(heap, x, heap.segment->addr + step.offset, step.size) : nullptr;
}

Block* VmmHeaps::take_planned(StreamState& ss, Pool pool, std::size_t size, PlannedPages pages) {
  Heap* heap = heap_of(ss, pool);
  if (heap == nullptr) return nullptr;
  PlanCursor& cursor = heap->cursor;
  if (cursor.state() == PlanState::laying_out && !finish_layout(*heap)) return nullptr;
  if (cursor.state() != PlanState::following) return nullptr;
  const EpochPlan::Step& step = cursor.next_step();
  if (step.size != size) {
    cursor.depart();
    return nullptr;
  }
  Block* b = take_step(*heap, step);
  if (b == nullptr && needs_pages(*heap, step)) {
    if (pages == PlannedPages::mapped_only) return nullptr;  // the exclusive path maps them
    if (map_planned(*heap, step)) b = take_step(*heap, step);
  }
  if (b == nullptr) {
    cursor.depart();
    return nullptr;
  }
  cursor.served(b);
  return b;
}

// Whether the step's range is free but lies (in part) where no pages are mapped: a hole that
// empty_cache() or a reclaim left below the plan's height since the plan was laid out.
bool VmmHeaps::needs_pages(const Heap& heap, const EpochPlan::Step& step) const {
  const Address end = heap.segment->addr + step.offset + step.size;
  bool hole = false;
  for (const Block* x = first_block_of(heap, step); x != nullptr && x->addr < end; x = x->next) {
    if (x->state != BlockState::free || x->asleep) return false;
    hole = hole || !x->mapped;
  }
  return hole;
}

// Maps the holes the step's range lies in, each from its start up to the plan's height (the
// epoch that follows the plan will use those pages where they are, so one growth maps them all,
// in chunks sized by new_chunk_size() for Growth::plan). False when that is not possible now (a
// capture is underway, part of the heap sleeps, or the device cannot give the pages the step
// needs).
bool VmmHeaps::map_planned(Heap& heap, const EpochPlan::Step& step) {
  if (st_.capture_underway() || !heap.sleeping.empty()) return false;
  const Address base = heap.segment->addr;
  const Address end = base + step.offset + step.size;
  const Address top = std::max(base + heap.cursor.plan()->height, round_up(end, page_));
  return map_holes(heap, first_block_of(heap, step), end, top, heap.cursor.plan()->height);
}

// Cuts [at, at + size) out of the free mapped memory that starts with x (free, mapped, in the
// index or held, holding `at`): x and the free mapped blocks after it that the range needs are
// taken out of the index or the held pages and merged; the pieces before and after the range go
// to the index. Returns the range as a free block in no index, or nullptr (nothing changed but
// the merge) when free mapped memory does not reach its end.
Block* VmmHeaps::carve(Heap& heap, Block* x, Address at, std::size_t size) {
  const auto take_out = [&](Block* y) {
    if (y->held) {
      heap.held.unhold(y, y->size, heap.blocks());
    } else {
      heap.index().remove(y);
    }
  };
  take_out(x);
  x = st_.coalesce(x);
  for (Block* n = x->next; x->addr + x->size < at + size && n != nullptr && n->state == BlockState::free && n->mapped;
       n = x->next) {
    take_out(n);
    heap.blocks().absorb_next(x);
  }
  FreeIndex& index = heap.index();
  if (x->addr + x->size < at + size) {
    index.insert(st_.coalesce(x));
    return nullptr;
  }
  Block* mid = x;
  if (at > x->addr) {
    mid = heap.blocks().split_at(x, at - x->addr);
    index.insert(x);
  }
  if (mid->size > size) {
    // The rest joins a free mapped block after it (one the range did not need, next to a held
    // block the range took whole).
    Block* rest = heap.blocks().split_at(mid, size);
    if (free_mapped(rest->next)) {
      index.remove(rest->next);
      heap.blocks().absorb_next(rest);
    }
    index.insert(rest);
  }
  return mid;
}

}  // namespace tensorpool::detail
