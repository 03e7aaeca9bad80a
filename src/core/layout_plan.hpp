// layout_plan.hpp: offline placement of one recorded epoch of a vmm heap (STAlloc-style
// planning). Given the blocks an epoch allocated, with their sizes and lifetimes in the heap's
// own clock, plan_layout() gives every block an offset from the heap's start such that no two
// blocks alive at the same time overlap, and says how high the layout reaches. A program that
// runs the same epoch again can then be served at those offsets with no device call, from
// `height` bytes of mapped memory (vmm_heaps.cpp; docs/vmm.md, "Planned layouts").
//
// Seven candidates, each tried only while the best so far is above the peak of live bytes
// (peak_live_bytes(): no layout reaches lower), each kept only when lower than the best so far:
//   recorded  the offsets the blocks really had, reaching as high as the epoch's address range
//             did (a candidate whenever the record is a layout: blocks alive together never
//             overlap; checked);
//   online    the epoch replayed in clock order against an ideal online allocator: best fit
//             among the gaps between the blocks alive at the time (coalesced on every free), else
//             the top. O(n log n). An epoch whose blocks nest (a forward pass kept for the
//             backward pass, with temporaries freed at once) reaches the live peak this way.
//             Fixed and pinned blocks are held where they were from the epoch's start (a pinned
//             block that overlaps a fixed one freed before it makes this candidate none);
//   packed    greedy by size: blocks in decreasing size (ties: earlier first) each take the
//             smallest gap between the already placed blocks alive at the same time that fits
//             it (ties: the lowest), else the top of them; fixed and pinned blocks are placed
//             first, where they were. It sees a step's whole future, so it places what an online rule cannot
//             (on training steps whose gradients and activations interleave it is the lowest);
//   replacing the same packing, but a block that replaces another (the largest block at least
//             half its size freed in the kReplacedWithin events before its allocation: `x = f(x)`,
//             a loss's upcast made as the logits it reads are freed) first tries that block's
//             place, starting where it started, else ending where it ended, and that block is
//             placed first if it is not yet. Packing by size stacks every step's large
//             short-lived blocks at one place, and what a step keeps into the next (the logits)
//             then takes turns above them; this leaves it a slot that the next step's upcast
//             covers;
//   peak first the same placement (fixed and pinned blocks first, each block the smallest gap
//             that fits among those alive with it), in another order: the blocks alive at the
//             live peak's first tick, in clock order, then the others in clock order. The peak's
//             blocks stack with no gap that a block placed before them left (packing by size
//             places a large block before smaller ones it outlives; the online order keeps the
//             gaps of blocks freed before the peak), and the rest fill around them
//             (docs/benchmarks.md, "The live peak's blocks placed first");
//   by area   the same placement, the blocks in decreasing size times lifetime (ties: larger,
//             then earlier, first): a block that lives long is placed before a larger one that
//             lives briefly, so the long-lived ones stack low and the brief ones share the gaps
//             above them over time, where packing by size puts the brief large block low and
//             leaves the long-lived ones around it;
//   by size, longest first  packing by size with ties (blocks of one size: a layer's
//             activations, its states) broken by the longer lifetime first, not the earlier
//             start: of the blocks of one shape, the one that outlives the others goes low
//             and the rest reuse the places above it as they come and go.
// The last two are the usual orders of greedy offline placement besides size (what they lower:
// docs/benchmarks.md, "Two more orders of packing"); no order is lowest on every epoch, so each
// is tried while the best is above the peak.
// An epoch with kept blocks (RecordedBlock::kept: a predicted step's new optimizer states, whose
// places make the next step's base) is planned first with the kept blocks placed before the
// others in every packing, each as low as it goes, and no online candidate; that layout is kept
// when it reaches no higher than the record did, or no more than twice as far above the live
// peak as the layout planned with the kept blocks as any (planned only then; the first packings
// stop above twice the record's slack, and run again within the higher bound if need be). A
// base left compact lets the steps after it reach lower: a scattered one leaves holes their
// activations cannot fill (docs/benchmarks.md, "New states placed as low as they go"); but from
// some scattered bases the kept blocks, first, take the room that the blocks alive across them
// (gradients) need, and the plan goes far higher (the factor of two is a choice).
// Packing (any of the five ways) costs O(n^2) simple steps at most (each block passes over the
// placed ones in offset order). The pass leaves out placed blocks that cannot change its answer
// (all below what it has covered, alive at other times, or a gapless run of blocks all alive with
// it, which only raises the top) and stops at a gap of exactly the block's size; packing stops as
// soon as its height reaches the best so far (it would not be kept). The layout is the plain
// scan's any way (test_layout_plan.cpp checks it block for block). A run of fixed blocks side by
// side with one lifetime (a step's base: weights, a KV cache) is one block to every candidate
// (FixedRuns; the same layout, checked against block by block). On training steps that leaves out most of the
// work (BM_PlanLayoutStep: about 10 ms for a gpt2-xl step of 7,153 blocks, 6.5 ms for a Mixtral
// step of 9,699); BM_PlanLayout's synthetic epoch of 8,192 blocks nests, and the online layout
// reaches its peak in 2-3 ms with no packing. Packing is bounded: it stops once its passes would
// have looked at kMaxPackSteps placed blocks (counted as if none were left out), what an epoch of
// 32,768 blocks costs at most, and the best so far is kept. vmm_plan_max_blocks bounds n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tensorpool::detail {

/// One recorded allocation. Invariants (checked by plan_layout): size > 0, start < end; the
/// clock is strictly increasing over the epoch's allocations and frees (no two events share a
/// tick), so two blocks overlap in time iff a.start < b.end && b.start < a.end.
struct RecordedBlock {
  std::size_t size = 0;
  std::uint64_t start = 0;    // tick of the allocation
  std::uint64_t end = 0;      // tick of the free (the epoch's last tick + 1 if never freed)
  std::size_t recorded = 0;   // the offset it had in the recorded epoch
  /// A block the epoch did not allocate (live before it began and after it ended: a step's
  /// weights): every layout keeps it at `recorded`, and the others are placed around it.
  bool fixed = false;
  /// An allocation of the epoch that lives on past its end (a step's output the program keeps
  /// over the boundary): every layout keeps it at `recorded` too, so that the epoch that follows
  /// the plan leaves it where the next epoch's base had it when that one was planned.
  bool pinned = false;
  /// An allocation of the epoch that lives on past its end whose place the layout chooses (a
  /// predicted step's new optimizer states: step_turns.hpp): the next epoch's base. The packings
  /// place the kept blocks before the others, in clock order, each at the lowest place clear of
  /// the blocks already placed that are alive with it, so that the next base lies as compact as
  /// this one allows; and the online candidate is not tried (it puts a kept block wherever the
  /// others leave room when it comes: a step's kept logits at the top of its forward peak, which
  /// the next step's forward must then go around).
  bool kept = false;

  /// Every layout keeps it at `recorded`.
  bool stays_where_recorded() const noexcept { return fixed || pinned; }
};

/// Which candidate a layout is (see the file comment).
enum class LayoutSource : std::uint8_t { recorded, online, packed, replacing, peak_first, by_area, by_size_longest };

struct PlannedLayout {
  std::vector<std::size_t> offsets;  // per block, in input order
  /// Per block, in input order: the index of the block that ends closest below it among those
  /// alive when it is allocated (kNone: none), where a search for its address can start.
  std::vector<std::uint32_t> below;
  std::size_t height = 0;  // max(offset + size)
  LayoutSource source = LayoutSource::recorded;
  static constexpr std::uint32_t kNone = UINT32_MAX;
};

/// The most placed blocks packing looks at, in all (see the file comment): n (n - 1) / 2 for
/// n = 32768, so that no epoch of up to 32,768 blocks is ever cut short.
inline constexpr std::size_t kMaxPackSteps = std::size_t{32768} * 32767 / 2;

/// How plan_layout() treats a run of fixed blocks (consecutive in the input, each starting where
/// the one before it ends, all with one lifetime): as one block, or block by block. Nothing else
/// is ever alive in a run's range and no gap opens inside it, so every candidate is the same
/// either way (the offsets, the links below, the height, the packing's bound), and one block is
/// cheaper: a step's base of thousands of tensors is a few runs. `as_blocks` is for the test and
/// the benchmark that compare the two.
enum class FixedRuns : std::uint8_t { as_one_block, as_blocks };

/// Plans the layout (there always is one: the online candidate). Throws std::invalid_argument
/// when a block breaks RecordedBlock's invariants.
PlannedLayout plan_layout(std::span<const RecordedBlock> blocks, std::size_t max_pack_steps = kMaxPackSteps,
                          FixedRuns runs = FixedRuns::as_one_block);

/// The largest sum of sizes of blocks alive at one tick: no layout reaches lower.
std::size_t peak_live_bytes(std::span<const RecordedBlock> blocks);

/// The allocations of a record (an epoch's, or step_turns.hpp's): its entries before the first
/// fixed one (the fixed blocks, live throughout, come after them).
std::size_t allocations_in(std::span<const RecordedBlock> record) noexcept;

}  // namespace tensorpool::detail
