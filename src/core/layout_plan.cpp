// layout_plan.cpp: the planner of layout_plan.hpp (greedy by size over lifetimes, against the
// recorded layout).
#include "core/layout_plan.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace tensorpool::detail {

namespace {

void check_input(std::span<const RecordedBlock> blocks) {
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const RecordedBlock& b = blocks[i];
    if (b.size == 0 || b.start >= b.end)
      throw std::invalid_argument("plan_layout: block " + std::to_string(i) + " has size " + std::to_string(b.size) +
                                  " and lifetime [" + std::to_string(b.start) + ", " + std::to_string(b.end) + ")");
  }
}

// Greedy by size, best-fit gap among the placed blocks alive at the same time. The placed blocks
// are kept in offset order, so each block's gaps come from one pass over them that skips those
// not alive with it: O(n^2) simple steps in all. nullopt once the passes have looked at more
// than `max_steps` placed blocks (the layout is then left unfinished).
std::optional<std::vector<std::size_t>> pack(std::span<const RecordedBlock> blocks, std::size_t max_steps) {
  const std::size_t n = blocks.size();
  std::vector<std::size_t> order;
  order.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    if (!blocks[i].fixed) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
    return blocks[a].start < blocks[b].start;
  });
  struct Placed {
    std::size_t lo, hi;         // [offset, offset + size)
    std::uint64_t start, end;   // lifetime
  };
  std::vector<Placed> placed;  // by lo
  placed.reserve(n);
  std::vector<std::size_t> offsets(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const RecordedBlock& b = blocks[i];
    if (!b.fixed) continue;
    offsets[i] = b.recorded;
    placed.push_back(Placed{b.recorded, b.recorded + b.size, b.start, b.end});
  }
  std::sort(placed.begin(), placed.end(), [](const Placed& x, const Placed& y) { return x.lo < y.lo; });
  std::size_t steps = 0;
  for (const std::size_t i : order) {
    steps += placed.size();
    if (steps > max_steps) return std::nullopt;
    const RecordedBlock& b = blocks[i];
    std::size_t top = 0;
    std::size_t best_gap = SIZE_MAX;
    std::size_t best_at = 0;
    for (const Placed& p : placed) {
      if (p.start >= b.end || b.start >= p.end) continue;  // never alive together
      if (p.lo > top && p.lo - top >= b.size && p.lo - top < best_gap) {
        best_gap = p.lo - top;
        best_at = top;
      }
      top = std::max(top, p.hi);
    }
    const std::size_t at = best_gap != SIZE_MAX ? best_at : top;
    offsets[i] = at;
    const Placed mine{at, at + b.size, b.start, b.end};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), mine,
                                   [](const Placed& x, const Placed& y) { return x.lo < y.lo; }),
                  mine);
  }
  return offsets;
}

std::size_t height_of(std::span<const RecordedBlock> blocks, const std::vector<std::size_t>& offsets) {
  std::size_t h = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) h = std::max(h, offsets[i] + blocks[i].size);
  return h;
}

// The events of the epoch in clock order: (tick, 2 * block + 1) for an allocation, (tick,
// 2 * block) for a free.
std::vector<std::pair<std::uint64_t, std::size_t>> events_in_order(std::span<const RecordedBlock> blocks) {
  std::vector<std::pair<std::uint64_t, std::size_t>> ev;
  ev.reserve(2 * blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ev.emplace_back(blocks[i].start, 2 * i + 1);  // odd: allocation
    ev.emplace_back(blocks[i].end, 2 * i);        // even: free
  }
  std::sort(ev.begin(), ev.end());  // a free and an allocation on one tick: the free first
  return ev;
}

// Replays the epoch against `offsets`: for each block, the block alive below it when it is
// allocated (PlannedLayout::below); nullopt if two blocks alive together overlap (the allocator
// must never follow such a layout).
std::optional<std::vector<std::uint32_t>> link_below(std::span<const RecordedBlock> blocks,
                                                     const std::vector<std::size_t>& offsets) {
  std::vector<std::uint32_t> below(blocks.size(), PlannedLayout::kNone);
  std::map<std::size_t, std::size_t> alive;  // offset -> block
  for (const auto& [tick, code] : events_in_order(blocks)) {
    const std::size_t i = code / 2;
    const std::size_t off = offsets[i];
    if (code % 2 == 0) {
      alive.erase(off);
      continue;
    }
    auto next = alive.lower_bound(off);
    if (next != alive.end() && next->first < off + blocks[i].size) return std::nullopt;
    if (next != alive.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + blocks[prev->second].size > off) return std::nullopt;
      below[i] = static_cast<std::uint32_t>(prev->second);
    }
    alive.emplace(off, i);
  }
  return below;
}

}  // namespace

std::size_t peak_live_bytes(std::span<const RecordedBlock> blocks) {
  std::size_t live = 0;
  std::size_t peak = 0;
  for (const auto& [tick, code] : events_in_order(blocks)) {
    const std::size_t size = blocks[code / 2].size;
    if (code % 2 == 0) {
      live -= size;
    } else {
      live += size;
      peak = std::max(peak, live);
    }
  }
  return peak;
}

std::optional<PlannedLayout> plan_layout(std::span<const RecordedBlock> blocks, std::size_t max_pack_steps) {
  check_input(blocks);
  if (blocks.size() >= PlannedLayout::kNone) throw std::invalid_argument("plan_layout: too many blocks");
  PlannedLayout recorded;
  recorded.offsets.resize(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) recorded.offsets[i] = blocks[i].recorded;
  recorded.height = height_of(blocks, recorded.offsets);
  recorded.source = LayoutSource::recorded;
  // The recorded layout when it is one and no packing can be lower (it reaches the live peak).
  std::optional<std::vector<std::uint32_t>> recorded_below = link_below(blocks, recorded.offsets);
  if (recorded_below && recorded.height <= peak_live_bytes(blocks)) {
    recorded.below = std::move(*recorded_below);
    return recorded;
  }
  std::optional<std::vector<std::size_t>> offsets = pack(blocks, max_pack_steps);
  if (!offsets) {  // packing would cost too much: the recorded layout, if it is one
    if (!recorded_below) return std::nullopt;
    recorded.below = std::move(*recorded_below);
    return recorded;
  }
  PlannedLayout packed;
  packed.offsets = std::move(*offsets);
  packed.height = height_of(blocks, packed.offsets);
  packed.source = LayoutSource::packed;
  if (recorded_below && recorded.height <= packed.height) {
    recorded.below = std::move(*recorded_below);
    return recorded;
  }
  std::optional<std::vector<std::uint32_t>> packed_below = link_below(blocks, packed.offsets);
  if (!packed_below) throw std::logic_error("plan_layout: the packed layout overlaps itself");
  packed.below = std::move(*packed_below);
  return packed;
}

}  // namespace tensorpool::detail
