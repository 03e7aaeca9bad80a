// fit.cpp: `tensorpool fit`: the capacity search of replay::fit per allocator and device, printed
// as a table (with the first OOM just below each fit explained) or as JSON.
#include "fit.hpp"

#include <algorithm>
#include <iostream>

#include <fmt/format.h>

#include "progress.hpp"
#include "report.hpp"
#include "tensorpool/trace/load.hpp"

namespace tensorpool::cli {

namespace {

std::string gib(std::size_t bytes) {
  return fmt::format("{:.3f}", static_cast<double>(bytes) / static_cast<double>(GiB));
}

}  // namespace

std::string tolerance_text(const replay::FitOptions& options) {
  return fmt::format("{:g}% or {}", options.relative_tolerance * 100.0, format_bytes(options.absolute_tolerance));
}

std::string fit_text(const std::vector<replay::FitResult>& results, const trace::Trace& trace,
                     const replay::FitOptions& options) {
  std::string out = fmt::format("{:<18} {:>6} {:>12} {:>12} {:>8} {:>8} {:>8}  {}\n", "allocator", "device",
                                "req GiB", "fits GiB", "ratio", "replays", "1% less", "checked");
  std::vector<replay::ReplayResult> below;
  for (const auto& r : results) {
    for (const auto& d : r.devices) {
      const std::string fits = d.fits ? gib(d.capacity) : "none";
      const std::string ratio = d.fits ? fmt::format("{:.4f}", d.ratio) : "-";
      const std::string checked =
          !d.fits      ? "no capacity up to the search's limit fits"
          : !d.verified ? "NO: replays 1% below without an OOM"
          : d.monotone  ? "yes"
                        : fmt::format("yes; not monotone: runs out at {} GiB, above the fit", gib(d.oom_above));
      out += fmt::format("{:<18} {:>6} {:>12} {:>12} {:>8} {:>8} {:>8}  {}\n", r.allocator, d.device,
                         gib(d.peak_requested), fits, ratio, d.replays, d.verified ? "OOM" : "-", checked);
      if (!d.below_refused.empty()) {
        out += fmt::format("  {} at {} GiB (just below the fit): not built there: {}\n", r.allocator,
                           gib(d.below_capacity), d.below_refused);
      } else if (d.below) {
        replay::ReplayResult b = *d.below;
        b.allocator = fmt::format("{} at {} GiB (just below the fit)", r.allocator, gib(d.below_capacity));
        below.push_back(std::move(b));
      }
    }
  }
  out += fmt::format("req: peak requested (the floor); fits: the smallest capacity without an OOM (bisection to\n"
                     "{}, whichever is larger); ratio = fits / req; 1% less: the replay at 99% of the fit\n"
                     "ran out of memory.\n",
                     tolerance_text(options));
  return out + oom_breakdown(below, trace);
}

nlohmann::json fit_json(const std::vector<replay::FitResult>& results, const trace::Trace& trace) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& d : r.devices) {
      nlohmann::json below = nullptr;
      if (d.below) below = to_json(*d.below, &trace)["first_oom"];
      devices.push_back({{"device", d.device},
                         {"peak_requested_bytes", d.peak_requested},
                         {"fits", d.fits},
                         {"capacity_bytes", d.capacity},
                         {"ratio_to_peak_requested", d.ratio},
                         {"verified", d.verified},
                         {"monotone", d.monotone},
                         {"oom_above_bytes", d.oom_above},
                         {"replays", d.replays},
                         {"below_capacity_bytes", d.below_capacity},
                         {"first_oom_below", below},
                         {"refused_below", d.below_refused},
                         {"at_capacity", to_json(d.at_capacity, &trace)}});
    }
    rows.push_back({{"allocator", r.allocator}, {"fits", r.fits}, {"capacity_bytes", r.capacity}, {"devices", devices}});
  }
  return rows;
}

std::vector<replay::FitTarget> fit_targets(const RunOptions& run) {
  std::vector<replay::FitTarget> targets;
  for (std::size_t i = 0; i < run.allocators.size(); ++i) {
    const replay::ReplayOptions ro = replay_options(run, i);
    replay::FitTarget t{ro.allocator, ro.target.conf, ro.target.cost_model};
    t.step_at_iterations = ro.step_at_iterations;
    t.device_lag = ro.target.device_lag;
    targets.push_back(std::move(t));
  }
  return targets;
}

std::uint64_t expected_fit_replays(const trace::Trace& t, const replay::FitOptions& o) {
  replay::TraceSource source(t);
  std::uint64_t replays = 0;
  for (const auto& d : replay::baseline(source, "requested", o.device).devices) {
    const std::size_t peak = d.result.peak_requested;
    std::size_t hi = std::max<std::size_t>((peak + peak / 4 + MiB - 1) / MiB * MiB, 2 * MiB);
    std::size_t lo = peak > 0 ? peak - 1 : 0;
    replays += 2;  // the upper bound, the check 1% below
    const auto tolerance = std::max({static_cast<std::size_t>(static_cast<double>(hi) * o.relative_tolerance),
                                     o.absolute_tolerance, std::size_t{1}});
    for (; hi - lo > tolerance; ++replays) lo += (hi - lo) / 2;
  }
  return replays * o.targets.size();
}

int cmd_fit(const RunOptions& run, const replay::FitOptions& search) {
  const trace::Trace t = trace::load_trace(run.trace);
  replay::FitOptions o = search;
  o.targets = fit_targets(run);
  o.device = run.device;
  o.warmup = run.warmup;
  Progress progress(Progress::wanted(run.quiet, run.json), expected_fit_replays(t, o));
  progress.step(fmt::format("fit: {} allocator(s)", o.targets.size()));
  if (progress.enabled()) o.on_replay = [&progress] { progress.add(1); };
  const auto results = replay::fit(t, o);
  progress.finish();
  if (run.json) {
    const nlohmann::json j = {{"trace", run.trace},
                              {"relative_tolerance", o.relative_tolerance},
                              {"absolute_tolerance_bytes", o.absolute_tolerance},
                              {"warmup", run.warmup},
                              {"step_at_iterations", run.step_at_iterations},
                              {"device_lag", run.device_lag},
                              {"allocators", fit_json(results, t)}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("{}\n{}", run.trace, fit_text(results, t, o));
  return 0;
}

}  // namespace tensorpool::cli
