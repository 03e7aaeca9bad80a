// layout_plan.cpp: the planner of layout_plan.hpp (greedy by size over lifetimes, against the
// recorded layout).
#include "core/layout_plan.hpp"

#include <algorithm>
#include <bit>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace tensorpool::detail {

namespace {

/// Blocks indexed by their rank in start order; each leaf holds the end of a placed block (0:
/// not placed), each inner node the largest end below it. for_each_alive(r, t) visits the placed
/// blocks of rank < r that end after t, pruning subtrees whose largest end is <= t.
class EndTree {
 public:
  explicit EndTree(std::size_t n) : leaves_(std::bit_ceil(std::max<std::size_t>(n, 1))), max_end_(2 * leaves_, 0) {}

  void place(std::size_t rank, std::uint64_t end) {
    std::size_t node = leaves_ + rank;
    max_end_[node] = end;
    for (node /= 2; node >= 1; node /= 2) max_end_[node] = std::max(max_end_[2 * node], max_end_[2 * node + 1]);
  }

  template <class F>
  void for_each_alive(std::size_t rank_limit, std::uint64_t after, F&& f) const {
    if (rank_limit == 0) return;
    visit(1, 0, leaves_, rank_limit, after, f);
  }

 private:
  template <class F>
  void visit(std::size_t node, std::size_t lo, std::size_t hi, std::size_t limit, std::uint64_t after, F& f) const {
    if (lo >= limit || max_end_[node] <= after) return;
    if (hi - lo == 1) {
      f(lo);
      return;
    }
    const std::size_t mid = lo + (hi - lo) / 2;
    visit(2 * node, lo, mid, limit, after, f);
    visit(2 * node + 1, mid, hi, limit, after, f);
  }

  std::size_t leaves_;
  std::vector<std::uint64_t> max_end_;
};

void check_input(std::span<const PlanBlock> blocks) {
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const PlanBlock& b = blocks[i];
    if (b.size == 0 || b.start >= b.end)
      throw std::invalid_argument("plan_layout: block " + std::to_string(i) + " has size " + std::to_string(b.size) +
                                  " and lifetime [" + std::to_string(b.start) + ", " + std::to_string(b.end) + ")");
  }
}

// Greedy by size, best-fit gap among the placed blocks alive at the same time.
std::vector<std::size_t> pack(std::span<const PlanBlock> blocks) {
  const std::size_t n = blocks.size();
  std::vector<std::size_t> by_start(n);
  std::iota(by_start.begin(), by_start.end(), std::size_t{0});
  std::sort(by_start.begin(), by_start.end(), [&](std::size_t a, std::size_t b) { return blocks[a].start < blocks[b].start; });
  std::vector<std::size_t> rank(n);
  std::vector<std::uint64_t> starts(n);
  for (std::size_t r = 0; r < n; ++r) {
    rank[by_start[r]] = r;
    starts[r] = blocks[by_start[r]].start;
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
    return blocks[a].start < blocks[b].start;
  });

  std::vector<std::size_t> offsets(n, 0);
  EndTree tree(n);
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // [offset, end) of the placed blocks alive
  for (const std::size_t i : order) {
    const PlanBlock& b = blocks[i];
    busy.clear();
    const std::size_t limit = static_cast<std::size_t>(std::lower_bound(starts.begin(), starts.end(), b.end) - starts.begin());
    tree.for_each_alive(limit, b.start, [&](std::size_t r) {
      const std::size_t j = by_start[r];
      busy.emplace_back(offsets[j], offsets[j] + blocks[j].size);
    });
    std::sort(busy.begin(), busy.end());
    std::size_t top = 0;
    std::size_t best_gap = SIZE_MAX;
    std::size_t best_at = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo > top && lo - top >= b.size && lo - top < best_gap) {
        best_gap = lo - top;
        best_at = top;
      }
      top = std::max(top, hi);
    }
    offsets[i] = best_gap != SIZE_MAX ? best_at : top;
    tree.place(rank[i], b.end);
  }
  return offsets;
}

std::size_t height_of(std::span<const PlanBlock> blocks, const std::vector<std::size_t>& offsets) {
  std::size_t h = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) h = std::max(h, offsets[i] + blocks[i].size);
  return h;
}

// The events of the epoch in clock order: (tick, block, is_alloc).
std::vector<std::pair<std::uint64_t, std::size_t>> events_in_order(std::span<const PlanBlock> blocks) {
  std::vector<std::pair<std::uint64_t, std::size_t>> ev;
  ev.reserve(2 * blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ev.emplace_back(blocks[i].start, 2 * i + 1);  // odd: allocation
    ev.emplace_back(blocks[i].end, 2 * i);        // even: free
  }
  std::sort(ev.begin(), ev.end());  // a free and an allocation on one tick: the free first
  return ev;
}

// Replays the epoch against plan.offsets and fills plan.below; false if two blocks alive
// together overlap (the allocator must never follow such a plan).
bool check_and_link(std::span<const PlanBlock> blocks, LayoutPlan& plan) {
  plan.below.assign(blocks.size(), LayoutPlan::kNone);
  std::map<std::size_t, std::size_t> alive;  // offset -> block
  for (const auto& [tick, code] : events_in_order(blocks)) {
    const std::size_t i = code / 2;
    const std::size_t off = plan.offsets[i];
    if (code % 2 == 0) {
      alive.erase(off);
      continue;
    }
    auto next = alive.lower_bound(off);
    if (next != alive.end() && next->first < off + blocks[i].size) return false;
    if (next != alive.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + blocks[prev->second].size > off) return false;
      plan.below[i] = static_cast<std::uint32_t>(prev->second);
    }
    alive.emplace(off, i);
  }
  return true;
}

}  // namespace

std::size_t peak_live_bytes(std::span<const PlanBlock> blocks) {
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

LayoutPlan plan_layout(std::span<const PlanBlock> blocks) {
  check_input(blocks);
  if (blocks.size() >= LayoutPlan::kNone) throw std::invalid_argument("plan_layout: too many blocks");
  LayoutPlan plan;
  std::vector<std::size_t> recorded(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) recorded[i] = blocks[i].recorded;
  std::vector<std::size_t> packed = pack(blocks);
  const std::size_t recorded_height = height_of(blocks, recorded);
  const std::size_t packed_height = height_of(blocks, packed);
  if (recorded_height <= packed_height) {  // the recorded layout, if it is one
    plan.offsets = std::move(recorded);
    plan.height = recorded_height;
    plan.recorded = true;
    if (check_and_link(blocks, plan)) return plan;
  }
  plan.offsets = std::move(packed);
  plan.height = packed_height;
  plan.recorded = false;
  if (!check_and_link(blocks, plan)) throw std::logic_error("plan_layout: the packed layout overlaps itself");
  return plan;
}

}  // namespace tensorpool::detail
