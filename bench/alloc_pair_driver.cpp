// alloc_pair_driver.cpp: allocate+free pairs of one size after the population of
// bench_allocator.cpp (1k live blocks), for instruction counts under valgrind's callgrind, which
// do not depend on the machine's load (docs/benchmarks.md):
//   valgrind --tool=callgrind tensorpool_alloc_pair_driver SIZE PAIRS [CONF]
// The instructions of one pair: (Ir at 101000 pairs - Ir at 1000 pairs) / 100000. CONF: the
// allocator's settings (default: none, so mode:auto, which is vmm on the simulated device;
// "mode:fixed" for fixed segments).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "driver_args.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

int main(int argc, char** argv) {
  constexpr const char* kUsage = "SIZE PAIRS [CONF]";
  if (argc != 3 && argc != 4) return bench::usage_error(argv[0], kUsage, "expected two or three arguments");
  std::uint64_t size = 0;
  std::uint64_t pairs = 0;
  Config config;
  try {
    size = bench::count_argument(argv[1], "SIZE", 1);
    pairs = bench::count_argument(argv[2], "PAIRS", 0);
    if (argc == 4) config = Config::parse(argv[3]);
  } catch (const Error& e) {
    return bench::usage_error(argv[0], kUsage, e.what());
  }
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * TiB});
  Allocator alloc(device, config);
  std::vector<void*> held;
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i < 1500; ++i) {
    held.push_back(alloc.allocate(512 + rng() % (64 * KiB)));
    if (i % 3 == 2) {
      alloc.deallocate(held[held.size() - 2]);
      held.erase(held.end() - 2);
    }
  }
  alloc.deallocate(alloc.allocate(size));  // warm: the block is cached from here on
  for (std::uint64_t i = 0; i < pairs; ++i) {
    void* p = alloc.allocate(size);
    asm volatile("" : : "r"(p) : "memory");  // keep the pair
    alloc.deallocate(p);
  }
  for (void* p : held) alloc.deallocate(p);
  return 0;
}
