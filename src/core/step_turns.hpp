// step_turns.hpp: the record of the next step of a loop whose kept outputs take turns with what
// they replace, made from the record of the step that just ended (vmm_steps.cpp plans it).
//
// A PyTorch training loop keeps its logits over the step boundary (`logits = model(x)` frees the
// last step's only once this step's are made): the step allocates a block it keeps (pinned,
// layout_plan.hpp) while a base block of the same size is still alive, and frees that base block
// later in the step. The next step begins with the kept
// block where this one put it and the freed one's place empty, so its base is not this step's,
// and a plan of this step (made around this base) does not fit it. The next step makes the same
// requests, though, with the roles of the two places swapped: its kept block can go where the
// freed one was, and the block kept now is its base, freed when this step freed the one it
// replaces. mirrored_step() writes that record; planned, it lets the next step follow a plan at
// once, and the step after it follow this step's own plan (its base is this step's again), so the
// loop settles into two plans that take turns from its second step epoch on.
//
// A step that replaces its kept blocks one after another (an optimizer that makes each state
// anew, `m = b1 * m + (1 - b1) * g`, while the old one lives: the CS336 loops) has no mirror:
// each new block would go where the next one's predecessor still lives. predicted_step() writes
// the next step's record anyway, around the base it will begin with (this step's kept blocks
// where they are, each freed when this step freed the one it replaced), and leaves the places of
// the blocks it keeps to the plan, which puts them as low as they go (the next base compact: a
// base scattered over the pages leaves holes the next forward pass cannot fill); the step after
// it is predicted in turn at the next boundary (or, with the planner thread, ahead: from the
// record the next step makes if it keeps to its plan, followed_record()).
//
// The optimizer's first step makes each state (zeros) and then makes it anew in the same way,
// freeing the zeros: its base grew by the new states and freed nothing, so nothing pairs, and
// the step after it would run online, leaving its new states scattered wherever the free index
// put them (a base the whole chain of predictions then plans around: on the CS336 2.7B model in
// fp32, a 39,064 MiB base of weights and states reaching up to 67,301 MiB, for a 66,868 MiB
// peak). predicted_after_creation() predicts that step from the first: the same requests but the
// zeros, each kept block freed where its zeros were, the new ones placed by the plan as low as
// they go.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/layout_plan.hpp"

namespace tensorpool::detail {

/// The record of the step that follows the step recorded in `record` (a step epoch's record as
/// VmmHeaps::end_step_epoch() leaves it: its `allocations` allocations in order, its pinned ones
/// among them, then its base as fixed blocks, live ones alive to the epoch's end and freed ones
/// to their free), if that step repeats this one with the roles swapped:
///   * the pinned blocks pair with the base blocks the step freed, one for one, by size (the
///     k-th pinned block of a size, in allocation order, with the k-th freed of that size, in
///     the order of their frees);
///   * each pinned block is recorded at the place of the base block it pairs with (so the step
///     that follows the plan leaves its kept blocks where this step's base had them), and each
///     base block freed is recorded at the place of the pinned block it pairs with, alive until
///     the last free of a base block of its size (which of them the program frees first is not
///     known: the latest is safe for each);
///   * a pinned block and a base block freed that would then overlap while both are alive make
///     no record.
/// Nullopt when there is nothing to swap (no pinned block), when the two sets do not pair, or on
/// such an overlap. O(n log n).
std::optional<std::vector<RecordedBlock>> mirrored_step(std::span<const RecordedBlock> record, std::size_t allocations);

/// The record of the step that follows the step recorded in `record`, if that step makes this
/// one's requests from the base it will begin with (the blocks live now):
///   * the pinned blocks pair with the base blocks the step freed, as for mirrored_step();
///   * each base block freed is recorded at the place of the pinned block it pairs with (the
///     next step frees the block kept now, where it lies), alive until its own free (the k-th of
///     a size freed in the next step is the k-th kept of that size now: the program keeps its
///     order);
///   * each pinned block is recorded unpinned and kept (RecordedBlock::kept): the plan places
///     it, alive to the end, as low as it goes before the step's other blocks (the step after
///     the next has its base where the plan put it, as compact as this base allows).
/// A step that does not follow the prediction departs from the plan at its first request whose
/// planned place is taken, as from any plan. Nullopt when there is no pinned block or the two
/// sets do not pair. O(n log n).
std::optional<std::vector<RecordedBlock>> predicted_step(std::span<const RecordedBlock> record,
                                                        std::size_t allocations);

/// The record of the step that follows the step recorded in `record`, when the blocks that step
/// keeps chiefly replaced blocks it made itself: an optimizer's first step, which makes each
/// state (`m = state.get("m", zeros_like(p))`) and then makes it anew (`m = b1 * m + ...`,
/// freeing the zeros), so that its base grew by the new states and freed nothing, and no
/// prediction pairs. The next step makes the same requests but the replaced ones (the states
/// exist) and frees each kept block where this step freed the block it replaced:
///   * a pinned block replaced an allocation of the same size made before it and freed at most
///     kRebindWithin events after it (the program rebinding its name: `x = f(x)`), the oldest
///     such if several (the temporaries of f are younger); each replaced block once;
///   * a prediction only when the pinned blocks that replaced one are at least half the bytes
///     pinned (a choice, docs/vmm.md "Steps"): a step that keeps what it made for good (torch's
///     optimizers make their states once and update them in place) and replaced little (a
///     micro-batch's logits, made while the last one's live) would make those requests again;
///   * the replaced allocations are left out; each pinned block is recorded unpinned and kept
///     (RecordedBlock::kept), and again as a base block at its place, freed when the block it
///     replaced was (one that replaced none: alive to the end);
///   * the base blocks this step did not free, as they are.
/// Followed, the step after the first places its new states as low as they go around the base
/// the first left online (the chain of predictions begins a step sooner, from a compact base);
/// a step that does not make those requests departs from the plan at its first request whose
/// size or place differs. Nullopt when no pinned block replaced one, or too few bytes did.
/// O(n log n).
std::optional<std::vector<RecordedBlock>> predicted_after_creation(std::span<const RecordedBlock> record,
                                                                  std::size_t allocations);

/// Events after a kept block's allocation within which the block it replaced is freed
/// (predicted_after_creation()): as many as layout_plan.cpp's kReplacedWithin.
inline constexpr std::uint64_t kRebindWithin = 8;

/// The record a step makes when it follows a plan of its predicted record `predicted`
/// (predicted_step()'s: `allocations` allocations first, then its base) that puts allocation i at
/// `offsets[i]`: its allocations there, those alive to its end pinned (kept over the boundary),
/// its base as predicted. What the boundary after that step will record, so that the step after
/// it can be predicted while it runs (the planner thread's step ahead, vmm_steps.cpp). Nullopt
/// when `offsets` is not one per allocation.
std::optional<std::vector<RecordedBlock>> followed_record(std::span<const RecordedBlock> predicted,
                                                         std::size_t allocations,
                                                         std::span<const std::size_t> offsets);

/// A block of a step's base: where it lies from the heap's start, and its size.
struct BaseBlock {
  std::size_t offset = 0;
  std::size_t size = 0;
  bool operator==(const BaseBlock&) const = default;
};

/// The blocks alive at the end of the step recorded in `record` (its base blocks not freed, the
/// allocations it keeps): the base of the step after it, in address order. O(n log n).
std::vector<BaseBlock> base_after(std::span<const RecordedBlock> record);

/// Which record next_step_record() made.
enum class NextStepKind : std::uint8_t { mirrored, predicted };

struct NextStepRecord {
  std::vector<RecordedBlock> blocks;
  NextStepKind kind = NextStepKind::mirrored;
};

/// The next step's record: its mirror (mirrored_step()), else its prediction (predicted_step(),
/// else predicted_after_creation()).
std::optional<NextStepRecord> next_step_record(std::span<const RecordedBlock> record, std::size_t allocations);

}  // namespace tensorpool::detail
