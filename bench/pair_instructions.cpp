// Runs N cached 1 MiB allocate+free pairs (1000 other live blocks, as BM_AllocFreePair) with one
// of the optional layers, for instruction counts under callgrind, which a timing on a loaded
// machine cannot settle: instructions per pair = (count at N - count at 0) / N.
//
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null pair_instructions N VARIANT
//
// VARIANT: plain | observer (a no-op observer) | recording (to /dev/null, the writer thread's
// instructions included) | nvtx_off (through with_nvtx, both keys off) | nvtx | nvtx_mem |
// nvtx_both (no NVTX tool attached). Built with TP_CORE_ONLY it needs only the core library
// (plain and observer), so the same source measures another build of the core.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "driver_args.hpp"
#include "mixed_fill.hpp"
#include "tensorpool/tensorpool.hpp"
#ifndef TP_CORE_ONLY
#include "tensorpool/record.hpp"
#if TP_BENCH_NVTX
#include "tensorpool/cuda/nvtx.hpp"
#endif
#endif

using namespace tensorpool;

namespace {

struct NoOp final : Observer {
  void on_event(const AllocatorEvent& e) noexcept override { asm volatile("" : : "r"(e.address)); }
};

#if !defined(TP_CORE_ONLY) && TP_BENCH_NVTX
bool is_nvtx(const std::string& v) { return v.rfind("nvtx", 0) == 0; }
#endif

// The variants this build measures.
bool known_variant(const std::string& v) {
  if (v == "plain" || v == "observer") return true;
#ifndef TP_CORE_ONLY
  if (v == "recording") return true;
#if TP_BENCH_NVTX
  if (v == "nvtx_off" || v == "nvtx" || v == "nvtx_mem" || v == "nvtx_both") return true;
#endif
#endif
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage = "N VARIANT";
  if (argc != 3) return bench::usage_error(argv[0], kUsage, "expected two arguments");
  std::uint64_t n = 0;
  try {
    n = bench::count_argument(argv[1], "N", 0);
  } catch (const Error& e) {
    return bench::usage_error(argv[0], kUsage, e.what());
  }
  const std::string variant = argv[2];
  if (!known_variant(variant))
    return bench::usage_error(argv[0], kUsage, "VARIANT is one this build measures (see the file's banner)");
  // Fixed segments, as when the layers' figures of docs/benchmarks.md were measured.
  const Config config = Config::parse(variant == "nvtx"        ? "mode:fixed,nvtx:on"
                                      : variant == "nvtx_mem"  ? "mode:fixed,nvtx_mem:on"
                                      : variant == "nvtx_both" ? "mode:fixed,nvtx:on,nvtx_mem:on"
                                                               : "mode:fixed");
  std::shared_ptr<DeviceBackend> device =
      std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * TiB});
#if !defined(TP_CORE_ONLY) && TP_BENCH_NVTX
  if (is_nvtx(variant)) device = with_nvtx(device, config);
#endif
  Allocator alloc(device, config);
  const std::vector<void*> held = bench::fill_mixed(
      1000, [&](std::size_t bytes) { return alloc.allocate(bytes); }, [&](void* p) { alloc.deallocate(p); });
  alloc.deallocate(alloc.allocate(MiB));
  if (variant == "observer") alloc.add_observer(std::make_shared<NoOp>());
#ifndef TP_CORE_ONLY
#if TP_BENCH_NVTX
  if (is_nvtx(variant)) attach_nvtx(alloc);
#endif
  Recording rec;
  if (variant == "recording") rec = start_recording(alloc, "/dev/null");
#endif
  for (std::uint64_t i = 0; i < n; ++i) {
    void* p = alloc.allocate(MiB);
    asm volatile("" : : "r"(p) : "memory");
    alloc.deallocate(p);
  }
#ifndef TP_CORE_ONLY
  rec.stop();
#endif
  for (void* p : held) alloc.deallocate(p);
  return 0;
}
