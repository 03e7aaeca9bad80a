// mixed_fill.hpp: the fill the allocate + free pair benchmarks start from (bench_allocator.cpp,
// bench_vs_cub.cpp), so every side of a comparison holds the same blocks: `live` blocks of
// 512 B .. 64 KiB, and every third one freed again, leaving thousands of free fragments.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "tensorpool/types.hpp"

namespace tensorpool::bench {

/// The blocks still held, in allocation order.
template <class Allocate, class Deallocate>
std::vector<void*> fill_mixed(std::size_t live, Allocate&& allocate, Deallocate&& deallocate) {
  std::vector<void*> held;
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i < live + live / 2; ++i) {
    held.push_back(allocate(512 + rng() % (64 * KiB)));
    if (i % 3 == 2) {
      deallocate(held[held.size() - 2]);
      held.erase(held.end() - 2);
    }
  }
  return held;
}

}  // namespace tensorpool::bench
