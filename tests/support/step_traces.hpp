// tests/support/step_traces.hpp: two small traces whose replays show what tensorpool's step()
// and a device that runs behind the host change (test_replay.cpp and test_fit.cpp replay them).
#pragma once

#include <cstdint>

#include "tensorpool/trace/event.hpp"
#include "tensorpool/types.hpp"

namespace tptest {

namespace step_traces_detail {

inline tensorpool::trace::TraceEvent event(tensorpool::trace::Op op, std::uint64_t addr, std::uint64_t size) {
  return {.op = op, .addr = addr, .size = size};
}

}  // namespace step_traces_detail

/// Weights (3 x 32 MiB) that stay, then 8 steps of three blocks (a and b of 40 MiB, a freed, c of
/// 60 MiB), an iteration marker before each: online, c does not fit a's hole and goes above b
/// (96 + 140 MiB); planned around the weights at the step boundaries (step() at the markers), the
/// steps need 96 + 100 MiB, and the pages above go once the plan repeats.
inline tensorpool::trace::Trace weights_and_steps() {
  using tensorpool::MiB;
  using tensorpool::trace::Op;
  using step_traces_detail::event;
  tensorpool::trace::Trace t;
  for (std::uint64_t w = 1; w <= 3; ++w) t.events.push_back(event(Op::alloc, w, 32 * MiB));
  for (std::uint64_t step = 0; step < 8; ++step) {
    const std::uint64_t a = 100 + 3 * step, b = a + 1, c = a + 2;
    t.events.insert(t.events.end(),
                    {event(Op::iteration, 0, step), event(Op::alloc, a, 40 * MiB), event(Op::alloc, b, 40 * MiB),
                     event(Op::free_requested, a, 40 * MiB), event(Op::alloc, c, 60 * MiB),
                     event(Op::free_requested, b, 40 * MiB), event(Op::free_requested, c, 60 * MiB)});
  }
  return t;
}

/// Six epochs of the same three blocks that empty the heap, an iteration marker before each; in
/// the first, empty_cache() gives a's pages back and c goes above b, so the plan (100 MiB) must
/// move the pages to the heap's start: at the end of the first epoch when the stream's work is
/// done by then, else at the next epoch's first request (online, a would take new pages under
/// the plan: 140 MiB).
inline tensorpool::trace::Trace plan_that_moves_pages() {
  using tensorpool::MiB;
  using tensorpool::trace::Op;
  using step_traces_detail::event;
  tensorpool::trace::Trace t;
  for (std::uint64_t epoch = 0; epoch < 6; ++epoch) {
    const std::uint64_t a = 100 + 3 * epoch, b = a + 1, c = a + 2;
    t.events.insert(t.events.end(), {event(Op::iteration, 0, epoch), event(Op::alloc, a, 40 * MiB),
                                     event(Op::alloc, b, 40 * MiB), event(Op::free_requested, a, 40 * MiB)});
    if (epoch == 0) t.events.push_back(event(Op::empty_cache, 0, 0));
    t.events.insert(t.events.end(), {event(Op::alloc, c, 60 * MiB), event(Op::free_requested, b, 40 * MiB),
                                     event(Op::free_requested, c, 60 * MiB)});
  }
  return t;
}

}  // namespace tptest
