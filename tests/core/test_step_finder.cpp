// The step finder (src/core/step_finder.hpp): the boundaries of a program's steps from its
// requests alone. A model of a training step (layers whose sizes repeat, an optimizer that updates
// layer after layer with the bytes in use back at the same count each time) is found, once per
// step, at the same place, at its low point; a loop too short to be a step and steps that never
// repeat are not.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/step_finder.hpp"
#include "tensorpool/types.hpp"

using namespace tensorpool;
using tensorpool::detail::StepFinder;

namespace {

struct Request {
  std::uint64_t size;
  std::uint64_t in_use;  // bytes allocated after it
  std::uint64_t live;    // blocks allocated after it
};

constexpr int kParams = 12;         // weights per layer
constexpr int kOptimizerTemps = 6;  // temporaries per weight in the optimizer's update

// What a training step's allocator holds between steps: per weight, the weight and two optimizer
// states.
struct Held {
  std::uint64_t in_use = 0;
  std::uint64_t live = 0;
  explicit Held(int layers) : in_use(3 * GiB), live(3ull * kParams * static_cast<std::uint64_t>(layers)) {}
};

// One training step of a model of `layers` identical layers, as its allocator sees it: the
// forward pass keeps two activations per layer and frees a temporary, the loss, the backward pass
// makes each layer's gradients and frees its activations, the optimizer updates weight after
// weight through temporaries (a loop over the layers, the bytes in use back at the same count after
// each), and zero_grad() frees the gradients.
std::vector<Request> training_step(Held& held, int layers, std::uint64_t hidden = MiB) {
  std::vector<Request> out;
  const auto alloc = [&](std::uint64_t size) {
    held.in_use += size;
    ++held.live;
    out.push_back({size, held.in_use, held.live});
  };
  const auto free = [&](std::uint64_t size, std::uint64_t blocks = 1) {
    held.in_use -= size;
    held.live -= blocks;
  };
  const auto weight = [&](int p) { return static_cast<std::uint64_t>(p + 1) * hidden / 4; };
  for (int l = 0; l < layers; ++l) {
    alloc(4 * hidden);  // kept for the backward pass
    alloc(hidden);
    alloc(8 * hidden);  // temporary
    free(8 * hidden);
  }
  alloc(16);  // the loss
  free(16);
  std::uint64_t grads = 0;
  for (int l = layers - 1; l >= 0; --l) {
    for (int p = 0; p < kParams; ++p) {
      alloc(weight(p));
      grads += weight(p);
    }
    free(5 * hidden, 2);  // the layer's activations
  }
  for (int l = 0; l < layers; ++l)
    for (int p = 0; p < kParams; ++p)
      for (int t = 0; t < kOptimizerTemps; ++t) {
        alloc(weight(p));
        free(weight(p));
      }
  free(grads, static_cast<std::uint64_t>(kParams) * static_cast<std::uint64_t>(layers));  // zero_grad()
  return out;
}

// Feeds `steps` steps to a finder; the indexes (from the trace's start) where it says a boundary
// belongs.
std::vector<std::size_t> boundaries(StepFinder& finder, const std::vector<std::vector<Request>>& steps) {
  std::vector<std::size_t> at;
  std::size_t i = 0;
  for (const auto& step : steps)
    for (const Request& r : step) {
      if (finder.on_alloc(r.size, r.in_use, r.live)) at.push_back(i);
      ++i;
    }
  return at;
}

}  // namespace

TEST_CASE("step finder: a training step's boundary is found once per step, at the same place, at its low point",
          "[step][finder]") {
  for (int layers : {8, 12, 24, 48}) {
    INFO(layers << " layers");
    Held held(layers);
    std::vector<std::vector<Request>> steps;
    for (int s = 0; s < 12; ++s) steps.push_back(training_step(held, layers));
    const std::size_t period = steps[0].size();
    REQUIRE(period == static_cast<std::size_t>(layers) * (3 + kParams + kParams * kOptimizerTemps) + 1);
    StepFinder finder;
    const std::vector<std::size_t> at = boundaries(finder, steps);
    REQUIRE(finder.period() == period);
    // From the fourth step on (the third is the first whole period that repeats the one before),
    // exactly one boundary per step, each a period after the last.
    REQUIRE(at.size() >= 8);
    REQUIRE(at.front() < 4 * period);
    for (std::size_t k = 1; k < at.size(); ++k) REQUIRE(at[k] - at[k - 1] == period);
    REQUIRE(at.back() >= 11 * period);
    // At the low point: the allocation after the boundary is the first of the step's with the
    // least bytes in use before it (here the step's first: only the weights and optimizer states
    // are allocated there).
    const std::vector<Request>& step = steps[at.back() / period];
    const std::size_t after = (at.back() + 1) % period;
    const auto before = [](const Request& r) { return r.in_use - r.size; };
    for (std::size_t i = 0; i < period; ++i) REQUIRE(before(step[after]) <= before(step[i]));
    REQUIRE(after == 0);
  }
}

TEST_CASE("step finder: a loop too short to be a step is never one, and is sampled less and less",
          "[step][finder]") {
  for (const std::uint64_t size : std::vector<std::uint64_t>{512, 4 * KiB, MiB, 64 * MiB, 100 * MiB}) {
    INFO(size << " bytes");
    StepFinder finder;
    std::size_t found = 0;
    for (int i = 0; i < 1000000; ++i) found += finder.on_alloc(size, 2 * GiB + size, 1);  // allocate + free
    REQUIRE(found == 0);
    REQUIRE(finder.period() == 0);
    REQUIRE(finder.samples() < 1000);
  }
  // A short loop of a few sizes (a pair of two blocks, a layer's three requests) neither.
  StepFinder finder;
  std::size_t found = 0;
  for (int i = 0; i < 300000; ++i) {
    const std::uint64_t size = (i % 3 + 1) * MiB;
    found += finder.on_alloc(size, GiB + size * (i % 3 == 2 ? 2 : 1), 2);
  }
  REQUIRE(found == 0);
  REQUIRE(finder.period() == 0);
}

TEST_CASE("step finder: steps that never repeat have no boundary, and once they do it is found", "[step][finder]") {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> layers(10, 40);
  Held held(40);  // a model of 40 layers whose steps run some of them
  std::vector<std::vector<Request>> steps;
  for (int s = 0; s < 20; ++s) steps.push_back(training_step(held, layers(rng)));  // a new length each step
  StepFinder finder;
  REQUIRE(boundaries(finder, steps).empty());
  REQUIRE(finder.period() == 0);
  // The same finder, once the program settles on one step: found.
  std::vector<std::vector<Request>> settled;
  for (int s = 0; s < 8; ++s) settled.push_back(training_step(held, 30));
  REQUIRE_FALSE(boundaries(finder, settled).empty());
  REQUIRE(finder.period() == settled[0].size());
  // A step of another length begins as the old one did (its boundary is found there), and drops
  // the period where it departs.
  std::vector<std::vector<Request>> changed = {training_step(held, 20)};
  REQUIRE(boundaries(finder, changed).size() <= 1);
  REQUIRE(finder.period() == 0);
}
