// layout_plan.cpp: the planner of layout_plan.hpp (greedy by size over lifetimes, against the
// recorded layout).
#include "core/layout_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// The blocks packing has placed, in offset order, in runs of a few dozen (chunks). Each chunk
// knows the highest end of its blocks, which part of the epoch's clock they live in (their
// starts and ends, and a mask of the 64 equal stretches of the clock they touch) and whether they
// cover their range without a gap, so that a block's pass over the placed ones (best_fit())
// skips a chunk whose blocks all end below what the pass has covered already, or are all alive
// at other times, and takes a gapless chunk of blocks all alive with it as one raise of the
// covered top: exactly what the pass over its blocks one by one would conclude. On the epochs
// of the shared and generated traces most chunks go so; on BM_PlanLayout's synthetic epoch
// (blocks of every size, nearly all alive together) few do.
class PlacedBlocks {
 public:
  struct Placed {
    std::size_t lo, hi;          // [offset, offset + size)
    std::uint64_t start, end;    // lifetime
    std::uint64_t stretches;     // the bits of the clock's stretches [start, end) touches
  };
  struct Chunk {
    std::vector<Placed> blocks;  // by lo; never empty
    std::size_t max_hi = 0;
    std::uint64_t min_start = UINT64_MAX, max_start = 0;
    std::uint64_t min_end = UINT64_MAX, max_end = 0;
    std::uint64_t stretches = 0;
    /// In offset order, every block starts at or below the highest end before it: the blocks
    /// cover [blocks.front().lo, max_hi) without a gap.
    bool gapless = true;

    void add(const Placed& p) {
      max_hi = std::max(max_hi, p.hi);
      min_start = std::min(min_start, p.start);
      max_start = std::max(max_start, p.start);
      min_end = std::min(min_end, p.end);
      max_end = std::max(max_end, p.end);
      stretches |= p.stretches;
    }
    void find_gaps() {
      std::size_t covered = blocks.front().hi;
      gapless = true;
      for (const Placed& p : blocks) {
        gapless = gapless && p.lo <= covered;
        covered = std::max(covered, p.hi);
      }
    }
    /// Whether no block here can be alive at a tick of [start, end) (a superset test).
    bool apart_from(std::uint64_t start, std::uint64_t end, std::uint64_t query_stretches) const {
      return (stretches & query_stretches) == 0 || min_start >= end || start >= max_end;
    }
    /// Whether every block here is alive at some tick of [start, end).
    bool all_alive_in(std::uint64_t start, std::uint64_t end) const { return max_start < end && start < min_end; }
  };

  explicit PlacedBlocks(std::uint64_t clock_end) : stretch_(std::max<std::uint64_t>(clock_end, 1) / 64 + 1) {}

  /// The bits of the clock's 64 stretches that [start, end) touches (start < end <= clock_end).
  std::uint64_t stretches(std::uint64_t start, std::uint64_t end) const {
    const unsigned first = stretch_of(start);
    const unsigned last = stretch_of(end - 1);
    const std::uint64_t up_to_last = last == 63 ? ~std::uint64_t{0} : (std::uint64_t{1} << (last + 1)) - 1;
    return up_to_last & ~((std::uint64_t{1} << first) - 1);
  }

  /// Inserts after the blocks at the same offset (the order a flat sorted vector would have).
  void insert(const Placed& p) {
    ++count_;
    if (chunks_.empty()) chunks_.emplace_back();
    // The last chunk whose first block starts at or below p: the next one starts above it.
    const auto after = std::upper_bound(chunks_.begin() + 1, chunks_.end(), p.lo,
                                        [](std::size_t lo, const Chunk& c) { return lo < c.blocks.front().lo; });
    Chunk& c = *(after - 1);
    const auto at = std::upper_bound(c.blocks.begin(), c.blocks.end(), p.lo,
                                     [](std::size_t lo, const Placed& x) { return lo < x.lo; });
    c.blocks.insert(at, p);
    c.add(p);
    if (c.blocks.size() >= 2 * kChunk) {
      split(static_cast<std::size_t>(after - 1 - chunks_.begin()));
    } else {
      c.find_gaps();
    }
  }

  const std::vector<Chunk>& chunks() const { return chunks_; }
  std::size_t size() const { return count_; }

 private:
  static constexpr std::size_t kChunk = 32;  // blocks per chunk: between kChunk and 2 * kChunk - 1

  // Ticks below the clock's end fall in stretches 0..63.
  unsigned stretch_of(std::uint64_t tick) const {
    return static_cast<unsigned>(std::min<std::uint64_t>(tick / stretch_, 63));
  }

  void split(std::size_t i) {
    Chunk upper;
    std::vector<Placed>& lower = chunks_[i].blocks;
    upper.blocks.assign(lower.begin() + static_cast<std::ptrdiff_t>(kChunk), lower.end());
    lower.resize(kChunk);
    Chunk rebuilt;
    rebuilt.blocks = std::move(lower);
    for (const Placed& p : rebuilt.blocks) rebuilt.add(p);
    for (const Placed& p : upper.blocks) upper.add(p);
    rebuilt.find_gaps();
    upper.find_gaps();
    chunks_[i] = std::move(rebuilt);
    chunks_.insert(chunks_.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::move(upper));
  }

  std::uint64_t stretch_;  // ticks per stretch
  std::vector<Chunk> chunks_;
  std::size_t count_ = 0;
};

// How pack() ended.
enum class PackEnd : std::uint8_t {
  done,        // every block placed
  not_lower,   // stopped: the layout already reached `stop_at` (it cannot end lower)
  too_costly,  // stopped: the passes would look at more than `max_steps` placed blocks
};

struct Packing {
  PackEnd end = PackEnd::done;
  std::vector<std::size_t> offsets;  // complete only when end == done
};

// Where block b goes among the placed blocks: the lowest of the smallest gaps that fit it between
// the placed blocks alive at the same time (in offset order: a gap opens where a block starts
// above the highest end before it), else the top of them. The pass stops at a gap of exactly b's
// size: none fits better, and none found later is lower.
std::size_t best_fit(const PlacedBlocks& placed, const RecordedBlock& b) {
  const std::uint64_t mine = placed.stretches(b.start, b.end);
  std::size_t top = 0;
  std::size_t best_gap = SIZE_MAX;
  std::size_t best_at = 0;
  for (const PlacedBlocks::Chunk& c : placed.chunks()) {
    if (c.max_hi <= top || c.apart_from(b.start, b.end, mine)) continue;  // would change nothing
    if (c.gapless && c.blocks.front().lo <= top && c.all_alive_in(b.start, b.end)) {
      top = c.max_hi;  // no gap opens in it: it only raises the top (weights, a step's base)
      continue;
    }
    for (const PlacedBlocks::Placed& p : c.blocks) {
      if (p.start >= b.end || b.start >= p.end) continue;  // never alive together
      if (p.lo > top && p.lo - top >= b.size && p.lo - top < best_gap) {
        best_gap = p.lo - top;
        best_at = top;
        if (best_gap == b.size) return best_at;
      }
      top = std::max(top, p.hi);
    }
  }
  return best_gap != SIZE_MAX ? best_at : top;
}

// Greedy by size: blocks in decreasing size (ties: earlier first), each where best_fit() puts
// it, after the fixed blocks where they were. O(n^2) simple steps at most (each block passes
// over the placed ones); the chunks' bounds skip most of them on real epochs. The layout's
// height only grows as blocks are placed, so packing stops once it reaches `stop_at` (a layout
// at least as high as the recorded one is not kept), or once the passes would have looked at
// more than `max_steps` placed blocks (counted as if none were skipped, so that what is cut
// short does not depend on the data's shape).
Packing pack(std::span<const RecordedBlock> blocks, std::size_t max_steps, std::size_t stop_at) {
  const std::size_t n = blocks.size();
  std::vector<std::size_t> order;
  order.reserve(n);
  std::uint64_t clock_end = 1;
  for (std::size_t i = 0; i < n; ++i) {
    clock_end = std::max(clock_end, blocks[i].end);
    if (!blocks[i].fixed) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
    return blocks[a].start < blocks[b].start;
  });
  PlacedBlocks placed(clock_end);
  const auto place = [&](const RecordedBlock& b, std::size_t at) {
    placed.insert({at, at + b.size, b.start, b.end, placed.stretches(b.start, b.end)});
  };
  Packing out;
  out.offsets.assign(n, 0);
  std::size_t height = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const RecordedBlock& b = blocks[i];
    if (!b.fixed) continue;
    out.offsets[i] = b.recorded;
    place(b, b.recorded);
    height = std::max(height, b.recorded + b.size);
  }
  std::size_t steps = 0;
  for (const std::size_t i : order) {
    if (height >= stop_at) return {PackEnd::not_lower, {}};
    steps += placed.size();
    if (steps > max_steps) return {PackEnd::too_costly, {}};
    const RecordedBlock& b = blocks[i];
    const std::size_t at = best_fit(placed, b);
    out.offsets[i] = at;
    height = std::max(height, at + b.size);
    place(b, at);
  }
  if (height >= stop_at) return {PackEnd::not_lower, {}};
  return out;
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
  // A packing as high as the recorded layout is not kept (ties: the recorded one), so it stops
  // there when the recorded layout is one.
  Packing packing = pack(blocks, max_pack_steps, recorded_below ? recorded.height : SIZE_MAX);
  if (packing.end != PackEnd::done) {  // not lower, or too costly: the recorded layout, if it is one
    if (!recorded_below) return std::nullopt;
    recorded.below = std::move(*recorded_below);
    return recorded;
  }
  PlannedLayout packed;
  packed.offsets = std::move(packing.offsets);
  packed.height = height_of(blocks, packed.offsets);
  packed.source = LayoutSource::packed;
  std::optional<std::vector<std::uint32_t>> packed_below = link_below(blocks, packed.offsets);
  if (!packed_below) throw std::logic_error("plan_layout: the packed layout overlaps itself");
  packed.below = std::move(*packed_below);
  return packed;
}

}  // namespace tensorpool::detail
