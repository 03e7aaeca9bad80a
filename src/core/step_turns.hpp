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
#pragma once

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

}  // namespace tensorpool::detail
