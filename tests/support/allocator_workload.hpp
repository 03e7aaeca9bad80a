// tests/support/allocator_workload.hpp: a seeded workload of allocator calls, for the tests that
// record a live allocator and check that the recording replays to the live run's figures
// (tests/record, tests/capi).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensorpool/tensorpool.hpp"

namespace tensorpool::testing {

/// A seeded mix on three streams of `device`: mostly small, some medium, a few huge requests
/// (some of which run out of memory on a device of a few GiB), record_stream, frees in random
/// order and, when `empty_cache_every` > 0, an empty_cache() every that many steps. Frees
/// everything at the end. Returns the OOM count.
inline std::size_t run_workload(Allocator& alloc, SimulatedDevice& device, int steps,
                                std::uint64_t seed = 7, int empty_cache_every = 0) {
  std::uint64_t state = 0x9e3779b97f4a7c15ULL ^ seed;
  const auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const Stream streams[3] = {kDefaultStream, device.create_stream(), device.create_stream()};
  std::vector<void*> live;
  std::size_t ooms = 0;
  for (int i = 0; i < steps; ++i) {
    if (empty_cache_every > 0 && i % empty_cache_every == empty_cache_every - 1) alloc.empty_cache();
    const std::uint64_t r = next();
    if (r % 100 < 55 || live.empty()) {
      const std::uint64_t kind = (r >> 8) % 100;
      const std::size_t bytes = kind < 70   ? (r >> 16) % MiB + 1
                                : kind < 98 ? (r >> 16) % (30 * MiB) + 1
                                            : (r >> 16) % (900 * MiB) + 1;
      try {
        live.push_back(alloc.allocate(bytes, streams[r % 3]));
        if ((r >> 40) % 8 == 0) alloc.record_stream(live.back(), streams[(r + 1) % 3]);
      } catch (const OutOfMemoryError&) {
        ++ooms;
      }
    } else {
      const std::size_t k = (r >> 8) % live.size();
      alloc.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (void* p : live) alloc.deallocate(p);
  return ooms;
}

}  // namespace tensorpool::testing
