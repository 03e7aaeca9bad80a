// random_workload.hpp: the random workload both model test files drive their targets with:
// mostly small, some medium, a few huge requests on three streams, record_stream, frees, stream
// syncs (and, if asked, empty_cache), checking the target's books after every step.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/replay/target.hpp"

namespace tensorpool::replay::testing {

struct LiveBlock {
  void* p;
  std::size_t bytes;
};

struct WorkloadResult {
  std::vector<LiveBlock> live;  // still allocated at the end
  std::size_t ooms = 0;
};

/// 20000 seeded steps on `t`; `extra_check(t)` runs after the common checks of every step.
template <class ExtraCheck>
WorkloadResult run_random_workload(ReplayTarget& t, std::size_t capacity, bool with_empty_cache,
                                   ExtraCheck&& extra_check) {
  std::uint64_t state = 0x9e3779b97f4a7c15ULL;
  const auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  WorkloadResult w;
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t r = next();
    const Stream stream = r % 3;
    if (r % 100 < 50 || w.live.empty()) {
      // Mostly small, some medium, a few huge requests (the huge ones can run out of memory).
      const std::uint64_t kind = (r >> 8) % 100;
      const std::size_t bytes = kind < 60   ? (r >> 16) % (1 * MiB) + 1
                                : kind < 97 ? (r >> 16) % (24 * MiB) + 1
                                            : (r >> 16) % (400 * MiB) + 1;
      try {
        w.live.push_back({t.allocate(bytes, stream), bytes});
        if ((r >> 40) % 10 == 0) t.record_stream(w.live.back().p, (stream + 1) % 3);
      } catch (const OutOfMemoryError& e) {
        ++w.ooms;
        REQUIRE(e.info().requested == bytes);
      }
    } else if (r % 100 < 97) {
      const std::size_t k = (r >> 8) % w.live.size();
      t.deallocate(w.live[k].p, w.live[k].bytes, 0);
      w.live[k] = w.live.back();
      w.live.pop_back();
    } else if (!with_empty_cache || r % 1000 < 975) {
      t.stream_synchronized(stream);
    } else {
      t.empty_cache();
    }
    REQUIRE(t.allocated() <= t.reserved());
    REQUIRE(t.reserved() <= capacity);
    REQUIRE(t.upstream().allocs >= t.upstream().frees);
    extra_check(t);
  }
  return w;
}

}  // namespace tensorpool::replay::testing
