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
// release() give them back to the index first.
//
// Planned layouts: the recorded epoch is planned offline (layout_plan.hpp: the lower of the
// recorded layout and a packing by size) and stored in the heap's PlanCache under the signature
// of the epoch before it; the next epoch gets the plan stored after an epoch like the one that
// just ended, else that one's own. While the epoch makes the plan's requests in order, the
// PlanCursor says `following` and each request is served at its planned offset (take_planned()),
// carved from held or free memory, with no device call and no search of the index. The plan
// needs the memory from the heap's start to its height mapped; if the pages lie elsewhere
// (remapped under pressure), the free that ends the epoch maps them back there (map_plan()),
// once. A request the plan did not foresee departs from it for the rest of the epoch (the held
// pages serve it), and that epoch is planned afresh. A program that repeats its steps from an
// empty heap so runs them at the live peak the packing reaches, with no device call (docs/vmm.md,
// "Planned layouts").
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "core/logging.hpp"
#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

namespace {

// A free block a request can use: mapped, and not held (held pages are in no index).
bool free_mapped(const Block* b) { return b != nullptr && b->state == BlockState::free && b->mapped && !b->held; }

}  // namespace

// --- held pages -----------------------------------------------------------------------------

Block* HeldPages::hold(Block* x, BlockPool& blocks) {
  x->held = true;
  bytes_ += x->size;
  if (x->next != nullptr && x->next->held) {
    blocks_.erase(x->next->addr);
    blocks.absorb_next(x);
  }
  if (x->prev != nullptr && x->prev->held) {
    x = x->prev;
    blocks.absorb_next(x);
  } else {
    blocks_.emplace(x->addr, x);
  }
  return x;
}

Block* HeldPages::unhold(Block* r, std::size_t bytes, BlockPool& blocks) {
  blocks_.erase(r->addr);
  if (bytes < r->size) {
    Block* rest = blocks.split_at(r, bytes);
    rest->held = true;
    blocks_.emplace(rest->addr, rest);
  }
  r->held = false;
  bytes_ -= r->size;
  return r;
}

// Holds every free mapped block of the heap: `freed` (in no index) and those in the index.
void VmmHeaps::hold_all(Heap& heap, Block* freed) {
  for (Block* x = heap.segment->first; x != nullptr; x = x->next) {
    if (x != freed && free_mapped(x)) {
      heap.index().remove(x);
      x = heap.held.hold(x, st_.blocks);
    }
  }
  heap.held.hold(freed, st_.blocks);
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
    Block* front = heap.held.unhold(r, std::min(r->size, std::max(need, step)), st_.blocks);
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
    if (heap.pool() == pool && !(spare == Spare::following && heap.cursor.state() == PlanState::following))
      release_held(heap);
}

void VmmHeaps::release_held(Heap& heap) {
  while (!heap.held.empty()) {
    Block* r = heap.held.blocks().begin()->second;
    Block* merged = st_.coalesce(heap.held.unhold(r, r->size, st_.blocks));
    heap.index().insert(merged);
  }
}

// --- the end of an epoch --------------------------------------------------------------------

// b, free and coalesced (in no index), leaves its heap with nothing allocated: the epoch ends.
// All the heap's free mapped memory is held (b and every free block after an unmapped hole),
// and the epoch just recorded is planned for the next one.
Block* VmmHeaps::end_epoch(Block* b) {
  Heap& heap = heap_of(b);
  hold_all(heap, b);
  plan_next_epoch(heap);
  heap.epoch.restart();
  return nullptr;
}

// The heap is empty and its epoch recorded. Its plan is stored under the signature of the epoch
// before it (an epoch that followed its plan to the end, with nothing more, keeps that plan: the
// same requests in the same order, no planning cost). The next epoch gets the plan stored after
// an epoch like this one, if any, else this one's again, when the memory from the heap's start up
// to its height is mapped (map_plan()); without one it runs unplanned from the held pages.
void VmmHeaps::plan_next_epoch(Heap& heap) {
  PlanCursor& cursor = heap.cursor;
  const bool matched = cursor.matched(heap.epoch.entries.size());
  const std::uint64_t signature = heap.epoch.signature;
  if (matched && signature == heap.last_signature && cursor.key() == signature) {
    // The epoch repeated the one before it, as the plan stored after that one said: the same
    // plan again, with nothing to store or look up (a loop that runs one epoch over and over).
    if (map_plan(heap, cursor.plan()->height)) {
      cursor.follow_again();
    } else {
      cursor.record();
    }
    return;
  }
  std::shared_ptr<const EpochPlan> mine = matched ? cursor.release_plan() : make_plan(heap);
  cursor.record();  // until a plan for the next epoch is found and its pages are in place
  std::uint64_t next_key = heap.last_signature;  // where `mine` is stored
  std::shared_ptr<const EpochPlan> next = heap.plans.find(signature);
  if (next) {
    next_key = signature;
  } else {
    next = mine;
  }
  if (mine) heap.plans.store(heap.last_signature, std::move(mine), signature);
  heap.last_signature = signature;
  if (next && map_plan(heap, next->height)) cursor.follow(std::move(next), next_key);
}

// The plan of the epoch just recorded (null when it made more allocations than are recorded, or
// none, or planning failed: a free must not fail for want of a plan).
std::shared_ptr<const EpochPlan> VmmHeaps::make_plan(const Heap& heap) const {
  const std::vector<RecordedBlock>& record = heap.epoch.entries;
  if (heap.epoch.full || record.empty()) return nullptr;
  try {
    const PlannedLayout layout = plan_layout(record);
    auto plan = std::make_shared<EpochPlan>();
    plan->steps.resize(record.size());
    for (std::size_t i = 0; i < record.size(); ++i)
      plan->steps[i] = EpochPlan::Step{.size = record[i].size, .offset = layout.offsets[i], .below = layout.below[i]};
    plan->height = round_up(layout.height, page_);
    return plan;
  } catch (const std::exception& e) {
    log().error("vmm: planning an epoch of {} allocations failed: {}", record.size(), e.what());
    return nullptr;
  }
}

// Makes [start, start + height) of the empty heap mapped (and held), if the physical memory
// the heap and the cache hold can: when it is not already, every chunk of the heap is unmapped
// (after synchronizing its stream) and chunks are mapped back from the heap's start, its own and
// the cached ones, until the plan's height is covered. No memory is created for a plan.
bool VmmHeaps::map_plan(Heap& heap, std::size_t height) {
  const Address start = heap.segment->addr;
  const Address end = start + height;
  Address covered = start;
  for (auto it = heap.chunks.begin(); it != heap.chunks.end() && it->first == covered && covered < end; ++it)
    covered = it->second.end();
  if (covered >= end) return true;
  std::size_t physical = cached_.bytes(heap.pool());
  for (const auto& [a, c] : heap.chunks) physical += c.size;
  if (physical < height) return false;
  // Unmap everything (the heap is empty: every chunk lies under a free block); the heap becomes
  // one unmapped hole, as when it was made, and is mapped again from its start. This is the one
  // place a free makes device calls (and waits for the heap's stream): once, when an epoch ends
  // whose plan the pages are not laid out for.
  try {
    release_held(heap);
    reclaim_heap(heap, 0);
    Block* hole = heap.segment->first;
    if (hole->mapped || hole->state != BlockState::free) return false;
    const Mapped mapped = map_into(heap, {.hole = hole, .bytes = height, .need = height});
    if (mapped.block == nullptr) return false;
    heap.index().remove(mapped.block);
    heap.held.hold(mapped.block, st_.blocks);
    return mapped.complete;
  } catch (const DeviceError& e) {  // the heap stays consistent, partly mapped; no plan then
    log().warn("vmm: laying out the pages of a planned heap failed: {}", e.what());
    return false;
  }
}

// --- following a plan -----------------------------------------------------------------------

Block* VmmHeaps::take_planned(StreamState& ss, Pool pool, std::size_t size) {
  Heap* heap = heap_of(ss, pool);
  if (heap == nullptr || heap->cursor.state() != PlanState::following) return nullptr;
  PlanCursor& cursor = heap->cursor;
  const EpochPlan::Step& step = cursor.next_step();
  Block* x = step.size == size ? find_planned(*heap, step) : nullptr;
  Block* b = x != nullptr ? carve(*heap, x, heap->segment->addr + step.offset, size) : nullptr;
  if (b == nullptr) {
    cursor.depart();
    return nullptr;
  }
  cursor.served(b);
  return b;
}

// The free mapped block (in the index or held) that holds the start of the step's range, or
// nullptr. The search starts after the block of the step `below` when that block is still
// there (allocated at its planned address), else at the heap's start.
Block* VmmHeaps::find_planned(const Heap& heap, const EpochPlan::Step& step) const {
  const Address at = heap.segment->addr + step.offset;
  Block* x = heap.segment->first;
  if (step.below != PlannedLayout::kNone) {
    const Block* anchor = heap.cursor.placed(step.below);
    const Address anchor_at = heap.segment->addr + heap.cursor.plan()->steps[step.below].offset;
    if (anchor != nullptr && anchor->segment == heap.segment && anchor->addr == anchor_at &&
        anchor->state != BlockState::free && anchor->addr + anchor->size <= at)
      x = anchor->next;
  }
  while (x != nullptr && x->addr + x->size <= at) x = x->next;
  if (x == nullptr || x->state != BlockState::free || !x->mapped || x->addr > at) return nullptr;
  return x;
}

// Cuts [at, at + size) out of the free mapped memory that starts with x (free, mapped, in the
// index or held, holding `at`): x and the free mapped blocks after it that the range needs are
// taken out of the index or the held pages and merged; the pieces before and after the range go
// to the index. Returns the range as a free block in no index, or nullptr (nothing changed but
// the merge) when free mapped memory does not reach its end.
Block* VmmHeaps::carve(Heap& heap, Block* x, Address at, std::size_t size) {
  const auto take_out = [&](Block* y) {
    if (y->held) {
      heap.held.unhold(y, y->size, st_.blocks);
    } else {
      heap.index().remove(y);
    }
  };
  take_out(x);
  x = st_.coalesce(x);
  for (Block* n = x->next; x->addr + x->size < at + size && n != nullptr && n->state == BlockState::free && n->mapped;
       n = x->next) {
    take_out(n);
    st_.blocks.absorb_next(x);
  }
  FreeIndex& index = heap.index();
  if (x->addr + x->size < at + size) {
    index.insert(st_.coalesce(x));
    return nullptr;
  }
  Block* mid = x;
  if (at > x->addr) {
    mid = st_.blocks.split_at(x, at - x->addr);
    index.insert(x);
  }
  if (mid->size > size) index.insert(st_.blocks.split_at(mid, size));
  return mid;
}

}  // namespace tensorpool::detail
