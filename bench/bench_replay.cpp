// Replay throughput: events per second of the replay engine driving tensorpool (and the models)
// on the simulated device, on one core. Target: at least 2 million events per second.
//
// Inputs: a generated LLM training trace (the demo's workload for 200 steps, 382,860 events) held
// in memory, and, when present, the largest shared PyTorch snapshot (../shared/traces), imported
// once before timing.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>

#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/load.hpp"
#include "tensorpool/workload/setup.hpp"

using namespace tensorpool;

namespace {

const trace::Trace& generated() {
  static const trace::Trace t = [] {
    workload::WorkloadSetup setup = workload::WorkloadSetup::for_model("custom");
    setup.apply("framework:megatron,micro_batch:4,seq:2048,seq_dist:uniform,dp:2,steps:200", "bench");
    return workload::generate_workload(setup);
  }();
  return t;
}

const trace::Trace* shared_trace() {
  static const std::unique_ptr<trace::Trace> t = []() -> std::unique_ptr<trace::Trace> {
    const std::string path = std::string(TENSORPOOL_SHARED_TRACES) + "/cs336-2.7b-seq128-fullstep.pickle";
    if (!std::filesystem::exists(path)) return nullptr;
    return std::make_unique<trace::Trace>(trace::load_trace(path));
  }();
  return t.get();
}

void run(benchmark::State& state, const trace::Trace& t, const char* allocator, const char* conf) {
  replay::ReplayOptions o;
  o.allocator = allocator;
  o.target.conf = conf;
  for (auto _ : state) {
    replay::TraceSource source(t);
    benchmark::DoNotOptimize(replay::replay(source, o));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(t.events.size()));
  state.counters["events"] = static_cast<double>(t.events.size());
}

void BM_ReplayGenerated(benchmark::State& state, const char* allocator, const char* conf) {
  run(state, generated(), allocator, conf);
}

void BM_ReplayShared(benchmark::State& state, const char* allocator, const char* conf) {
  const trace::Trace* t = shared_trace();
  if (t == nullptr) {
    state.SkipWithError("shared trace cs336-2.7b-seq128-fullstep.pickle not found");
    return;
  }
  run(state, *t, allocator, conf);
}

// Reading the largest shared snapshot and importing it as a trace (the pickle reader and the
// converter), from a file in the page cache.
void BM_LoadSnapshot(benchmark::State& state) {
  const std::string path = std::string(TENSORPOOL_SHARED_TRACES) + "/cs336-2.7b-seq128-fullstep.pickle";
  if (!std::filesystem::exists(path)) {
    state.SkipWithError("shared trace cs336-2.7b-seq128-fullstep.pickle not found");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(trace::load_trace(path));
}

}  // namespace

BENCHMARK_CAPTURE(BM_ReplayGenerated, tensorpool, "tensorpool", "")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayGenerated, tensorpool_vmm, "tensorpool", "mode:vmm")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayGenerated, pytorch, "pytorch", "")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayShared, tensorpool, "tensorpool", "")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayShared, tensorpool_vmm, "tensorpool", "mode:vmm")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayShared, pytorch, "pytorch", "")->Unit(benchmark::kMillisecond);

BENCHMARK(BM_LoadSnapshot)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
