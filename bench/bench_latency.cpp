// bench_latency.cpp: the host time of every allocate and deallocate of the Allocator, over five
// replays of each trace (the shared PyTorch snapshots, and a synthetic training step of 8192
// blocks with interleaved lifetimes), in the default mode (virtual memory on the simulated device)
// and in mode:fixed. Calls that made an upstream call (a device allocation, free, map or unmap)
// are counted apart: the bound the allocator promises is for the others.
//
//   tensorpool_bench_latency [--json FILE|-] [--passes N] [--runs R] [--step-at-iterations] [TRACE...]
//
// Without TRACE: every ../shared/traces/*.pickle beside the source tree, and the synthetic step.
// --step-at-iterations calls Allocator::step() at each iteration marker of the traces (a program
// that gives its step boundary, so that steps follow their plans: docs/vmm.md, "Steps"), and
// times those calls too (call "step").
// The whole measurement is made R times (default 3; a noisy host's preemptions land in one run,
// not in all): per trace, mode and call, the median over runs of p50, p99 and p99.9, and of the
// max both the lowest and the highest over runs, in microseconds, with the calls that made an
// upstream call counted apart. Prints one Markdown table; --json FILE writes the same rows
// (--json -: to stdout, without the table, for scripts/bench-tables.py record).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensorpool/replay/replay.hpp"
#include "tensorpool/tensorpool.hpp"
#include "tensorpool/trace/load.hpp"

using namespace tensorpool;

namespace {

using Clock = std::chrono::steady_clock;

struct Samples {
  std::vector<double> quiet_us;     // calls that made no upstream call
  std::size_t with_upstream = 0;    // calls that made one
  double with_upstream_max_us = 0;
};

// The Allocator on a simulated device whose stream work completes at once (as the replay target
// "tensorpool" runs it), each allocate and deallocate timed.
class TimedTarget final : public replay::ReplayTarget {
 public:
  TimedTarget(const replay::TargetOptions& o, const char* conf, Samples& allocs, Samples& frees, Samples& steps)
      : device_(std::make_shared<SimulatedDevice>(
            SimulatedDeviceOptions{.capacity = o.capacity, .event_mode = EventMode::immediate})),
        alloc_(device_, Config::parse(conf)),
        allocs_(allocs),
        frees_(frees),
        steps_(steps) {}

  std::string name() const override { return "timed"; }
  void* allocate(std::size_t bytes, Stream stream) override {
    const std::uint64_t before = upstream_calls();
    const auto t0 = Clock::now();
    void* p = alloc_.allocate(bytes, map(stream));
    const auto t1 = Clock::now();
    add(allocs_, t1 - t0, upstream_calls() != before);
    return p;
  }
  void deallocate(void* ptr, std::size_t, Stream) override {
    const std::uint64_t before = upstream_calls();
    const auto t0 = Clock::now();
    alloc_.deallocate(ptr);
    const auto t1 = Clock::now();
    add(frees_, t1 - t0, upstream_calls() != before);
  }
  void step() override {
    const std::uint64_t before = upstream_calls();
    const auto t0 = Clock::now();
    alloc_.step();
    const auto t1 = Clock::now();
    add(steps_, t1 - t0, upstream_calls() != before);
  }
  void record_stream(void* ptr, Stream stream) override { alloc_.record_stream(ptr, map(stream)); }
  void stream_synchronized(Stream stream) override { device_->complete_stream(map(stream)); }
  void empty_cache() override { alloc_.empty_cache(); }
  std::size_t reserved() const override { return alloc_.usage().reserved; }
  std::size_t allocated() const override { return alloc_.usage().allocated; }
  replay::UpstreamCounts upstream() const override { return {}; }  // not measured here

 private:
  std::uint64_t upstream_calls() const {
    const auto& c = device_->counters();
    return c.segment_allocs + c.segment_frees + c.maps + c.unmaps + c.physical_creates + c.physical_releases;
  }
  static void add(Samples& s, Clock::duration d, bool with_upstream) {
    const double us = std::chrono::duration<double, std::micro>(d).count();
    if (with_upstream) {
      ++s.with_upstream;
      s.with_upstream_max_us = std::max(s.with_upstream_max_us, us);
    } else {
      s.quiet_us.push_back(us);
    }
  }
  Stream map(Stream trace_stream) {
    if (trace_stream == 0) return kDefaultStream;
    for (const auto& [t, s] : streams_)
      if (t == trace_stream) return s;
    streams_.emplace_back(trace_stream, device_->create_stream());
    return streams_.back().second;
  }

  std::shared_ptr<SimulatedDevice> device_;
  Allocator alloc_;
  Samples& allocs_;
  Samples& frees_;
  Samples& steps_;
  std::vector<std::pair<Stream, Stream>> streams_;
};

// A training-like step of `n` allocations with interleaved lifetimes: an eighth live the whole
// step (weights, optimizer states), the rest a forward pass of activations kept for the backward
// pass (freed in reverse) with a short-lived temporary after each; sizes 512 B to 64 MiB.
trace::Trace synthetic_step(std::size_t n) {
  std::mt19937_64 rng(3);
  auto size = [&] { return (std::uint64_t{1} << (9 + rng() % 18)) + 512 * (rng() % 64); };
  trace::Trace t;
  t.info.source = "synthetic-step";
  std::uint64_t next_addr = 0x10000;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> weights, saved;  // (addr, size)
  auto alloc = [&] {
    const std::uint64_t s = size(), a = next_addr;
    next_addr += s + 4096;
    t.events.push_back({.op = trace::Op::alloc, .addr = a, .size = s});
    return std::pair{a, s};
  };
  auto free = [&](std::pair<std::uint64_t, std::uint64_t> b) {
    t.events.push_back({.op = trace::Op::free_requested, .addr = b.first, .size = b.second});
  };
  std::size_t made = 0;
  for (; made < n / 8; ++made) weights.push_back(alloc());
  for (; made + 2 <= n; made += 2) {
    saved.push_back(alloc());
    free(alloc());
  }
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) free(*it);
  for (const auto& w : weights) free(w);
  return t;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

struct Row {
  std::string trace, mode, call;
  std::size_t quiet = 0, with_upstream = 0;
  double p50 = 0, p99 = 0, p999 = 0, max_low = 0, max_high = 0, with_upstream_max = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One row from the samples of each run.
Row row(const std::string& trace, const char* mode, const char* call, std::vector<Samples>& runs) {
  Row r{trace, mode, call};
  std::vector<double> p50, p99, p999, maxes;
  for (Samples& s : runs) {
    r.quiet = s.quiet_us.size();
    r.with_upstream = s.with_upstream;
    r.with_upstream_max = std::max(r.with_upstream_max, s.with_upstream_max_us);
    maxes.push_back(s.quiet_us.empty() ? 0 : *std::max_element(s.quiet_us.begin(), s.quiet_us.end()));
    p50.push_back(percentile(s.quiet_us, 0.50));
    p99.push_back(percentile(s.quiet_us, 0.99));
    p999.push_back(percentile(s.quiet_us, 0.999));
  }
  r.p50 = median(p50);
  r.p99 = median(p99);
  r.p999 = median(p999);
  r.max_low = *std::min_element(maxes.begin(), maxes.end());
  r.max_high = *std::max_element(maxes.begin(), maxes.end());
  return r;
}

void write_json(std::ostream& out, const std::vector<Row>& rows, int passes, int runs) {
  out << "{\"passes\": " << passes << ", \"runs\": " << runs << ", \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "  {\"trace\": \"" << r.trace << "\", \"mode\": \"" << r.mode << "\", \"call\": \"" << r.call
        << "\", \"calls\": " << r.quiet << ", \"p50_us\": " << r.p50 << ", \"p99_us\": " << r.p99
        << ", \"p999_us\": " << r.p999 << ", \"max_us_lowest\": " << r.max_low << ", \"max_us_highest\": " << r.max_high
        << ", \"with_upstream\": " << r.with_upstream << ", \"with_upstream_max_us\": " << r.with_upstream_max << "}"
        << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int passes = 5;
  int runs = 3;
  bool step_at_iterations = false;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
      passes = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--step-at-iterations") == 0) {
      step_at_iterations = true;
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "usage: %s [--json FILE|-] [--passes N] [--runs R] [--step-at-iterations] [TRACE...]\n", argv[0]);
      return 2;
    } else {
      paths.push_back(argv[i]);
    }
  }
  std::vector<std::pair<std::string, trace::Trace>> traces;
  if (paths.empty()) {
    const std::filesystem::path shared = TENSORPOOL_SHARED_TRACES;
    if (std::filesystem::is_directory(shared))
      for (const auto& e : std::filesystem::directory_iterator(shared))
        if (e.path().extension() == ".pickle") paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
  }
  for (const auto& p : paths) traces.emplace_back(std::filesystem::path(p).stem().string(), trace::load_trace(p));
  traces.emplace_back("synthetic step, 8192 blocks", synthetic_step(8192));

  std::vector<Row> rows;
  for (auto& [name, t] : traces) {
    for (const auto& [mode, conf] : {std::pair{"default", ""}, std::pair{"fixed", "mode:fixed"}}) {
      std::vector<Samples> allocs(static_cast<std::size_t>(runs)), frees(static_cast<std::size_t>(runs)),
          steps(static_cast<std::size_t>(runs));
      for (int run = 0; run < runs; ++run) {
        Samples& a = allocs[static_cast<std::size_t>(run)];
        Samples& f = frees[static_cast<std::size_t>(run)];
        Samples& s = steps[static_cast<std::size_t>(run)];
        // Room for every sample up front: the bench's own reallocations stay out of the timings
        // (a freed large vector trims the C heap, and the allocator's next malloc faults pages in).
        a.quiet_us.reserve(t.events.size() * static_cast<std::size_t>(passes));
        f.quiet_us.reserve(t.events.size() * static_cast<std::size_t>(passes));
        replay::ReplayOptions o;
        o.warmup = passes - 1;  // every pass is timed: the target sees them all
        o.step_at_iterations = step_at_iterations;
        o.make_target = [&, c = conf](const replay::TargetOptions& to) {
          return std::make_unique<TimedTarget>(to, c, a, f, s);
        };
        replay::TraceSource source(t);
        replay::replay(source, o);
      }
      rows.push_back(row(name, mode, "allocate", allocs));
      rows.push_back(row(name, mode, "deallocate", frees));
      if (step_at_iterations) rows.push_back(row(name, mode, "step", steps));
    }
  }
  if (json_path == "-") {
    write_json(std::cout, rows, passes, runs);
    return 0;
  }
  std::printf("| trace | mode | call | calls | p50 us | p99 us | p99.9 us | max us (lowest, highest of %d runs) | "
              "with upstream calls: count, max us |\n", runs);
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %zu | %.2f | %.2f | %.2f | %.1f, %.1f | %zu, %.1f |\n", r.trace.c_str(), r.mode.c_str(),
                r.call.c_str(), r.quiet, r.p50, r.p99, r.p999, r.max_low, r.max_high, r.with_upstream, r.with_upstream_max);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    write_json(out, rows, passes, runs);
  }
  return 0;
}
