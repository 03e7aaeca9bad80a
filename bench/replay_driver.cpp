// replay_driver.cpp: replays of a generated training trace (the demo's workload, STEPS optimizer
// steps) against tensorpool, for instruction counts under valgrind's callgrind, which do not
// depend on the machine's load (docs/benchmarks.md: the replay engine's observer hook costs
// nothing when no observer is set):
//   valgrind --tool=callgrind tensorpool_replay_driver STEPS REPLAYS [observe]
// The instructions of one replay: Ir at REPLAYS=3 minus Ir at REPLAYS=1, halved. With `observe`,
// a do-nothing observer watches each replay (what an attached observer costs).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "driver_args.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/workload/setup.hpp"

using namespace tensorpool;

namespace {

#ifdef TENSORPOOL_DRIVER_OBSERVER
struct Nothing final : replay::ReplayObserver {
  std::size_t seen = 0;
  void after_event(const replay::ReplayPoint& p, const replay::ReplayView&) override { seen += p.event & 1; }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage = "STEPS REPLAYS [observe]";
  if (argc != 3 && argc != 4) return bench::usage_error(argv[0], kUsage, "expected two or three arguments");
  std::uint64_t steps = 0;
  std::uint64_t replays = 0;
  try {
    steps = bench::count_argument(argv[1], "STEPS", 0, 1000);
    replays = bench::count_argument(argv[2], "REPLAYS", 1);
  } catch (const Error& e) {
    return bench::usage_error(argv[0], kUsage, e.what());
  }
  if (argc == 4 && std::strcmp(argv[3], "observe") != 0)
    return bench::usage_error(argv[0], kUsage, "the third argument, if any, is `observe`");
  workload::WorkloadSetup setup = workload::WorkloadSetup::for_model("custom");
  setup.apply("framework:megatron,micro_batch:4,seq:2048,seq_dist:uniform,dp:2", "replay_driver");
  setup.steps = static_cast<int>(steps);
  const trace::Trace t = workload::generate_workload(setup);
  replay::ReplayOptions o;
#ifdef TENSORPOOL_DRIVER_OBSERVER
  Nothing nothing;
  if (argc == 4) o.observer = &nothing;  // `observe`, checked above
#endif
  std::size_t peak = 0;
  for (std::uint64_t i = 0; i < replays; ++i) {
    replay::TraceSource source(t);
    peak += replay::replay(source, o).total.peak_reserved;
  }
  std::printf("%zu events, %llu replays, peak reserved %zu\n", t.events.size(),
              static_cast<unsigned long long>(replays), peak / static_cast<std::size_t>(replays));
  return 0;
}
