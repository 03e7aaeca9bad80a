// Cached allocate+free pairs on the simulated device, with 1k and 100k other live blocks:
// BM_AllocFreePair and BM_AllocFreeMixed with fixed segments (mode:fixed), BM_AllocFreePairVmm in
// the virtual-memory mode (the default on a device with virtual memory, as the simulated one);
// BM_PlanLayout and BM_PlanLayoutStep time the planner of vmm heaps' layouts (src/core/layout_plan.hpp).
//
// Each benchmark first fills the allocator with `live` blocks of mixed sizes (512 B .. 64 KiB,
// and every third one freed again so the free index holds thousands of fragments), then times
// allocate(size) immediately followed by deallocate() of the same block. Target: <= 50 ns per
// pair, and at most 2x slower with 100k live blocks than with 1k.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/layout_plan.hpp"
#include "tensorpool/trace/event.hpp"
#include "tensorpool/workload/setup.hpp"
#include "mixed_fill.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

Config with_mode(Mode mode) {
  Config c;
  c.mode = mode;
  return c;
}

struct Populated {
  explicit Populated(std::size_t live, Mode mode = Mode::fixed)
      : device(std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * TiB})),
        alloc(device, with_mode(mode)),
        held(bench::fill_mixed(
            live, [this](std::size_t bytes) { return alloc.allocate(bytes); },
            [this](void* p) { alloc.deallocate(p); })) {}
  ~Populated() {
    for (void* p : held) alloc.deallocate(p);
  }
  std::shared_ptr<SimulatedDevice> device;
  Allocator alloc;
  std::vector<void*> held;
};

void alloc_free_pair(benchmark::State& state, Mode mode) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const auto live = static_cast<std::size_t>(state.range(1));
  Populated pop(live, mode);
  pop.alloc.deallocate(pop.alloc.allocate(size));  // warm: the block is cached from here on
  for (auto _ : state) {
    void* p = pop.alloc.allocate(size);
    benchmark::DoNotOptimize(p);
    pop.alloc.deallocate(p);
  }
  state.counters["live_blocks"] = static_cast<double>(pop.held.size());
  state.counters["segment_allocs"] = static_cast<double>(pop.alloc.stats().upstream_allocs);
}

void BM_AllocFreePair(benchmark::State& state) { alloc_free_pair(state, Mode::fixed); }
void BM_AllocFreePairVmm(benchmark::State& state) { alloc_free_pair(state, Mode::vmm); }

// A rotating window of different sizes: the block found is rarely the one just freed.
void BM_AllocFreeMixed(benchmark::State& state) {
  const auto live = static_cast<std::size_t>(state.range(0));
  Populated pop(live);
  std::mt19937_64 rng(2);
  std::vector<std::size_t> sizes(4096);
  for (auto& s : sizes) s = 512 + rng() % (8 * MiB);
  std::vector<void*> ring(64, nullptr);
  std::size_t i = 0;
  for (auto _ : state) {
    void*& slot = ring[i % ring.size()];
    if (slot != nullptr) pop.alloc.deallocate(slot);
    slot = pop.alloc.allocate(sizes[i % sizes.size()]);
    ++i;
  }
  for (void* p : ring)
    if (p != nullptr) pop.alloc.deallocate(p);
}

// One training-like epoch of `n` allocations for the planner: an eighth are long-lived (weights,
// optimizer state: the whole epoch), the rest a forward pass of activations kept for the backward
// pass (freed in reverse) with a short-lived temporary after each, sizes 512 B to 64 MiB.
std::vector<detail::RecordedBlock> training_epoch(std::size_t n) {
  std::mt19937_64 rng(3);
  auto size = [&] { return (std::size_t{1} << (9 + rng() % 18)) + 512 * (rng() % 64); };
  std::vector<detail::RecordedBlock> blocks;
  std::uint64_t clock = 0;
  std::size_t offset = 0;
  auto alloc = [&] {
    blocks.push_back({size(), clock++, 0, offset});
    offset += blocks.back().size;  // a bump layout as the "recorded" one
    return blocks.size() - 1;
  };
  std::vector<std::size_t> weights;
  std::vector<std::size_t> saved;
  for (std::size_t i = 0; i < n / 8; ++i) weights.push_back(alloc());
  while (blocks.size() + 2 <= n) {
    saved.push_back(alloc());
    const std::size_t temporary = alloc();
    blocks[temporary].end = clock++;
  }
  while (!saved.empty()) {
    blocks[saved.back()].end = clock++;
    saved.pop_back();
  }
  for (const std::size_t w : weights) blocks[w].end = clock++;
  return blocks;
}

// The planner on an epoch of `n` allocations: the background time planning such an epoch costs
// once, and which candidate it kept (`source`: LayoutSource, 0 recorded, 1 online, 2 packed, 3
// replacing, 4 peak first, 5 by area, 6 by size with the longest first). The epoch nests, so the
// online candidate reaches its live peak and packing never runs.
void BM_PlanLayout(benchmark::State& state) {
  const std::vector<detail::RecordedBlock> epoch = training_epoch(static_cast<std::size_t>(state.range(0)));
  std::size_t height = 0;
  detail::LayoutSource source = detail::LayoutSource::recorded;
  for (auto _ : state) {
    const detail::PlannedLayout plan = detail::plan_layout(epoch);
    height = plan.height;
    source = plan.source;
  }
  state.counters["blocks"] = static_cast<double>(epoch.size());
  state.counters["source"] = static_cast<double>(source);  // LayoutSource: 0 recorded ... 6 by size, longest first
  state.counters["height_over_live_peak"] =
      static_cast<double>(height) / static_cast<double>(detail::peak_live_bytes(epoch));
}

// One steady-state step of a generated training run as the epoch a step boundary records
// (vmm_steps.cpp): the blocks live when the second iteration begins are fixed
// where a bump layout puts them (weights, optimizer states), the step's own allocations have
// their lifetimes on the step's clock, and their recorded layout overlaps itself (every block at
// the base's top), so that the packing runs and is kept.
std::vector<detail::RecordedBlock> generated_step(const std::string& model, const std::string& options) {
  workload::WorkloadSetup setup = workload::WorkloadSetup::for_model(model);
  setup.apply(options);
  const trace::Trace t = workload::generate_workload(setup);
  std::vector<detail::RecordedBlock> blocks;
  std::unordered_map<std::uint64_t, std::size_t> live;  // address -> block
  std::unordered_map<std::uint64_t, std::size_t> before;  // address -> size, live before the step
  int iterations = 0;
  std::uint64_t clock = 1;
  std::size_t base_top = 0;
  for (const trace::TraceEvent& e : t.events) {
    if (e.op == trace::Op::iteration && ++iterations == 3) break;
    if (iterations < 2) {  // before the step: what stays live becomes its base
      if (e.op == trace::Op::alloc) before[e.addr] = e.size;
      if (e.op == trace::Op::free_requested) before.erase(e.addr);
      continue;
    }
    if (e.op == trace::Op::iteration) {  // the step begins: its base, fixed at tick 0
      for (const auto& [addr, size] : before) {
        live[addr] = blocks.size();
        blocks.push_back({size, 0, 0, base_top, true});
        base_top += size;
      }
      continue;
    }
    if (e.op == trace::Op::alloc) {
      live[e.addr] = blocks.size();
      blocks.push_back({e.size, clock++, 0, base_top});
    } else if (e.op == trace::Op::free_requested) {
      if (const auto freed = live.find(e.addr); freed != live.end()) {
        blocks[freed->second].end = clock++;
        live.erase(freed);
      }
    }
  }
  for (detail::RecordedBlock& b : blocks)
    if (b.end == 0) b.end = clock;  // live at the step's end
  return blocks;
}

// The planner on one step of a generated training run (the gpt2-xl step of the generated suite's
// PyTorch loop, Mixtral's of its MoE run): real sizes, lifetimes and a base, unlike
// BM_PlanLayout's synthetic epoch. The base's runs of fixed blocks planned as one block each (the
// planner's way) and, for comparison in the same run, block by block (the same layout).
void BM_PlanLayoutStep(benchmark::State& state, const std::string& model, const std::string& options,
                       detail::FixedRuns runs) {
  const std::vector<detail::RecordedBlock> epoch = generated_step(model, options);
  std::size_t height = 0;
  for (auto _ : state) {
    height = detail::plan_layout(epoch, detail::kMaxPackSteps, runs).height;
  }
  state.counters["blocks"] = static_cast<double>(epoch.size());
  state.counters["height_over_live_peak"] =
      static_cast<double>(height) / static_cast<double>(detail::peak_live_bytes(epoch));
}

// Sleep and wake of 8 GiB of live blocks (128 of 64 MiB) in the vmm mode: host time per cycle,
// and the modelled time of the upstream calls (the simulated device's default cost model) per GiB
// for each of sleep (unmap + release) and wake (create + map).
void BM_SleepWake(benchmark::State& state) {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 80 * GiB});
  Allocator alloc(device, with_mode(Mode::vmm));
  std::vector<void*> live;
  for (int i = 0; i < 128; ++i) live.push_back(alloc.allocate(64 * MiB));
  double sleep_ns = 0;
  double wake_ns = 0;
  std::size_t asleep = 0;
  for (auto _ : state) {
    const std::uint64_t before = device->counters().modelled_ns;
    asleep = alloc.sleep().asleep_bytes;
    const std::uint64_t slept = device->counters().modelled_ns;
    alloc.wake();
    sleep_ns += static_cast<double>(slept - before);
    wake_ns += static_cast<double>(device->counters().modelled_ns - slept);
  }
  const double gib = static_cast<double>(asleep) / static_cast<double>(GiB) * static_cast<double>(state.iterations());
  state.counters["asleep_GiB"] = static_cast<double>(asleep) / static_cast<double>(GiB);
  state.counters["modelled_sleep_us_per_GiB"] = sleep_ns / 1000 / gib;
  state.counters["modelled_wake_us_per_GiB"] = wake_ns / 1000 / gib;
  for (void* p : live) alloc.deallocate(p);
}

}  // namespace

BENCHMARK(BM_SleepWake)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AllocFreePair)
    ->ArgNames({"size", "live"})
    ->ArgsProduct({{4096, 1 << 20, 64 << 20}, {1000, 100000}});
BENCHMARK(BM_AllocFreePairVmm)
    ->ArgNames({"size", "live"})
    ->ArgsProduct({{4096, 1 << 20, 64 << 20}, {1000, 100000}});
BENCHMARK(BM_AllocFreeMixed)->ArgNames({"live"})->Arg(1000)->Arg(100000);
BENCHMARK(BM_PlanLayout)->ArgNames({"blocks"})->Arg(1024)->Arg(4096)->Arg(8192)->Arg(16384)->Arg(65536)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanLayoutStep, gpt2_xl_torch_loop, "gpt2-xl", "framework:pytorch,micro_batch:4,steps:3",
                  detail::FixedRuns::as_one_block)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanLayoutStep, gpt2_xl_torch_loop_block_by_block, "gpt2-xl",
                  "framework:pytorch,micro_batch:4,steps:3", detail::FixedRuns::as_blocks)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanLayoutStep, mixtral_8x7b, "mixtral-8x7b",
                  "framework:megatron,zero:3,dp:32,checkpointing:full,micro_batch:2,steps:3",
                  detail::FixedRuns::as_one_block)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanLayoutStep, mixtral_8x7b_block_by_block, "mixtral-8x7b",
                  "framework:megatron,zero:3,dp:32,checkpointing:full,micro_batch:2,steps:3",
                  detail::FixedRuns::as_blocks)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
