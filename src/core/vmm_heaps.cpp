// vmm_heaps.cpp: the virtual-memory source as a SegmentSource (vmm_heaps.hpp): a heap per stream
// and pool, made on first use; the growth policy; release and teardown.
//
// Growth: when the free index has no block large enough, grow() takes pages, in this order, from
// the heap's held pages (vmm_epochs.cpp), from chunks cached unmapped, from chunks that are
// entirely free somewhere else (unmapped there after synchronizing their stream: done when idle
// physical memory exceeds the idle limit, or when nothing more can be created), and finally from
// a new chunk; the pages are mapped at the lowest unmapped hole whose span (with its free mapped
// neighbours) fits the request (vmm_pages.cpp).
#include "core/vmm_heaps.hpp"

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/logging.hpp"
#include "core/util.hpp"

namespace tensorpool::detail {

VmmHeaps::VmmHeaps(AllocatorState& state, VirtualMemory& vm) : st_(state), vm_(vm), page_(vm.page_size()) {
  st_.config.max_split_size = 0;  // every block of a heap can be split: no oversize segments
}

// The heap of ss for `pool`, made on first use: a reserved range of four times the device's
// capacity, one unmapped free block. Twice: the address space of a full device, fragmented;
// twice that again: stitched ranges (vmm_stitch.cpp) map pages that stay mapped where they lie.
Heap& VmmHeaps::heap_for(StreamState& ss, Pool pool) {
  Heap*& slot = ss.vmm_heaps[static_cast<int>(pool)];
  if (slot != nullptr) return *slot;
  const std::size_t range = round_up(4 * st_.props.capacity, page_);
  st_.refuse_if_captured(ss.stream);
  const Address base = vm_.reserve_address_range(range, page_);
  if (base == 0)
    throw DeviceError("tensorpool: cannot reserve " + format_bytes(range) + " of address space on " +
                      st_.props.name);
  auto seg = std::make_unique<Segment>();
  seg->addr = base;
  seg->size = range;
  seg->owner = &ss;
  seg->pool = pool;
  seg->index = &AllocatorState::index_for(ss, pool, false);
  Block* b = ss.shard->blocks.acquire();
  b->addr = base;
  b->size = range;
  b->segment = seg.get();
  b->mapped = false;
  seg->first = b;
  Heap& heap = heaps_.try_emplace(base, seg.get(), st_.config.vmm_plan_max_blocks).first->second;
  seg->epoch = &heap.epoch;
  seg->vmm = &heap;
  ss.plan_state[static_cast<int>(pool)] = heap.cursor.state_address();
  heap.unmapped.emplace(base, b);
  st_.segments.emplace(base, std::move(seg));
  slot = &heap;
  if (st_.config.vmm_planner == PlannerMode::background && st_.config.vmm_plan_max_blocks != 0) {
    if (!planner_) planner_ = std::make_unique<EpochPlanner>(page_);
    // Two spares: the record one epoch hands over is replaced while the one before it may still
    // be planned.
    planner_->prepare(heap.mailbox, 2, st_.config.vmm_plan_max_blocks);
  }
  return heap;
}

std::size_t VmmHeaps::held_bytes(Pool pool) const {
  std::size_t bytes = 0;
  for (const auto& [base, heap] : heaps_)
    if (heap.pool() == pool) bytes += heap.held.bytes();
  return bytes;
}

Block* VmmHeaps::grow(StreamState& ss, Pool pool, std::size_t size) {
  Heap& heap = heap_for(ss, pool);
  heap.resume_recording();  // a heap that grows is recorded again (docs/vmm.md, "Planned layouts", 6)
  if (Block* b = from_held(heap, size)) return b;
  st_.refuse_if_captured(ss.stream);  // what follows may unmap, synchronize, map
  // Pages given back above a plan are needed again: a give-back now would only cycle them
  // (a release and a map again per change of step), so the heap keeps them from here on.
  heap.keeps_pages = heap.keeps_pages || std::exchange(heap.gave_back, false);
  const std::size_t want = round_up(size, page_);
  const std::size_t left = st_.room_left();
  const bool pressure = want > left;
  // Too few held pages: they join the free block before the hole, for place(), and other heaps'
  // may be remapped here; but for the pages of heaps that follow a plan, unless under pressure
  // (they are about to be used where they lie). Too much idle memory is remapped from this heap
  // only: other streams' heaps want theirs back at their next step, and pages moved back and
  // forth cost a synchronization each way every step (which is also why this heap's own stay
  // when they cycle with its steps: idle_pages()).
  const Spare spare = pressure ? Spare::none : Spare::following;
  release_held(pool, spare);
  if (pressure) {
    reclaim_free_chunks(pool, 0, spare);
  } else if (idle_pages(heap, size) == IdlePages::remap) {
    heap.reserved_at_idle_reclaim = st_.counters.reserved(pool);
    if (reclaim_heap(heap, 0).bytes != 0) heap.remapped_idle = true;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    Placement where = place(heap, size);
    if (where.hole == nullptr && !heap.lent.empty()) {
      // No hole holds it: free stitched ranges give their address space back (vmm_stitch.cpp).
      unstitch_free(heap, StreamWork::may_run);
      where = place(heap, size);
    }
    where.left = left;
    if (where.hole == nullptr) return nullptr;
    const Mapped mapped = map_into(heap, where);
    if (mapped.complete && mapped.block != nullptr && mapped.block->size >= size) return mapped.block;
    if (attempt == 0 && reclaim_free_chunks(pool, 0, Spare::none).bytes == 0) break;
  }
  return stitch(heap, size);  // the heap's free pages mapped again where the request needs them
}

// Whether grow() would remap the heap's idle pages (synchronizing its stream) for this request:
// its held pages do not serve it and idle_pages() says remap. Under pressure grow() reclaims
// instead, which synchronizes too where there are idle pages to reclaim, so the device's free
// memory is not asked.
bool VmmHeaps::growth_synchronizes(const StreamState& ss, Pool pool, std::size_t size) const {
  const Heap* heap = ss.vmm_heaps[static_cast<int>(pool)];
  if (heap == nullptr || held_block_for(*heap, size) != nullptr) return false;
  return idle_pages(*heap, size) == IdlePages::remap;
}

// Unmaps every entirely free chunk (empty_cache: but the first vmm_reserve bytes of them, over
// both pools) and releases every cached one.
std::size_t VmmHeaps::release(ReleaseGoal goal) {
  if (goal == ReleaseGoal::empty_cache)
    for (auto& [base, heap] : heaps_) {  // from here, as new
      heap.keeps_pages = heap.gave_back = false;
      heap.run_floor = 0;
    }
  release_held(Pool::small, Spare::none);
  release_held(Pool::large, Spare::none);
  // Free stitched ranges give their pages back where they lie first: those chunks may then be free.
  for (auto& [base, heap] : heaps_) unstitch_free(heap, StreamWork::may_run);
  const std::size_t keep = goal == ReleaseGoal::empty_cache ? st_.config.vmm_reserve : 0;
  std::vector<std::size_t> held_before;
  for (const auto& [base, heap] : heaps_) held_before.push_back(heap.chunk_bytes);
  const Reclaimed small = reclaim_free_chunks(Pool::small, keep, Spare::none);
  reclaim_free_chunks(Pool::large, small.keep_left, Spare::none);
  if (goal == ReleaseGoal::empty_cache) {  // the program empties its cache: it will again
    auto before = held_before.begin();
    for (auto& [base, heap] : heaps_) heap.cycles_pages = heap.cycles_pages || heap.chunk_bytes < *before++;
  }
  return release_cached_chunks();
}

// Teardown: no kernel may still touch the pages; unmap and release everything, give the
// address ranges back.
void VmmHeaps::destroy() {
  if (planner_) planner_->stop();
  st_.device->synchronize_device();
  try {
    for (auto& [base, heap] : heaps_)
      for (DeviceEvent* e : {&heap.layout_event, &heap.give_back_event})
        if (*e != 0) st_.device->destroy_event(std::exchange(*e, 0));
    // Every mapping first: a stitched chunk maps part of another chunk's handle.
    for (auto& [base, heap] : heaps_)
      for (auto& [a, c] : heap.chunks) vm_.unmap(c.addr, c.size);
    for (auto& [base, heap] : heaps_) {
      for (const auto& [a, k] : heap.kept) st_.device->free_host(k.host, k.bytes);
      heap.kept.clear();
      for (auto& [a, c] : heap.chunks)
        if (!c.stitched()) vm_.release_physical(c.handle);
      heap.clear_chunks();
      vm_.release_address_range(heap.segment->addr, heap.segment->size);
    }
    for (const Chunk& c : cached_.take_all()) vm_.release_physical(c.handle);
  } catch (const std::exception& e) {
    log().error("allocator teardown on {}: {}", st_.props.name, e.what());
  }
}

void VmmHeaps::for_each_held(const std::function<void(const Block*)>& f) const {
  for (const auto& [base, heap] : heaps_)
    for (const auto& [addr, b] : heap.held.blocks()) f(b);
}

std::unique_ptr<SegmentSource> make_vmm_heaps(AllocatorState& state) {
  VirtualMemory* vm = state.device->virtual_memory();
  if (vm == nullptr)
    throw ConfigError("tensorpool config: mode:vmm needs a device with virtual memory; " +
                      state.props.name + " has none");
  return std::make_unique<VmmHeaps>(state, *vm);
}

}  // namespace tensorpool::detail
