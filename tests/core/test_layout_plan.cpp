// The offline planner of vmm heaps' layouts (src/core/layout_plan.hpp): every layout it returns
// keeps blocks alive together apart, never reaches below the peak of live bytes, never above the
// recorded layout, and names for each block a neighbour below it that is alive when it is.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/layout_plan.hpp"
#include "tensorpool/types.hpp"

using namespace tensorpool;
using tensorpool::detail::PlannedLayout;
using tensorpool::detail::RecordedBlock;

namespace {

bool alive_together(const RecordedBlock& a, const RecordedBlock& b) { return a.start < b.end && b.start < a.end; }

// Whether a layout came from one of the five packings (by size, by size with blocks on the place
// of the block they replace, the live peak's blocks first, by area, by size with the longest
// lived first): what the packing's bound may cut short.
bool packing(detail::LayoutSource source) {
  return source != detail::LayoutSource::recorded && source != detail::LayoutSource::online;
}

// Checks every pair by brute force: blocks alive together lie apart; and the height.
void require_apart(const std::vector<RecordedBlock>& blocks, const PlannedLayout& plan) {
  REQUIRE(plan.offsets.size() == blocks.size());
  std::size_t height = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    height = std::max(height, plan.offsets[i] + blocks[i].size);
    for (std::size_t j = i + 1; j < blocks.size(); ++j) {
      if (!alive_together(blocks[i], blocks[j])) continue;
      const bool apart = plan.offsets[i] + blocks[i].size <= plan.offsets[j] ||
                         plan.offsets[j] + blocks[j].size <= plan.offsets[i];
      INFO("blocks " << i << " and " << j);
      REQUIRE(apart);
    }
  }
  REQUIRE(plan.height == height);
}

// require_apart(), and the `below` links.
void require_valid(const std::vector<RecordedBlock>& blocks, const PlannedLayout& plan) {
  require_apart(blocks, plan);
  REQUIRE(plan.below.size() == blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::uint32_t below = plan.below[i];
    if (below == PlannedLayout::kNone) {
      // Nothing alive at its allocation lies below it.
      for (std::size_t j = 0; j < blocks.size(); ++j)
        if (j != i && blocks[j].start < blocks[i].start && blocks[j].end > blocks[i].start)
          REQUIRE(plan.offsets[j] > plan.offsets[i]);
    } else {
      const RecordedBlock& b = blocks[below];
      REQUIRE(b.start < blocks[i].start);
      REQUIRE(b.end > blocks[i].start);
      REQUIRE(plan.offsets[below] + b.size <= plan.offsets[i]);
    }
  }
}

// A random epoch on one clock: allocations and frees interleaved, every block freed by the end.
std::vector<RecordedBlock> random_epoch(std::mt19937_64& rng, std::size_t n) {
  std::vector<RecordedBlock> blocks;
  std::vector<std::size_t> alive;
  std::uniform_int_distribution<int> coin(0, 2);
  std::uniform_int_distribution<std::size_t> sizes(1, 64);
  std::uint64_t clock = 0;
  std::size_t offset = 0;  // a bump "recorded" layout: valid, and high
  while (blocks.size() < n || !alive.empty()) {
    if (blocks.size() < n && (alive.empty() || coin(rng) != 0)) {
      const std::size_t size = sizes(rng) * 512;
      blocks.push_back(RecordedBlock{size, clock++, 0, offset});
      offset += size;
      alive.push_back(blocks.size() - 1);
    } else {
      std::uniform_int_distribution<std::size_t> pick(0, alive.size() - 1);
      const std::size_t k = pick(rng);
      blocks[alive[k]].end = clock++;
      alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return blocks;
}

}  // namespace

TEST_CASE("layout plan: packs by size below an online allocator's layout, down to the live peak", "[plan]") {
  // a (40) and b (40) alive, a freed, c (60) alive with b. Online, c does not fit a's hole and
  // goes above b (recorded: 0, 40, 80; 140 high). Packed: c at 0, a at 0 (never alive with c),
  // b above both at 60: 100 high, the peak of live bytes (b + c).
  const std::vector<RecordedBlock> blocks = {{40 * MiB, 0, 2, 0}, {40 * MiB, 1, 4, 40 * MiB}, {60 * MiB, 3, 5, 80 * MiB}};
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.source == detail::LayoutSource::packed);
  REQUIRE(plan.offsets == std::vector<std::size_t>{0, 60 * MiB, 0});
  REQUIRE(plan.height == 100 * MiB);
  REQUIRE(detail::peak_live_bytes(blocks) == 100 * MiB);
  // When b is allocated, a (0 to 40) is alive below its place (60); nothing is below a or c.
  REQUIRE(plan.below == std::vector<std::uint32_t>{PlannedLayout::kNone, 0, PlannedLayout::kNone});
}

TEST_CASE("layout plan: the live peak's blocks placed first reach the peak where the other candidates do not",
          "[plan]") {
  // Sizes in MiB, (start, end) ticks: a 1 (1, 29), b 5 (2, 12), c 5 (3, 37), d 1 (6, 36), e 4 (23, 34),
  // f 4 (25, 31); recorded stacked, 20 high. The live peak, 15, is at tick 25: a c d e f.
  //  - online: a 0, b 1, c 6, d 11; b freed leaves a 5 MiB hole, e takes it (best fit) at 1 and
  //    f finds only 1 MiB there: on top at 12, 16 high;
  //  - by size: b 0 and c 5 (b outlives nothing it could share with), e and f above b's end...
  //    16 high (no block replaces another: the fourth candidate does not run);
  //  - the peak's blocks first, in clock order: a 0, c 1, d 6, e 7, f 11; then b at 7 (alive with
  //    a, c and d only): 15 high.
  const std::vector<RecordedBlock> blocks = {{1 * MiB, 1, 29, 0},       {5 * MiB, 2, 12, 1 * MiB},
                                             {5 * MiB, 3, 37, 6 * MiB}, {1 * MiB, 6, 36, 11 * MiB},
                                             {4 * MiB, 23, 34, 12 * MiB}, {4 * MiB, 25, 31, 16 * MiB}};
  REQUIRE(detail::peak_live_bytes(blocks) == 15 * MiB);
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.source == detail::LayoutSource::peak_first);
  REQUIRE(plan.height == 15 * MiB);
  REQUIRE(plan.offsets == std::vector<std::size_t>{0, 7 * MiB, 1 * MiB, 6 * MiB, 7 * MiB, 11 * MiB});

  // The same epoch keeping an output past its end (a pinned block, made after the others are
  // freed): it stays where it was recorded, and the candidate is tried as for any epoch.
  std::vector<RecordedBlock> keeping = blocks;
  RecordedBlock kept{1 * MiB, 38, 40, 0};
  kept.pinned = true;
  keeping.push_back(kept);
  const PlannedLayout turn = detail::plan_layout(keeping);
  require_valid(keeping, turn);
  REQUIRE(turn.source == detail::LayoutSource::peak_first);
  REQUIRE(turn.height == 15 * MiB);
  REQUIRE(turn.offsets.back() == 0);
}

TEST_CASE("layout plan: a recorded layout as low as the packed one is kept", "[plan]") {
  const std::vector<RecordedBlock> blocks = {{8 * MiB, 0, 3, 0}, {4 * MiB, 1, 2, 8 * MiB}, {4 * MiB, 4, 5, 0}};
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.source == detail::LayoutSource::recorded);
  REQUIRE(plan.offsets == std::vector<std::size_t>{0, 8 * MiB, 0});
  REQUIRE(plan.below[1] == 0);  // the 8 MiB block ends where the 4 MiB one starts
}

TEST_CASE("layout plan: a recorded layout that overlaps itself is not used", "[plan]") {
  // Two blocks alive together recorded at the same offset: not a layout; the online one, at the
  // live peak, is, whether packing may run or not.
  const std::vector<RecordedBlock> blocks = {{4 * MiB, 0, 3, 0}, {4 * MiB, 1, 2, 0}};
  for (const std::size_t max_pack_steps : {detail::kMaxPackSteps, std::size_t{0}}) {
    const PlannedLayout plan = detail::plan_layout(blocks, max_pack_steps);
    require_valid(blocks, plan);
    REQUIRE(plan.source == detail::LayoutSource::online);
    REQUIRE(plan.height == 8 * MiB);
  }
}

TEST_CASE("layout plan: random epochs get valid layouts between the live peak and the recorded height",
          "[plan]") {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 200; ++round) {
    const std::size_t n = 1 + static_cast<std::size_t>(round % 60);
    const std::vector<RecordedBlock> blocks = random_epoch(rng, n);
    const PlannedLayout plan = detail::plan_layout(blocks);
    INFO("round " << round << ", " << n << " blocks");
    require_valid(blocks, plan);
    std::size_t recorded = 0;
    for (const RecordedBlock& b : blocks) recorded = std::max(recorded, b.recorded + b.size);
    REQUIRE(plan.height >= detail::peak_live_bytes(blocks));
    REQUIRE(plan.height <= recorded);
  }
}

TEST_CASE("layout plan: blocks without a lifetime or a size are refused", "[plan]") {
  REQUIRE_THROWS_AS(detail::plan_layout(std::vector<RecordedBlock>{{0, 0, 1, 0}}), std::invalid_argument);
  REQUIRE_THROWS_AS(detail::plan_layout(std::vector<RecordedBlock>{{512, 3, 3, 0}}), std::invalid_argument);
  REQUIRE(detail::plan_layout(std::vector<RecordedBlock>{}).height == 0);
}

TEST_CASE("layout plan: packing that would cost too much keeps the lower of the recorded and online layouts",
          "[plan]") {
  std::mt19937_64 rng(777);
  int online = 0;
  for (int round = 0; round < 50; ++round) {
    const std::size_t n = 2 + static_cast<std::size_t>(round % 40);
    const std::vector<RecordedBlock> blocks = random_epoch(rng, n);
    INFO("round " << round << ", " << n << " blocks");
    const PlannedLayout unbounded = detail::plan_layout(blocks, SIZE_MAX);
    // n (n - 1) / 2 placed blocks is what packing n blocks looks at, at most: never cut short.
    const PlannedLayout enough = detail::plan_layout(blocks, n * (n - 1) / 2);
    REQUIRE(enough.offsets == unbounded.offsets);
    REQUIRE(enough.source == unbounded.source);
    // No packing allowed past the first block: the recorded (bump) layout, valid, or the online
    // one where it is lower.
    const PlannedLayout cut = detail::plan_layout(blocks, 0);
    require_valid(blocks, cut);
    REQUIRE(!packing(cut.source));
    REQUIRE(cut.height >= unbounded.height);
    if (cut.source == detail::LayoutSource::recorded) {
      for (std::size_t i = 0; i < n; ++i) REQUIRE(cut.offsets[i] == blocks[i].recorded);
    } else {
      ++online;
      std::size_t recorded = 0;
      for (const RecordedBlock& b : blocks) recorded = std::max(recorded, b.recorded + b.size);
      REQUIRE(cut.height < recorded);
    }
  }
  REQUIRE(online >= 25);  // a bump layout is rarely the lower one
}

TEST_CASE("layout plan: an epoch whose blocks nest gets the online layout, at the live peak, without packing",
          "[plan]") {
  // Weights, then activations kept for the backward pass each with a temporary freed at once,
  // then the activations freed in reverse: a stack. The recorded layout is a bump (every block
  // above the last), far above the peak; an allocator that reuses the top reaches the peak.
  std::mt19937_64 rng(99);
  std::vector<RecordedBlock> blocks;
  std::uint64_t clock = 0;
  std::size_t bump = 0;
  const auto alloc = [&] {
    const std::size_t size = (std::size_t{1} << (9 + rng() % 16)) + 512 * (rng() % 64);
    blocks.push_back(RecordedBlock{size, clock++, 0, bump});
    bump += size;
    return blocks.size() - 1;
  };
  std::vector<std::size_t> weights, saved;
  for (int i = 0; i < 100; ++i) weights.push_back(alloc());
  for (int i = 0; i < 400; ++i) {
    saved.push_back(alloc());
    const std::size_t temporary = alloc();
    blocks[temporary].end = clock++;
  }
  for (auto s = saved.rbegin(); s != saved.rend(); ++s) blocks[*s].end = clock++;
  for (const std::size_t w : weights) blocks[w].end = clock++;
  // With packing allowed to look at nothing, the layout is the same: packing never ran.
  for (const std::size_t max_pack_steps : {detail::kMaxPackSteps, std::size_t{0}}) {
    const PlannedLayout plan = detail::plan_layout(blocks, max_pack_steps);
    require_valid(blocks, plan);
    REQUIRE(plan.source == detail::LayoutSource::online);
    REQUIRE(plan.height == detail::peak_live_bytes(blocks));
  }
}

namespace {

// The four orders of the packings without replacements (layout_plan.hpp): by decreasing size
// (ties: earlier first); the blocks alive at the live peak's first tick first, each set in clock
// order; by decreasing size times lifetime (ties: larger, then earlier); by decreasing size (ties:
// longer lifetime, then earlier).
enum class ReferenceOrder { by_size, peak_first, by_area, by_size_longest };

// The first tick at which the most bytes are alive (a free before an allocation on one tick).
std::uint64_t first_peak_tick(const std::vector<RecordedBlock>& blocks) {
  std::vector<std::pair<std::uint64_t, std::int64_t>> events;  // (tick, +size or -size)
  for (const RecordedBlock& b : blocks) {
    events.emplace_back(b.start, static_cast<std::int64_t>(b.size));
    events.emplace_back(b.end, -static_cast<std::int64_t>(b.size));
  }
  std::sort(events.begin(), events.end());
  std::int64_t live = 0;
  std::int64_t peak = 0;
  std::uint64_t at = 0;
  for (const auto& [tick, delta] : events) {
    live += delta;
    if (live > peak) {
      peak = live;
      at = tick;
    }
  }
  return at;
}

// The packing as layout_plan.hpp states it, by a plain scan of every placed block for each block
// (the planner skips runs of placed blocks that cannot change its answer, and stops at an exact
// fit): blocks in `order` after the fixed ones, each at the lowest of the smallest gaps that fit
// it between the placed blocks alive with it, else at their top.
std::vector<std::size_t> reference_packing(const std::vector<RecordedBlock>& blocks,
                                           ReferenceOrder how = ReferenceOrder::by_size) {
  struct Placed {
    std::size_t lo, hi;
    std::uint64_t start, end;
  };
  std::vector<Placed> placed;  // by lo; a block goes after those at the same offset
  std::vector<std::size_t> offsets(blocks.size(), 0);
  const auto place = [&](std::size_t i, std::size_t at) {
    offsets[i] = at;
    const Placed p{at, at + blocks[i].size, blocks[i].start, blocks[i].end};
    const auto pos = std::upper_bound(placed.begin(), placed.end(), p.lo,
                                      [](std::size_t lo, const Placed& x) { return lo < x.lo; });
    placed.insert(pos, p);
  };
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].fixed) {
      place(i, blocks[i].recorded);
    } else {
      order.push_back(i);
    }
  }
  const auto lifetime = [&](std::size_t i) { return static_cast<long double>(blocks[i].end - blocks[i].start); };
  const auto larger_then_earlier = [&](std::size_t a, std::size_t b) {
    return blocks[a].size != blocks[b].size ? blocks[a].size > blocks[b].size : blocks[a].start < blocks[b].start;
  };
  if (how == ReferenceOrder::by_size) {
    std::stable_sort(order.begin(), order.end(), larger_then_earlier);
  } else if (how == ReferenceOrder::by_area) {
    // (sizes and lifetimes of these epochs: the product is exact in a long double)
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const long double area_a = static_cast<long double>(blocks[a].size) * lifetime(a);
      const long double area_b = static_cast<long double>(blocks[b].size) * lifetime(b);
      return area_a != area_b ? area_a > area_b : larger_then_earlier(a, b);
    });
  } else if (how == ReferenceOrder::by_size_longest) {
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
      return lifetime(a) != lifetime(b) ? lifetime(a) > lifetime(b) : blocks[a].start < blocks[b].start;
    });
  } else {
    const std::uint64_t peak = first_peak_tick(blocks);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const bool a_at_peak = blocks[a].start <= peak && peak < blocks[a].end;
      const bool b_at_peak = blocks[b].start <= peak && peak < blocks[b].end;
      return a_at_peak != b_at_peak ? a_at_peak : blocks[a].start < blocks[b].start;
    });
  }
  for (const std::size_t i : order) {
    const RecordedBlock& b = blocks[i];
    std::size_t top = 0;
    std::size_t best_gap = SIZE_MAX;
    std::size_t best_at = 0;
    for (const Placed& p : placed) {
      if (!(p.start < b.end && b.start < p.end)) continue;
      if (p.lo > top && p.lo - top >= b.size && p.lo - top < best_gap) {
        best_gap = p.lo - top;
        best_at = top;
      }
      top = std::max(top, p.hi);
    }
    place(i, best_gap != SIZE_MAX ? best_at : top);
  }
  return offsets;
}

// The height of reference_packing()'s layout.
std::size_t reference_height(const std::vector<RecordedBlock>& blocks, ReferenceOrder how) {
  const std::vector<std::size_t> offsets = reference_packing(blocks, how);
  std::size_t height = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) height = std::max(height, offsets[i] + blocks[i].size);
  return height;
}

// An epoch shaped like a training step: long-lived blocks (some fixed: a step's base), nested
// activations and short temporaries, sizes from a few classes (exact fits are common) and a
// recorded layout that overlaps itself (every block at 0), so that the packing is what is kept.
std::vector<RecordedBlock> step_epoch(std::mt19937_64& rng, std::size_t n) {
  std::vector<RecordedBlock> blocks;
  std::vector<std::size_t> saved;
  std::uint64_t clock = 1;
  const auto size = [&] { return std::size_t{512} << (rng() % 12); };
  std::size_t fixed_at = 0;
  while (blocks.size() < n) {
    switch (rng() % 6) {
      case 0:  // fixed: alive from the epoch's start, where it was (to its end, or freed in it)
        blocks.push_back(RecordedBlock{size(), 0, 0, fixed_at, true});
        fixed_at += blocks.back().size;
        break;
      case 1: case 2:  // an activation kept for later
        blocks.push_back(RecordedBlock{size(), clock++, 0, 0});
        saved.push_back(blocks.size() - 1);
        break;
      case 3:  // a temporary
        blocks.push_back(RecordedBlock{size(), clock, clock + 1 + rng() % 3, 0});
        clock += 2;
        break;
      default:  // an activation freed
        if (!saved.empty()) {
          blocks[saved.back()].end = clock++;
          saved.pop_back();
        }
    }
  }
  for (const std::size_t s : saved) blocks[s].end = clock++;
  for (RecordedBlock& b : blocks) {
    if (b.end == 0) b.end = clock + 1;
    b.end = std::min<std::uint64_t>(b.end, clock + 1);
    if (b.fixed) b.end = rng() % 4 == 0 ? 1 + rng() % (clock + 1) : clock + 1;
    if (b.start >= b.end) b.end = b.start + 1;
  }
  return blocks;
}

}  // namespace

TEST_CASE("layout plan: the packing is the plain scan's, block for block", "[plan]") {
  std::mt19937_64 rng(2026);
  int packed = 0;
  int peak_first = 0;
  int by_area = 0;
  int by_size_longest = 0;
  for (int round = 0; round < 120; ++round) {
    // Up to 600 blocks: the planner's runs of placed blocks split many times.
    const std::size_t n = 1 + static_cast<std::size_t>(rng() % 600);
    const std::vector<RecordedBlock> blocks = round % 2 == 0 ? step_epoch(rng, n) : random_epoch(rng, n);
    INFO("round " << round << ", " << blocks.size() << " blocks");
    const PlannedLayout plan = detail::plan_layout(blocks, SIZE_MAX);
    // (require_valid()'s check of the `below` links assumes no two blocks start on one tick; the
    // fixed blocks of a step epoch all start on tick 0, as the allocator records them.)
    if (round % 2 == 1) {
      require_valid(blocks, plan);
    } else {
      require_apart(blocks, plan);
    }
    // The packing is kept when it is the lowest; another candidate only when lower still.
    const std::vector<std::size_t> reference = reference_packing(blocks);
    std::size_t reference_height = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i)
      reference_height = std::max(reference_height, reference[i] + blocks[i].size);
    REQUIRE(plan.height <= reference_height);
    switch (plan.source) {
      case detail::LayoutSource::packed:
        ++packed;
        REQUIRE(plan.offsets == reference);
        break;
      case detail::LayoutSource::peak_first:
        ++peak_first;
        REQUIRE(plan.offsets == reference_packing(blocks, ReferenceOrder::peak_first));
        break;
      case detail::LayoutSource::by_area:
        ++by_area;
        REQUIRE(plan.offsets == reference_packing(blocks, ReferenceOrder::by_area));
        break;
      case detail::LayoutSource::by_size_longest:
        ++by_size_longest;
        REQUIRE(plan.offsets == reference_packing(blocks, ReferenceOrder::by_size_longest));
        break;
      default:
        break;
    }
  }
  // Each packing is kept in a share of the rounds (27, 40, 5 and 1 of 120 at the seed above).
  INFO("packed " << packed << ", peak first " << peak_first << ", by area " << by_area << ", by size, longest first "
                 << by_size_longest);
  REQUIRE(packed >= 25);
  REQUIRE(peak_first >= 30);
  REQUIRE(by_area >= 1);
  REQUIRE(by_size_longest >= 1);
}

TEST_CASE("layout plan: packing by area places a long-lived block low where packing by size stacks above it",
          "[plan]") {
  // Sizes in MiB, (start, end) ticks: a 4 (10, 17), b 2 (3, 10), c 3 (4, 6), d 1 (8, 14); recorded
  // stacked, 10 high. The live peak, 5, is b + c (ticks 4-5) and a + d (10-13).
  //  - by size: a 0, c 0 (never alive with a), b above c at 3, and d, alive with a (0-4) and b
  //    (3-5), at 5: 6 high; by size with the longest first: the same (no two sizes are equal);
  //  - the peak's blocks first (b and c, alive at tick 4, in clock order), then the others in
  //    clock order: b 0, c 2, d 2 (alive with b only), a above d at 3: 7 high (online the same);
  //  - by area (a 28, b 14, c 6 and d 6: c the larger): a 0, b 0, c above b at 2, d above a at 4:
  //    5 high, the peak. The brief block c lies above the long-lived b, not under it.
  const std::vector<RecordedBlock> blocks = {
      {4 * MiB, 10, 17, 0}, {2 * MiB, 3, 10, 4 * MiB}, {3 * MiB, 4, 6, 6 * MiB}, {1 * MiB, 8, 14, 9 * MiB}};
  REQUIRE(detail::peak_live_bytes(blocks) == 5 * MiB);
  REQUIRE(reference_height(blocks, ReferenceOrder::by_size) == 6 * MiB);
  REQUIRE(reference_height(blocks, ReferenceOrder::peak_first) == 7 * MiB);
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.source == detail::LayoutSource::by_area);
  REQUIRE(plan.height == 5 * MiB);
  REQUIRE(plan.offsets == std::vector<std::size_t>{0, 0, 2 * MiB, 4 * MiB});
}

TEST_CASE("layout plan: of blocks of one size, the longest-lived placed first leaves room for the others",
          "[plan]") {
  // Sizes in MiB, (start, end) ticks: a 3 (11, 16), b 4 (2, 3), c 2 (1, 10), d 2 (8, 12), e 3 (12, 22);
  // recorded stacked, 14 high. The live peak, 6: b + c (tick 2), or a + e (12-15).
  //  - by size (ties: earlier first): b 0, a 0, e above a at 3, c above b at 4, and d, alive with
  //    a (0-3) and c (4-6), finds only a 1 MiB gap: at 6, 8 high;
  //  - by size, the longest-lived of each size first (e before a, c before d): b 0, e 0, a above e
  //    at 3, c above b at 4, d in e's place under a (e starts as d ends) at 0: 6 high, the peak.
  const std::vector<RecordedBlock> blocks = {{3 * MiB, 11, 16, 0},
                                             {4 * MiB, 2, 3, 3 * MiB},
                                             {2 * MiB, 1, 10, 7 * MiB},
                                             {2 * MiB, 8, 12, 9 * MiB},
                                             {3 * MiB, 12, 22, 11 * MiB}};
  REQUIRE(detail::peak_live_bytes(blocks) == 6 * MiB);
  REQUIRE(reference_height(blocks, ReferenceOrder::by_size) == 8 * MiB);
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.source == detail::LayoutSource::by_size_longest);
  REQUIRE(plan.height == 6 * MiB);
  REQUIRE(plan.offsets == std::vector<std::size_t>{3 * MiB, 0, 4 * MiB, 0, 0});
}

namespace {

// Four steps of a PyTorch loop: a forward pass keeping 8 activations of L/2, the logits (L) kept
// into the next step, the last step's logits freed, the loss's upcasts (2L, two alive at once)
// made right after, then the backward pass freeing the activations in reverse. Every block at
// 0: no recorded candidate.
std::vector<RecordedBlock> loop_keeping_logits(std::size_t logits) {
  std::vector<RecordedBlock> blocks;
  std::uint64_t clock = 1;
  const auto alloc = [&](std::size_t size) {
    blocks.push_back(RecordedBlock{size, clock++, 0, 0});
    return blocks.size() - 1;
  };
  const auto free = [&](std::size_t i) { blocks[i].end = clock++; };
  std::size_t last_logits = SIZE_MAX;
  for (int step = 0; step < 4; ++step) {
    std::vector<std::size_t> activations;
    for (int i = 0; i < 8; ++i) activations.push_back(alloc(logits / 2));
    const std::size_t current = alloc(logits);
    if (last_logits != SIZE_MAX) free(last_logits);
    last_logits = current;
    const std::size_t up1 = alloc(2 * logits);
    const std::size_t up2 = alloc(2 * logits);
    free(up1);
    const std::size_t up3 = alloc(2 * logits);
    free(up2);
    free(up3);
    for (auto a = activations.rbegin(); a != activations.rend(); ++a) free(*a);
  }
  free(last_logits);
  return blocks;
}

}  // namespace

TEST_CASE("layout plan: blocks placed where the block they replace was reach the peak of a loop that keeps its logits",
          "[plan]") {
  // Packing by size puts every step's upcasts at one place, and the logits, each alive with its
  // step's upcasts and with the next step's logits, take turns between two slots above them: a
  // logits' size over the peak. An upcast made as the last logits are freed that starts where
  // they were (the replacing candidate) leaves the other slot to the next logits.
  const std::size_t logits = 100 * MiB;
  const std::vector<RecordedBlock> blocks = loop_keeping_logits(logits);
  const std::size_t peak = detail::peak_live_bytes(blocks);
  REQUIRE(peak == 9 * logits);  // the activations, the logits and two upcasts
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.source == detail::LayoutSource::replacing);
  REQUIRE(plan.height == peak);
  // Packing by size alone (the plain scan) is a logits' size higher.
  const std::vector<std::size_t> by_size = reference_packing(blocks);
  std::size_t by_size_height = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i)
    by_size_height = std::max(by_size_height, by_size[i] + blocks[i].size);
  REQUIRE(by_size_height == peak + logits);
}

TEST_CASE("layout plan: pinned blocks (allocated by a step, kept past its end) stay where they were recorded",
          "[plan][step]") {
  std::mt19937_64 rng(25);
  int pinned_blocks = 0;
  for (int round = 0; round < 60; ++round) {
    std::vector<RecordedBlock> blocks = step_epoch(rng, 1 + static_cast<std::size_t>(rng() % 400));
    std::size_t top = 0;
    std::uint64_t clock_end = 0;
    for (const RecordedBlock& b : blocks) {
      top = std::max(top, b.recorded + b.size);
      clock_end = std::max(clock_end, b.end);
    }
    // Some of the epoch's blocks that live to its end are pinned, each recorded in a place of its
    // own above the rest; one more, pinned over a fixed block freed before it comes (the online
    // candidate, which holds pinned blocks from the start, then overlaps itself and is dropped).
    for (RecordedBlock& b : blocks) {
      if (b.fixed || b.end != clock_end || rng() % 2 != 0) continue;
      b.pinned = true;
      b.recorded = top;
      top += b.size;
    }
    for (const RecordedBlock& f : blocks) {
      if (!f.fixed || f.end >= clock_end) continue;
      blocks.push_back(RecordedBlock{f.size, f.end, clock_end, f.recorded, false, true});
      break;
    }
    INFO("round " << round << ", " << blocks.size() << " blocks");
    const PlannedLayout plan = detail::plan_layout(blocks, SIZE_MAX);
    require_apart(blocks, plan);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (!blocks[i].pinned && !blocks[i].fixed) continue;
      pinned_blocks += blocks[i].pinned;
      REQUIRE(plan.offsets[i] == blocks[i].recorded);
    }
  }
  REQUIRE(pinned_blocks >= 40);
}

namespace {

// A step epoch as VmmHeaps::end_step_epoch() records it: the step's allocations first
// (activations freed mostly in reverse order, temporaries, now and then one pinned: alive to the end, kept where it was), then
// the base blocks still alive at the end, in address order (side by side, now and then a hole),
// then the base blocks the step freed, in the order it freed them. Every base block starts on
// tick 0. `recorded_valid`: the step's blocks lie above the base, apart (a valid recorded
// layout, high); else all at the base's top, overlapping (no recorded candidate), but the pinned
// ones, which every layout keeps where they were.
std::vector<RecordedBlock> base_and_step(std::mt19937_64& rng, std::size_t steps, std::size_t base,
                                         bool recorded_valid) {
  const auto size = [&] { return std::size_t{512} << (rng() % 10); };
  std::vector<RecordedBlock> kept;
  std::vector<RecordedBlock> freed;
  std::size_t at = 0;
  for (std::size_t i = 0; i < base; ++i) {
    if (rng() % 8 == 0) at += size();  // a hole
    RecordedBlock b{size(), 0, 0, at, true};
    at += b.size;
    (rng() % 6 == 0 ? freed : kept).push_back(b);
  }
  std::vector<RecordedBlock> blocks;
  std::vector<std::size_t> saved;
  std::uint64_t clock = 1;
  std::size_t top = at;
  while (blocks.size() < steps) {
    const std::size_t kind = rng() % 5;
    if (kind == 0 && !saved.empty()) {  // not always the latest: the online layout is not the lowest
      const std::size_t k = rng() % std::min<std::size_t>(saved.size(), 3);
      blocks[saved[saved.size() - 1 - k]].end = clock++;
      saved.erase(saved.end() - 1 - static_cast<std::ptrdiff_t>(k));
      continue;
    }
    RecordedBlock b{size(), clock++, 0, at};
    b.pinned = kind == 4 && rng() % 4 == 0;
    if (recorded_valid || b.pinned) b.recorded = top;  // pinned blocks never overlap: they stay
    top += b.size;
    if (kind == 1 || kind == 2) saved.push_back(blocks.size());
    if (kind == 3 || (kind == 4 && !b.pinned)) b.end = clock++;
    blocks.push_back(b);
  }
  for (const std::size_t s : saved) blocks[s].end = clock++;
  const std::uint64_t end = clock + freed.size() + 1;
  for (RecordedBlock& b : blocks)
    if (b.end == 0) b.end = end;  // pinned: alive past the end
  for (RecordedBlock& b : kept) b.end = end;
  for (RecordedBlock& b : freed) b.end = 1 + rng() % (end - 1);
  std::sort(freed.begin(), freed.end(), [](const RecordedBlock& a, const RecordedBlock& b) { return a.end < b.end; });
  blocks.insert(blocks.end(), kept.begin(), kept.end());
  blocks.insert(blocks.end(), freed.begin(), freed.end());
  return blocks;
}

}  // namespace

TEST_CASE("layout plan: a run of fixed blocks planned as one block gives the layout planned block by block",
          "[plan][step]") {
  using detail::FixedRuns;
  std::mt19937_64 rng(4242);
  int runs = 0;
  int packed = 0;
  int replacing = 0;
  int cut_short = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<RecordedBlock> blocks;
    if (round % 8 == 7) {
      // A loop that keeps its logits, on a base of weights side by side (one run or a few).
      blocks = loop_keeping_logits(std::size_t{512} << (4 + rng() % 8));
      std::uint64_t end = 0;
      for (const RecordedBlock& b : blocks) end = std::max(end, b.end + 1);
      std::size_t at = 0;
      for (std::size_t i = 0, weights = 1 + rng() % 300; i < weights; ++i) {
        if (rng() % 50 == 0) at += 512;  // a hole: another run begins
        blocks.push_back(RecordedBlock{std::size_t{512} << (rng() % 10), 0, end, at, true});
        at += blocks.back().size;
      }
    } else if (round % 2 == 0) {
      blocks = base_and_step(rng, 1 + rng() % 120, rng() % 400, round % 4 == 0);
    } else {
      // step_epoch()'s blocks in the record's order: the step's, then the fixed ones by address.
      blocks = step_epoch(rng, 1 + rng() % 600);
      std::stable_partition(blocks.begin(), blocks.end(), [](const RecordedBlock& b) { return !b.fixed; });
    }
    // Where the whole packing is kept, now and then a bound that may cut it short: somewhere in
    // what its passes look at block by block (each placed block, fixed ones included), which the
    // bound must count for the blocks a run stands for.
    const std::size_t n = blocks.size();
    std::size_t bound = detail::kMaxPackSteps;
    const bool packs = packing(detail::plan_layout(blocks).source);
    if (packs && round % 3 != 0) {
      const auto stays = static_cast<std::size_t>(
          std::count_if(blocks.begin(), blocks.end(), [](const RecordedBlock& b) { return b.stays_where_recorded(); }));
      const std::size_t m = n - stays;
      bound = rng() % (m * stays + m * (m - 1) / 2 + 1);
    }
    INFO("round " << round << ": " << n << " blocks, bound " << bound);
    const PlannedLayout apart = detail::plan_layout(blocks, bound, FixedRuns::as_blocks);
    const PlannedLayout merged = detail::plan_layout(blocks, bound, FixedRuns::as_one_block);
    REQUIRE(merged.offsets == apart.offsets);
    REQUIRE(merged.below == apart.below);
    REQUIRE(merged.height == apart.height);
    REQUIRE(merged.source == apart.source);
    for (std::size_t i = 1; i < n; ++i)
      runs += blocks[i].fixed && blocks[i - 1].fixed && blocks[i].end == blocks[i - 1].end &&
              blocks[i].recorded == blocks[i - 1].recorded + blocks[i - 1].size;
    packed += packs;
    replacing += merged.source == detail::LayoutSource::replacing;
    cut_short += packs && !packing(merged.source);
  }
  // The rounds merge runs, and reach the packing, and the packing's bound.
  INFO(runs << " blocks continue a run; " << packed << " rounds pack (" << replacing << " with blocks where the block "
            "they replace was), " << cut_short << " of them cut short");
  REQUIRE(runs > 10000);
  REQUIRE(packed >= 30);
  REQUIRE(replacing >= 5);
  REQUIRE(cut_short >= 10);
}

namespace {

// The record of a step whose optimizer makes its states anew (RecordedBlock::kept), in MiB: the
// weights W (0-64) and W2 (128-160) stay; the old state F (at `old_state`, 64 or 96) is freed at
// tick 3, and the other 32 MiB between W and W2 is free all step; a gradient G (32, ticks 1-6)
// lives across the new state K (32, made at tick 4, kept). G and K recorded at `g_at` and `k_at`.
std::vector<RecordedBlock> state_step(std::size_t old_state, std::size_t g_at, std::size_t k_at) {
  RecordedBlock g{32 * MiB, 1, 6, g_at};
  RecordedBlock k{32 * MiB, 4, 7, k_at};
  k.kept = true;
  return {g, k, RecordedBlock{64 * MiB, 0, 7, 0, true}, RecordedBlock{32 * MiB, 0, 3, old_state, true},
          RecordedBlock{32 * MiB, 0, 7, 128 * MiB, true}};
}

// Where plan_layout() puts state_step()'s G and K, and how high it reaches (the layout checked).
struct StatePlaces {
  std::size_t g = 0;
  std::size_t k = 0;
  std::size_t height = 0;
  bool operator==(const StatePlaces&) const = default;
};

StatePlaces plan_state_step(std::size_t old_state, std::size_t g_at, std::size_t k_at) {
  const std::vector<RecordedBlock> blocks = state_step(old_state, g_at, k_at);
  const PlannedLayout plan = detail::plan_layout(blocks);
  require_apart(blocks, plan);
  REQUIRE(plan.source != detail::LayoutSource::online);
  return {plan.offsets[0], plan.offsets[1], plan.height};
}

}  // namespace

TEST_CASE("layout plan: kept blocks go first, each as low as it goes, unless that layout reaches above the record "
          "and twice as far above the live peak as the other",
          "[plan][step]") {
  REQUIRE(detail::peak_live_bytes(state_step(96 * MiB, 64 * MiB, 96 * MiB)) == 160 * MiB);
  // The old state above the hole (F at 96, the hole at 64): K goes first, at the lowest place
  // clear of the base alive with it (the hole: F is gone by tick 4), and G, alive with K and with
  // F, finds no room below the top: 192 MiB high. As recorded (G in the hole, K at F's place) the
  // step reached 160, the live peak, and so does the layout with K placed as any block (G takes
  // the hole, K F's place once F is gone): that one is kept.
  REQUIRE(plan_state_step(96 * MiB, 64 * MiB, 96 * MiB) == StatePlaces{64 * MiB, 96 * MiB, 160 * MiB});
  // Recorded higher (the step reached 224 MiB), the kept block goes first: the plan reaches no
  // higher than the step did, and K lies as low as it goes.
  REQUIRE(plan_state_step(96 * MiB, 160 * MiB, 192 * MiB) == StatePlaces{160 * MiB, 64 * MiB, 192 * MiB});
  // With the old state below the hole, K takes F's place first and G the hole: the live peak.
  REQUIRE(plan_state_step(64 * MiB, 160 * MiB, 192 * MiB) == StatePlaces{96 * MiB, 64 * MiB, 160 * MiB});
  // Packing cut short at once: with the kept block first there is no candidate (no online one),
  // and the layout is the one with K placed as any block, online (the recorded one overlaps).
  const std::vector<RecordedBlock> overlapping = state_step(96 * MiB, 64 * MiB, 64 * MiB);
  const PlannedLayout bounded = detail::plan_layout(overlapping, 0);
  require_apart(overlapping, bounded);
  REQUIRE(bounded.source == detail::LayoutSource::online);
}
