// layout_plan.cpp: the planner of layout_plan.hpp (the recorded layout, an ideal online allocator
// replayed in clock order, greedy packing over lifetimes by size, by size with blocks on the place
// of the block they replace, the live peak's blocks first, by size times lifetime and by size with
// the longest-lived first: the lowest).
#include "core/layout_plan.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <map>
#include <memory_resource>
#include <optional>
#include <set>
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

bool has_kept(std::span<const RecordedBlock> blocks) {
  return std::any_of(blocks.begin(), blocks.end(), [](const RecordedBlock& b) { return b.kept; });
}

// The blocks packing has placed, in offset order, in runs of a few dozen (chunks). Each chunk
// knows the highest end of its blocks, which part of the epoch's clock they live in (their
// starts and ends, and per stretch of the clock, one of 64 equal ones, which of its blocks start
// by it and which end in or after it) and whether they cover their range without a gap. A
// block's pass over the placed ones (fit_among()) so skips a chunk whose blocks all end below
// what the pass has covered already, takes a gapless chunk of blocks all alive with it as one
// raise of the covered top, and in the others looks only at the blocks that live in the
// stretches it lives in: exactly what the pass over every block one by one would conclude, since
// the blocks it leaves out are never alive with the block or change nothing. On the epochs of
// the shared and generated traces that leaves a tenth of the blocks or less; on BM_PlanLayout's
// synthetic epoch (blocks of every size, nearly all alive together) about half.
class PlacedBlocks {
 public:
  struct Placed {
    std::size_t lo, hi;        // [offset, offset + size)
    std::uint64_t start, end;  // lifetime
  };
  static constexpr unsigned kStretches = 64;
  /// The stretches of the clock a lifetime touches: [first, last].
  struct Stretches {
    unsigned first, last;
  };

  struct Chunk {
    std::vector<Placed> blocks;  // by lo; never empty; at most 63
    std::size_t max_hi = 0;
    std::uint64_t max_start = 0;
    std::uint64_t min_end = UINT64_MAX;
    /// Bit i of started_by[s]: blocks[i] starts in stretch s or before; of ending_from[s]: it
    /// ends in stretch s or after. A lifetime touching stretches [a, z] is alive with at most
    /// the blocks started_by[z] & ending_from[a] names.
    std::array<std::uint64_t, kStretches> started_by{};
    std::array<std::uint64_t, kStretches> ending_from{};
    /// In offset order, every block starts at or below the highest end before it: the blocks
    /// cover [blocks.front().lo, max_hi) without a gap.
    bool gapless = true;

    /// The blocks that may be alive in the stretches `when` touches.
    std::uint64_t maybe_alive(Stretches when) const { return started_by[when.last] & ending_from[when.first]; }
    /// Whether every block here is alive at some tick of [start, end).
    bool all_alive_in(std::uint64_t start, std::uint64_t end) const { return max_start < end && start < min_end; }
  };

  explicit PlacedBlocks(std::uint64_t clock_end)
      : ticks_per_stretch_(std::max<std::uint64_t>(clock_end, 1) / kStretches + 1) {}

  Stretches stretches(std::uint64_t start, std::uint64_t end) const {
    return {stretch_of(start), stretch_of(end - 1)};
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
    const auto bit = static_cast<unsigned>(at - c.blocks.begin());
    c.blocks.insert(at, p);
    const Stretches when = stretches(p.start, p.end);
    for (unsigned s = 0; s < kStretches; ++s) {
      c.started_by[s] = with_bit(c.started_by[s], bit, when.first <= s);
      c.ending_from[s] = with_bit(c.ending_from[s], bit, when.last >= s);
    }
    if (c.blocks.size() >= 2 * kChunk) {
      split(static_cast<std::size_t>(after - 1 - chunks_.begin()));
    } else {
      summarize(c);
    }
  }

  const std::vector<Chunk>& chunks() const { return chunks_; }
  std::size_t size() const { return count_; }

 private:
  static constexpr std::size_t kChunk = 32;  // blocks per chunk: between kChunk and 2 * kChunk - 1

  // Ticks below the clock's end fall in stretches 0..63.
  unsigned stretch_of(std::uint64_t tick) const {
    return static_cast<unsigned>(std::min<std::uint64_t>(tick / ticks_per_stretch_, kStretches - 1));
  }

  // `mask` with a bit inserted at position `at` (the bits from `at` up move one up).
  static std::uint64_t with_bit(std::uint64_t mask, unsigned at, bool set) {
    const std::uint64_t below = (std::uint64_t{1} << at) - 1;
    return (mask & below) | ((mask & ~below) << 1) | (std::uint64_t{set} << at);
  }

  static void summarize(Chunk& c) {
    c.max_hi = 0;
    c.max_start = 0;
    c.min_end = UINT64_MAX;
    c.gapless = true;
    std::size_t covered = c.blocks.front().hi;
    for (const Placed& p : c.blocks) {
      c.max_hi = std::max(c.max_hi, p.hi);
      c.max_start = std::max(c.max_start, p.start);
      c.min_end = std::min(c.min_end, p.end);
      c.gapless = c.gapless && p.lo <= covered;
      covered = std::max(covered, p.hi);
    }
  }

  void split(std::size_t i) {
    Chunk& lower = chunks_[i];
    Chunk upper;
    upper.blocks.assign(lower.blocks.begin() + static_cast<std::ptrdiff_t>(kChunk), lower.blocks.end());
    lower.blocks.resize(kChunk);
    const std::uint64_t kept = (std::uint64_t{1} << kChunk) - 1;
    for (unsigned s = 0; s < kStretches; ++s) {
      upper.started_by[s] = lower.started_by[s] >> kChunk;
      upper.ending_from[s] = lower.ending_from[s] >> kChunk;
      lower.started_by[s] &= kept;
      lower.ending_from[s] &= kept;
    }
    summarize(lower);
    summarize(upper);
    chunks_.insert(chunks_.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::move(upper));
  }

  std::uint64_t ticks_per_stretch_;
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

// Which gap between the placed blocks alive with a block fit_among() gives it.
enum class Fit : std::uint8_t {
  best,    // the smallest that fits (ties: the lowest)
  lowest,  // the lowest that fits
};

// Where block b goes among the placed blocks: the gap `how` says between the placed blocks alive
// at the same time (in offset order: a gap opens where a block starts above the highest end
// before it), else the top of them. The pass stops at the first gap that fits for Fit::lowest,
// at a gap of exactly b's size for Fit::best: none fits better, and none found later is lower.
std::size_t fit_among(const PlacedBlocks& placed, const RecordedBlock& b, Fit how) {
  const PlacedBlocks::Stretches when = placed.stretches(b.start, b.end);
  std::size_t top = 0;
  std::size_t best_gap = SIZE_MAX;
  std::size_t best_at = 0;
  for (const PlacedBlocks::Chunk& c : placed.chunks()) {
    if (c.max_hi <= top) continue;  // its blocks end below what is covered: they change nothing
    if (c.gapless && c.blocks.front().lo <= top && c.all_alive_in(b.start, b.end)) {
      top = c.max_hi;  // no gap opens in it: it only raises the top (weights, a step's base)
      continue;
    }
    for (std::uint64_t maybe = c.maybe_alive(when); maybe != 0; maybe &= maybe - 1) {
      const PlacedBlocks::Placed& p = c.blocks[static_cast<std::size_t>(std::countr_zero(maybe))];
      if (p.start >= b.end || b.start >= p.end) continue;  // never alive together
      if (p.lo > top && p.lo - top >= b.size && p.lo - top < best_gap) {
        best_gap = p.lo - top;
        best_at = top;
        if (how == Fit::lowest || best_gap == b.size) return best_at;
      }
      top = std::max(top, p.hi);
    }
  }
  return best_gap != SIZE_MAX ? best_at : top;
}

// Whether [lo, lo + b.size) is clear of every placed block alive with b.
bool clear_at(const PlacedBlocks& placed, const RecordedBlock& b, std::size_t lo) {
  const std::size_t hi = lo + b.size;
  const PlacedBlocks::Stretches when = placed.stretches(b.start, b.end);
  for (const PlacedBlocks::Chunk& c : placed.chunks()) {
    if (c.blocks.front().lo >= hi) break;  // chunks and their blocks go by offset
    if (c.max_hi <= lo) continue;
    for (std::uint64_t maybe = c.maybe_alive(when); maybe != 0; maybe &= maybe - 1) {
      const PlacedBlocks::Placed& p = c.blocks[static_cast<std::size_t>(std::countr_zero(maybe))];
      if (p.start < b.end && b.start < p.end && p.lo < hi && lo < p.hi) return false;
    }
  }
  return true;
}

// A block replaces the largest block at least half its size freed within this many ticks
// (events of the epoch) before its allocation (a choice: docs/vmm.md, "Planned layouts"); a
// chain of blocks each replacing the next is placed this many at a time at most.
constexpr std::uint64_t kReplacedWithin = 8;
constexpr std::size_t kReplacedChain = 8;

// Per block, the block it replaces (kNone: none, or it stays where recorded); see
// kReplacedWithin. O(n log n).
std::vector<std::uint32_t> replaced_blocks(std::span<const RecordedBlock> blocks) {
  std::vector<std::pair<std::uint64_t, std::uint32_t>> by_end;  // (free tick, block)
  by_end.reserve(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) by_end.emplace_back(blocks[i].end, static_cast<std::uint32_t>(i));
  std::sort(by_end.begin(), by_end.end());
  std::vector<std::uint32_t> replaced(blocks.size(), PlannedLayout::kNone);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const RecordedBlock& b = blocks[i];
    if (b.stays_where_recorded()) continue;
    const std::uint64_t from = b.start > kReplacedWithin ? b.start - kReplacedWithin : 0;
    auto it = std::upper_bound(by_end.begin(), by_end.end(), std::make_pair(b.start, UINT32_MAX));
    while (it != by_end.begin() && std::prev(it)->first >= from) {
      --it;
      const std::uint32_t j = it->second;
      const std::size_t size = blocks[j].size;
      const bool larger = replaced[i] == PlannedLayout::kNone || size > blocks[replaced[i]].size;
      if (j != i && 2 * size >= b.size && larger) replaced[i] = j;
    }
  }
  return replaced;
}

// What a block replaces (replaced_blocks()), where pack() looks for it: the
// place of block `block` (an index of the packing's input) plus `delta`, `size` bytes; for a
// block that stays where it was recorded, `block` is kNone and `delta` is its place.
struct Replaced {
  std::uint32_t block = PlannedLayout::kNone;
  std::size_t delta = 0;
  std::size_t size = 0;
};

// The order pack() places blocks in (the fixed and pinned ones aside: placed first, where they
// were recorded). `by_size`: decreasing size, ties earlier first; `by_size_longest`: the same,
// ties the longer lifetime first; `by_area`: decreasing size times lifetime, ties by size, then
// earlier first (layout_plan.hpp says why those two). `peak_first`: the blocks alive
// at `peak_tick` (the live peak: no layout is lower than they are, stacked) first, then the
// others, each set in clock order. Placed in clock order with nothing freed between them, the
// peak's blocks stack around the fixed ones with no gap that a block placed before them could
// have left, and the others then fill around them as an online allocator would (fit_among() among
// the blocks alive with each). Packing by size can leave such a gap (a large block placed before
// the smaller ones it outlives), and so can the online order (a block freed before the peak).
struct PackOrder {
  enum class Kind : std::uint8_t { by_size, by_size_longest, by_area, peak_first } kind = Kind::by_size;
  std::uint64_t peak_tick = 0;  // peak_first: the first tick of the live peak
};

// The blocks pack() places itself (not those that stay where recorded), in the order `how` says.
std::vector<std::size_t> packing_order(std::span<const RecordedBlock> blocks, PackOrder how) {
  std::vector<std::size_t> order;
  order.reserve(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (!blocks[i].stays_where_recorded()) order.push_back(i);
  const auto lifetime = [&](std::size_t i) { return blocks[i].end - blocks[i].start; };
  const auto larger_then_earlier = [&](std::size_t a, std::size_t b) {
    if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
    return blocks[a].start < blocks[b].start;
  };
  switch (how.kind) {
    case PackOrder::Kind::by_size:
      std::sort(order.begin(), order.end(), larger_then_earlier);
      return order;
    case PackOrder::Kind::by_size_longest:
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
        if (lifetime(a) != lifetime(b)) return lifetime(a) > lifetime(b);
        return blocks[a].start < blocks[b].start;
      });
      return order;
    case PackOrder::Kind::by_area:
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        // Two 64-bit factors: the product fits in 128 bits.
        __extension__ using Area = unsigned __int128;
        const Area area_a = Area{blocks[a].size} * lifetime(a), area_b = Area{blocks[b].size} * lifetime(b);
        if (area_a != area_b) return area_a > area_b;
        return larger_then_earlier(a, b);
      });
      return order;
    case PackOrder::Kind::peak_first:
      break;
  }
  const auto at_peak = [&](std::size_t i) { return blocks[i].start <= how.peak_tick && how.peak_tick < blocks[i].end; };
  const auto by_clock = [&](std::size_t a, std::size_t b) { return blocks[a].start < blocks[b].start; };
  const auto rest = std::partition(order.begin(), order.end(), at_peak);
  std::sort(order.begin(), rest, by_clock);
  std::sort(rest, order.end(), by_clock);
  return order;
}

// How a layout places the kept blocks (RecordedBlock::kept): before the others, each as low as
// it goes, with no online candidate; or as any other block.
enum class KeptBlocks : std::uint8_t { lowest_first, as_any };

// Greedy: the blocks in `how`'s order (packing_order(); by default decreasing size, ties earlier
// first), each where fit_among() puts it (the best fit), after the fixed blocks where they were
// and, with KeptBlocks::lowest_first, the kept ones as low as they go. O(n^2) simple steps at
// most (each block passes over the placed ones); the chunks' bounds skip most of them on real
// epochs. The layout's height only grows as blocks are placed, so packing stops once it
// reaches `stop_at` (a layout at least as high as the recorded one is not kept), or once the
// passes would have looked at more than `max_steps` placed blocks (counted as if none were
// skipped, so that what is cut short does not depend on the data's shape).
// `hidden`: blocks the input stands for beyond its own (fixed runs merged: FixedRuns), placed
// before the pass, so that the bound counts what it would block by block.
// `replaced` (empty: none, the plain packing by size), per block, the block it replaces (a
// program's `x = f(x)`: the loss's upcast made as the logits it reads are freed): such a block
// first tries that block's place, starting where it started, else ending where it ended, when
// that is clear of the blocks alive with it, and the replaced block is placed first if it is not
// yet (it may be smaller), so that its place is known. Without it, packing by size stacks the
// large short-lived blocks of every step at one place, and what each step keeps across into the
// next can only take turns above them (docs/benchmarks.md, "Blocks placed where the block they
// replace was").
Packing pack(std::span<const RecordedBlock> blocks, std::span<const Replaced> replaced, std::size_t max_steps,
             std::size_t stop_at, std::size_t hidden, KeptBlocks kept, PackOrder how = {}) {
  static const Replaced kNothing{};
  const auto replaces = [&](std::size_t i) -> const Replaced& { return replaced.empty() ? kNothing : replaced[i]; };
  const std::size_t n = blocks.size();
  std::uint64_t clock_end = 1;
  for (const RecordedBlock& b : blocks) clock_end = std::max(clock_end, b.end);
  const std::vector<std::size_t> order = packing_order(blocks, how);
  PlacedBlocks placed(clock_end);
  Packing out;
  out.offsets.assign(n, 0);
  std::vector<bool> done(n, false);
  std::size_t height = 0;
  const auto place = [&](std::size_t i, std::size_t at) {
    placed.insert({at, at + blocks[i].size, blocks[i].start, blocks[i].end});
    out.offsets[i] = at;
    done[i] = true;
    height = std::max(height, at + blocks[i].size);
  };
  for (std::size_t i = 0; i < n; ++i)
    if (blocks[i].stays_where_recorded()) place(i, blocks[i].recorded);
  std::size_t steps = 0;
  // The kept blocks (the next epoch's base), in clock order, each as low as it goes.
  for (std::size_t i = 0; kept == KeptBlocks::lowest_first && i < n; ++i) {
    if (!blocks[i].kept || blocks[i].stays_where_recorded()) continue;
    steps += placed.size() + hidden;
    if (steps > max_steps) return {PackEnd::too_costly, {}};
    place(i, fit_among(placed, blocks[i], Fit::lowest));
  }
  // Where block i goes: on the place of the block it replaces if clear (that block placed), else
  // best fit. False when the bounds stop the packing.
  const auto place_one = [&](std::size_t i) {
    if (height >= stop_at) return false;
    const RecordedBlock& b = blocks[i];
    const Replaced& r = replaces(i);
    std::optional<std::size_t> at;
    if (r.size != 0 && (r.block == PlannedLayout::kNone || done[r.block])) {
      const std::size_t lo = (r.block == PlannedLayout::kNone ? 0 : out.offsets[r.block]) + r.delta;
      for (const std::size_t c : {lo, lo + r.size >= b.size ? lo + r.size - b.size : SIZE_MAX})
        if (c != SIZE_MAX && (!at || c < *at) && clear_at(placed, b, c)) at = c;
    }
    // Counted once per block, with or without replacements: the checks of the replaced block's
    // place stop where that place ends, so the bound caps a packing with them within three
    // passes per block.
    steps += placed.size() + hidden;
    if (steps > max_steps) return false;
    place(i, at ? *at : fit_among(placed, b, Fit::best));
    return true;
  };
  std::vector<std::size_t> chain;
  for (const std::size_t i : order) {
    // i, the block it replaces, the block that one replaces, ...: the first not yet placed
    // comes last, and is placed first.
    chain.clear();
    for (std::size_t j = i; j != PlannedLayout::kNone && !done[j] && chain.size() < kReplacedChain;
         j = replaces(j).block)
      chain.push_back(j);
    for (auto j = chain.rbegin(); j != chain.rend(); ++j)
      if (!place_one(*j)) return {steps > max_steps ? PackEnd::too_costly : PackEnd::not_lower, {}};
  }
  if (height >= stop_at) return {PackEnd::not_lower, {}};
  return out;
}

// The events of an epoch in clock order: (tick, 2 * block + 1) for an allocation, (tick,
// 2 * block) for a free; on one tick a free comes first.
using Events = std::vector<std::pair<std::uint64_t, std::size_t>>;

bool is_allocation(std::size_t code) { return code % 2 == 1; }

Events events_in_order(std::span<const RecordedBlock> blocks) {
  Events ev;
  ev.reserve(2 * blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ev.emplace_back(blocks[i].start, 2 * i + 1);  // odd: allocation
    ev.emplace_back(blocks[i].end, 2 * i);        // even: free
  }
  std::sort(ev.begin(), ev.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    if (is_allocation(a.second) != is_allocation(b.second)) return is_allocation(b.second);
    return a.second < b.second;
  });
  return ev;
}

// The most bytes alive at once, and the first tick they are.
struct LivePeak {
  std::size_t bytes = 0;
  std::uint64_t tick = 0;
};

LivePeak live_peak(std::span<const RecordedBlock> blocks, const Events& events) {
  std::size_t live = 0;
  LivePeak peak;
  for (const auto& [tick, code] : events) {
    const std::size_t size = blocks[code / 2].size;
    if (is_allocation(code)) {
      live += size;
      if (live > peak.bytes) peak = {live, tick};
    } else {
      live -= size;
    }
  }
  return peak;
}

std::size_t height_of(std::span<const RecordedBlock> blocks, const std::vector<std::size_t>& offsets) {
  std::size_t h = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) h = std::max(h, offsets[i] + blocks[i].size);
  return h;
}

// An ideal online allocator over one address range: best fit (the smallest free gap that fits,
// the lowest of those) among the gaps between the blocks it holds, gaps coalesced on every free,
// else the top, which a free at the top lowers. O(log n) a call.
class BestFitRange {
 public:
  /// Starts with the ranges of `held` taken: [lo, hi) pairs, sorted.
  explicit BestFitRange(const std::vector<std::pair<std::size_t, std::size_t>>& held) {
    for (const auto& [lo, hi] : held) {
      if (lo > top_) add_gap(top_, lo - top_);
      top_ = std::max(top_, hi);
    }
  }

  std::size_t allocate(std::size_t size) {
    const auto fit = by_size_.lower_bound({size, 0});
    if (fit == by_size_.end()) {
      top_ += size;
      return top_ - size;
    }
    const auto [gap, at] = *fit;
    remove_gap(at, gap);
    if (gap > size) add_gap(at + size, gap - size);
    return at;
  }

  void free(std::size_t lo, std::size_t size) {
    std::size_t hi = lo + size;
    if (const auto above = by_offset_.find(hi); above != by_offset_.end()) {
      hi += above->second;
      remove_gap(above->first, above->second);
    }
    if (const auto next = by_offset_.lower_bound(lo); next != by_offset_.begin()) {
      const auto below = std::prev(next);
      if (below->first + below->second == lo) {
        lo = below->first;
        remove_gap(below->first, below->second);
      }
    }
    if (hi == top_) {
      top_ = lo;  // the space above the top is no gap: the top is where it begins
    } else {
      add_gap(lo, hi - lo);
    }
  }

 private:
  void add_gap(std::size_t lo, std::size_t size) {
    by_offset_.emplace(lo, size);
    by_size_.emplace(size, lo);
  }
  void remove_gap(std::size_t lo, std::size_t size) {
    by_offset_.erase(lo);
    by_size_.erase({size, lo});
  }

  // Nodes from one arena, given back all at once with the range: a replay makes and drops a few
  // per event, and the heap's allocator would cost as much as the trees.
  std::pmr::monotonic_buffer_resource arena_;
  std::pmr::map<std::size_t, std::size_t> by_offset_{&arena_};           // gap offset -> size
  std::pmr::set<std::pair<std::size_t, std::size_t>> by_size_{&arena_};  // (size, offset)
  std::size_t top_ = 0;
};

// The epoch replayed in clock order against BestFitRange, with the fixed blocks held where they
// were from the epoch's start to their free: the layout an ideal online allocator would have
// given it. O(n log n).
std::vector<std::size_t> online_layout(std::span<const RecordedBlock> blocks, const Events& events) {
  std::vector<std::size_t> offsets(blocks.size(), 0);
  std::vector<std::pair<std::size_t, std::size_t>> fixed;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i].stays_where_recorded()) continue;  // pinned ones too: held from the start
    offsets[i] = blocks[i].recorded;
    fixed.emplace_back(blocks[i].recorded, blocks[i].recorded + blocks[i].size);
  }
  std::sort(fixed.begin(), fixed.end());
  BestFitRange range(fixed);
  for (const auto& [tick, code] : events) {
    const std::size_t i = code / 2;
    if (is_allocation(code) && blocks[i].stays_where_recorded()) continue;  // held from the start
    if (is_allocation(code)) {
      offsets[i] = range.allocate(blocks[i].size);
    } else {
      range.free(offsets[i], blocks[i].size);
    }
  }
  return offsets;
}

// Replays the epoch against `offsets`: for each block, the block alive below it when it is
// allocated (PlannedLayout::below); nullopt if two blocks alive together overlap (the allocator
// must never follow such a layout).
std::optional<std::vector<std::uint32_t>> link_below(std::span<const RecordedBlock> blocks,
                                                     const std::vector<std::size_t>& offsets, const Events& events) {
  std::vector<std::uint32_t> below(blocks.size(), PlannedLayout::kNone);
  std::pmr::monotonic_buffer_resource arena;  // nodes given back all at once (BestFitRange)
  std::pmr::map<std::size_t, std::size_t> alive{&arena};  // offset -> block
  for (const auto& [tick, code] : events) {
    const std::size_t i = code / 2;
    const std::size_t off = offsets[i];
    if (!is_allocation(code)) {
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

// The input with each run of fixed blocks (consecutive, each starting where the one before it
// ends, with one lifetime) as one block, and the layout of that spread back over the input.
// Within a run, block k's link below is block k - 1 (they start on one tick, in input order); a
// link to a run is to its last block, the one that ends closest below.
class MergedRuns {
 public:
  explicit MergedRuns(std::span<const RecordedBlock> blocks) : blocks_(blocks), merged_of_(blocks.size()) {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (continues_run(i)) {
        merged_.back().size += blocks[i].size;
        merged_of_[i] = static_cast<std::uint32_t>(merged_.size() - 1);
        continue;
      }
      merged_of_[i] = static_cast<std::uint32_t>(merged_.size());
      merged_.push_back(blocks[i]);
      first_.push_back(static_cast<std::uint32_t>(i));
    }
    first_.push_back(static_cast<std::uint32_t>(blocks.size()));
  }
  /// The merged block input block i lies in.
  std::uint32_t merged_of(std::size_t i) const { return merged_of_[i]; }

  std::span<const RecordedBlock> merged() const { return merged_; }
  /// Input blocks beyond one per merged block.
  std::size_t hidden() const { return blocks_.size() - merged_.size(); }

  PlannedLayout spread(const PlannedLayout& m) const {
    PlannedLayout out;
    out.height = m.height;
    out.source = m.source;
    out.offsets.resize(blocks_.size());
    out.below.resize(blocks_.size());
    for (std::size_t j = 0; j < merged_.size(); ++j) {
      const std::uint32_t first = first_[j];
      for (std::uint32_t i = first; i < first_[j + 1]; ++i) {
        out.offsets[i] = m.offsets[j] + (blocks_[i].recorded - blocks_[first].recorded);
        out.below[i] = i == first ? last_of(m.below[j]) : i - 1;
      }
    }
    return out;
  }

 private:
  bool continues_run(std::size_t i) const {
    if (i == 0) return false;
    const RecordedBlock& b = blocks_[i];
    const RecordedBlock& before = blocks_[i - 1];
    return b.fixed && before.fixed && b.start == before.start && b.end == before.end &&
           b.recorded == before.recorded + before.size;
  }
  std::uint32_t last_of(std::uint32_t merged) const {
    return merged == PlannedLayout::kNone ? merged : first_[merged + 1] - 1;
  }

  std::span<const RecordedBlock> blocks_;
  std::vector<RecordedBlock> merged_;
  std::vector<std::uint32_t> first_;  // per merged block, its first input block; then the input's size
  std::vector<std::uint32_t> merged_of_;  // per input block, its merged block
};

// pack()'s input for the `count` blocks planned (the input, or its runs merged: block i
// of the input is planned as block index_of(i)) from replaced_blocks() of the input: empty when
// no block replaces another. A replaced block that stays where recorded (in a run or not) is
// given by its recorded place, and the others are in no run: the same either way.
template <typename IndexOf>
std::vector<Replaced> replacements(std::span<const RecordedBlock> blocks, std::size_t count, IndexOf index_of) {
  const std::vector<std::uint32_t> replaced = replaced_blocks(blocks);
  if (std::all_of(replaced.begin(), replaced.end(), [](std::uint32_t j) { return j == PlannedLayout::kNone; }))
    return {};
  std::vector<Replaced> out(count);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::uint32_t j = replaced[i];
    if (j == PlannedLayout::kNone) continue;
    Replaced& r = out[index_of(i)];
    r.size = blocks[j].size;
    if (blocks[j].stays_where_recorded()) {
      r.delta = blocks[j].recorded;
    } else {
      r.block = index_of(j);
    }
  }
  return out;
}

// plan_layout() on checked blocks; `hidden` as for pack(); `replaced()` gives pack()'s
// input, asked for only when that candidate runs (empty: no block replaces another, no such
// candidate); `kept`, how the kept blocks go; `ceiling`, the highest a candidate may reach
// (SIZE_MAX: any). Nullopt when no candidate does (with SIZE_MAX, only when the kept blocks go
// first and the packings were cut short: no online candidate then).
template <typename MakeReplaced>
std::optional<PlannedLayout> plan_blocks(std::span<const RecordedBlock> blocks, std::size_t max_pack_steps,
                                         std::size_t hidden, KeptBlocks kept, std::size_t ceiling,
                                         MakeReplaced replaced) {
  const Events events = events_in_order(blocks);
  const LivePeak peak = live_peak(blocks, events);
  const std::size_t floor = peak.bytes;  // no layout is lower
  PlannedLayout best;
  best.offsets.resize(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) best.offsets[i] = blocks[i].recorded;
  best.height = height_of(blocks, best.offsets);
  best.source = LayoutSource::recorded;
  std::optional<std::vector<std::uint32_t>> recorded_below = link_below(blocks, best.offsets, events);
  if (best.height > ceiling) recorded_below.reset();  // above the ceiling: no candidate
  if (recorded_below && best.height <= floor) {
    best.below = std::move(*recorded_below);
    return best;
  }
  // Each candidate replaces the best so far only when it is lower (ties: the earlier one), and
  // the next is tried only while the best is above the floor.
  // No online candidate when kept blocks go first (RecordedBlock::kept says why).
  const bool keeps = kept == KeptBlocks::lowest_first && has_kept(blocks);
  std::vector<std::size_t> online = keeps ? std::vector<std::size_t>{} : online_layout(blocks, events);
  // Pinned blocks held from the start may overlap a fixed block freed before they come: then the
  // online candidate overlaps itself and is not one.
  const bool pinned = std::any_of(blocks.begin(), blocks.end(), [](const RecordedBlock& b) { return b.pinned; });
  const bool online_apart = !keeps && (!pinned || link_below(blocks, online, events).has_value());
  if (const std::size_t height = keeps ? SIZE_MAX : height_of(blocks, online);
      online_apart && height <= ceiling && (!recorded_below || height < best.height)) {
    best.offsets = std::move(online);
    best.height = height;
    best.source = LayoutSource::online;
  } else if (!recorded_below) {
    best.height = ceiling == SIZE_MAX ? SIZE_MAX : ceiling + 1;  // no candidate yet: a packing's, below it
  }
  if (best.height > floor) {
    Packing packing = pack(blocks, {}, max_pack_steps, best.height, hidden, kept);
    if (packing.end == PackEnd::done) {
      best.offsets = std::move(packing.offsets);
      best.height = height_of(blocks, best.offsets);
      best.source = LayoutSource::packed;
    }
  }
  if (best.height > floor) {
    const std::vector<Replaced> replacing = replaced();
    Packing packing = replacing.empty() ? Packing{PackEnd::not_lower, {}}
                                        : pack(blocks, replacing, max_pack_steps, best.height, hidden, kept);
    if (packing.end == PackEnd::done) {
      best.offsets = std::move(packing.offsets);
      best.height = height_of(blocks, best.offsets);
      best.source = LayoutSource::replacing;
    }
  }
  const std::pair<PackOrder::Kind, LayoutSource> other_orders[] = {
      {PackOrder::Kind::peak_first, LayoutSource::peak_first},
      {PackOrder::Kind::by_area, LayoutSource::by_area},
      {PackOrder::Kind::by_size_longest, LayoutSource::by_size_longest}};
  for (const auto& [kind, source] : other_orders) {
    if (best.height <= floor) break;
    Packing packing = pack(blocks, {}, max_pack_steps, best.height, hidden, kept, {kind, peak.tick});
    if (packing.end == PackEnd::done) {
      best.offsets = std::move(packing.offsets);
      best.height = height_of(blocks, best.offsets);
      best.source = source;
    }
  }
  if (best.source == LayoutSource::recorded) {
    if (!recorded_below && (keeps || ceiling != SIZE_MAX)) return std::nullopt;
    if (!recorded_below) throw std::runtime_error("plan_layout: no candidate keeps the blocks apart within the packing bound");
    best.below = std::move(*recorded_below);
    return best;
  }
  std::optional<std::vector<std::uint32_t>> below = link_below(blocks, best.offsets, events);
  if (!below) throw std::logic_error("plan_layout: the planned layout overlaps itself");
  best.below = std::move(*below);
  return best;
}

// plan_layout() on checked blocks, the kept ones placed as `kept` says, no higher than `ceiling`
// (plan_blocks()).
std::optional<PlannedLayout> plan_checked(std::span<const RecordedBlock> blocks, std::size_t max_pack_steps,
                                          FixedRuns runs, KeptBlocks kept, std::size_t ceiling) {
  const auto as_input = [&] {
    return replacements(blocks, blocks.size(), [](std::size_t i) { return static_cast<std::uint32_t>(i); });
  };
  if (runs == FixedRuns::as_blocks) return plan_blocks(blocks, max_pack_steps, 0, kept, ceiling, as_input);
  const MergedRuns merged(blocks);
  if (merged.hidden() == 0) return plan_blocks(blocks, max_pack_steps, 0, kept, ceiling, as_input);
  const auto as_merged = [&] {
    return replacements(blocks, merged.merged().size(), [&](std::size_t i) { return merged.merged_of(i); });
  };
  const std::optional<PlannedLayout> planned =
      plan_blocks(merged.merged(), max_pack_steps, merged.hidden(), kept, ceiling, as_merged);
  if (!planned) return std::nullopt;
  return merged.spread(*planned);
}

// How high the blocks reached where they were recorded (for a predicted step: the step it is
// predicted from, whose pages the heap holds).
std::size_t recorded_height(std::span<const RecordedBlock> blocks) {
  std::size_t h = 0;
  for (const RecordedBlock& b : blocks) h = std::max(h, b.recorded + b.size);
  return h;
}

}  // namespace

std::size_t peak_live_bytes(std::span<const RecordedBlock> blocks) {
  return live_peak(blocks, events_in_order(blocks)).bytes;
}

std::size_t allocations_in(std::span<const RecordedBlock> record) noexcept {
  std::size_t n = 0;
  while (n < record.size() && !record[n].fixed) ++n;
  return n;
}

PlannedLayout plan_layout(std::span<const RecordedBlock> blocks, std::size_t max_pack_steps, FixedRuns runs) {
  check_input(blocks);
  if (blocks.size() >= PlannedLayout::kNone) throw std::invalid_argument("plan_layout: too many blocks");
  if (!has_kept(blocks)) return *plan_checked(blocks, max_pack_steps, runs, KeptBlocks::as_any, SIZE_MAX);
  // Kept blocks first (RecordedBlock::kept says why) when that layout reaches no higher than the
  // blocks did where they were recorded (the pages the step it is predicted from held), or above
  // the live peak at most twice as far as the lowest layout with the kept blocks placed as any.
  // Packed first within twice as far as the record reached (the packings stop above it: the
  // layouts refused reach far higher, and cost the most), and again within twice as far as that
  // layout only when it reaches higher still.
  const std::size_t floor = peak_live_bytes(blocks);
  const std::size_t reached = recorded_height(blocks);
  const auto within = [&](std::size_t height) { return floor + 2 * (std::max(height, floor) - floor); };
  std::optional<PlannedLayout> first =
      plan_checked(blocks, max_pack_steps, runs, KeptBlocks::lowest_first, within(reached));
  if (first && first->height <= reached) return std::move(*first);
  PlannedLayout as_any = *plan_checked(blocks, max_pack_steps, runs, KeptBlocks::as_any, SIZE_MAX);
  if (first && first->height <= within(as_any.height)) return std::move(*first);
  if (first) return as_any;  // above the record's reach, and more than twice as_any's distance
  if (within(as_any.height) > within(reached))
    first = plan_checked(blocks, max_pack_steps, runs, KeptBlocks::lowest_first, within(as_any.height));
  return first ? std::move(*first) : std::move(as_any);
}

}  // namespace tensorpool::detail
