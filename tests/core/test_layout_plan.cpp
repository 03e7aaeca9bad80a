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
using tensorpool::detail::LayoutPlan;
using tensorpool::detail::PlanBlock;

namespace {

bool alive_together(const PlanBlock& a, const PlanBlock& b) { return a.start < b.end && b.start < a.end; }

// Checks every pair by brute force, and the `below` links.
void require_valid(const std::vector<PlanBlock>& blocks, const LayoutPlan& plan) {
  REQUIRE(plan.offsets.size() == blocks.size());
  REQUIRE(plan.below.size() == blocks.size());
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
    const std::uint32_t below = plan.below[i];
    if (below == LayoutPlan::kNone) {
      // Nothing alive at its allocation lies below it.
      for (std::size_t j = 0; j < blocks.size(); ++j)
        if (j != i && blocks[j].start < blocks[i].start && blocks[j].end > blocks[i].start)
          REQUIRE(plan.offsets[j] > plan.offsets[i]);
    } else {
      const PlanBlock& b = blocks[below];
      REQUIRE(b.start < blocks[i].start);
      REQUIRE(b.end > blocks[i].start);
      REQUIRE(plan.offsets[below] + b.size <= plan.offsets[i]);
    }
  }
  REQUIRE(plan.height == height);
}

// A random epoch on one clock: allocations and frees interleaved, every block freed by the end.
std::vector<PlanBlock> random_epoch(std::mt19937_64& rng, std::size_t n) {
  std::vector<PlanBlock> blocks;
  std::vector<std::size_t> alive;
  std::uniform_int_distribution<int> coin(0, 2);
  std::uniform_int_distribution<std::size_t> sizes(1, 64);
  std::uint64_t clock = 0;
  std::size_t offset = 0;  // a bump "recorded" layout: valid, and high
  while (blocks.size() < n || !alive.empty()) {
    if (blocks.size() < n && (alive.empty() || coin(rng) != 0)) {
      const std::size_t size = sizes(rng) * 512;
      blocks.push_back(PlanBlock{size, clock++, 0, offset});
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
  const std::vector<PlanBlock> blocks = {{40 * MiB, 0, 2, 0}, {40 * MiB, 1, 4, 40 * MiB}, {60 * MiB, 3, 5, 80 * MiB}};
  const LayoutPlan plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE_FALSE(plan.recorded);
  REQUIRE(plan.offsets == std::vector<std::size_t>{0, 60 * MiB, 0});
  REQUIRE(plan.height == 100 * MiB);
  REQUIRE(detail::peak_live_bytes(blocks) == 100 * MiB);
  // When b is allocated, a (0 to 40) is alive below its place (60); nothing is below a or c.
  REQUIRE(plan.below == std::vector<std::uint32_t>{LayoutPlan::kNone, 0, LayoutPlan::kNone});
}

TEST_CASE("layout plan: a recorded layout as low as the packed one is kept", "[plan]") {
  const std::vector<PlanBlock> blocks = {{8 * MiB, 0, 3, 0}, {4 * MiB, 1, 2, 8 * MiB}, {4 * MiB, 4, 5, 0}};
  const LayoutPlan plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE(plan.recorded);
  REQUIRE(plan.offsets == std::vector<std::size_t>{0, 8 * MiB, 0});
  REQUIRE(plan.below[1] == 0);  // the 8 MiB block ends where the 4 MiB one starts
}

TEST_CASE("layout plan: a recorded layout that overlaps itself is not used", "[plan]") {
  // Two blocks alive together recorded at the same offset: not a layout; the packed one is.
  const std::vector<PlanBlock> blocks = {{4 * MiB, 0, 3, 0}, {4 * MiB, 1, 2, 0}};
  const LayoutPlan plan = detail::plan_layout(blocks);
  require_valid(blocks, plan);
  REQUIRE_FALSE(plan.recorded);
  REQUIRE(plan.height == 8 * MiB);
}

TEST_CASE("layout plan: random epochs get valid layouts between the live peak and the recorded height",
          "[plan]") {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 200; ++round) {
    const std::size_t n = 1 + static_cast<std::size_t>(round % 60);
    const std::vector<PlanBlock> blocks = random_epoch(rng, n);
    const LayoutPlan plan = detail::plan_layout(blocks);
    INFO("round " << round << ", " << n << " blocks");
    require_valid(blocks, plan);
    std::size_t recorded = 0;
    for (const PlanBlock& b : blocks) recorded = std::max(recorded, b.recorded + b.size);
    REQUIRE(plan.height >= detail::peak_live_bytes(blocks));
    REQUIRE(plan.height <= recorded);
  }
}

TEST_CASE("layout plan: blocks without a lifetime or a size are refused", "[plan]") {
  REQUIRE_THROWS_AS(detail::plan_layout(std::vector<PlanBlock>{{0, 0, 1, 0}}), std::invalid_argument);
  REQUIRE_THROWS_AS(detail::plan_layout(std::vector<PlanBlock>{{512, 3, 3, 0}}), std::invalid_argument);
  REQUIRE(detail::plan_layout(std::vector<PlanBlock>{}).height == 0);
}
