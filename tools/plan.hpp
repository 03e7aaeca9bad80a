// plan.hpp: `tensorpool plan`: for a training setup and a device capacity, the largest micro-batch
// each allocator fits (replay::largest_fitting over generated traces), the accumulation steps
// that reach the global batch, peak reserved and headroom there, and the setup changes that let
// a larger micro-batch fit, ranked by the memory they save.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan_capture.hpp"
#include "tensorpool/replay/fit.hpp"
#include "tensorpool/workload/setup.hpp"

namespace tensorpool::cli {

struct PlanOptions {
  workload::WorkloadSetup setup;  // validated; plan searches its micro_batch
  /// Non-empty: the traces are captured from this script (plan_capture.hpp) instead of generated
  /// from `setup`, whose global batch and dp alone apply; no setup changes are tried.
  CaptureCommand capture;
  std::vector<replay::FitTarget> targets;  // the allocators (fit_targets(): as replay gets them)
  std::size_t capacity = 0;
  unsigned threads = 0;  // 0: one per core
  bool json = false;
  bool quiet = false;    // no progress bar (progress.hpp)
  std::string report;    // also write the plan's HTML page here (plan_page.hpp); empty: none
  /// Called after each replay of the searches, from any of their threads (thread-safe); empty:
  /// never. cmd_plan() sets it to its progress bar.
  std::function<void()> on_replay;
};

/// What one allocator fits with one setup.
struct PlanFit {
  std::string allocator;
  std::optional<std::uint64_t> micro_batch;  // nullopt: not even the smallest fits
  std::uint64_t accumulation = 0;            // global batch / (micro-batch x dp)
  std::size_t peak_requested = 0;            // at micro_batch: the largest over the devices (stages)
  std::size_t peak_reserved = 0;
  std::optional<std::uint64_t> next_micro_batch;  // the candidate after micro_batch, which OOMed
  std::optional<replay::ReplayReport> next;       // its replay (first_oom explains it)
  std::shared_ptr<const trace::Trace> next_trace; // the trace of that replay (its labels)
};

struct PlanChange {
  workload::SetupChange change;
  std::size_t saves = 0;                // peak requested at the reference micro-batch, less
  bool helps = false;                   // some allocator fits a larger micro-batch with it
  std::vector<PlanFit> fits;            // per allocator
};

struct PlanReport {
  PlanOptions options;
  replay::TraceFamily traces;             // the trace at each micro-batch: generated or captured
  std::vector<std::uint64_t> candidates;  // micro-batches tried: divisors of global batch / dp
  std::vector<PlanFit> fits;              // per allocator
  std::uint64_t reference_micro_batch = 1;  // where the changes' savings are measured
  std::vector<PlanChange> changes;        // ranked by `saves`, largest first
};

/// What is planned, in words: the setup's description, or the captured script.
std::string plan_subject(const PlanOptions& options);

/// `bytes` as "12.34 GiB" (the plan's text and answer).
std::string gib(std::size_t bytes);

/// The setup at micro-batch `mb`, with only the micro-batches its peak needs in the trace (what
/// plan replays).
workload::WorkloadSetup plan_setup_at(const workload::WorkloadSetup& setup, std::uint64_t mb);

/// Refuses a setup plan cannot search (inference, no global batch), naming the option; throws
/// ConfigError.
void check_plan(const workload::WorkloadSetup& setup);
PlanReport make_plan(const PlanOptions& options);
std::string plan_text(const PlanReport& report);
nlohmann::json plan_json(const PlanReport& report);
int cmd_plan(const PlanOptions& options);

}  // namespace tensorpool::cli
