// vmm_heaps.hpp: the virtual-memory source (mode:vmm): its data and the class that runs it.
// Physical pages, not address ranges, are the cached resource.
//
// Each stream has one heap per pool: a segment spanning a large reserved address range (twice
// the device capacity), tiled by blocks like any segment. Physical memory comes in chunks (one
// VirtualMemory::create_physical handle each, a multiple of the page size) mapped at
// page-aligned addresses of the heap. Blocks under chunks are "mapped"; free address space
// without pages is held by free blocks with mapped == false, listed in Heap::unmapped and never
// in a free index, so the fast path only ever sees mapped memory. Because a heap is one
// contiguous range, free space of neighbouring chunks coalesces, so the "separate segments never
// merge" fragmentation of fixed segments does not arise. Mapped memory stays mapped unless it is
// idle beyond a limit, needed elsewhere, or given back: a workload that repeats itself makes no
// map calls.
//
// One file per concern (docs/architecture.md, "The virtual-memory source"):
//   vmm_heaps.cpp   the SegmentSource: heaps made per stream and pool, the growth policy,
//                   release and teardown
//   vmm_pages.cpp   the pages: where a growth maps (placement, chunk sizes), mapping chunks,
//                   the cache of unmapped chunks, idle memory and its reclaim
//   vmm_epochs.cpp  epochs: held pages, the end of an epoch, pages above a plan given back,
//                   and following a plan (vmm_plans.hpp: the plan cache and cursor)
//   vmm_steps.cpp   step boundaries, and the plan the next epoch follows (its own, a step's
//                   mirror, a whole run's)
//   vmm_layout.cpp  the pages a plan needs put in place: an empty heap laid out again, holes
//                   under a step's base traded for the pages above its plan
//   vmm_sleep.cpp   sleep and wake: every heap's pages given back, live blocks kept at their
//                   addresses, and mapped back
//   vmm_check.cpp   the invariants of the source, for check_invariants
// See docs/vmm.md.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/epoch_log.hpp"
#include "core/run_record.hpp"
#include "core/segment_source.hpp"
#include "core/step_turns.hpp"
#include "core/vmm_planner.hpp"
#include "core/vmm_plans.hpp"

namespace tensorpool::detail {

/// A physical allocation (one handle) of whole pages.
struct Chunk {
  Address addr = 0;  // where it is mapped (0 while unmapped, in the cache)
  std::size_t size = 0;
  PhysicalHandle handle = 0;
  Pool pool = Pool::large;
  /// A stitched chunk (vmm_stitch.cpp): the address of the lent block whose pages it maps again
  /// (part of another chunk's handle, whose physical memory it is); 0: a chunk of its own. Never
  /// cached or released: unmapped, it gives its pages back to the lent block.
  Address lent_at = 0;
  std::size_t offset = 0;  // a stitched chunk: where its pages begin in the handle
  Address end() const noexcept { return addr + size; }
  bool stitched() const noexcept { return lent_at != 0; }
};

/// A free block a request can use: mapped, and not held (held pages are in no index).
inline bool free_mapped(const Block* b) noexcept {
  return b != nullptr && b->state == BlockState::free && b->mapped && !b->held;
}

/// Physical chunks mapped nowhere, kept to be mapped again (reserved memory, counted in the
/// reserved bytes until released). Invariant: every chunk's addr is 0.
class ChunkCache {
 public:
  /// Takes the chunk of `pool` to map next into `room` bytes: the smallest that covers `want`,
  /// else the largest that fits; nullopt if none fits.
  std::optional<Chunk> take(Pool pool, std::size_t want, std::size_t room);
  void put(const Chunk& c) { chunks_.push_back(Chunk{0, c.size, c.handle, c.pool}); }
  /// Removes and returns the chunk of `handle`, if cached.
  std::optional<Chunk> take_handle(PhysicalHandle handle);
  std::size_t bytes(Pool pool) const noexcept;
  /// Removes and returns every chunk (to be released).
  std::vector<Chunk> take_all() noexcept { return std::exchange(chunks_, {}); }
  /// Takes every cached chunk of `pool`.
  std::vector<Chunk> take_all(Pool pool);
  const std::vector<Chunk>& chunks() const noexcept { return chunks_; }

 private:
  std::vector<Chunk> chunks_;
};

/// A heap's held pages: free mapped blocks kept out of the free index when an epoch ends (one
/// held block per run of mapped memory), given back a growth step at a time. Invariants: each
/// listed block is free, mapped, has held == true and no held neighbour; bytes() is their sum.
class HeldPages {
 public:
  using Entries = std::vector<std::pair<Address, Block*>, CacheLineAllocator<std::pair<Address, Block*>>>;

  /// Holds free block x (in no index), merged with held neighbours; returns the held block x is
  /// now part of.
  Block* hold(Block* x, BlockPool& blocks);
  /// Takes the first `bytes` of held block r out of the held pages (the rest stays held);
  /// returns them as a free block in no index, not coalesced.
  Block* unhold(Block* r, std::size_t bytes, BlockPool& blocks);

  bool empty() const noexcept { return blocks_.empty(); }
  std::size_t bytes() const noexcept { return bytes_; }
  /// The held blocks as (address, block), by address.
  const Entries& blocks() const noexcept { return blocks_; }
  /// The held block that starts at `addr`, or nullptr.
  Block* find(Address addr) const noexcept;

 private:
  Entries::iterator position(Address addr) noexcept;
  // A sorted vector: a heap holds a few blocks (one per run of mapped pages between holes), and
  // an epoch of a repeated step holds and unholds them every time: no node allocated per call.
  Entries blocks_;
  std::size_t bytes_ = 0;
};

/// The layout a heap waits to make (Heap::pending_layout).
enum class PendingLayout : std::uint8_t { whole_heap, pages_above };

/// One heap: its mapping state, its held pages and its epochs. Invariants (vmm_check.cpp): chunks
/// do not overlap, lie inside the segment and are of its pool; every page of a block with
/// mapped == true lies in a chunk; a block with mapped == false is free, page-aligned at both
/// ends, intersects no chunk, and is in `unmapped` (which holds nothing else).
struct alignas(64) Heap {  // a cache line of its own: heaps of other streams change side by side
  Heap(Segment* seg, std::size_t max_plan_steps) : segment(seg), plans(max_plan_steps) {
    epoch.capacity = max_plan_steps;
    // No reallocation in the fast path; the pages fault in as the first epoch writes them (the
    // planner's spares, which the later epochs write, are written once by its thread).
    epoch.entries.reserve(max_plan_steps);
    cursor.reserve(max_plan_steps);
  }

  Segment* segment;                    // the reserved range, in AllocatorState::segments
  std::map<Address, Chunk> chunks;     // mapped chunks by address: changed by add_chunk/remove_chunk only
  // Kept with `chunks` (check_heap), so that the end of an epoch reads them without a walk:
  std::size_t chunk_bytes = 0;         // the sum of the chunks' sizes
  std::size_t mapped_prefix = 0;       // [start, start + mapped_prefix) is covered by chunks
  Address mapped_end = 0;              // the end of the highest chunk (0: none)
  std::set<Address> stitched_chunks;   // the addresses of the stitched ones (vmm_stitch.cpp; check_stitched)
  Address epoch_mapped_end = 0;        // mapped_end when the current epoch began (release_never_used)
  std::size_t reserved_at_idle_reclaim = 0;  // the pool's reserved bytes at the heap's last idle
                                             // reclaim (0: none): idle_pages()
  std::map<Address, Block*> unmapped;  // free blocks without pages, by address
  std::map<Address, Block*> lent;      // lent blocks (Block::lent), by address: vmm_stitch.cpp
  HeldPages held;
  bool asleep = false;                 // between sleep() and wake() (vmm_sleep.cpp)
  std::vector<Chunk> sleeping;         // the pages under live blocks that sleep() released, by
                                       // address (handle 0): their blocks are asleep until wake()
                                       // maps pages there again
  std::size_t asleep_blocks = 0;       // live asleep blocks, and their bytes
  std::size_t asleep_allocated = 0;
  struct Kept {
    void* host;
    std::size_t bytes;
  };
  std::map<Address, Kept> kept;        // sleep(keep): live asleep blocks' bytes in host memory

  RunRecord run;                       // the steps' records since the heap was last empty, joined
  EpochLog epoch;                      // the current epoch's record (Segment::epoch points here,
                                       // while `recording`)
  /// False after an epoch of one block that repeats (stop_recording()): the heap's allocations
  /// and frees are then not recorded (Segment::epoch is null, `epoch` is empty): it serves them
  /// on its pages as fixed segments do, until a growth, a step boundary or a sleep resumes the
  /// record (resume_recording()).
  bool recording = true;
  /// Of the epoch that ended last (kFirstEpochKey: none yet; after a step epoch that emptied
  /// the heap, VmmHeaps::emptied_key() of its signature). The plans are stored under it.
  std::uint64_t last_signature = 0;
  /// The signatures of the last kStepsSeen step epochs that ended (0: none), oldest overwritten
  /// first, and how many step epochs in a row ended like none before them (sight_step()).
  static constexpr std::size_t kStepsSeen = 8;
  std::array<std::uint64_t, kStepsSeen> steps_seen{};
  std::size_t steps_seen_next = 0;
  std::size_t new_steps_in_a_row = 0;
  PlanCache plans;                     // plans by the signature of the epoch before theirs
  PlanCursor cursor;                   // the current epoch and its plan (StreamState::plan_state)
  PlanMailbox mailbox;                 // with the planner thread (vmm_planner:background)
  DeviceEvent layout_event = 0;        // while laying_out: after the stream's work on the pages
  /// While laying_out: what moves then (finish_layout()): every page of the emptied heap
  /// (lay_out()), or, under a step epoch's live base, the pages above the plan's height into the
  /// holes below it, up to trade_height (trade_pages_above(); only this case reads it).
  PendingLayout pending_layout = PendingLayout::whole_heap;
  std::size_t trade_height = 0;
  DeviceEvent give_back_event = 0;     // while chunks above a followed plan's height wait to be
                                       // released: after the stream's work on them
  bool gave_back = false;              // give_back_above_plan() released chunks, and the heap has
                                       // mapped none since
  bool keeps_pages = false;            // a growth mapped pages again after a give-back: chunks
                                       // above a plan stay mapped (until empty_cache())
  /// What the heap held (the top of its mapped pages, from its start) when a step emptied it,
  /// while the plans stored from the run that ended do not cover the run that follows
  /// (run_plans() not closed: more steps than kRunPlans, or steps never planned, as a server's
  /// decode steps whose KV cache grows): no give-back goes below it until an epoch that began
  /// with the heap empty leaves it empty again, or empty_cache() (0: no floor). The run that
  /// ended is the evidence of how high this one goes; the plans its first steps follow say
  /// nothing of the later ones.
  std::size_t run_floor = 0;
  /// The highest of the plans the steps took in turn since the last step that took none (the
  /// two turns of a mirror, the predictions of a chain; 0: none): their pages stay mapped up to it
  /// while steps go on taking turns (plan_next_epoch()).
  std::size_t turns_height = 0;
  /// The plan the current step was given is a prediction (step_turns.hpp): with the planner
  /// thread, its boundary predicts the step after it again, to plan the one after that ahead
  /// (VmmHeaps::plan_ahead()); its pages are laid out whatever holes the heap has
  /// (trade_pages_above()).
  bool predicting = false;
  /// The steps in a row that followed a predicted plan (0: the last step followed none). The
  /// first plan of a chain was made around the base a step left online, the later ones around
  /// bases the chain's own plans placed: turns_height leaves the first out.
  std::uint32_t predictions_followed = 0;
  bool remapped_idle = false;          // a growth of the current epoch unmapped idle pages of the
                                       // heap to map them elsewhere (a synchronization):
                                       // affords_layout()
  bool cycles_pages = false;           // empty_cache() released chunks of the heap in the current
                                       // epoch: its pages go to the device and back every step
                                       // (map_plan() lays a plan out in fewer chunks)
  /// The plan the last epoch followed to its end (null: it did not), kept alive for the
  /// comparison: plans followed in turn give back what lies above both (choose_next_plan()).
  std::shared_ptr<const EpochPlan> followed_before;

  Pool pool() const noexcept { return segment->pool; }
  Stream stream() const noexcept { return segment->owner->stream; }

  /// A step epoch with `signature` ended: a repeat if one with it ended among the last
  /// kStepsSeen; else new, and noted. New steps are planned (new_plan) until kStepsSeen of them
  /// came in a row: then the steps do not repeat (a server whose KV cache grows every decode
  /// step), and new ones are not planned (new_skip) until one repeats or follows its plan.
  enum class StepSighting : std::uint8_t { repeat, new_plan, new_skip };
  StepSighting sight_step(std::uint64_t signature) noexcept {
    if (std::find(steps_seen.begin(), steps_seen.end(), signature) != steps_seen.end()) {
      new_steps_in_a_row = 0;
      return StepSighting::repeat;
    }
    steps_seen[steps_seen_next] = signature;
    steps_seen_next = (steps_seen_next + 1) % kStepsSeen;
    new_steps_in_a_row = std::min(new_steps_in_a_row + 1, kStepsSeen + 1);
    return new_steps_in_a_row > kStepsSeen ? StepSighting::new_skip : StepSighting::new_plan;
  }

  void add_chunk(const Chunk& c) {
    chunks.emplace(c.addr, c);
    if (c.stitched()) stitched_chunks.insert(c.addr);
    chunk_bytes += c.size;
    mapped_end = std::max(mapped_end, c.end());
    if (c.addr != segment->addr + mapped_prefix) return;
    for (auto it = chunks.find(c.addr); it != chunks.end() && it->first == segment->addr + mapped_prefix; ++it)
      mapped_prefix += it->second.size;
  }
  void remove_chunk(const Chunk& c) {
    chunks.erase(c.addr);
    stitched_chunks.erase(c.addr);
    chunk_bytes -= c.size;
    if (c.end() == mapped_end) mapped_end = chunks.empty() ? 0 : std::prev(chunks.end())->second.end();
    if (c.addr < segment->addr + mapped_prefix) mapped_prefix = c.addr - segment->addr;
  }
  /// A new epoch begins: an empty record, and the mapped end it began with (release_never_used()).
  void begin_epoch() {
    epoch.restart();
    cycles_pages = false;
    remapped_idle = false;
    epoch_mapped_end = mapped_end;
  }
  /// The heap is empty after an epoch of one block that repeats: the next ones go unrecorded.
  void stop_recording() {
    begin_epoch();
    segment->epoch = nullptr;
    recording = false;
  }
  /// The record resumes. With blocks in use (allocated while it was stopped) the epoch it
  /// resumes in is counted but not recorded (as one past vmm_plan_max_blocks: no plan from it);
  /// the pages mapped now are not its own (release_never_used() leaves them: blocks freed while
  /// it was stopped may have used them). O(the heap's blocks).
  void resume_recording() {
    if (recording) return;
    epoch_mapped_end = mapped_end;  // not as at stop_recording(): a release may have unmapped since
    for (Block* b = segment->first; b != nullptr; b = b->next) {
      if (!held_by_program(b)) continue;
      b->epoch_slot = EpochLog::kNoSlot;
      ++epoch.live;
      epoch.high = std::max<std::size_t>(epoch.high, b->addr + b->size - segment->addr);
    }
    epoch.full = epoch.live != 0;
    segment->epoch = &epoch;
    recording = true;
  }
  void clear_chunks() {
    chunks.clear();
    stitched_chunks.clear();
    chunk_bytes = 0;
    mapped_prefix = 0;
    mapped_end = 0;
  }
  FreeIndex& index() const noexcept { return *segment->index; }
  BlockPool& blocks() const noexcept { return AllocatorState::blocks_of(segment); }
};

/// Which heaps' pages an operation leaves alone.
enum class Spare : std::uint8_t {
  none,
  following,  // those of heaps that follow a plan (or wait to lay their pages out for one): their
              // pages are about to be used where they lie
};

/// Whether the work a stream queued on pages may still run when they are unmapped.
enum class StreamWork : std::uint8_t {
  may_run,  // ask first: reclaim_heap() synchronizes the stream, trim_chunk_at() queries it
  done,     // a query of the stream, or an event recorded after the work, said it completed
};

/// Whether the blocks live when the next epoch begins lie where those of the epoch that ends did
/// (a step epoch's base: VmmHeaps::end_step_epoch).
enum class NextBase : std::uint8_t {
  same,     // the same places and sizes (or none: the heap is empty)
  moved,    // other blocks, or elsewhere: a plan made around this epoch's base would not fit it
  emptied,  // none: a step epoch emptied the heap, and the next epoch begins from an empty heap
};

/// The heights above which the next epochs leave the pages unused, as VmmHeaps::plan_next_epoch()
/// finds them besides the next plan (0: not known).
struct NextHeights {
  std::size_t turns = 0;  // a step's two turns, both planned (VmmHeaps::take_turn())
  std::size_t run = 0;    // a run from the emptied heap, every plan of it stored (VmmHeaps::run_plans())
};

/// What a growth does with the idle pages of its heap (VmmHeaps::idle_pages).
enum class IdlePages : std::uint8_t {
  keep,   // idle memory within the limit, or the heap follows a plan: they stay where they are
  remap,  // unmapped (after synchronizing the stream) to serve the growth
  cycle,  // they cycle with the heap's steps: they stay, and the growth creates what it lacks
};

/// Whose chunks lay_out() maps a plan's pages with.
enum class Chunks : std::uint8_t {
  reuse,  // the heap's own and the cached ones: no memory created
  fresh,  // new ones, as large as a planned growth makes (the heap's and the cached ones released)
};

/// What can be done now for a plan's pages (VmmHeaps::map_plan).
enum class Layout : std::uint8_t {
  ready,       // mapped from the heap's start up to the plan's height
  impossible,  // the physical memory of the heap and the cache is not enough, or the device refused
  waiting,     // the pages must move, after the stream's work on them (Heap::layout_event)
};

class VmmHeaps final : public SegmentSource {
 public:
  VmmHeaps(AllocatorState& state, VirtualMemory& vm);

  // SegmentSource (vmm_heaps.cpp, vmm_epochs.cpp, vmm_check.cpp)
  Block* grow(StreamState& ss, Pool pool, std::size_t size) override;
  bool growth_synchronizes(const StreamState& ss, Pool pool, std::size_t size) const override;
  std::size_t release(ReleaseGoal goal) override;
  Release releases() const noexcept override { return Release::at_once; }
  std::size_t page_size() const noexcept override { return page_; }
  void destroy() override;
  void check(Recount& rc) const override;
  Block* end_epoch(Block* b) override;
  EpochEnd epoch_end_of(const Block* b) const noexcept override;
  Block* take_planned(StreamState& ss, Pool pool, std::size_t size, PlannedPages pages) override;
  void step_boundary(StepBoundary boundary) override;
  void for_each_held(const std::function<void(const Block*)>& f) const override;
  bool supports_sleep() const noexcept override { return true; }
  SleepReport sleep(Sleepers who, Contents contents) override;
  void wake(Sleepers who) override;
  void forget_asleep(Block* b) override;
  SleepReport asleep() const override;

 private:
  /// What a growth maps for.
  enum class Growth : std::uint8_t {
    request,  // a request nothing mapped fits: chunks sized by new_chunk_size()
    plan,     // the holes below a plan's height, which the epoch that follows it will use whole
  };
  /// Where a growth maps: `bytes` at the start of `hole` (an unmapped free block), of which the
  /// request needs at least `need`.
  struct Placement {
    Block* hole = nullptr;
    std::size_t bytes = 0;
    std::size_t need = 0;
    std::size_t request = 0;  // the request's size (Growth::plan: the plan's height)
    Address block_end = 0;    // where the request's block will end, if it is placed here
    Growth growth = Growth::request;
    std::size_t left = SIZE_MAX;  // what the allocator could still create when the growth began
                                  // (AllocatorState::room_left(); SIZE_MAX: not asked): chunk_floor()
    Address limit = 0;            // no chunk is mapped past it (0: the hole's end); a plan's height
  };
  /// What map_into() mapped.
  struct Mapped {
    Block* block = nullptr;  // the free mapped block at or before the hole (in the index); null: nothing mapped
    bool complete = false;   // the `need` bytes were mapped
  };
  /// What a reclaim unmapped, and how much of what it was to keep mapped it did not use.
  struct Reclaimed {
    std::size_t bytes = 0;
    std::size_t keep_left = 0;
  };

  // --- heaps (vmm_heaps.cpp) ---
  static Heap* heap_of(const StreamState& ss, Pool pool) noexcept { return ss.vmm_heaps[static_cast<int>(pool)]; }
  static Heap& heap_of(const Block* b) noexcept { return *b->segment->vmm; }
  Heap& heap_for(StreamState& ss, Pool pool);
  std::size_t held_bytes(Pool pool) const;

  // --- pages (vmm_pages.cpp) ---
  std::size_t growth_step(Pool pool) const noexcept;
  std::size_t idle_limit(Pool pool) const noexcept;
  IdlePages idle_pages(const Heap& heap, std::size_t size) const;
  Placement place(const Heap& heap, std::size_t size) const;
  std::size_t new_chunk_size(const Placement& where, Address at, Address end) const;
  std::size_t planned_chunk_size(std::size_t height) const noexcept;
  /// chunk_floor() counts the memory left times this once the device is fuller than 1 - 1/this.
  static constexpr std::size_t kFloorShareOfLeft = 4;
  std::size_t chunk_floor(bool past_block, std::size_t left) const noexcept;
  Mapped map_into(Heap& heap, const Placement& where);
  std::optional<Chunk> create_chunk(std::size_t bytes, Pool pool);
  std::size_t idle_physical(Pool pool) const;
  Reclaimed reclaim_free_chunks(Pool pool, std::size_t keep, Spare spare);
  Reclaimed reclaim_heap(Heap& heap, std::size_t keep, StreamWork work = StreamWork::may_run);
  Block* unmap_chunk(Heap& heap, Block* free_block, const Chunk& chunk);
  void mark_unmapped(Heap& heap, Block* b);
  std::size_t release_cached_chunks();
  std::size_t release_chunks(std::vector<Chunk> chunks);
  void release_chunk(const Chunk& c);

  // --- epochs: held pages, ends, give-back, following a plan (vmm_epochs.cpp) ---
  void hold_all(Heap& heap, Block* freed);
  Block* from_held(Heap& heap, std::size_t size);
  Block* held_block_for(const Heap& heap, std::size_t size) const;
  void release_held(Pool pool, Spare spare);
  void release_held(Heap& heap);
  /// The epoch that ends made the requests of the plan stored after an epoch like the one before
  /// it, and that one was like it: the next epoch follows the same plan again (plan_next_epoch()).
  static bool repeats_its_plan(const Heap& heap) noexcept {
    const PlanCursor& cursor = heap.cursor;
    const std::uint64_t signature = heap.epoch.signature;
    return cursor.matched(heap.epoch.allocations()) && signature == heap.last_signature &&
           cursor.key() == signature;
  }
  /// ... and the plan's pages are in place (mapped from the heap's start up to its height).
  static bool repeats_in_place(const Heap& heap) noexcept {
    return repeats_its_plan(heap) && heap.mapped_prefix >= heap.cursor.plan()->height;
  }
  /// ... with nothing mapped above the height (or pages above that the heap keeps: keeps_pages)
  /// and no give-back waiting: the end only holds the pages and follows the plan again
  /// (epoch_end_of()).
  static bool repeats_in_place_alone(const Heap& heap) noexcept {
    return repeats_in_place(heap) && (heap.keeps_pages || !has_pages_above_plan(heap)) && heap.give_back_event == 0;
  }
  /// The epoch that ends made one allocation, as the one before it did, and the heap maps
  /// nothing but the chunks that block reached, all from its start (nothing held, no chunk above,
  /// no event pending, no part asleep): the next epoch needs no plan and no held pages, since
  /// the free index puts its one block where a plan would (the heap's only free block, from its
  /// start), and its end only hands the block to the index (epoch_end_of()). (A chunk
  /// that straddles the block's end is cut to the plan's height by a give-back only once the
  /// stream is idle there: trim_chunk_at().)
  /// A heap that keeps its pages (keeps_pages: nothing above a plan would be given back) may
  /// hold pages and map chunks above the block: they go to the index with it (end_epoch()).
  bool repeats_alone_trivially(const Heap& heap) const noexcept {
    const EpochLog& log = heap.epoch;
    const Address start = heap.segment->addr;
    return log.entries.size() == 1 && !log.at_step && log.signature == heap.last_signature &&
           heap.mapped_end == start + heap.mapped_prefix && heap.give_back_event == 0 &&
           heap.cursor.state() != PlanState::laying_out && heap.sleeping.empty() &&
           (heap.keeps_pages || (heap.held.empty() && no_chunk_above(heap, log.high)));
  }
  /// No chunk of the heap starts at or above the page `height` bytes from its start reach.
  bool no_chunk_above(const Heap& heap, std::size_t height) const noexcept {
    const Address top = heap.segment->addr + round_up(height, page_);
    return heap.mapped_end <= top || std::prev(heap.chunks.end())->first < top;
  }
  /// Every chunk above what the heap's epoch reached was mapped by that epoch (or there is none).
  bool pages_above_are_own(const Heap& heap) const noexcept {
    return no_chunk_above(heap, heap.epoch.high) ||
           heap.epoch_mapped_end <= heap.segment->addr + round_up(heap.epoch.high, page_);
  }
  void choose_next_plan(Heap& heap, NextBase next_base, std::uint64_t next_base_signature);
  /// The heap has a plan and maps chunks above its height (give_back_above_plan()).
  static bool has_pages_above_plan(const Heap& heap) noexcept {
    return heap.cursor.plan() != nullptr && heap.mapped_end > heap.segment->addr + heap.cursor.plan()->height;
  }
  /// `height`: the highest of the plans the heap follows (one, or two in turn).
  void give_back_above_plan(Heap& heap, std::size_t height);
  void release_above(Heap& heap, Address top);
  Block* free_block_over(const Heap& heap, const Chunk& c) const noexcept;
  void cache_chunk_under(Heap& heap, Block* b, const Chunk& c);
  void release_chunk_under(Heap& heap, Block* b, const Chunk& c);
  std::vector<PhysicalHandle> cache_above(Heap& heap, Address top);
  void release_if_cached(const std::vector<PhysicalHandle>& handles);
  void trim_chunk_at(Heap& heap, Address top, StreamWork work);
  void give_back_cached(Heap& heap);
  void release_never_used(Heap& heap);
  /// Where the pages the current epoch mapped and no block of it used begin.
  Address never_used_from(const Heap& heap) const noexcept {
    return std::max(heap.segment->addr + round_up(heap.epoch.high, page_), heap.epoch_mapped_end);
  }
  /// The heap maps chunks above never_used_from() (release_never_used()).
  bool has_never_used_pages(const Heap& heap) const noexcept { return heap.mapped_end > never_used_from(heap); }
  void drop_event(DeviceEvent& e) noexcept;
  Block* find_planned(const Heap& heap, const EpochPlan::Step& step) const;
  Block* take_step(Heap& heap, const EpochPlan::Step& step);
  Block* first_block_of(const Heap& heap, const EpochPlan::Step& step) const;
  bool needs_pages(const Heap& heap, const EpochPlan::Step& step) const;
  bool map_planned(Heap& heap, const EpochPlan::Step& step);
  Block* carve(Heap& heap, Block* x, Address at, std::size_t size);

  // --- step boundaries and the next epoch's plan (vmm_steps.cpp) ---
  void end_step_epoch(Heap& heap, std::uint64_t next_base);
  /// The step epoch's base blocks freed before its end join its record, as fixed blocks.
  static void add_freed_base(EpochLog& log) {
    log.entries.insert(log.entries.end(), log.freed_base.begin(), log.freed_base.end());
    log.fixed += log.freed_base.size();
  }
  /// The key the heap's first epoch stores its plan under (no epoch ended before it).
  static constexpr std::uint64_t kFirstEpochKey = 0;
  /// The key of the plan for an epoch from an empty heap after a step epoch of `signature` that
  /// emptied it: not the plan for the step that follows such a step, stored under `signature`.
  static constexpr std::uint64_t emptied_key(std::uint64_t signature) noexcept {
    return EpochLog::mixed(signature, kEmptiedSalt);
  }
  static constexpr std::uint64_t kEmptiedSalt = 0x656d70746965640aull;  // "emptied\n"
  /// The key of the plan of a whole run (RunRecord) from an empty heap after a step epoch of
  /// `signature` that emptied it (VmmHeaps::plan_run()).
  static constexpr std::uint64_t run_key(std::uint64_t signature) noexcept { return EpochLog::mixed(signature, kRunSalt); }
  static constexpr std::uint64_t kRunSalt = 0x72756e0aull;  // "run\n"
  static constexpr std::uint64_t kAheadSalt = 0x61686561640aull;  // "ahead\n": plan_ahead()'s key
  void rebase(Heap& heap, std::uint64_t base_signature);
  NextHeights plan_next_epoch(Heap& heap, NextBase next_base, std::uint64_t next_base_signature);
  PlanCache::Chain run_plans(const Heap& heap, std::uint64_t key, std::uint64_t last) const;
  bool run_lays_out_now(const Heap& heap);
  /// The plans of a run from an emptied heap that run_plans() looks at.
  static constexpr std::size_t kRunPlans = 16;
  /// How the step epoch that ends ran: following one of its plans to the end, or online.
  enum class StepRun : std::uint8_t { followed, online };
  struct Turn {
    std::shared_ptr<const EpochPlan> plan;  // null: none
    std::uint64_t key = 0;                  // where it is stored
    std::size_t height = 0;                 // above it both turns leave the pages unused (0: unknown)
  };
  Turn take_turn(Heap& heap, StepRun run, const EpochPlan* mine, std::uint64_t next_signature,
                 const std::optional<NextStepRecord>& next_step);
  PlanCache::Found next_turn(Heap& heap, std::uint64_t next_signature, const std::optional<NextStepRecord>& next_step);
  static std::uint64_t signature_after(const EpochLog& log, std::uint64_t base) noexcept;
  static std::uint64_t next_step_signature(const std::optional<NextStepRecord>& next_step, std::size_t this_requests,
                                           std::uint64_t this_step, std::uint64_t next_base) noexcept;
  static std::uint64_t live_signature(const Heap& heap) noexcept;
  void join_run(Heap& heap, RunRecord::EpochEnded ended);
  void plan_run(Heap& heap, std::uint64_t key, std::uint64_t last);
  std::shared_ptr<const EpochPlan> plan_now(const Heap& heap);
  std::shared_ptr<const EpochPlan> plan_on_caller(std::span<const RecordedBlock> record, std::uint32_t boundaries = 0);
  void hand_to_planner(Heap& heap);
  void hand_next_step_to_planner(Heap& heap, std::uint64_t next_signature, NextStepRecord&& next_step);
  void plan_ahead(Heap& heap, const NextStepRecord& next_step, const EpochPlan& plan, std::uint64_t next_signature);
  static std::uint64_t base_signature(std::span<const BaseBlock> base) noexcept;
  /// One block of a base folded into its signature (live_signature(), base_signature()).
  static constexpr std::uint64_t mixed_base_block(std::uint64_t hash, std::size_t offset, std::size_t size) noexcept {
    return EpochLog::mixed(EpochLog::mixed(hash, offset), size);
  }
  static std::uint64_t signature_of(std::span<const RecordedBlock> record, std::size_t allocations,
                                    std::uint64_t base) noexcept;
  void count_next_step(NextStepKind kind) noexcept;
  static bool mirror_would_replace_own_plan(const Heap& heap) noexcept;
  void collect_plans(Heap& heap);

  // --- a plan's pages laid out (vmm_layout.cpp) ---
  Layout map_plan(Heap& heap, std::size_t height);
  bool lay_out(Heap& heap, std::size_t height, Chunks chunks = Chunks::reuse);
  bool moves_only_pages_above(const Heap& heap, std::size_t height) const noexcept;
  bool rechunks(const Heap& heap, std::size_t height);
  bool affords_layout(const Heap& heap, std::size_t height) const noexcept;
  bool holds_pages_for(const Heap& heap, std::size_t height) const noexcept;
  bool stream_work_done(const Heap& heap);
  Layout trade_pages_above(Heap& heap, std::size_t height);
  Layout trade_after_work(Heap& heap, std::size_t height);
  Layout defer_until_work_done(Heap& heap, PendingLayout what, std::size_t height);
  Layout trade_now(Heap& heap, std::size_t height);
  Layout move_pages_into_holes(Heap& heap, std::size_t height);
  std::size_t hole_bytes_below(const Heap& heap, Address top) const noexcept;
  std::size_t chunk_bytes_from(const Heap& heap, Address top) const noexcept;
  struct ChunkAcross {
    Chunk chunk;
    Block* free = nullptr;
  };
  ChunkAcross chunk_across(const Heap& heap, Address top) const noexcept;
  bool map_holes(Heap& heap, Block* x, Address end, Address top, std::size_t request);
  DeviceEvent event_pending_on(const Heap& heap);
  bool finish_layout(Heap& heap);
  void abandon_layout(Heap& heap);

  // --- stitching under pressure (vmm_stitch.cpp) ---
  /// A run of whole free pages lent to a stitch: [begin, end) of free block `block`, in `chunk`.
  struct LentRun {
    Block* block;
    const Chunk* chunk;
    Address begin;
    Address end;
  };
  Block* stitch(Heap& heap, std::size_t size);
  Block* with_last_pages(Heap& heap, std::size_t size);
  Block* stitch_free_pages(Heap& heap, std::size_t size);
  std::array<const Block*, 2> joined_by(const Placement& where) const noexcept;
  std::vector<LentRun> runs_to_lend(const Heap& heap, std::array<const Block*, 2> spared, std::size_t need) const;
  void map_runs(Heap& heap, Address at, const std::vector<LentRun>& runs);
  void lend(Heap& heap, const std::vector<LentRun>& runs);
  void unstitch_free(Heap& heap, StreamWork work);
  static std::vector<Chunk> free_stitched_chunks(const Heap& heap);
  void give_back_lent(Heap& heap, const Chunk& stitched);
  void check_stitched(const Heap& h) const;
  static Block* free_block_covering(const Heap& heap, const Chunk& c) noexcept;
  static Block* block_holding(Block* from, Address at) noexcept;
  static Block* hole_holding(const Heap& heap, Address at);
  static bool covers_free(const Block* b, const Chunk& c) noexcept;

  // --- sleep and wake (vmm_sleep.cpp) ---
  static bool covered(const Heap& heap, Sleepers who) noexcept {
    return who.cover(heap.segment->owner->tag);
  }
  SleepReport asleep(Sleepers who) const;
  std::size_t sleep_heap(Heap& heap);
  std::vector<Chunk> pages_under_live(const Heap& heap, const std::vector<Chunk>& chunks) const;
  void unmap_off_sleeping(Heap& heap, Block* b);
  void keep_contents(const std::vector<Heap*>& heaps);
  void free_kept(Heap& heap, Address addr) noexcept;
  bool slept_before(Sleepers who) const noexcept;
  void forget_sleeps(Sleepers who) noexcept;
  std::string wake_heaps(Sleepers who);
  std::string restore_contents(Heap& heap);
  std::vector<std::pair<Heap*, Chunk>> pages_for_waking(Sleepers who);
  void forget_sleeping_chunks(Heap& heap);
  void wake_blocks(Heap& heap);

  // --- invariants (vmm_check.cpp) ---
  void check_heap(const Heap& heap) const;
  void check_epoch(const Heap& heap) const;
  void check_asleep(const Heap& heap, const Block* b) const;

  AllocatorState& st_;
  VirtualMemory& vm_;
  const std::size_t page_;                 // vm_.page_size()
  std::map<Address, Heap> heaps_;          // by the address of their range
  ChunkCache cached_;
  // The boundary step_boundary() is making (plan_next_epoch() mirrors a step only at the
  // program's own: a found boundary is a guess from the requests, which a mirror would compound).
  StepBoundary boundary_ = StepBoundary::called;
  std::uint64_t boundaries_made_ = 0;  // step_boundary() calls so far
  // The sleep() calls no wake() has answered yet: a wake() after one is no misuse, even when that
  // sleep found no heap to put to sleep (nothing allocated yet: heaps, once made, stay).
  std::vector<Sleepers> unwoken_sleeps_;
  // Last: destroyed (stopped) before the heaps whose mailboxes it writes to.
  std::unique_ptr<EpochPlanner> planner_;  // vmm_planner:background, made with the first heap
};

}  // namespace tensorpool::detail
