// sleep_wake.cpp: what Allocator::sleep() and wake() cost on a real GPU, per GiB asleep
// (issue 28: "the modelled time of sleep and wake per GiB and, where a GPU was lent, measured").
// For each size: a virtual-memory allocator over CudaVmmBackend holds that many bytes in 64 MiB
// blocks on a stream of its own, each filled with its own byte; then REPS rounds of
//   sleep(keep) + wake()      every block's bytes copied to pinned host memory, its pages
//                             unmapped and released; new pages created and mapped, the bytes
//                             copied back (this program then reads 4 KiB at each end of every
//                             block back and compares);
// and REPS rounds of
//   sleep(discard) + wake()   the same without the copies (this program then writes 4 KiB at each
//                             end of every block and reads them back).
// Each round also checks what the issue asks: the GPU's free memory grows by at least what
// sleeps (cudaMemGetInfo), every block keeps its address and is awake after wake(). Medians of
// the rounds; one JSON object on stdout once every size has run, and exit status 1 if a check
// failed (or, with no JSON, if a call or an allocation failed: stderr says which).
//
//   sleep_wake [MIB_LIST] [REPS]      (default: 1024,4096 and 3)
//
// It uses only runtime calls the project's CUDA test double also has, so tests/cuda runs it
// there with small sizes (the checks, not the times: the double's pages are host memory).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "tensorpool/allocator.hpp"
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/cuda/interop.hpp"

namespace {

using namespace tensorpool;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBlock = 64 * MiB;
constexpr std::size_t kProbe = 4 * KiB;  // read back at each end of a block after a kept wake

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sleep_wake: %s failed: CUDA error %d\n", what, static_cast<int>(e));
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::size_t free_memory() {
  std::size_t free = 0;
  std::size_t total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

std::vector<std::size_t> parse_sizes(const char* list) {
  std::vector<std::size_t> mib;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0 || v % 64 != 0) {
      std::fprintf(stderr, "sleep_wake: '%s' in the size list is not a positive multiple of 64 (MiB)\n", item.c_str());
      std::exit(64);
    }
    mib.push_back(static_cast<std::size_t>(v));
  }
  return mib;
}

// The byte block i holds.
unsigned char pattern(std::size_t i) { return static_cast<unsigned char>(0x11 + 37 * i); }

std::vector<void*> fill(Allocator& alloc, std::size_t bytes, cudaStream_t stream) {
  std::vector<void*> blocks;
  std::vector<unsigned char> host(kBlock);
  for (std::size_t i = 0; i < bytes / kBlock; ++i) {
    void* p = alloc.allocate(kBlock, to_stream(stream));
    std::fill(host.begin(), host.end(), pattern(i));
    check(cudaMemcpy(p, host.data(), kBlock, cudaMemcpyHostToDevice), "cudaMemcpy (fill)");
    blocks.push_back(p);
  }
  return blocks;
}

// Whether probe(i, at) holds at both ends (the first and the last kProbe bytes) of every block i.
template <class Probe>
bool at_both_ends(const std::vector<void*>& blocks, Probe probe) {
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    auto* base = static_cast<unsigned char*>(blocks[i]);
    if (!probe(i, base) || !probe(i, base + kBlock - kProbe)) return false;
  }
  return true;
}

// Every block still reads its own byte at both ends.
bool contents_kept(const std::vector<void*>& blocks) {
  std::vector<unsigned char> back(kProbe);
  return at_both_ends(blocks, [&](std::size_t i, unsigned char* at) {
    check(cudaMemcpy(back.data(), at, kProbe, cudaMemcpyDeviceToHost), "cudaMemcpy (probe)");
    return std::all_of(back.begin(), back.end(), [&](unsigned char c) { return c == pattern(i); });
  });
}

// Every block's new pages take a write and read it back, at both ends (after a discarded wake).
bool pages_usable(const std::vector<void*>& blocks) {
  const std::vector<unsigned char> probe(kProbe, 0xa5);
  std::vector<unsigned char> back(kProbe);
  return at_both_ends(blocks, [&](std::size_t, unsigned char* at) {
    check(cudaMemcpy(at, probe.data(), kProbe, cudaMemcpyHostToDevice), "cudaMemcpy (write probe)");
    check(cudaMemcpy(back.data(), at, kProbe, cudaMemcpyDeviceToHost), "cudaMemcpy (read probe)");
    return back == probe;
  });
}

struct Row {
  std::size_t mib = 0;
  Contents contents = Contents::discard;
  std::size_t asleep_bytes = 0;
  std::size_t min_freed = SIZE_MAX;  // the least free-memory gain of a round
  std::vector<double> sleep_ms, wake_ms;
  bool checks_ok = true;
};

void round_of(Allocator& alloc, const std::vector<void*>& blocks, Row& row) {
  const std::size_t before = free_memory();
  const auto t0 = Clock::now();
  const SleepReport r = alloc.sleep(row.contents);
  row.sleep_ms.push_back(ms_since(t0));
  const std::size_t after = free_memory();
  const std::size_t freed = after > before ? after - before : 0;
  row.asleep_bytes = r.asleep_bytes;
  row.min_freed = std::min(row.min_freed, freed);
  bool ok = r.asleep_blocks == blocks.size() && freed >= r.asleep_bytes;
  for (void* p : blocks) ok = ok && alloc.is_asleep(p);
  const auto t1 = Clock::now();
  alloc.wake();
  row.wake_ms.push_back(ms_since(t1));
  for (void* p : blocks) ok = ok && !alloc.is_asleep(p);
  ok = ok && (row.contents == Contents::keep ? contents_kept(blocks) : pages_usable(blocks));
  row.checks_ok = row.checks_ok && ok;
}

// The row as JSON.
std::string json(const Row& row) {
  const double gib = static_cast<double>(row.asleep_bytes) / static_cast<double>(GiB);
  const double s = median(row.sleep_ms);
  const double w = median(row.wake_ms);
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"mib\": %zu, \"contents\": \"%s\", \"asleep_bytes\": %zu, \"least_freed_bytes\": %zu, "
                "\"sleep_ms\": %.3f, \"wake_ms\": %.3f, \"sleep_ms_per_gib\": %.3f, \"wake_ms_per_gib\": %.3f, "
                "\"rounds\": %zu, \"checks_ok\": %s}",
                row.mib, row.contents == Contents::keep ? "keep" : "discard", row.asleep_bytes,
                row.min_freed == SIZE_MAX ? 0 : row.min_freed, s, w, gib > 0 ? s / gib : 0.0, gib > 0 ? w / gib : 0.0,
                row.sleep_ms.size(), row.checks_ok ? "true" : "false");
  return text;
}

int run(int argc, char** argv) {
  const std::vector<std::size_t> sizes = parse_sizes(argc > 1 ? argv[1] : "1024,4096");
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  if (reps < 1) {
    std::fprintf(stderr, "sleep_wake: REPS must be at least 1\n");
    return 64;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  bool all_ok = true;
  std::string rows;  // printed whole at the end: a run that fails half-way writes no JSON
  for (const std::size_t mib : sizes) {
    Allocator alloc(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
    const std::vector<void*> blocks = fill(alloc, mib * MiB, stream);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    // The kept rounds first: a discarded sleep loses what the blocks held.
    for (const Contents contents : {Contents::keep, Contents::discard}) {
      Row row;
      row.mib = mib;
      row.contents = contents;
      for (int r = 0; r < reps; ++r) round_of(alloc, blocks, row);
      rows += (rows.empty() ? "\n  " : ",\n  ") + json(row);
      all_ok = all_ok && row.checks_ok;
    }
    for (void* p : blocks) alloc.deallocate(p);
    alloc.empty_cache();
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  std::printf("{\"block_bytes\": %zu, \"rows\": [%s\n]}\n", kBlock, rows.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // out of device or host memory, a device error
    std::fprintf(stderr, "sleep_wake: %s\n", e.what());
    return 1;
  }
}
