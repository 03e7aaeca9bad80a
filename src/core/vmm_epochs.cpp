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
// around their base; a step whose base moved only because what it keeps replaced what it freed
// of its base (a loop's logits) is also planned as its mirror, for the next step to follow at
// once (synchronous planner) or from a later step (the planner thread) (next_turn(),
// step_turns.hpp; docs/vmm.md, "Steps"); small holes under a step's base are
// traded for the chunks above its plan (trade_pages_above()). A step epoch that empties the heap
// is followed by an epoch from an empty heap, whose plan is stored under emptied_key() of the
// step's signature (NextBase::emptied); the steps' records since the heap was last empty, joined
// (RunRecord, run_record.hpp), are planned there as one epoch, which that epoch follows over as
// many boundaries as the run went over (plan_run()).
#include <algorithm>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "core/logging.hpp"
#include "core/step_turns.hpp"
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
  const std::size_t step = growth_step(heap.pool());
  for (const auto& [addr, r] : heap.held.blocks()) {
    const std::size_t before = free_mapped(r->prev) ? r->prev->size : 0;
    if (before + r->size < size) continue;
    const std::size_t need = size > before ? round_up(size - before, page_) : page_;
    Block* front = heap.held.unhold(r, std::min(r->size, std::max(need, step)), heap.blocks());
    Block* merged = st_.coalesce(front);
    heap.index().insert(merged);
    return merged;
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
  // A step that ran online gives back only what it reached itself (the top chunk is its own).
  const bool takes_turns =
      follows && heights.turns != 0 && (followed != nullptr || no_chunk_above(heap, heap.epoch.high));
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

// --- step boundaries ------------------------------------------------------------------------

// Allocator::step(). A heap that empties ends its epochs there, whatever the steps: an epoch
// that began where the heap was empty is left alone over one boundary (not at the program's
// first, nor once it has made every request of its plan). A heap that did not empty over a
// whole step (it holds the weights, the optimizer states) has its epochs run from one boundary
// to the next (the first from where the heap was empty, with no base), each planned around its
// base (the blocks live when it began, fixed where they are, each alive until its free or the
// epoch's end); the blocks it allocated and still holds at the boundary count as alive to its
// end (gradients a zero_grad() after the boundary frees). The next epoch that makes the same
// requests follows that plan as an epoch from an empty heap does; a request whose planned place
// is taken (the base differs) departs. At a boundary the program called (`boundary`), a step
// whose kept blocks replaced base blocks it freed is also planned as its mirror, which the next
// step follows (next_turn(); with the planner thread, a later one). An epoch past vmm_plan_max_blocks plans nothing. The next epoch
// begins at the boundary, with the blocks live there as its base, and the epoch that ended is
// joined to the heap's run (RunRecord). An epoch that follows the plan of a whole run goes on over
// as many boundaries as that run did, while it keeps to the plan. O(the heap's blocks), and the
// planning.
void VmmHeaps::step_boundary(StepBoundary boundary) {
  boundary_ = boundary;
  // The program's first step runs from its start: every epoch has gone over a whole step at the
  // program's first boundary.
  const bool first_boundary = boundaries_made_++ == 0;
  for (auto& [start, heap] : heaps_) {
    heap.resume_recording();
    EpochLog& log = heap.epoch;
    if (log.live == 0) continue;
    if (heap.asleep || !heap.sleeping.empty()) {
      heap.run.drop();  // the step is not recorded whole
      continue;
    }
    // An epoch that follows the plan of a whole run (RunRecord) goes on over as many boundaries
    // as that run did, while it keeps to the plan.
    if (heap.cursor.state() == PlanState::following && heap.cursor.plan()->boundaries > log.boundaries) {
      ++log.boundaries;
      continue;
    }
    // An epoch from an empty heap that has made every request of its plan ends here, where the
    // epoch its plan was made from ended (a later run of the program's first step).
    const bool ends_as_planned = heap.cursor.matched(log.allocations());
    const bool whole_step = log.at_step || first_boundary || ends_as_planned;
    if (!whole_step && log.boundaries == 0) {  // on over this one, ended at the next
      ++log.boundaries;
      continue;
    }
    // The blocks live now are the next epoch's base (nothing below allocates or frees one).
    const std::uint64_t next_base = live_signature(heap);
    if (!log.full && !log.entries.empty()) {
      end_step_epoch(heap, next_base);
    } else {
      // An epoch past vmm_plan_max_blocks, or with nothing recorded: it plans nothing, and a plan
      // it followed is left. (Nothing recorded, it may have freed base blocks: the run is joined.)
      join_run(heap, RunRecord::EpochEnded::at_boundary);
      if (heap.cursor.state() == PlanState::laying_out) abandon_layout(heap);
      drop_event(heap.give_back_event);
      heap.cursor.record();
      heap.last_signature = log.signature;
    }
    rebase(heap, next_base);
  }
}

// The step epoch ends: its record gets the base as fixed blocks (where they are, alive from its
// start to their free or its end), the blocks it still holds count as alive to its end, and the
// next epoch's plan is chosen (map_plan() never moves pages under live blocks, and follows a plan
// with holes below its height while chunks lie above it only when the holes are small:
// trade_pages_above()). The free pages are held (once the plan
// is chosen: a walk of the heap) only for a next epoch that follows a plan. One that does not runs
// from the free index, as the program would without step(): held pages replay a growth from an
// empty heap, which a heap with a base never was, and served that way a loop's steps land
// elsewhere than online, higher and with remaps (docs/vmm.md, "Steps").
// `next_base`: live_signature() of the blocks live now, the next epoch's base.
void VmmHeaps::end_step_epoch(Heap& heap, std::uint64_t next_base) {
  EpochLog& log = heap.epoch;
  const Address start = heap.segment->addr;
  for (RecordedBlock& e : log.entries)
    if (e.end == 0) {  // allocated by the epoch, live over the boundary: where the next base has it
      e.end = log.clock;
      e.pinned = true;
    }
  for (const Block* x = heap.segment->first; x != nullptr; x = x->next) {
    if (!held_by_program(x) || x->epoch_slot != EpochLog::kBaseSlot) continue;
    log.entries.push_back(RecordedBlock{x->size, 0, log.clock, x->addr - start, true});
    ++log.fixed;
  }
  add_freed_base(log);
  join_run(heap, RunRecord::EpochEnded::at_boundary);
  choose_next_plan(heap, next_base == log.base_signature ? NextBase::same : NextBase::moved, next_base);
  if (plan_asks_source(heap.cursor.state())) hold_all(heap, nullptr);
}

// Joins the record of the epoch that just ended to the heap's run (RunRecord), before the
// planner may take the record.
void VmmHeaps::join_run(Heap& heap, RunRecord::EpochEnded ended) {
  heap.run.join(heap.epoch, st_.config.vmm_plan_max_blocks, ended);
}

// A step emptied the heap: the run since it was last empty, joined whole, is planned as one
// epoch from an empty heap to an empty heap, and stored under `key` (run_key() of that step's
// signature) as an epoch of signature `last` (the run's last plan: its chain is closed,
// run_plans()). The epoch from the empty heap after such a step follows it over its boundaries
// (plan_next_epoch()), as a program without step() follows the plan of its whole run. Planned
// where vmm_planner says (in the background, the run's record is swapped for a spare buffer: no
// copy in the free, and the plan is there from a later run).
void VmmHeaps::plan_run(Heap& heap, std::uint64_t key, std::uint64_t last) {
  RunRecord& run = heap.run;
  if (!run.whole()) return;
  if (st_.config.vmm_planner == PlannerMode::synchronous) {
    if (std::shared_ptr<const EpochPlan> plan = make_epoch_plan(run.entries(), page_, run.boundaries()))
      heap.plans.store(key, std::move(plan), heap.last_signature, last);
  } else {
    planner_->try_hand_over(heap.mailbox, key, last, run.record_to_hand_over(), run.boundaries());
  }
  run.drop();
}

// Hashes the places and sizes of the heap's blocks in use, in address order.
std::uint64_t VmmHeaps::live_signature(const Heap& heap) noexcept {
  std::uint64_t hash = EpochLog::kSignatureSeed;
  for (const Block* x = heap.segment->first; x != nullptr; x = x->next) {
    if (!held_by_program(x)) continue;
    hash = EpochLog::mixed(EpochLog::mixed(hash, x->addr - heap.segment->addr), x->size);
  }
  return hash;
}

// A new epoch begins at a step boundary: every block live now is its base (`base_signature`:
// live_signature() of them).
void VmmHeaps::rebase(Heap& heap, std::uint64_t base_signature) {
  EpochLog& log = heap.epoch;
  heap.begin_epoch();
  log.at_step = true;
  log.clock = 1;  // tick 0 is the base's: allocated before every event of the epoch
  for (Block* x = heap.segment->first; x != nullptr; x = x->next) {
    if (!held_by_program(x)) continue;
    x->epoch_slot = EpochLog::kBaseSlot;
    ++log.base;
    log.high = std::max<std::size_t>(log.high, x->addr + x->size - heap.segment->addr);
  }
  // Two step epochs are alike only around the same base.
  log.base_signature = base_signature;
  log.mix(base_signature);
  reserve_resident(log.freed_base, log.base);  // the fast path's frees of base blocks allocate nothing
}

// The heap is empty and its epoch recorded (or a step epoch ended). Its plan (a step epoch's not
// after a run of Heap::kStepsSeen step epochs like none before them: sight_step()) is stored under
// the signature of the epoch before it (an epoch that followed its plan to the end, with nothing
// more, keeps that plan: the same requests in the same order, no planning cost). The next epoch
// gets the plan stored after an epoch like this one, if any, else this one's again (synchronous
// planner) or the latest plan of an epoch like this one (background planner: this one's is not
// made yet), but those two only when the next epoch begins with this one's base (`next_base`),
// when the memory from the heap's start up to its height (taking turns: the higher turn's) is
// mapped (map_plan()); without one it runs unplanned from the held pages. When the base moved
// (`next_base_signature`: the next one's live_signature()), the next step may be this one's other
// turn (next_turn()): taken only within the pages the heap holds and, for a step that ran online,
// below where it reached. When a step emptied the heap (NextBase::emptied), the next epoch gets
// the plan stored after a step like it that emptied the heap, else the heap's first epoch's, with
// the pages of the run that follows laid out (run_plans()). Returns the heights above which the
// two turns, or the whole run, leave the pages unused (0: not known).
NextHeights VmmHeaps::plan_next_epoch(Heap& heap, NextBase next_base, std::uint64_t next_base_signature) {
  PlanCursor& cursor = heap.cursor;
  // Another stream took a block of the heap (oom_ladder.cpp) and gave it back before the heap's
  // own stream made a request: the layout it waited for is dropped (a new one is asked below).
  if (cursor.state() == PlanState::laying_out) abandon_layout(heap);
  if (!heap.sleeping.empty()) {  // no plan while part of the heap sleeps (vmm_sleep.cpp)
    cursor.record();
    heap.last_signature = heap.epoch.signature;
    return {};
  }
  const bool matched = cursor.matched(heap.epoch.allocations());
  const std::uint64_t signature = heap.epoch.signature;
  // The last plan of a run that this epoch ends by emptying the heap: its own, or, when it only
  // freed (a run's weights), that of the epoch before it.
  const std::uint64_t run_last = heap.epoch.allocations() != 0 ? signature : heap.last_signature;
  if (next_base != NextBase::emptied && repeats_its_plan(heap)) {
    // The epoch repeated the one before it, as the plan stored after that one said: the same
    // plan again, with nothing to store or look up (a loop that runs one epoch over and over).
    switch (map_plan(heap, cursor.plan()->height)) {
      case Layout::ready: cursor.follow_again(); break;
      case Layout::waiting: cursor.wait_for_layout_again(); break;
      case Layout::impossible: cursor.record(); break;
    }
    return {};
  }
  // The signature of the next step if it makes this one's requests from its base (read before
  // the record is handed to the planner thread).
  const std::uint64_t next_signature = next_base == NextBase::moved ? signature_after(heap.epoch, next_base_signature) : 0;
  std::shared_ptr<const EpochPlan> mine;
  std::optional<std::vector<RecordedBlock>> mirror;  // the next step's record, as mirrored_step() predicts it
  if (matched) {
    mine = cursor.release_plan();
    heap.new_steps_in_a_row = 0;  // a step epoch that followed a plan repeated one
  } else if (heap.epoch.at_step && heap.sight_step(signature) == Heap::StepSighting::new_skip) {
    // The last Heap::kStepsSeen step epochs were each like none before them (a decode step whose
    // KV cache grew, a new sequence length every step): the steps do not repeat, and a plan is
    // followed only by a step that repeats one, while planning a step costs O(its base), which a
    // server that calls step() per decode step paid for plans never followed. New steps are
    // planned again once one repeats.
  } else {
    // A step the program ended (step()) whose base moved by what it kept: the next step may be
    // its mirror, planned with this one (in step(), never in an allocation): here by the
    // synchronous planner, so that the next step follows it (next_turn()); by the planner thread
    // otherwise, found from a later step (hand_mirror_to_planner()).
    if (next_base == NextBase::moved && boundary_ == StepBoundary::called)
      mirror = mirrored_step(heap.epoch.entries, heap.epoch.allocations());
    if (st_.config.vmm_planner == PlannerMode::synchronous) {
      mine = plan_now(heap);
    } else {
      hand_to_planner(heap);
      if (mirror) hand_mirror_to_planner(heap, next_signature, std::move(*mirror));
      mirror.reset();
    }
  }
  cursor.record();  // until a plan for the next epoch is found and its pages are in place
  collect_plans(heap);
  // What follows this epoch: an epoch from an empty heap, when a step epoch emptied it, is stored
  // under a key of its own (after a step like this one, the next step follows it).
  const std::uint64_t after = next_base == NextBase::emptied ? emptied_key(signature) : signature;
  if (next_base == NextBase::emptied) plan_run(heap, run_key(signature), run_last);
  // From the emptied heap: the plan of the whole run that followed a step like this one, when its
  // pages can be laid out at once (run_lays_out_now()).
  const bool run_lays_out = next_base == NextBase::emptied && run_lays_out_now(heap);
  std::shared_ptr<const EpochPlan> next;
  std::uint64_t next_key = after;
  if (run_lays_out) {
    next = heap.plans.find(run_key(signature));
    if (next) next_key = run_key(signature);
  }
  if (!next) next = heap.plans.find(after);
  // None stored after an epoch like this one: this epoch's own plan, or the latest of its kind,
  // both made around this epoch's base; but not when the next epoch begins with another (their
  // blocks would go where that base lies).
  if (!next && next_base == NextBase::same) {
    if (mine) {
      next = mine;
      next_key = heap.last_signature;  // where `mine` is stored
    } else {
      PlanCache::Found latest = heap.plans.latest_of(signature);
      next = std::move(latest.plan);
      next_key = latest.key;
    }
  }
  if (mine) heap.plans.store(heap.last_signature, mine, signature, signature);
  // None stored after a step like this one that emptied the heap: the program starts over, as the
  // heap's first epoch began (its plan is stored under key 0, no epoch before it).
  if (!next && next_base == NextBase::emptied) {
    next = heap.plans.find(kFirstEpochKey);
    next_key = kFirstEpochKey;
  }
  // A step whose base moved by what it kept: the next step may be its other turn.
  std::size_t turns_height = 0;
  if (!next && next_base == NextBase::moved) {
    Turn turn = take_turn(heap, matched ? StepRun::followed : StepRun::online, mine.get(), next_signature, mirror);
    next = std::move(turn.plan);
    next_key = turn.key;
    turns_height = turn.height;
  }
  heap.last_signature = after;
  if (!next) return {};
  // Taking turns, the pages go up to the higher turn: this one's layout alone would trade or
  // give back the pages above it, which the other turn maps again at the next boundary. From an
  // emptied heap, up to the highest plan of the run that follows (run_plans()).
  const PlanCache::Chain run = run_lays_out ? run_plans(heap, next_key, run_last) : PlanCache::Chain{};
  switch (map_plan(heap, std::max({next->height, turns_height, run.height}))) {
    case Layout::ready: cursor.follow(std::move(next), next_key); break;
    case Layout::waiting: cursor.wait_for_layout(std::move(next), next_key); break;
    case Layout::impossible: return {};
  }
  return {.turns = turns_height, .run = run.closed ? run.height : 0};
}

// The next step's plan when this step's base moved: its other turn (next_turn()), taken only
// within the pages the heap holds and, for a step that ran online, below where it reached (else
// the steps run online again); `mine`, this step's own plan (null: not made yet). The height
// above which both leave the pages unused, when both are known.
VmmHeaps::Turn VmmHeaps::take_turn(Heap& heap, StepRun run, const EpochPlan* mine, std::uint64_t next_signature,
                                   const std::optional<std::vector<RecordedBlock>>& mirror) {
  PlanCache::Found turn = next_turn(heap, next_signature, mirror);
  if (!turn.plan) return {};
  const std::size_t height = std::max(turn.plan->height, mine != nullptr ? mine->height : 0);
  const std::size_t reached = run == StepRun::online ? round_up(heap.epoch.high, page_) : SIZE_MAX;
  if (height > std::min(reached, heap.chunk_bytes)) return {};
  return Turn{std::move(turn.plan), turn.key, mine != nullptr ? height : 0};
}

// The plans of the run from the emptied heap that begins with the plan stored under `key`, as
// the run went the last time: that plan, the plan stored after it, and so on, up to the plan of
// an epoch of signature `last` (the step that just emptied the heap, or the one before it when
// that step only freed: PlanCache::chain(), kRunPlans of them at most). The pages laid out for
// the run's first epoch reach the highest of them: laid out to the first epoch's height alone (a
// model's weights), the heap left each step of the run holes under its base larger than a growth
// step, which it does not trade (trade_pages_above()): the steps ran online, remapping, and
// their pages crept up the address range with every run. A chain that reaches `last` (closed)
// holds the whole run: what lies above its height goes (choose_next_plan()).
// Asked only when the run's pages can be laid out at once (run_lays_out_now()).
PlanCache::Chain VmmHeaps::run_plans(const Heap& heap, std::uint64_t key, std::uint64_t last) const {
  return heap.plans.chain(key, kRunPlans, last);
}

// Whether the pages of a run from the emptied heap can be laid out now: the work the stream
// queued is done (a query, not during a capture). On a device behind the host the layout would
// wait for an event and move every page of the heap at the next epoch's first request
// (finish_layout()), once per run: the run's plans are then not taken (plan_next_epoch()).
bool VmmHeaps::run_lays_out_now(const Heap& heap) {
  return !st_.capture_underway() && stream_work_done(heap);  // no stream query in a capture
}

// The plan for the next step of a step epoch whose base moved, if the next step repeats this one
// with the roles of what it keeps and what it freed of its base swapped (step_turns.hpp): the
// plan made for an epoch with the next base and this one's requests (a loop whose two turns were
// both planned: the step before this one), else the plan of `mirror`, this epoch's mirrored
// record, made now and stored under this epoch's signature (the plan for the epoch after one like
// it; the synchronous planner's: the planner thread was handed the mirror instead,
// hand_mirror_to_planner()). `heap.last_signature` is still the signature of the epoch before this one, where this
// one's own plan is stored: the other turn, kept from eviction. Null when neither.
// `next_signature`: signature_after() the next base.
PlanCache::Found VmmHeaps::next_turn(Heap& heap, std::uint64_t next_signature,
                                     const std::optional<std::vector<RecordedBlock>>& mirror) {
  if (PlanCache::Found made = heap.plans.latest_of(next_signature); made.plan) return made;
  if (!mirror || mirror_would_replace_own_plan(heap)) return {};
  std::shared_ptr<const EpochPlan> plan = make_epoch_plan(*mirror, page_);
  if (!plan) return {};
  st_.counters.count(&Stats::mirrored_steps);
  const std::uint64_t signature = heap.epoch.signature;
  heap.plans.store(signature, plan, heap.last_signature, next_signature);
  return PlanCache::Found{std::move(plan), signature};
}

// The signature an epoch has that makes the requests `log` recorded from a base whose
// live_signature() is `base` (as rebase() and EpochLog::on_alloc() make it). O(its allocations).
std::uint64_t VmmHeaps::signature_after(const EpochLog& log, std::uint64_t base) noexcept {
  std::uint64_t signature = EpochLog::mixed(EpochLog::kSignatureSeed, base);
  for (std::size_t i = 0; i < log.allocations(); ++i) signature = EpochLog::mixed(signature, log.entries[i].size);
  return signature;
}

// The plan of the epoch just recorded, made here (null when it made more allocations than are
// recorded, or none, or planning failed).
std::shared_ptr<const EpochPlan> VmmHeaps::plan_now(const Heap& heap) const {
  if (heap.epoch.full) return nullptr;
  return make_epoch_plan(heap.epoch.entries, page_);
}

// Hands the epoch just recorded to the planner thread (nothing when it cannot be planned): its
// record is swapped for a spare buffer, so the next epoch records at once. Without a spare (the
// thread still plans the two epochs handed over before), or while the thread holds its mutex,
// this one is not planned: nothing is allocated or waited for here, and a heap whose epochs come
// faster than they are planned queues no more.
void VmmHeaps::hand_to_planner(Heap& heap) {
  if (heap.epoch.full || heap.epoch.entries.empty()) return;
  planner_->try_hand_over(heap.mailbox, heap.last_signature, heap.epoch.signature, heap.epoch.entries);
}

// The background planner's part of next_turn(): the mirror of the step just ended, handed to the
// planner thread (planned there, not in step(): a step of 12,581 blocks and its mirror cost 92 ms
// of planning), to be stored under this step's signature as the plan of an epoch of signature
// `next_signature`, where next_turn() finds it from a later step. Not when such a plan is stored
// already (a loop's turns, found), nor when it would replace this step's own plan (a step like
// the one before it).
void VmmHeaps::hand_mirror_to_planner(Heap& heap, std::uint64_t next_signature, std::vector<RecordedBlock>&& mirror) {
  if (mirror_would_replace_own_plan(heap) || heap.plans.latest_of(next_signature).plan) return;
  if (planner_->try_hand_over_made(heap.mailbox, heap.epoch.signature, next_signature, std::move(mirror)))
    st_.counters.count(&Stats::mirrored_steps);
}

// Whether a mirror stored under this epoch's signature would replace this step's own plan: the
// step before was like it (the other turn, stored under that one's signature).
bool VmmHeaps::mirror_would_replace_own_plan(const Heap& heap) noexcept {
  return heap.epoch.signature == heap.last_signature;
}

// Stores the plans the planner thread finished for this heap.
void VmmHeaps::collect_plans(Heap& heap) {
  if (!planner_) return;
  for (FinishedPlan& f : planner_->try_collect(heap.mailbox))
    heap.plans.store(f.key, std::move(f.plan), f.signature, f.signature);
}

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
  // (vmm_epochs.cpp, step boundaries): nothing moves under it, and what lies above the height goes
  // only once the plan repeats, so mapping the holes and keeping the chunks would hold both until
  // then (up to 1.5 GiB above the online peak on the loops of docs/benchmarks.md, "Steps found
  // from the requests"): the holes are traded for the chunks above where trade_pages_above()
  // allows, else the plan is not followed and the step runs online, with the pages it has.
  if (heap.epoch.live != 0) return trade_pages_above(heap, height);
  if (!affords_layout(heap, height)) return Layout::impossible;
  if (st_.capture_underway()) return Layout::impossible;  // no device call during a capture
  try {
    if (const DeviceEvent pending = event_pending_on(heap); pending != 0) {
      heap.layout_event = pending;
      heap.pending_layout = PendingLayout::whole_heap;
      return Layout::waiting;
    }
  } catch (const DeviceError& err) {  // no layout, no plan: the heap runs unplanned
    log().warn("vmm: an event to lay out a planned heap failed: {}", err.what());
    return Layout::impossible;
  }
  return lay_out(heap, height) ? Layout::ready : Layout::impossible;
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
// steps run online quietly (docs/benchmarks.md, "Small holes under a step's base"). Not in a
// heap that keeps its pages (it grew again after a give-back), nor during a capture. O(the
// heap's blocks below the height).
Layout VmmHeaps::trade_pages_above(Heap& heap, std::size_t height) {
  if (heap.keeps_pages || st_.capture_underway()) return Layout::impossible;
  const Address top = heap.segment->addr + height;
  const std::size_t holes = hole_bytes_below(heap, top);
  const std::size_t wholly_above = chunk_bytes_from(heap, top);
  const ChunkAcross cut = chunk_across(heap, top);
  const std::size_t across = cut.free != nullptr ? cut.chunk.end() - top : 0;
  const bool small = holes <= growth_step(heap.pool());
  if ((!small && !heap.remapped_idle) || holes > wholly_above + across) return Layout::impossible;
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
  try {
    if (const DeviceEvent pending = event_pending_on(heap); pending != 0) {
      heap.layout_event = pending;
      heap.pending_layout = PendingLayout::pages_above;
      heap.trade_height = height;
      return Layout::waiting;
    }
  } catch (const DeviceError& err) {  // no trade, no plan: the step runs online
    log().warn("vmm: an event for a planned step's pages failed: {}", err.what());
    return Layout::impossible;
  }
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
