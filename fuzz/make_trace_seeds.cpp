// fuzz/make_trace_seeds.cpp: writes the seed corpus of fuzz_trace with the project's own trace
// writers: small traces that use every op, labels, flags, several devices and streams, in both
// formats. Usage: fuzz_make_trace_seeds OUTPUT_DIR
#include <cstdio>
#include <string>

#include "tensorpool/trace/format.hpp"

using namespace tensorpool::trace;

namespace {

Trace every_op() {
  Trace t;
  t.info.source = "fuzz-seed";
  t.info.metadata = {"allocator=tensorpool", "max_split_size=134217728"};
  const std::uint32_t fwd = t.intern("forward (model.py:42)");
  const std::uint32_t bwd = t.intern("backward (train.py:10)");
  const std::uint64_t base = 0x7f0000000000;
  // Columns: op, flags, device, label, stream, addr, size, time_us (TraceEvent's fields in order).
  t.events = {
      {Op::seed_segment, kFlagSmallPool, 0, 0, 0, base, 2 << 20, 0},
      {Op::seed_alloc, 0, 0, fwd, 0, base, 512, 0},
      {Op::seed_segment, kFlagExpandable, 1, 0, 7, base + (1ull << 32), 20 << 20, 0},
      {Op::segment_alloc, 0, 0, 0, 0, base + (64 << 20), 20 << 20, 5},
      {Op::alloc, 0, 0, fwd, 0, base + (64 << 20), 4000000, 6},
      {Op::record_stream, 0, 0, 0, 3, base + (64 << 20), 0, 7},
      {Op::iteration, 0, 0, 0, 0, 0, 1, 8},
      {Op::free_requested, 0, 0, bwd, 0, base + (64 << 20), 4000000, 9},
      {Op::stream_sync, 0, 0, 0, 3, 0, 0, 10},
      {Op::free_completed, 0, 0, bwd, 0, base + (64 << 20), 4000000, 11},
      {Op::segment_map, 0, 1, 0, 7, base + (1ull << 32) + (20 << 20), 2 << 20, 12},
      {Op::segment_unmap, 0, 1, 0, 7, base + (1ull << 32) + (20 << 20), 2 << 20, 13},
      {Op::segment_free, 0, 0, 0, 0, base + (64 << 20), 20 << 20, 14},
      {Op::oom, 0, 0, 0, 0, 0, 1ull << 40, 15},
      {Op::alloc, 0, 0, 0, 0xffffffffffffffffull, 0xfffffffffffffe00ull, 1, -3},
  };
  return t;
}

Trace tiny() {
  Trace t;
  t.info.source = "tiny";
  t.events = {{.op = Op::alloc, .addr = 4096, .size = 100, .time_us = 1},
              {.op = Op::free_requested, .addr = 4096, .size = 100, .time_us = 2},
              {.op = Op::free_completed, .addr = 4096, .size = 100, .time_us = 3}};
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  write_trace(dir + "/every_op.tptrace", every_op(), Format::binary);
  write_trace(dir + "/every_op.jsonl", every_op(), Format::jsonl);
  write_trace(dir + "/tiny.tptrace", tiny(), Format::binary);
  write_trace(dir + "/tiny.jsonl", tiny(), Format::jsonl);
  write_trace(dir + "/empty.tptrace", Trace{}, Format::binary);
  return 0;
}
