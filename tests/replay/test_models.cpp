// Tests of the models of foreign allocators ("pytorch": PyTorch's native CUDA caching allocator,
// "cub": CUB's CachingDeviceAllocator): one test per rule, through the ReplayTarget interface,
// and the validation of the pytorch model against the real PyTorch snapshots in shared/traces.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/skip.hpp"
#include "random_workload.hpp"
#include "replay/models/models.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/trace/event.hpp"
#include "tensorpool/trace/pytorch_snapshot.hpp"

using namespace tensorpool;
using namespace tensorpool::replay;

namespace {

std::unique_ptr<ReplayTarget> pytorch(const std::string& conf = "", std::size_t capacity = 80 * GiB) {
  TargetOptions o;
  o.conf = conf;
  o.capacity = capacity;
  return make_pytorch_target(o);
}

std::unique_ptr<ReplayTarget> cub(const std::string& conf = "", std::size_t capacity = 80 * GiB) {
  TargetOptions o;
  o.conf = conf;
  o.capacity = capacity;
  return make_cub_target(o);
}

std::uintptr_t at(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

trace::TraceEvent seed(std::size_t size, bool small, Stream stream = 0) {
  trace::TraceEvent e;
  e.op = trace::Op::seed_segment;
  e.size = size;
  e.stream = stream;
  e.flags = small ? trace::kFlagSmallPool : 0;
  return e;
}

}  // namespace

// ============================================================================================
// pytorch
// ============================================================================================

TEST_CASE("pytorch: requests round up to 512 B, small ones share 2 MiB segments", "[models][pytorch]") {
  auto t = pytorch();
  REQUIRE(t->name() == "pytorch");
  void* a = t->allocate(1, 0);
  REQUIRE(t->allocated() == 512);
  REQUIRE(t->reserved() == 2 * MiB);
  void* b = t->allocate(513, 0);
  REQUIRE(t->allocated() == 512 + 1024);
  REQUIRE(at(b) == at(a) + 512);  // carved from the same small segment, right after a
  void* c = t->allocate(1 * MiB, 0);  // exactly 1 MiB is still small
  REQUIRE(t->reserved() == 2 * MiB);
  REQUIRE(at(c) == at(a) + 1536);
  REQUIRE(t->upstream().allocs == 1);
  for (void* p : {a, b, c}) t->deallocate(p, 0, 0);
  REQUIRE(t->allocated() == 0);
  REQUIRE(t->reserved() == 2 * MiB);  // cached, not returned
}

TEST_CASE("pytorch: large segment sizes: 20 MiB below 10 MiB, else the request rounded to 2 MiB",
          "[models][pytorch]") {
  struct Case {
    std::size_t request, segment;
  };
  for (const Case c : {Case{1 * MiB + 1, 20 * MiB}, Case{5 * MiB, 20 * MiB},
                       Case{10 * MiB - 512, 20 * MiB}, Case{10 * MiB, 10 * MiB},
                       Case{11 * MiB + 1, 12 * MiB}, Case{100 * MiB, 100 * MiB}}) {
    auto t = pytorch();
    t->allocate(c.request, 0);
    INFO("request " << c.request);
    REQUIRE(t->reserved() == c.segment);
    REQUIRE(t->upstream().allocs == 1);
  }
}

TEST_CASE("pytorch: roundup_power2_divisions rounds to equal steps between powers of two",
          "[models][pytorch]") {
  auto t = pytorch("roundup_power2_divisions:4");
  t->allocate(1 * MiB + 1, 0);  // between 1 and 2 MiB the steps are 256 KiB
  REQUIRE(t->allocated() == 1 * MiB + 256 * KiB);
  t->allocate(3 * MiB, 0);  // between 2 and 4 MiB: 512 KiB steps, 3 MiB is one of them
  REQUIRE(t->allocated() == 1 * MiB + 256 * KiB + 3 * MiB);
  t->allocate(4 * MiB, 0);  // a power of two stays
  REQUIRE(t->allocated() == 1 * MiB + 256 * KiB + 7 * MiB);
  t->allocate(1000, 0);  // below 4 * 512 B: plain 512 B rounding
  REQUIRE(t->allocated() == 1 * MiB + 256 * KiB + 7 * MiB + 1024);
}

TEST_CASE("pytorch: best fit is the smallest free block of the same stream", "[models][pytorch]") {
  auto t = pytorch();
  // Three 12, 14 and 16 MiB segments on stream 1, one 13 MiB segment on stream 2; all freed.
  void* s12 = t->allocate(12 * MiB, 1);
  void* s14 = t->allocate(14 * MiB, 1);
  void* s16 = t->allocate(16 * MiB, 1);
  void* s13 = t->allocate(13 * MiB, 2);
  for (void* p : {s12, s14, s16, s13}) t->deallocate(p, 0, 0);
  REQUIRE(t->upstream().allocs == 4);

  // 12.5 MiB on stream 1: the 13 MiB block is stream 2's, so the 14 MiB block is the best fit.
  void* a = t->allocate(12 * MiB + 512 * KiB, 1);
  REQUIRE(at(a) == at(s14));
  // 13 MiB on stream 2 takes its own block, 13 MiB on stream 1 the 16 MiB one.
  REQUIRE(at(t->allocate(13 * MiB, 2)) == at(s13));
  REQUIRE(at(t->allocate(13 * MiB, 1)) == at(s16));
  // 12 MiB on stream 3: nothing of its stream is cached, a new segment.
  REQUIRE(at(t->allocate(12 * MiB, 3)) != at(s12));
  REQUIRE(t->upstream().allocs == 5);
}

TEST_CASE("pytorch: a tag is a private pool of segments its own, per stream, as a torch.cuda.MemPool",
          "[models][pytorch]") {
  for (const char* allocator : {"pytorch", "pytorch-expandable"}) {
    INFO(allocator);
    TargetOptions o;
    o.capacity = 80 * GiB;
    auto t = make_target(allocator, o);
    void* plain = t->allocate(12 * MiB, 1);
    t->deallocate(plain, 0, 0);
    // Cached memory of the stream is not the pool's, and the pool's is no one else's.
    void* pooled = t->allocate_tagged(12 * MiB, 1, "kv_cache");
    CHECK(at(pooled) != at(plain));
    const std::size_t with_pool = t->reserved();
    CHECK(with_pool >= 24 * MiB);
    t->deallocate(pooled, 0, 0);
    CHECK(at(t->allocate(12 * MiB, 1)) == at(plain));
    CHECK(at(t->allocate_tagged(12 * MiB, 1, "kv_cache")) == at(pooled));
    CHECK(at(t->allocate_tagged(12 * MiB, 2, "kv_cache")) != at(pooled));  // per stream
    CHECK(t->reserved() > with_pool);
    // Exports and maps name the trace's streams, not the model's.
    for (const auto& seg : t->memory_state().state.segments) CHECK((seg.stream == 1 || seg.stream == 2));
  }
}

TEST_CASE("pytorch: among equal free blocks the lowest address wins", "[models][pytorch]") {
  auto t = pytorch();
  void* x = t->allocate(12 * MiB, 0);
  void* y = t->allocate(12 * MiB, 0);
  t->deallocate(y, 0, 0);
  t->deallocate(x, 0, 0);
  REQUIRE(at(t->allocate(12 * MiB, 0)) == std::min(at(x), at(y)));
}

TEST_CASE("pytorch: small-pool blocks split when at least 512 B remain", "[models][pytorch]") {
  auto t = pytorch();
  void* a = t->allocate(1 * MiB, 0);
  void* b = t->allocate(1 * MiB - 512, 0);  // leaves exactly 512 B: split
  REQUIRE(t->allocated() == 2 * MiB - 512);
  void* c = t->allocate(512, 0);
  REQUIRE(at(b) == at(a) + 1 * MiB);
  REQUIRE(at(c) == at(b) + 1 * MiB - 512);
  REQUIRE(t->reserved() == 2 * MiB);
  REQUIRE(t->allocated() == 2 * MiB);
}

TEST_CASE("pytorch: large-pool blocks split only when more than 1 MiB remains", "[models][pytorch]") {
  SECTION("a 1 MiB remainder stays with the allocation") {
    auto t = pytorch();
    void* a = t->allocate(19 * MiB, 0);
    REQUIRE(t->reserved() == 20 * MiB);
    REQUIRE(t->allocated() == 20 * MiB);  // the whole block is handed out and counted
    t->allocate(2 * MiB, 0);              // nothing left in a's segment
    REQUIRE(t->upstream().allocs == 2);
    t->deallocate(a, 0, 0);
    REQUIRE(t->allocated() == 2 * MiB);
  }
  SECTION("a remainder above 1 MiB is split off and reusable") {
    auto t = pytorch();
    void* a = t->allocate(18 * MiB + 512 * KiB, 0);
    REQUIRE(t->allocated() == 18 * MiB + 512 * KiB);
    void* b = t->allocate(1 * MiB + 512 * KiB, 0);  // large pool (> 1 MiB): fits the remainder
    REQUIRE(at(b) == at(a) + 18 * MiB + 512 * KiB);
    REQUIRE(t->upstream().allocs == 1);
  }
  SECTION("without max_split_size, a big cached block is split for a smaller large request") {
    auto t = pytorch();
    void* big = t->allocate(200 * MiB, 0);
    t->deallocate(big, 0, 0);
    REQUIRE(at(t->allocate(90 * MiB, 0)) == at(big));
    REQUIRE(at(t->allocate(110 * MiB, 0)) == at(big) + 90 * MiB);
    REQUIRE(t->upstream().allocs == 1);
  }
}

TEST_CASE("pytorch: small and large requests never share a pool", "[models][pytorch]") {
  auto t = pytorch();
  void* big = t->allocate(20 * MiB, 0);
  t->deallocate(big, 0, 0);
  t->allocate(4 * KiB, 0);  // the cached 20 MiB block is large-pool: a 2 MiB small segment
  REQUIRE(t->reserved() == 22 * MiB);
  void* small = t->allocate(1 * MiB, 0);  // fills the small segment
  t->deallocate(small, 0, 0);
  t->allocate(1 * MiB + 512, 0);  // large: the 20 MiB block, not the free 1 MiB small block
  REQUIRE(t->upstream().allocs == 2);
}

TEST_CASE("pytorch: freed blocks merge with free neighbours of their own segment only",
          "[models][pytorch]") {
  SECTION("inside a segment") {
    auto t = pytorch();
    void* a = t->allocate(6 * MiB, 0);
    void* b = t->allocate(6 * MiB, 0);
    void* c = t->allocate(6 * MiB, 0);  // 2 MiB left at the end of the 20 MiB segment
    REQUIRE(t->upstream().allocs == 1);
    t->deallocate(a, 0, 0);
    t->deallocate(b, 0, 0);  // merges with a: 12 MiB free at a
    REQUIRE(at(t->allocate(12 * MiB, 0)) == at(a));
    t->deallocate(c, 0, 0);  // merges with the 2 MiB tail
    REQUIRE(at(t->allocate(8 * MiB, 0)) == at(c));
    REQUIRE(t->upstream().allocs == 1);
  }
  SECTION("never across segments") {
    auto t = pytorch();
    void* a = t->allocate(12 * MiB, 0);
    void* b = t->allocate(12 * MiB, 0);
    t->deallocate(a, 0, 0);
    t->deallocate(b, 0, 0);  // two free 12 MiB segments, 24 MiB in all
    t->allocate(24 * MiB, 0);
    REQUIRE(t->upstream().allocs == 3);
    REQUIRE(t->reserved() == 48 * MiB);
  }
}

TEST_CASE("pytorch: max_split_size keeps oversize blocks whole and for oversize requests only",
          "[models][pytorch]") {
  auto t = pytorch("max_split_size_mb:64");
  void* big = t->allocate(100 * MiB, 0);
  t->deallocate(big, 0, 0);
  // Below max_split_size: the cached 100 MiB block is off limits.
  void* a = t->allocate(30 * MiB, 0);
  REQUIRE(at(a) != at(big));
  REQUIRE(t->upstream().allocs == 2);
  // 70 MiB: oversize, but 100 MiB >= 70 + 20 MiB wastes too much: a new segment.
  void* b = t->allocate(70 * MiB, 0);
  REQUIRE(at(b) != at(big));
  REQUIRE(t->upstream().allocs == 3);
  // 90 MiB: 100 < 90 + 20: takes the block whole, unsplit.
  REQUIRE(at(t->allocate(90 * MiB, 0)) == at(big));
  REQUIRE(t->allocated() == 30 * MiB + 70 * MiB + 100 * MiB);
  REQUIRE(t->upstream().allocs == 3);
}

TEST_CASE("pytorch: max_split_size must be above 20 MiB, unknown keys are refused",
          "[models][pytorch]") {
  REQUIRE_THROWS_AS(pytorch("max_split_size:20MiB"), ConfigError);
  REQUIRE_NOTHROW(pytorch("max_split_size:21MiB"));
  REQUIRE_NOTHROW(pytorch("max_split_size:none, roundup_power2_divisions:2"));
  REQUIRE_THROWS_AS(pytorch("roundup_power2_divisions:3"), ConfigError);
  REQUIRE_THROWS_AS(pytorch("expandable_segments:true"), ConfigError);
  REQUIRE_THROWS_AS(pytorch("garbage_collection_threshold:0.6"), ConfigError);
  REQUIRE_THROWS_AS(pytorch("max_split_size"), ConfigError);
}

TEST_CASE("pytorch: a full device makes it release cached segments and retry", "[models][pytorch]") {
  auto t = pytorch("", 64 * MiB);
  void* cached = t->allocate(24 * MiB, 0);
  void* live = t->allocate(4 * MiB, 0);  // a 20 MiB segment, 16 MiB of it free
  t->deallocate(cached, 0, 0);
  REQUIRE(t->reserved() == 44 * MiB);
  // 30 MiB: no block fits, 44 + 30 > 64: the whole free 24 MiB segment goes, the retry works.
  void* a = t->allocate(30 * MiB, 0);
  REQUIRE(t->reserved() == 50 * MiB);
  REQUIRE(t->upstream().allocs == 3);
  REQUIRE(t->upstream().frees == 1);
  REQUIRE(t->upstream().syncs == 1);  // the cudaFree waits for the device
  // 60 MiB: 50 + 60 > 64 and nothing is fully free (live pins its segment): out of memory.
  try {
    t->allocate(60 * MiB, 0);
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    REQUIRE(e.info().requested == 60 * MiB);
    REQUIRE(e.info().reserved == 50 * MiB);
    REQUIRE(e.info().allocated == 34 * MiB);
    REQUIRE(e.info().largest_free_block == 16 * MiB);
    REQUIRE(e.info().capacity == 64 * MiB);
  }
  // Still usable.
  t->deallocate(a, 0, 0);
  t->deallocate(live, 0, 0);
  REQUIRE_NOTHROW(t->allocate(60 * MiB, 0));
  REQUIRE(t->reserved() == 60 * MiB);
  REQUIRE_THROWS_AS(t->allocate(~std::size_t{0}, 0), OutOfMemoryError);
}

TEST_CASE("pytorch: with max_split_size, oversize segments are released first", "[models][pytorch]") {
  auto t = pytorch("max_split_size:40MiB", 200 * MiB);
  void* a = t->allocate(50 * MiB, 0);
  void* b = t->allocate(100 * MiB, 0);
  void* c = t->allocate(5 * MiB, 0);  // a 20 MiB segment
  void* live = t->allocate(30 * MiB, 0);
  for (void* p : {a, b, c}) t->deallocate(p, 0, 0);
  REQUIRE(t->reserved() == 200 * MiB);
  SECTION("the smallest one large enough") {
    // 60 MiB: the 100 MiB block wastes too much (>= 60 + 20), and there is no room. It is the
    // smallest cached oversize block >= 60 MiB: only it goes.
    t->allocate(60 * MiB, 0);
    REQUIRE(t->reserved() == 160 * MiB);
    REQUIRE(t->upstream().frees == 1);
    REQUIRE(at(t->allocate(45 * MiB, 0)) == at(a));  // 50 < 45 + 20: the cached 50 MiB block
  }
  SECTION("else the largest ones until enough is freed") {
    // 130 MiB: no single block is large enough. The oversize blocks go, largest first (100 then
    // 50 MiB), enough for the retry: the 20 MiB segment stays cached.
    t->allocate(130 * MiB, 0);
    REQUIRE(t->reserved() == 180 * MiB);
    REQUIRE(t->upstream().frees == 2);
  }
  const auto allocs = t->upstream().allocs;
  t->allocate(5 * MiB, 0);  // from the still-cached 20 MiB segment
  REQUIRE(t->upstream().allocs == allocs);
  t->deallocate(live, 0, 0);
}

TEST_CASE("pytorch: a block used on another stream is reusable once that stream synchronized",
          "[models][pytorch]") {
  auto t = pytorch();
  void* a = t->allocate(12 * MiB, 1);
  t->record_stream(a, 2);
  t->deallocate(a, 0, 0);
  void* b = t->allocate(12 * MiB, 1);  // a is still in use by stream 2
  REQUIRE(at(b) != at(a));
  t->deallocate(b, 0, 0);
  t->stream_synchronized(2);
  REQUIRE(at(t->allocate(12 * MiB, 1)) == at(a));
  REQUIRE(at(t->allocate(12 * MiB, 1)) == at(b));
  REQUIRE(t->upstream().allocs == 2);
}

TEST_CASE("pytorch: empty_cache releases only segments without live blocks", "[models][pytorch]") {
  auto t = pytorch();
  void* a = t->allocate(4 * MiB, 0);
  void* b = t->allocate(24 * MiB, 0);
  t->allocate(4 * KiB, 0);
  t->deallocate(b, 0, 0);
  t->empty_cache();
  REQUIRE(t->reserved() == 22 * MiB);
  REQUIRE(t->upstream().frees == 1);
  t->deallocate(a, 0, 0);
  t->empty_cache();
  REQUIRE(t->reserved() == 2 * MiB);
  REQUIRE_THROWS_AS(t->deallocate(a, 0, 0), UsageError);
}

TEST_CASE("pytorch: seeded segments are adopted as free segments, outside the window's calls",
          "[models][pytorch]") {
  auto t = pytorch();
  t->seed_segment(seed(20 * MiB, false));
  t->seed_segment(seed(2 * MiB, true));
  t->seed_segment(seed(64 * MiB, false, 7));
  REQUIRE(t->reserved() == 86 * MiB);
  REQUIRE(t->allocated() == 0);
  REQUIRE(t->upstream().allocs == 0);
  REQUIRE(t->upstream().modelled_ns == 0);
  // Allocations land in the seeded segments of their pool and stream.
  t->allocate(4 * MiB, 0);
  t->allocate(100 * KiB, 0);
  t->allocate(16 * MiB, 0);  // the 20 MiB segment still has 16 MiB free
  t->allocate(64 * MiB, 7);
  REQUIRE(t->upstream().allocs == 0);
  REQUIRE(t->reserved() == 86 * MiB);
  // Nothing left for these: a new segment each, now counted.
  t->allocate(4 * MiB, 0);
  t->allocate(1 * MiB, 7);
  REQUIRE(t->upstream().allocs == 2);
  REQUIRE(t->reserved() == 86 * MiB + 20 * MiB + 2 * MiB);
}

TEST_CASE("pytorch: seeded segments are released like any other", "[models][pytorch]") {
  auto t = pytorch("", 64 * MiB);
  t->seed_segment(seed(40 * MiB, false));
  t->allocate(50 * MiB, 0);  // the seed is too small and the device too full: it goes
  REQUIRE(t->reserved() == 50 * MiB);
  REQUIRE(t->upstream().frees == 1);
  REQUIRE(t->upstream().allocs == 1);
  REQUIRE_THROWS_AS(t->seed_segment(seed(20 * MiB, false)), OutOfMemoryError);
}

TEST_CASE("pytorch: seed_alloc places live blocks at their recorded offsets",
          "[models][pytorch]") {
  auto t = pytorch();
  trace::TraceEvent large = seed(20 * MiB, false);
  large.addr = 0x10000000;
  trace::TraceEvent small = seed(2 * MiB, true);
  small.addr = 0x20000000;
  t->seed_segment(large);
  t->seed_segment(small);
  const auto live = [](std::uint64_t addr, std::size_t size) {
    trace::TraceEvent e;
    e.op = trace::Op::seed_alloc;
    e.addr = addr;
    e.size = size;
    return e;
  };
  // A 4 MiB free gap before a; 512 KiB between a and b, which no large-pool block can be: a's
  // unsplit tail.
  void* a = t->seed_alloc(live(large.addr + 4 * MiB, 2 * MiB));
  void* b = t->seed_alloc(live(large.addr + 6 * MiB + 512 * KiB, 3 * MiB));
  REQUIRE(at(b) == at(a) + 2 * MiB + 512 * KiB);
  REQUIRE(t->allocated() == 2 * MiB + 512 * KiB + 3 * MiB);
  // Small pool: every gap stays a free block.
  void* c = t->seed_alloc(live(small.addr + 4 * KiB, 1000));
  REQUIRE(t->allocated() == 5 * MiB + 512 * KiB + 1024);
  // The gaps serve later requests, as they did in PyTorch.
  REQUIRE(at(t->allocate(4 * MiB, 0)) == at(a) - 4 * MiB);
  REQUIRE(at(t->allocate(4 * KiB, 0)) == at(c) - 4 * KiB);
  REQUIRE(t->upstream().allocs == 0);
  // A seed in no seeded segment, or on another target: a plain allocate().
  REQUIRE(t->seed_alloc(live(0x50000000, 12 * MiB)) != nullptr);
  REQUIRE(t->upstream().allocs == 1);
  auto other = cub();
  REQUIRE(other->seed_alloc(live(0x10, 100)) != nullptr);
  REQUIRE(other->allocated() == 512);
}

// ============================================================================================
// cub
// ============================================================================================

TEST_CASE("cub: requests round up to the bins 512 B, 4 KiB, 32 KiB, 256 KiB, 2 MiB", "[models][cub]") {
  struct Case {
    std::size_t request, bin;
  };
  for (const Case c : {Case{0, 512}, Case{1, 512}, Case{512, 512}, Case{513, 4 * KiB},
                       Case{4 * KiB + 1, 32 * KiB}, Case{32 * KiB + 1, 256 * KiB},
                       Case{256 * KiB + 1, 2 * MiB}, Case{2 * MiB, 2 * MiB}}) {
    auto t = cub();
    REQUIRE(t->name() == "cub");
    t->allocate(c.request, 0);
    INFO("request " << c.request);
    REQUIRE(t->allocated() == c.bin);
    REQUIRE(t->reserved() == c.bin);
  }
}

TEST_CASE("cub: requests above the largest bin are exact and never cached", "[models][cub]") {
  auto t = cub();
  void* a = t->allocate(2 * MiB + 1, 0);
  REQUIRE(t->allocated() == 2 * MiB + 1);
  REQUIRE(t->reserved() == 4 * MiB);  // cudaMalloc from 2 MiB up takes whole 2 MiB pages, as raw's does
  t->deallocate(a, 0, 0);
  REQUIRE(t->reserved() == 0);
  REQUIRE(t->upstream().frees == 1);
  t->allocate(2 * MiB + 1, 0);
  REQUIRE(t->upstream().allocs == 2);
}

TEST_CASE("cub: a cached block serves its own bin only", "[models][cub]") {
  auto t = cub();
  void* a = t->allocate(4 * KiB, 0);
  t->deallocate(a, 0, 0);
  void* b = t->allocate(512, 0);  // a smaller bin: the 4 KiB block is not used
  REQUIRE(at(b) != at(a));
  REQUIRE(t->upstream().allocs == 2);
  REQUIRE(at(t->allocate(3000, 0)) == at(a));  // same bin: reused
  REQUIRE(t->upstream().allocs == 2);
  REQUIRE(t->reserved() == 4 * KiB + 512);
}

TEST_CASE("cub: reuse is per stream until the freeing stream's work completed", "[models][cub]") {
  auto t = cub();
  void* a = t->allocate(32 * KiB, 1);
  t->deallocate(a, 0, 0);
  void* b = t->allocate(32 * KiB, 2);  // a's free on stream 1 may still be in flight
  REQUIRE(at(b) != at(a));
  t->deallocate(b, 0, 0);
  t->stream_synchronized(1);  // completes a's ready event; b's (stream 2) is pending
  REQUIRE(at(t->allocate(32 * KiB, 3)) == at(a));
  void* c = t->allocate(32 * KiB, 3);  // b is not ready for stream 3
  REQUIRE(at(c) != at(b));
  REQUIRE(at(t->allocate(32 * KiB, 2)) == at(b));  // but is for its own stream
  REQUIRE(t->upstream().allocs == 3);
}

TEST_CASE("cub: the oldest usable cached block of a bin is reused first", "[models][cub]") {
  auto t = cub();
  void* a = t->allocate(256 * KiB, 0);
  void* b = t->allocate(256 * KiB, 0);
  t->deallocate(b, 0, 0);
  t->deallocate(a, 0, 0);
  REQUIRE(at(t->allocate(256 * KiB, 0)) == at(b));
  REQUIRE(at(t->allocate(256 * KiB, 0)) == at(a));
}

TEST_CASE("cub: frees beyond max_cached_bytes go back to the device", "[models][cub]") {
  SECTION("default: 6 MiB - 1 B") {
    auto t = cub();
    void* a = t->allocate(2 * MiB, 0);
    void* b = t->allocate(2 * MiB, 0);
    void* c = t->allocate(2 * MiB, 0);
    for (void* p : {a, b, c}) t->deallocate(p, 0, 0);
    REQUIRE(t->reserved() == 4 * MiB);  // the third would make 6 MiB > 6 MiB - 1
    REQUIRE(t->upstream().frees == 1);
  }
  SECTION("configured") {
    auto t = cub("max_cached_bytes:4KiB");
    void* a = t->allocate(4 * KiB, 0);
    void* b = t->allocate(512, 0);
    t->deallocate(a, 0, 0);
    t->deallocate(b, 0, 0);
    REQUIRE(t->reserved() == 4 * KiB);
  }
  SECTION("unlimited") {
    auto t = cub("max_cached_bytes:none");
    std::vector<void*> ps;
    for (int i = 0; i < 8; ++i) ps.push_back(t->allocate(2 * MiB, 0));
    for (void* p : ps) t->deallocate(p, 0, 0);
    REQUIRE(t->reserved() == 16 * MiB);
    REQUIRE(t->upstream().frees == 0);
  }
}

TEST_CASE("cub: a failed cudaMalloc frees the whole cache and retries once", "[models][cub]") {
  auto t = cub("max_cached_bytes:none", 8 * MiB);
  void* a = t->allocate(2 * MiB, 1);
  void* b = t->allocate(256 * KiB, 2);
  void* live = t->allocate(2 * MiB, 0);
  t->deallocate(a, 0, 0);
  t->deallocate(b, 0, 0);
  // 5 MiB (exact; 6 MiB of whole pages on the device): 4.25 MiB held, 3.75 MiB free: the cache
  // goes (both bins, both streams).
  void* c = t->allocate(5 * MiB, 0);
  REQUIRE(t->upstream().frees == 2);
  REQUIRE(t->reserved() == 8 * MiB);
  try {
    t->allocate(2 * MiB, 0);
    FAIL("expected OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    REQUIRE(e.info().requested == 2 * MiB);
    REQUIRE(e.info().reserved == 8 * MiB);
    REQUIRE(e.info().capacity == 8 * MiB);
  }
  t->deallocate(c, 0, 0);
  t->deallocate(live, 0, 0);
  t->empty_cache();
  REQUIRE(t->reserved() == 0);
  REQUIRE_THROWS_AS(t->deallocate(c, 0, 0), UsageError);
  REQUIRE_THROWS_AS(t->allocate(~std::size_t{0}, 0), OutOfMemoryError);
}

TEST_CASE("cub: bins are configurable, bad settings are refused", "[models][cub]") {
  auto t = cub("bin_growth:2, min_bin:10, max_bin:20");
  t->allocate(1, 0);
  REQUIRE(t->allocated() == 1024);
  t->allocate(1025, 0);
  REQUIRE(t->allocated() == 1024 + 2048);
  t->allocate(1 * MiB + 1, 0);  // above 2^20: exact
  REQUIRE(t->allocated() == 1024 + 2048 + 1 * MiB + 1);
  REQUIRE_THROWS_AS(cub("bin_growth:1"), ConfigError);
  REQUIRE_THROWS_AS(cub("min_bin:8, max_bin:7"), ConfigError);
  REQUIRE_THROWS_AS(cub("bin_growth:1024, max_bin:7"), ConfigError);
  REQUIRE_THROWS_AS(cub("max_cached:1"), ConfigError);
  REQUIRE_THROWS_AS(cub("bin_growth:-8"), ConfigError);
}

// ============================================================================================
// Both: books stay balanced under a random workload
// ============================================================================================

TEST_CASE("models: a random workload keeps reserved, allocated and upstream calls consistent",
          "[models][pytorch][cub]") {
  struct Variant {
    const char* name;
    const char* conf;
  };
  for (const Variant v : {Variant{"pytorch", ""}, Variant{"pytorch", "max_split_size:48MiB"},
                          Variant{"pytorch", "roundup_power2_divisions:4"}, Variant{"cub", ""},
                          Variant{"cub", "max_cached_bytes:none"}}) {
    INFO(v.name << " '" << v.conf << "'");
    const std::size_t capacity = 1 * GiB;
    auto t = std::string(v.name) == "pytorch" ? pytorch(v.conf, capacity) : cub(v.conf, capacity);
    const testing::WorkloadResult w =
        testing::run_random_workload(*t, capacity, /*with_empty_cache=*/false, [](const ReplayTarget&) {});
    const std::size_t ooms = w.ooms;
    WARN(v.name << " '" << v.conf << "': " << ooms << " OOMs, " << t->upstream().allocs
                << " segment allocs");
    for (const auto& l : w.live) t->deallocate(l.p, l.bytes, 0);
    REQUIRE(t->allocated() == 0);
    for (Stream s = 0; s < 3; ++s) t->stream_synchronized(s);
    t->empty_cache();
    REQUIRE(t->reserved() == 0);
    REQUIRE(t->upstream().allocs == t->upstream().frees);
  }
}

// ============================================================================================
// Validation of the pytorch model against real PyTorch snapshots
// ============================================================================================

namespace {

// One device's window replayed on the pytorch model next to what PyTorch actually did.
struct WindowResult {
  std::string trace;
  unsigned device = 0;
  std::size_t events = 0;            // window events (seeds excluded)
  bool expandable = false;           // PyTorch ran with expandable segments
  std::size_t actual_start = 0;      // reserved at window start (the seed segments)
  std::size_t actual_peak = 0;       // from the seeds and the segment_* events
  std::uint64_t actual_segments = 0; // segment_alloc (or segment_map) events
  std::size_t model_peak = 0;
  std::uint64_t model_segments = 0;  // the model's upstream allocs during the window
  std::uint64_t seed_spill = 0;      // segments the model needed to place the seed_allocs
  std::size_t model_ooms = 0;
  std::size_t actual_ooms = 0;       // oom events: PyTorch itself failed a request
  std::size_t diverging_events = 0;  // events after which model and PyTorch reserved differ
  std::size_t unmatched_frees = 0;   // frees of addresses never allocated (should be 0)

  bool has_window() const { return events > 0; }
  double rel_diff() const {
    return actual_peak == 0 ? 0.0
                            : (static_cast<double>(model_peak) - static_cast<double>(actual_peak)) /
                                  static_cast<double>(actual_peak);
  }
};

struct DeviceReplay {
  bool exact_seeds = false;  // seed_alloc through seed_alloc() rather than allocate()
  std::unique_ptr<ReplayTarget> target;
  std::unordered_map<std::uint64_t, void*> live;  // trace address -> model pointer
  std::size_t actual_reserved = 0;
  bool window_started = false;
  WindowResult r;
};

void alloc_event(DeviceReplay& d, const trace::TraceEvent& e) {
  try {
    d.live[e.addr] = d.target->allocate(e.size, e.stream);
  } catch (const OutOfMemoryError&) {
    ++d.r.model_ooms;
  }
}

void free_event(DeviceReplay& d, const trace::TraceEvent& e) {
  const auto it = d.live.find(e.addr);
  if (it == d.live.end()) {
    ++d.r.unmatched_frees;
    return;
  }
  d.target->deallocate(it->second, e.size, e.stream);
  d.live.erase(it);
}

void actual_segment_event(DeviceReplay& d, const trace::TraceEvent& e) {
  if (e.op == trace::Op::segment_alloc || e.op == trace::Op::segment_map) {
    d.actual_reserved += e.size;
    ++d.r.actual_segments;
  } else {
    d.actual_reserved -= std::min<std::size_t>(e.size, d.actual_reserved);
  }
}

// The window begins at the first event that is not a seed: what the seed_allocs cost is set apart.
void start_window(DeviceReplay& d) {
  if (d.window_started) return;
  d.window_started = true;
  d.r.seed_spill = d.target->upstream().allocs;
}

void apply(DeviceReplay& d, const trace::TraceEvent& e) {
  using trace::Op;
  switch (e.op) {
    case Op::seed_segment:
      d.r.expandable |= (e.flags & trace::kFlagExpandable) != 0;
      d.target->seed_segment(e);
      d.actual_reserved += e.size;
      d.r.actual_start += e.size;
      return;
    case Op::seed_alloc:
      if (d.exact_seeds)
        d.live[e.addr] = d.target->seed_alloc(e);
      else
        alloc_event(d, e);
      return;
    default: break;
  }
  start_window(d);
  ++d.r.events;
  switch (e.op) {
    case Op::alloc: alloc_event(d, e); break;
    case Op::free_completed: free_event(d, e); break;  // the moment PyTorch can reuse the block
    case Op::record_stream:
      if (const auto it = d.live.find(e.addr); it != d.live.end())
        d.target->record_stream(it->second, e.stream);
      break;
    case Op::stream_sync: d.target->stream_synchronized(e.stream); break;
    case Op::segment_map:
    case Op::segment_unmap: d.r.expandable = true; [[fallthrough]];
    case Op::segment_alloc:
    case Op::segment_free: actual_segment_event(d, e); break;
    case Op::oom: ++d.r.actual_ooms; break;
    default: break;  // free_requested, iteration: nothing for the allocator to do
  }
}

std::vector<WindowResult> replay_on_pytorch_model(const trace::Trace& t, const std::string& name,
                                                 bool exact_seeds) {
  std::map<unsigned, DeviceReplay> devices;
  for (const trace::TraceEvent& e : t.events) {
    DeviceReplay& d = devices[e.device];
    if (!d.target) {
      d.exact_seeds = exact_seeds;
      TargetOptions o;
      o.device = e.device;
      d.target = make_pytorch_target(o);
      d.r.trace = name;
      d.r.device = e.device;
    }
    apply(d, e);
    // PyTorch logs a segment's cudaMalloc/cudaFree just before the alloc that caused it: compare
    // after the allocator's own events only.
    const bool allocator_event = e.op == trace::Op::alloc || e.op == trace::Op::free_completed;
    if (allocator_event && d.actual_reserved != d.target->reserved()) ++d.r.diverging_events;
    d.r.actual_peak = std::max(d.r.actual_peak, d.actual_reserved);
    d.r.model_peak = std::max(d.r.model_peak, d.target->reserved());
  }
  std::vector<WindowResult> out;
  for (auto& [dev, d] : devices) {
    start_window(d);
    d.r.model_segments = d.target->upstream().allocs - d.r.seed_spill;
    out.push_back(d.r);
  }
  return out;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", static_cast<double>(bytes) / static_cast<double>(MiB));
  return buf;
}

std::string row(const WindowResult& r) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%-38s dev %u: %6zu events, peak reserved actual %7s MiB, model %7s MiB (%+.2f%%), "
                "segment allocs actual %4llu, model %4llu (seed spill %llu), reserved differs "
                "after %zu events%s",
                r.trace.c_str(), r.device, r.events, mib(r.actual_peak).c_str(),
                mib(r.model_peak).c_str(), 100.0 * r.rel_diff(),
                static_cast<unsigned long long>(r.actual_segments),
                static_cast<unsigned long long>(r.model_segments),
                static_cast<unsigned long long>(r.seed_spill), r.diverging_events,
                r.expandable ? " [expandable segments]" : "");
  return buf;
}

std::vector<std::filesystem::path> pickles_in(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".pickle") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

double rel(std::size_t model, std::size_t actual) {
  return actual == 0 ? 0.0
                     : (static_cast<double>(model) - static_cast<double>(actual)) /
                           static_cast<double>(actual);
}

}  // namespace

// The acceptance bar, end to end: the replay engine drives make_target("pytorch") through each
// trace (seed_alloc events as allocate() calls, frees at free_requested, which PyTorch logs right
// before free_completed when no other stream used the block), and baseline() reads what PyTorch
// reserved from the trace's own seed_segment and segment_* events.
TEST_CASE("pytorch model: the engine's replay reserves within 2% of PyTorch's peak",
          "[models][pytorch][validation]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  const auto files = pickles_in(dir);
  REQUIRE(!files.empty());
  for (const auto& file : files) {
    const trace::Trace t = trace::pytorch::import_snapshot(file);
    TraceSource source(t);
    ReplayOptions options;
    options.allocator = "pytorch";
    const ReplayReport report = tensorpool::replay::replay(source, options);
    source.rewind();
    const BaselineReport actual = baseline(source);
    REQUIRE(report.devices.size() == actual.devices.size());
    for (std::size_t i = 0; i < report.devices.size(); ++i) {
      const ReplayResult& m = report.devices[i];
      const ReplayResult& a = actual.devices[i].result;
      REQUIRE(m.device == a.device);
      const bool expandable = a.upstream.maps > 0 || a.upstream.unmaps > 0;
      INFO(file.stem().string() << " dev " << m.device << ": peak reserved actual " << a.peak_reserved
                                << ", model " << m.peak_reserved << "; segment allocs actual "
                                << a.upstream.allocs + a.upstream.maps << ", model "
                                << m.upstream.allocs);
      if (expandable) {
        // See the next test: no 2% claim for expandable segments.
        CHECK(m.peak_reserved >= a.peak_reserved);
        continue;
      }
      CHECK(std::abs(rel(m.peak_reserved, a.peak_reserved)) <= 0.02);
      CHECK(m.upstream.allocs == a.upstream.allocs);
      CHECK(m.ooms == 0);
      CHECK(m.unmatched_frees == 0);
    }
  }
}

// The same windows through a driver of this file, which also tracks the reserved bytes event by
// event and can place the seeds exactly (seed_alloc); prints the validation table.
TEST_CASE("pytorch model: reserved bytes follow PyTorch's through every shared trace",
          "[models][pytorch][validation]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  const auto files = pickles_in(dir);
  REQUIRE(!files.empty());
  for (const auto& file : files) {
    const trace::Trace t = trace::pytorch::import_snapshot(file);
    for (const bool exact : {false, true}) {
      for (const WindowResult& r : replay_on_pytorch_model(t, file.stem().string(), exact)) {
        const std::string line = row(r) + (exact ? " [seeds placed exactly]" : " [seeds allocated]");
        WARN(line);
        INFO(line);
        CHECK(r.seed_spill == 0);  // the live blocks fit in the seeded segments
        CHECK(r.model_peak >= r.actual_start);
        if (r.expandable) {
          // qwen3 ran with expandable_segments:True: PyTorch mapped 2 MiB (small) / 20 MiB
          // (large) pages into one growing segment per pool and stream, where the model makes
          // separate cudaMalloc segments that never merge. No 2% claim for that mode. What holds:
          // the model never reserves less than the pages PyTorch mapped, and its only OOM (and
          // the free of the block it could not allocate) is on the device where PyTorch itself
          // ran out of memory (an 80 GiB GPU: the model reserved more for the same requests).
          CHECK(r.model_peak >= r.actual_peak);
          CHECK(r.model_ooms <= r.actual_ooms);
          CHECK(r.unmatched_frees <= r.model_ooms);
          continue;
        }
        CHECK(r.unmatched_frees == 0);
        CHECK(r.model_ooms == 0);
        CHECK(std::abs(r.rel_diff()) <= 0.02);
        CHECK(r.model_segments == r.actual_segments);
        // With the live blocks at their recorded offsets, the model's reserved bytes equal
        // PyTorch's after every alloc and free of the window. Through allocate() the seeds are
        // packed at the front of their segments, closing free gaps; the merged space lets the
        // model defer some of PyTorch's small-segment cudaMallocs (tinyllama: up to 2 MiB, for
        // a while) without changing the peak or the count.
        if (exact) CHECK(r.diverging_events == 0);
      }
    }
  }
}
