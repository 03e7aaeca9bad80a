// trace::summarize(): the facts `tensorpool info` prints, on hand-built traces.
#include <catch2/catch.hpp>

#include <cstdint>

#include "tensorpool/trace/summary.hpp"

using namespace tensorpool::trace;

namespace {

constexpr std::uint64_t kMiB = 1024 * 1024;

void add(Trace& t, Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream = 0,
         std::uint16_t device = 0, const char* label = "") {
  t.events.push_back({.op = op, .device = device, .label = t.intern(label), .stream = stream,
                      .addr = addr, .size = size});
}

}  // namespace

TEST_CASE("summarize counts ops, devices, allocating streams and unfreed blocks", "[summary]") {
  Trace t;
  add(t, Op::seed_alloc, 0x100, 1000, 0, 0, "seed");
  add(t, Op::alloc, 0x200, 3 * kMiB, 5, 0, "big");
  add(t, Op::alloc, 0x200, 100, 0, 1, "small");  // same address, another device: another block
  add(t, Op::record_stream, 0x200, 0, 9);
  add(t, Op::free_requested, 0x200, 3 * kMiB, 5, 0);
  add(t, Op::free_completed, 0x200, 3 * kMiB, 5, 0);
  add(t, Op::iteration, 0, 1);
  const TraceSummary s = summarize(t);
  CHECK(s.events == 7);
  CHECK(s.ops[static_cast<int>(Op::alloc)] == 2);
  CHECK(s.ops[static_cast<int>(Op::seed_alloc)] == 1);
  CHECK(s.ops[static_cast<int>(Op::record_stream)] == 1);
  CHECK(s.ops[static_cast<int>(Op::segment_alloc)] == 0);
  CHECK(s.devices == std::vector<std::uint16_t>{0, 1});
  CHECK(s.streams == 3);      // (0, 0), (0, 5), (1, 0); record_stream does not allocate
  CHECK(s.never_freed == 2);  // the seed and device 1's block
  REQUIRE(s.top_labels.size() == 3);
  CHECK(s.top_labels[0].label == "big");
  CHECK(s.top_labels[0].bytes == 3 * kMiB);
  CHECK(s.top_labels[2].label == "small");
  CHECK(summarize(t, 1).top_labels.size() == 1);
}

TEST_CASE("summarize: histograms bucket by upper bound, the last one open", "[summary]") {
  Trace t;
  add(t, Op::alloc, 1, 512);      // <= 512
  add(t, Op::alloc, 2, 513);      // <= 4 KiB
  add(t, Op::alloc, 3, 2ull << 30);  // > 1 GiB
  add(t, Op::free_requested, 1, 512);  // lifetime 3 events: <= 10
  const TraceSummary s = summarize(t);
  REQUIRE(s.sizes.counts.size() == s.sizes.bounds.size() + 1);
  CHECK(s.sizes.counts[0] == 1);
  CHECK(s.sizes.bytes[0] == 512);
  CHECK(s.sizes.counts[1] == 1);
  CHECK(s.sizes.counts.back() == 1);
  CHECK(s.sizes.bytes.back() == 2ull << 30);
  CHECK(s.lifetimes.counts[0] == 0);
  CHECK(s.lifetimes.counts[1] == 1);
  CHECK(s.lifetimes.bytes[1] == 512);
}

TEST_CASE("summarize: the requested peak is per device, then summed", "[summary]") {
  Trace t;
  add(t, Op::alloc, 1, 10 * kMiB, 0, 0);
  add(t, Op::alloc, 2, 5 * kMiB, 0, 0);
  add(t, Op::free_requested, 2, 5 * kMiB, 0, 0);
  add(t, Op::alloc, 1, 4 * kMiB, 0, 1);
  add(t, Op::alloc, 1, 7 * kMiB, 0, 1);  // a live address allocated again: the old block died
  add(t, Op::free_completed, 1, 7 * kMiB, 0, 1);
  add(t, Op::alloc, 9, 0, 0, 1);         // empty allocations hold nothing
  CHECK(summarize(t).peak_requested == 15 * kMiB + 7 * kMiB);
}
