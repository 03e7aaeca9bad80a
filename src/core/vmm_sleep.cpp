// vmm_sleep.cpp: sleep and wake of the vmm heaps (vmm_heaps.hpp): the physical memory of every
// heap given back to the device while every live block keeps its address, then mapped back.
//
// sleep() first gives back what is free (held pages, entirely free chunks, the chunk cache, as
// empty_cache does with nothing kept), then unmaps and releases every chunk left (each holds part
// of a live block). Only the pages under live blocks keep their place, as the heap's sleeping
// chunks (Heap::sleeping: one per run of such pages inside a released chunk); the free pages
// beside them become unmapped holes, given back for good. The blocks on the sleeping chunks
// become asleep: live ones stay allocated (the user still holds them, but must not touch them),
// free ones leave the free index and hold the address range without pages (mapped == false, in
// no unmapped list), so nothing is ever carved from a sleeping range.
// A block freed while asleep is forgotten: it joins the asleep free space around it. Requests
// made while asleep grow the heaps elsewhere, in their unmapped holes, as any growth does, and
// a heap with sleeping chunks follows no plan.
//
// wake() maps new physical memory at the sleeping chunks of every heap that still has a live
// asleep block (one chunk per sleeping chunk, at its address), or changes nothing and throws when
// the device refuses; a heap whose asleep blocks were all freed gets no pages back (its asleep
// free space becomes unmapped holes). With Contents::keep, sleep first copies the live blocks'
// requested bytes to host memory (Heap::kept, all or nothing) and wake copies them back; else
// woken blocks hold what new pages hold. Both run in the exclusive mode; sleep after the caller
// has synchronized the device and completed every pending free.
#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/logging.hpp"
#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

SleepReport VmmHeaps::sleep(Sleepers who, Contents contents) {
  std::vector<Heap*> chosen;
  for (auto& [base, heap] : heaps_)
    if (covered(heap, who) && !heap.asleep) chosen.push_back(&heap);
  for (Heap* heap : chosen) heap->resume_recording();  // forget_asleep() counts frees in the record
  if (contents == Contents::keep && st_.device->holds_contents()) keep_contents(chosen);
  for (Heap* heap : chosen) {
    if (heap->layout_event != 0) abandon_layout(*heap);
    drop_event(heap->give_back_event);
    heap->cursor.record();
    release_held(*heap);
    unstitch_free(*heap, StreamWork::done);
    reclaim_heap(*heap, 0, StreamWork::done);
  }
  std::size_t released = release_cached_chunks();
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    try {
      released += sleep_heap(*chosen[i]);
    } catch (...) {  // this heap and the ones after it stay awake: their copies go
      for (std::size_t j = i; j < chosen.size(); ++j)
        while (!chosen[j]->kept.empty()) free_kept(*chosen[j], chosen[j]->kept.begin()->first);
      throw;
    }
    chosen[i]->asleep = true;
  }
  if (!slept_before(who)) unwoken_sleeps_.push_back(who);
  SleepReport report = asleep(who);
  report.released_bytes = released;
  return report;
}

// Copies the requested bytes of every live block of `heaps` to host memory (Heap::kept), all or
// nothing: if the host memory is refused or a copy fails, what was taken is given back and the
// error says how much was needed.
void VmmHeaps::keep_contents(const std::vector<Heap*>& heaps) {
  std::vector<std::pair<Heap*, Block*>> live;
  std::size_t needed = 0;
  for (Heap* heap : heaps)
    for (Block* b = heap->segment->first; b != nullptr; b = b->next)
      if (b->state == BlockState::allocated && !b->lent) {
        live.emplace_back(heap, b);
        needed += b->requested;
      }
  try {
    for (auto& [heap, b] : live) {
      void* host = st_.device->allocate_host(b->requested);
      if (host == nullptr)
        throw DeviceError("tensorpool: sleep() keeping contents needs " + format_bytes(needed) +
                          " of host memory for " + std::to_string(live.size()) + " blocks; " +
                          format_bytes(b->requested) + " more were refused; nothing sleeps");
      heap->kept.emplace(b->addr, Heap::Kept{host, b->requested});
      st_.device->copy_to_host(host, b->addr, b->requested);
    }
  } catch (...) {
    for (auto& [heap, b] : live) free_kept(*heap, b->addr);
    throw;
  }
}

void VmmHeaps::free_kept(Heap& heap, Address addr) noexcept {
  const auto it = heap.kept.find(addr);
  if (it == heap.kept.end()) return;
  st_.device->free_host(it->second.host, it->second.bytes);
  heap.kept.erase(it);
}

// Unmaps and releases every chunk of the heap (each under part of a live block) and puts its
// blocks to sleep. If the device refuses an unmap, the chunks unmapped so far are mapped back and
// the error goes on with the heap as it was.
std::size_t VmmHeaps::sleep_heap(Heap& heap) {
  std::vector<Chunk> chunks;
  chunks.reserve(heap.chunks.size());
  for (const auto& [addr, c] : heap.chunks) chunks.push_back(c);
  std::size_t unmapped = 0;
  try {
    for (; unmapped < chunks.size(); ++unmapped) vm_.unmap(chunks[unmapped].addr, chunks[unmapped].size);
  } catch (...) {
    for (std::size_t i = 0; i < unmapped; ++i) {
      const Chunk& c = chunks[i];
      if (c.stitched()) {
        vm_.map_part(c.addr, c.size, c.handle, c.offset);
      } else {
        vm_.map(c.addr, c.size, c.handle);
      }
    }
    throw;
  }
  std::size_t released = 0;
  for (const Chunk& c : chunks) {
    st_.counters.count(&Stats::vm_unmaps);
    if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_unmap, c.addr, 0, c.size, heap.stream());
    if (c.stitched()) continue;  // its pages are its owner's, released with it (vmm_stitch.cpp)
    try {
      vm_.release_physical(c.handle);
    } catch (const DeviceError& e) {  // unmapped already: the heap goes on asleep
      log().error("vmm: releasing a sleeping chunk of {} failed: {}", format_bytes(c.size), e.what());
    }
    st_.counters.on_upstream_free(c.pool, c.size);
    if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_free, 0, 0, c.size, heap.stream());
    released += c.size;
  }
  heap.sleeping = pages_under_live(heap, chunks);
  heap.clear_chunks();
  heap.lent.clear();  // each lent block sleeps as free pages
  for (Block* b = heap.segment->first; b != nullptr; b = b->next) {
    if (!b->mapped) continue;
    b->asleep = true;
    if (b->lent) {
      b->lent = false;
      b->state = BlockState::free;
      b->mapped = false;
    } else if (b->state == BlockState::free) {
      heap.index().remove(b);
      b->mapped = false;
    } else {
      ++heap.asleep_blocks;
      heap.asleep_allocated += b->size;
    }
  }
  // A lent block and the free pages beside it are one asleep free range.
  std::vector<Block*> asleep_free;
  for (Block* b = heap.segment->first; b != nullptr; b = b->next) {
    if (!b->asleep || b->state != BlockState::free) continue;
    while (b->next != nullptr && b->next->asleep && b->next->state == BlockState::free) heap.blocks().absorb_next(b);
    asleep_free.push_back(b);
  }
  // No two of them are neighbours, and unmapping a piece of one merges it with unmapped holes
  // only: the others stay valid.
  for (Block* b : asleep_free) unmap_off_sleeping(heap, b);
  return released;
}

// The pages that sleep (wake() maps them back): those of `chunks` under a live block, by
// address, one run per stretch of such pages inside one chunk. A free page is given back for
// good: the pages a stitch lent (their owner chunk's free pages) so wake only once, in the
// stitched range.
std::vector<Chunk> VmmHeaps::pages_under_live(const Heap& heap, const std::vector<Chunk>& chunks) const {
  std::vector<std::pair<Address, Address>> live;  // page-rounded, merged, by address
  for (const Block* b = heap.segment->first; b != nullptr; b = b->next) {
    if (!b->mapped || b->state == BlockState::free || b->lent) continue;
    const Address from = b->addr / page_ * page_;
    const Address to = round_up(b->addr + b->size, page_);
    if (!live.empty() && from <= live.back().second) {
      live.back().second = std::max(live.back().second, to);
    } else {
      live.emplace_back(from, to);
    }
  }
  std::vector<Chunk> runs;
  auto l = live.begin();
  for (const Chunk& c : chunks) {  // by address, as the heap's map holds them
    while (l != live.end() && l->second <= c.addr) ++l;
    for (auto r = l; r != live.end() && r->first < c.end(); ++r) {
      const Address from = std::max(r->first, c.addr);
      const Address to = std::min(r->second, c.end());
      runs.push_back(Chunk{from, to - from, 0, c.pool});
    }
  }
  return runs;
}

// Asleep free block b (its pages released) keeps asleep only what lies in a sleeping run; the
// rest of it becomes unmapped address space, as if never mapped.
void VmmHeaps::unmap_off_sleeping(Heap& heap, Block* b) {
  auto run = std::upper_bound(heap.sleeping.begin(), heap.sleeping.end(), b->addr,
                              [](Address a, const Chunk& c) { return a < c.addr; });
  if (run != heap.sleeping.begin() && std::prev(run)->end() > b->addr) --run;
  while (b != nullptr) {
    const Address end = b->addr + b->size;
    const bool in_run = run != heap.sleeping.end() && run->addr <= b->addr;
    Address cut = end;
    if (in_run) {  // to the end of the runs that follow each other without a gap
      Address reach = run->end();
      while (++run != heap.sleeping.end() && run->addr == reach) reach = run->end();
      cut = std::min(reach, end);
    } else if (run != heap.sleeping.end()) {
      cut = std::min(run->addr, end);
    }
    Block* rest = cut < end ? heap.blocks().split_at(b, cut - b->addr) : nullptr;
    if (rest != nullptr) rest->asleep = true;
    if (!in_run) {
      b->asleep = false;
      mark_unmapped(heap, b);
    }
    b = rest;
  }
}

// Freed while asleep: b joins the asleep free space beside it. The heap's epoch counts the free;
// a heap left empty starts a new epoch unplanned.
void VmmHeaps::forget_asleep(Block* b) {
  Heap& heap = heap_of(b);
  free_kept(heap, b->addr);
  --heap.asleep_blocks;
  heap.asleep_allocated -= b->size;
  b->state = BlockState::free;
  b->requested = 0;
  b->mapped = false;
  const bool heap_emptied = heap.epoch.on_release(b, heap.segment->addr);
  const auto asleep_free = [](const Block* x) {
    return x != nullptr && x->asleep && x->state == BlockState::free;
  };
  if (asleep_free(b->prev)) {
    b = b->prev;
    heap.blocks().absorb_next(b);
  }
  if (asleep_free(b->next)) heap.blocks().absorb_next(b);
  if (heap_emptied) {
    heap.begin_epoch();
    drop_event(heap.give_back_event);
    heap.cursor.record();
  }
}

SleepReport VmmHeaps::asleep() const { return asleep(Sleepers{}); }

// What sleeps in the heaps `who` covers (released_bytes: 0).
SleepReport VmmHeaps::asleep(Sleepers who) const {
  SleepReport r;
  for (const auto& [base, heap] : heaps_) {
    if (!covered(heap, who)) continue;
    for (const Chunk& c : heap.sleeping) r.asleep_bytes += c.size;
    r.asleep_blocks += heap.asleep_blocks;
    r.asleep_allocated += heap.asleep_allocated;
    for (const auto& [addr, k] : heap.kept) r.kept_bytes += k.bytes;
  }
  return r;
}

// Whether a sleep() that no wake() has answered yet covers `who` (either of the two is of every
// tag, or both are of one).
bool VmmHeaps::slept_before(Sleepers who) const noexcept {
  return std::any_of(unwoken_sleeps_.begin(), unwoken_sleeps_.end(),
                     [&](const Sleepers& s) { return who.all || s.all || s.tag == who.tag; });
}

// A wake() of `who` answered the sleeps of every tag (who.all) or of its own tag.
void VmmHeaps::forget_sleeps(Sleepers who) noexcept {
  std::erase_if(unwoken_sleeps_, [&](const Sleepers& s) { return who.all || (!s.all && s.tag == who.tag); });
}

void VmmHeaps::wake(Sleepers who) {
  bool any = slept_before(who);
  for (const auto& [base, heap] : heaps_) any = any || (covered(heap, who) && heap.asleep);
  if (!any)
    throw UsageError(who.all ? std::string("tensorpool: wake() without sleep(): nothing sleeps")
                             : "tensorpool: wake('" + tag_name(who.tag) + "') without a sleep of that tag: none of "
                               "its blocks sleeps");
  const std::string lost = wake_heaps(who);  // a DeviceError here: nothing changed, all still asleep
  forget_sleeps(who);
  if (!lost.empty()) throw DeviceError("tensorpool: wake() mapped every page, but copying back the kept contents failed:" + lost);
}

// wake() once it is no misuse: maps the pages back and restores the kept contents; what it
// failed to copy back ("" when nothing). A DeviceError leaves everything asleep, nothing changed.
std::string VmmHeaps::wake_heaps(Sleepers who) {
  std::vector<std::pair<Heap*, Chunk>> made = pages_for_waking(who);
  for (auto& [base, heap] : heaps_)
    if (covered(heap, who) && heap.asleep && heap.asleep_blocks == 0) forget_sleeping_chunks(heap);
  for (auto& [heap, c] : made) {
    heap->add_chunk(c);
    st_.counters.count(&Stats::vm_maps);
    if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_map, c.addr, 0, c.size, heap->stream());
  }
  std::string lost;  // contents a copy back failed for
  for (auto& [base, heap] : heaps_) {
    if (!covered(heap, who) || !heap.asleep) continue;
    heap.asleep = false;
    heap.asleep_blocks = 0;
    heap.asleep_allocated = 0;
    if (!heap.sleeping.empty()) {
      heap.sleeping.clear();
      wake_blocks(heap);
    }
    lost += restore_contents(heap);
  }
  return lost;
}

// Copies the kept contents of the heap's woken blocks back and gives the host memory back;
// returns what failed ("" when nothing did: a failed block keeps its new pages' bytes).
std::string VmmHeaps::restore_contents(Heap& heap) {
  std::string lost;
  for (const auto& [addr, k] : heap.kept) {
    try {
      st_.device->copy_to_device(addr, k.host, k.bytes);
    } catch (const DeviceError& e) {
      lost += " " + hex(addr) + " (" + e.what() + ")";
    }
    st_.device->free_host(k.host, k.bytes);
  }
  heap.kept.clear();
  return lost;
}

// New physical memory mapped at every sleeping chunk of the heaps that still have a live asleep
// block, as (heap, chunk) pairs not yet in their heaps; on any refusal everything made here is
// given back and the error says how much was needed.
std::vector<std::pair<Heap*, Chunk>> VmmHeaps::pages_for_waking(Sleepers who) {
  std::vector<std::pair<Heap*, Chunk>> made;  // addr: where the chunk goes; mapped: the first `mapped`
  std::size_t mapped = 0;
  std::size_t needed = 0;
  std::size_t blocks = 0;
  const auto wakes = [&](const Heap& heap) { return covered(heap, who) && heap.asleep && heap.asleep_blocks != 0; };
  for (auto& [base, heap] : heaps_) {
    if (!wakes(heap)) continue;
    for (const Chunk& c : heap.sleeping) needed += c.size;
    blocks += heap.asleep_blocks;
  }
  try {
    for (auto& [base, heap] : heaps_) {
      if (!wakes(heap)) continue;
      for (const Chunk& c : heap.sleeping) {
        std::optional<Chunk> fresh = create_chunk(c.size, c.pool);
        if (!fresh) {
          release(ReleaseGoal::everything);
          fresh = create_chunk(c.size, c.pool);
        }
        if (!fresh)
          throw DeviceError("tensorpool: wake() needs " + format_bytes(needed) + " for the pages of " +
                            std::to_string(blocks) + " asleep blocks; the device (" +
                            format_bytes(st_.device->free_memory()) + " free" +
                            (st_.limit != 0 ? ", memory limit " + format_bytes(st_.limit) : std::string()) +
                            ") refused " + format_bytes(c.size) + "; everything stays asleep");
        fresh->addr = c.addr;
        made.emplace_back(&heap, *fresh);
      }
    }
    for (; mapped < made.size(); ++mapped) {
      const Chunk& c = made[mapped].second;
      vm_.map(c.addr, c.size, c.handle);
    }
  } catch (...) {
    for (std::size_t i = 0; i < made.size(); ++i) {
      const Chunk& c = made[i].second;
      try {
        if (i < mapped) vm_.unmap(c.addr, c.size);
        vm_.release_physical(c.handle);
      } catch (const DeviceError& e) {
        log().error("vmm: giving back the pages of a failed wake failed: {}", e.what());
      }
      st_.counters.on_upstream_free(c.pool, c.size);
      if (st_.hooks.observed()) st_.hooks.notify(EventType::segment_free, 0, 0, c.size, kDefaultStream);
    }
    throw;
  }
  return made;
}

// An asleep heap with no live asleep block gets no pages back: its asleep free space (whose ends are
// chunk boundaries or the ends of awake blocks and holes, all page-aligned) becomes unmapped.
void VmmHeaps::forget_sleeping_chunks(Heap& heap) {
  std::vector<Block*> asleep;
  for (Block* b = heap.segment->first; b != nullptr; b = b->next)
    if (b->asleep) asleep.push_back(b);
  heap.sleeping.clear();
  for (Block* b : asleep) {
    b->asleep = false;
    mark_unmapped(heap, b);
  }
}

// The heap's pages are back: its asleep blocks wake, the free ones into the index (coalesced
// with free mapped neighbours).
void VmmHeaps::wake_blocks(Heap& heap) {
  std::vector<Block*> free_ones;
  for (Block* b = heap.segment->first; b != nullptr; b = b->next) {
    if (!b->asleep) continue;
    b->asleep = false;
    b->mapped = true;
    if (b->state == BlockState::free) free_ones.push_back(b);
  }
  // No two were neighbours (asleep free space is coalesced), so no merge below takes a block
  // still in the list; each merge result goes to the index before the next merge reads it.
  for (Block* b : free_ones) heap.index().insert(st_.coalesce(b));
}

}  // namespace tensorpool::detail
