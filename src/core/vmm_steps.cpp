// vmm_steps.cpp: the step boundaries of the vmm heaps (vmm_heaps.hpp) and the plan each heap's
// next epoch follows.
//
// Allocator::step() (or a boundary the step finder found) ends the epoch of every heap that did
// not empty over a whole step: its record gets the blocks live when it began (its base) as fixed
// blocks, and the blocks it still holds count as alive to its end. It is planned around its base
// and stored under the signature of the epoch before it (plan_next_epoch(), shared with the
// epochs that end where the heap empties, vmm_epochs.cpp); the next epoch follows the plan stored
// after an epoch like this one. A step whose base moved only because what it keeps replaced what
// it freed of its base (a loop's logits) is also planned as its mirror (step_turns.hpp), so that
// the two plans take turns (next_turn(), take_turn()); one that replaced them one after another
// (an optimizer's new states) is planned as its prediction, the next step around the base it
// will have, and so is each step that followed such a plan (with the planner thread, a step
// ahead: plan_ahead()); so is the step after one that kept chiefly what it made in place of what
// it had made itself (the optimizer's first step: predicted_after_creation()), whose prediction
// makes this step's requests but those. A step that empties the heap has the run of
// steps since it was last empty planned as one epoch (RunRecord, plan_run()). The pages a chosen
// plan needs are laid out by map_plan() (vmm_layout.cpp). docs/vmm.md, "Steps".
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/step_turns.hpp"
#include "core/util.hpp"
#include "core/vmm_heaps.hpp"

namespace tensorpool::detail {

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
// whose kept blocks replaced base blocks it freed is also planned as its mirror or its prediction,
// which the next step follows (next_turn(); with the planner thread, a later one). An epoch past vmm_plan_max_blocks plans nothing. The next epoch
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
    if (std::shared_ptr<const EpochPlan> plan = plan_on_caller(run.entries(), run.boundaries()))
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
    hash = mixed_base_block(hash, x->addr - heap.segment->addr, x->size);
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
  const std::size_t requests = heap.epoch.allocations();  // the record may go to the planner below
  std::shared_ptr<const EpochPlan> mine;
  // The next step's record, when the program ended this step and its base moved by what it kept:
  // its mirror, or its prediction (next_step_record()), never made in an allocation. The
  // synchronous planner plans it in step(), so that the next step follows it (next_turn()). With
  // the planner thread a mirror goes to the thread, found from a later step
  // (hand_next_step_to_planner()); a prediction is planned in step() when no plan is stored for
  // it (the first of a chain: next_turn()), and the thread plans the step after it ahead
  // (plan_ahead()). Not made when the next step's plan is stored (two turns, found), but in a
  // chain with the planner thread, whose plan_ahead() needs it.
  std::optional<NextStepRecord> next_step;
  const bool predicts = next_base == NextBase::moved && boundary_ == StepBoundary::called;
  const bool background = st_.config.vmm_planner != PlannerMode::synchronous;
  const bool was_predicting = std::exchange(heap.predicting, false);
  heap.predictions_followed = matched && was_predicting ? heap.predictions_followed + 1 : 0;
  if (matched) {
    mine = cursor.release_plan();
    heap.new_steps_in_a_row = 0;  // a step epoch that followed a plan repeated one
    // A step that followed a predicted plan moves its base again (new optimizer states each
    // step): the step after it is predicted in turn (with the planner thread, also when its plan
    // is stored: plan_ahead() needs its record).
    if (predicts && ((background && was_predicting) || !heap.plans.latest_of(next_signature).plan))
      next_step = next_step_record(heap.epoch.entries, heap.epoch.allocations());
    if (next_step && background && next_step->kind == NextStepKind::mirrored) {
      hand_next_step_to_planner(heap, next_signature, std::move(*next_step));
      next_step.reset();
    }
  } else if (heap.epoch.at_step && heap.sight_step(signature) == Heap::StepSighting::new_skip) {
    // The last Heap::kStepsSeen step epochs were each like none before them (a decode step whose
    // KV cache grew, a new sequence length every step): the steps do not repeat, and a plan is
    // followed only by a step that repeats one, while planning a step costs O(its base), which a
    // server that calls step() per decode step paid for plans never followed. New steps are
    // planned again once one repeats.
  } else {
    if (predicts) next_step = next_step_record(heap.epoch.entries, heap.epoch.allocations());
    if (st_.config.vmm_planner == PlannerMode::synchronous) {
      mine = plan_now(heap);
    } else {
      hand_to_planner(heap);
      if (next_step && next_step->kind == NextStepKind::mirrored) {
        hand_next_step_to_planner(heap, next_signature, std::move(*next_step));
        next_step.reset();
      }
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
    const std::uint64_t turn_signature = next_step_signature(next_step, requests, next_signature, next_base_signature);
    Turn turn = take_turn(heap, matched ? StepRun::followed : StepRun::online, mine.get(), turn_signature, next_step);
    next = std::move(turn.plan);
    next_key = turn.key;
    turns_height = turn.height;
    heap.predicting = next != nullptr && next_step && next_step->kind == NextStepKind::predicted;
    if (heap.predicting && background) plan_ahead(heap, *next_step, *next, turn_signature);
  }
  // Steps that take turns one after another keep the pages up to the highest of their plans (a
  // chain of predictions, each planned around a base the last plan left, reaches a little higher
  // or lower every step: a give-back at each dip would be mapped again at the next rise, with a
  // growth), within the pages the heap holds; but not the first plan of a chain of predictions,
  // made around the base a step left online (its kept blocks wherever they came: higher than
  // the bases the chain's plans place; the optimizer's first step's, or the second's when the
  // first had nothing to predict from), once the step that followed it has ended: what it
  // reaches above the next is that base's cost, which the chain does not meet again (on the
  // CS336 medium model with autocast, 84 MiB, 0.47% of the step's peak: held, the loop kept
  // 1.0050 of what it requested from its third step, given back 1.0003).
  const bool first_of_chain = heap.predictions_followed == 1 && turns_height != 0 && heap.turns_height > turns_height;
  const std::size_t held_turns = first_of_chain ? 0 : std::min(heap.turns_height, heap.chunk_bytes);
  heap.turns_height = turns_height == 0 ? 0 : std::max(turns_height, held_turns);
  turns_height = heap.turns_height;
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

// The next step's plan when this step's base moved: its other turn (next_turn()). A mirror is
// taken only within the pages the heap holds and, after a step that ran online, below where it
// reached (else the steps run online again); a prediction at any height. `mine`, this step's own
// plan (null: not made yet). The height above which the turns leave the pages unused, when known.
VmmHeaps::Turn VmmHeaps::take_turn(Heap& heap, StepRun run, const EpochPlan* mine, std::uint64_t next_signature,
                                   const std::optional<NextStepRecord>& next_step) {
  PlanCache::Found turn = next_turn(heap, next_signature, next_step);
  if (!turn.plan) return {};
  // A mirror's two turns alternate (the step after the next repeats this one: `mine`); a
  // prediction's plan holds the next base and all the next step does, and the step after it is
  // predicted anew.
  const bool predicted = next_step && next_step->kind == NextStepKind::predicted;
  const std::size_t height =
      predicted ? turn.plan->height : std::max(turn.plan->height, mine != nullptr ? mine->height : 0);
  // A prediction may reach above the pages the heap holds, and above where a step that ran online
  // reached: the step maps the rest as it reaches it (map_planned(), or the trade of
  // trade_pages_above()), where online, from the base the step before left, it would grow higher
  // (on CS336 small, fp32 at context 256, with no prediction after its first step, the third
  // step reached 4,752 MiB online and 4,698 following its prediction). A mirror stays within them.
  const std::size_t reached = run == StepRun::online ? round_up(heap.epoch.high, page_) : SIZE_MAX;
  if (!predicted && height > std::min(reached, heap.chunk_bytes)) return {};
  return Turn{std::move(turn.plan), turn.key, predicted || mine != nullptr ? height : 0};
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
// both planned: the step before this one), else the plan of `next_step`, this epoch's mirrored or
// predicted record, made now and stored under this epoch's signature (the plan for the epoch
// after one like it; the synchronous planner's: the planner thread was handed the record instead,
// hand_next_step_to_planner()). `heap.last_signature` is still the signature of the epoch before this one, where this
// one's own plan is stored: the other turn, kept from eviction. Null when neither.
// `next_signature`: signature_after() the next base.
PlanCache::Found VmmHeaps::next_turn(Heap& heap, std::uint64_t next_signature,
                                     const std::optional<NextStepRecord>& next_step) {
  if (PlanCache::Found made = heap.plans.latest_of(next_signature); made.plan) return made;
  if (!next_step || mirror_would_replace_own_plan(heap)) return {};
  std::shared_ptr<const EpochPlan> plan = plan_on_caller(next_step->blocks);
  if (!plan) return {};
  count_next_step(next_step->kind);
  const std::uint64_t signature = heap.epoch.signature;
  heap.plans.store(signature, plan, heap.last_signature, next_signature);
  return PlanCache::Found{std::move(plan), signature};
}

// The signature the next step has if it makes the requests of `next_step` from its base (of
// live_signature() `next_base`): `this_step`'s, signature_after() that base of this step's
// `this_requests` requests, unless the record leaves some of them out
// (predicted_after_creation()).
std::uint64_t VmmHeaps::next_step_signature(const std::optional<NextStepRecord>& next_step, std::size_t this_requests,
                                            std::uint64_t this_step, std::uint64_t next_base) noexcept {
  if (!next_step) return this_step;
  const std::size_t requests = allocations_in(next_step->blocks);
  if (requests == this_requests) return this_step;
  return signature_of(next_step->blocks, requests, next_base);
}

// The signature an epoch has that makes the requests `log` recorded from a base whose
// live_signature() is `base` (as rebase() and EpochLog::on_alloc() make it). O(its allocations).
std::uint64_t VmmHeaps::signature_after(const EpochLog& log, std::uint64_t base) noexcept {
  return signature_of(log.entries, log.allocations(), base);
}

// The plan of the epoch just recorded, made here (null when it made more allocations than are
// recorded, or none, or planning failed).
std::shared_ptr<const EpochPlan> VmmHeaps::plan_now(const Heap& heap) {
  if (heap.epoch.full) return nullptr;
  return plan_on_caller(heap.epoch.entries);
}

// A plan made on the program's thread (Stats::plans_on_caller): every plan with the synchronous
// planner; with the planner thread, the first prediction of a chain (next_turn()).
std::shared_ptr<const EpochPlan> VmmHeaps::plan_on_caller(std::span<const RecordedBlock> record,
                                                          std::uint32_t boundaries) {
  st_.counters.count(&Stats::plans_on_caller);
  return make_epoch_plan(record, page_, boundaries);
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

// The background planner's part of next_turn(): the mirror or prediction of the step just ended,
// handed to the planner thread (planned there, not in step(): a step of 12,581 blocks and its mirror cost 92 ms
// of planning), to be stored under this step's signature as the plan of an epoch of signature
// `next_signature`, where next_turn() finds it from a later step. Not when such a plan is stored
// already (a loop's turns, found), nor when it would replace this step's own plan (a step like
// the one before it).
void VmmHeaps::hand_next_step_to_planner(Heap& heap, std::uint64_t next_signature, NextStepRecord&& next_step) {
  if (mirror_would_replace_own_plan(heap) || heap.plans.latest_of(next_signature).plan) return;
  const NextStepKind kind = next_step.kind;
  if (planner_->try_hand_over_made(heap.mailbox, heap.epoch.signature, next_signature, std::move(next_step.blocks)))
    count_next_step(kind);
}

// With the planner thread: the step after the next one, predicted from the record the next step
// makes if it keeps to `plan` (followed_record()), handed to the thread now, so that it is
// planned while the next step runs and found at its end (next_turn(), by the signature it will
// have). A chain of predictions then plans in step() only its first (next_turn()), and again
// after a step that departs, or when the thread has not kept up. Stored under a key of its own:
// not the plan stored after an epoch like the next one, which the step after it would take
// before its turn.
void VmmHeaps::plan_ahead(Heap& heap, const NextStepRecord& next_step, const EpochPlan& plan,
                          std::uint64_t next_signature) {
  std::vector<std::size_t> offsets(plan.steps.size());
  for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = plan.steps[i].offset;
  const std::optional<std::vector<RecordedBlock>> followed = followed_record(next_step.blocks, offsets.size(), offsets);
  if (!followed) return;
  std::optional<std::vector<RecordedBlock>> after = predicted_step(*followed, offsets.size());
  if (!after) return;
  const std::uint64_t signature = signature_of(*followed, offsets.size(), base_signature(base_after(*followed)));
  if (heap.plans.latest_of(signature).plan) return;
  const std::uint64_t key = EpochLog::mixed(next_signature, kAheadSalt);
  if (planner_->try_hand_over_made(heap.mailbox, key, signature, std::move(*after))) count_next_step(NextStepKind::predicted);
}

// live_signature() of a base given block by block, in address order.
std::uint64_t VmmHeaps::base_signature(std::span<const BaseBlock> base) noexcept {
  std::uint64_t hash = EpochLog::kSignatureSeed;
  for (const BaseBlock& b : base) hash = mixed_base_block(hash, b.offset, b.size);
  return hash;
}

// signature_after() of the requests of a record (its first `allocations` entries).
std::uint64_t VmmHeaps::signature_of(std::span<const RecordedBlock> record, std::size_t allocations,
                                     std::uint64_t base) noexcept {
  std::uint64_t signature = EpochLog::mixed(EpochLog::kSignatureSeed, base);
  for (std::size_t i = 0; i < allocations; ++i) signature = EpochLog::mixed(signature, record[i].size);
  return signature;
}

// Counts a step planned as its mirror, or as its prediction.
void VmmHeaps::count_next_step(NextStepKind kind) noexcept {
  st_.counters.count(kind == NextStepKind::mirrored ? &Stats::mirrored_steps : &Stats::predicted_steps);
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

}  // namespace tensorpool::detail
