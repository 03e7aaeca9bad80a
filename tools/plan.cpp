// plan.cpp: `tensorpool plan`: the largest micro-batch each allocator fits for a training setup on
// a device capacity, and the setup changes that let a larger one fit.
#include "plan.hpp"
#include "plan_answer.hpp"
#include "plan_page.hpp"

#include <algorithm>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "progress.hpp"
#include "report.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/pytorch_export.hpp"

namespace tensorpool::cli {

using workload::WorkloadSetup;

namespace {


// The micro-batches that reach the global batch exactly: the divisors of global batch / dp.
std::vector<std::uint64_t> micro_batch_candidates(const WorkloadSetup& s) {
  const std::uint64_t per_rank = s.effective_global_batch() / static_cast<std::uint64_t>(s.dp);
  std::vector<std::uint64_t> out;
  for (std::uint64_t d = 1; d * d <= per_rank; ++d) {
    if (per_rank % d != 0) continue;
    out.push_back(d);
    if (d * d != per_rank) out.push_back(per_rank / d);
  }
  std::sort(out.begin(), out.end());
  return out;
}


replay::TraceFamily generated_family(const WorkloadSetup& s) {
  return [s](std::uint64_t mb) {
    return std::make_shared<const trace::Trace>(workload::generate_workload(plan_setup_at(s, mb)));
  };
}

// The largest of the devices' (pipeline stages') figures: what one device must hold.
std::size_t largest(const replay::ReplayReport& r, std::size_t replay::ReplayResult::*field) {
  std::size_t most = 0;
  for (const auto& d : r.devices) most = std::max(most, d.*field);
  return most;
}

std::size_t peak_requested_at(const WorkloadSetup& s, std::uint64_t mb) {
  const trace::Trace t = workload::generate_workload(plan_setup_at(s, mb));
  replay::TraceSource source(t);
  std::size_t most = 0;
  for (const auto& d : replay::baseline(source, "requested").devices) most = std::max(most, d.result.peak_requested);
  return most;
}

std::vector<PlanFit> search(const WorkloadSetup& s, const replay::TraceFamily& family, const PlanOptions& o,
                            const std::vector<std::uint64_t>& candidates, unsigned threads) {
  const auto& targets = o.targets;
  const auto found = replay::largest_fitting(candidates, family, targets, o.capacity, threads, o.on_replay);
  std::vector<PlanFit> fits;
  for (const auto& f : found) {
    PlanFit p;
    p.allocator = f.allocator;
    std::size_t next = 0;
    if (f.index) {
      p.micro_batch = candidates[*f.index];
      p.accumulation = s.effective_global_batch() / (*p.micro_batch * static_cast<std::uint64_t>(s.dp));
      p.peak_requested = largest(*f.at_best, &replay::ReplayResult::peak_requested);
      p.peak_reserved = largest(*f.at_best, &replay::ReplayResult::peak_reserved);
      next = *f.index + 1;
    }
    if (next < candidates.size()) p.next_micro_batch = candidates[next];
    p.next = f.at_next;
    p.next_trace = f.next_trace;
    fits.push_back(std::move(p));
  }
  return fits;
}

bool larger(const PlanFit& changed, const PlanFit& base) {
  return changed.micro_batch && (!base.micro_batch || *changed.micro_batch > *base.micro_batch);
}

}  // namespace

std::string plan_subject(const PlanOptions& o) {
  return o.capture.empty() ? o.setup.describe()
                           : fmt::format("the training step of `{}`, captured at each micro-batch", o.capture.script);
}

std::string gib(std::size_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / static_cast<double>(GiB));
}

// A pipeline's first stage keeps pp micro-batches in flight, and one more reaches the steady state
// (gradients held while a micro-batch runs forward).
WorkloadSetup plan_setup_at(const WorkloadSetup& s, std::uint64_t mb) {
  WorkloadSetup m = s;
  m.micro_batch = mb;
  if (m.trace_micro_batches == 0) m.trace_micro_batches = static_cast<std::uint64_t>(s.pp) + 1;
  return m;
}

void check_plan(const WorkloadSetup& s) {
  if (s.mode != workload::Mode::training)
    throw ConfigError("plan: option 'mode' must be training: plan searches the micro-batch of a training run");
  if (s.global_batch == 0)
    throw ConfigError("plan: no global batch: give --global-batch (option global_batch), the sequences per "
                      "optimizer step over all data-parallel ranks");
  if (s.global_batch % static_cast<std::uint64_t>(s.dp) != 0)
    throw ConfigError(fmt::format("plan: option 'global_batch' ({}) is not a multiple of dp ({})", s.global_batch, s.dp));
}

PlanReport make_plan(const PlanOptions& o) {
  PlanReport report;
  report.options = o;
  report.candidates = micro_batch_candidates(o.setup);
  const unsigned threads = o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  report.traces = o.capture.empty() ? generated_family(o.setup) : capture_family(o.capture);
  report.fits = search(o.setup, report.traces, o, report.candidates, threads);

  report.reference_micro_batch = report.candidates.back();
  bool any = false;
  for (const auto& f : report.fits) {
    if (!f.micro_batch) continue;
    report.reference_micro_batch = any ? std::min(report.reference_micro_batch, *f.micro_batch) : *f.micro_batch;
    any = true;
  }
  if (!any) report.reference_micro_batch = report.candidates.front();
  if (!o.capture.empty()) return report;  // the script is the setup: no changes to try

  const std::vector<workload::SetupChange> changes = workload::setup_changes(o.setup);
  report.changes.resize(changes.size());
  const std::size_t base_peak = peak_requested_at(o.setup, report.reference_micro_batch);
  const unsigned inner = std::max<unsigned>(1, threads / std::max<unsigned>(1, static_cast<unsigned>(changes.size())));
  replay::parallel_for(changes.size(), threads, [&](std::size_t i) {
    PlanChange& c = report.changes[i];
    c.change = changes[i];
    const std::size_t peak = peak_requested_at(c.change.setup, report.reference_micro_batch);
    c.saves = base_peak > peak ? base_peak - peak : 0;
    c.fits = search(c.change.setup, generated_family(c.change.setup), o, report.candidates, inner);
    for (std::size_t a = 0; a < c.fits.size(); ++a) c.helps = c.helps || larger(c.fits[a], report.fits[a]);
  });
  std::stable_sort(report.changes.begin(), report.changes.end(),
                   [](const PlanChange& a, const PlanChange& b) { return a.saves > b.saves; });
  return report;
}

std::string plan_text(const PlanReport& r) {
  const PlanOptions& o = r.options;
  std::string out = fmt::format("plan: {}\ndevice capacity {}; micro-batches tried: divisors of {} (global batch / dp)\n\n",
                                plan_subject(o), gib(o.capacity),
                                o.setup.effective_global_batch() / static_cast<std::uint64_t>(o.setup.dp));
  out += fmt::format("{:<18} {:>11} {:>12} {:>15} {:>15} {:>12}\n", "allocator", "micro-batch", "accumulation",
                     "peak requested", "peak reserved", "headroom");
  std::string unfit;
  for (const auto& f : r.fits) {
    if (!f.micro_batch) {
      out += fmt::format("{:<18} {:>11} {:>12} {:>15} {:>15} {:>12}\n", f.allocator, "none", "-", "-", "-", "-");
      if (f.next) {
        replay::ReplayResult first = f.next->total;
        first.allocator = fmt::format("{} at micro-batch {}", f.allocator, r.candidates.front());
        unfit += oom_breakdown({first}, *f.next_trace);
      }
      continue;
    }
    out += fmt::format("{:<18} {:>11} {:>12} {:>15} {:>15} {:>12}\n", f.allocator, *f.micro_batch, f.accumulation,
                       gib(f.peak_requested), gib(f.peak_reserved),
                       gib(o.capacity > f.peak_reserved ? o.capacity - f.peak_reserved : 0));
  }
  if (!unfit.empty()) out += "\nnot even the smallest micro-batch fits:" + unfit;
  std::string helping;
  for (const auto& c : r.changes) {
    if (!c.helps) continue;
    std::string mbs;
    for (const auto& f : c.fits) mbs += fmt::format(" {}={}", f.allocator, f.micro_batch ? std::to_string(*f.micro_batch) : "none");
    helping += fmt::format("  {:<44} saves {:>10}:{}\n    costs: {}\n", c.change.description + " (" + c.change.options + ")",
                           gib(c.saves), mbs, c.change.cost);
  }
  if (!o.capture.empty()) return out;  // no changes tried
  out += helping.empty()
             ? "\nno single change among mixed precision, attention, checkpointing, an 8-bit optimizer, offloading, LoRA, ZeRO "
               "and sequence length lets a larger micro-batch fit\n"
             : fmt::format("\nchanges that let a larger micro-batch fit, by the memory they save at micro-batch {}"
                           " (and the micro-batch each allocator then fits):\n{}",
                           r.reference_micro_batch, helping);
  return out;
}

namespace {

enum class Traces : bool { generated, captured };  // where a plan's traces came from

nlohmann::json fit_json(const PlanFit& f, const WorkloadSetup& s, std::size_t capacity, Traces traces) {
  const bool captured = traces == Traces::captured;  // no workload options to give
  nlohmann::json next_oom = nullptr;
  if (f.next && f.next->total.first_oom) next_oom = to_json(f.next->total, f.next_trace.get())["first_oom"];
  const auto opt = [](const std::optional<std::uint64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"allocator", f.allocator},
          {"fits", f.micro_batch.has_value()},
          {"micro_batch", opt(f.micro_batch)},
          {"accumulation", f.micro_batch ? nlohmann::json(f.accumulation) : nlohmann::json(nullptr)},
          {"dp", s.dp},
          {"peak_requested_bytes", f.peak_requested},
          {"peak_reserved_bytes", f.peak_reserved},
          {"headroom_bytes", f.micro_batch && capacity > f.peak_reserved ? capacity - f.peak_reserved : 0},
          {"next_micro_batch", opt(f.next_micro_batch)},
          {"next_first_oom", next_oom},
          // The workload options of the traces replayed at micro_batch and next_micro_batch
          // (for `generate --options`): the plan keeps only what the peak needs of each step.
          {"trace_options", f.micro_batch && !captured ? nlohmann::json(plan_setup_at(s, *f.micro_batch).to_string()) : nlohmann::json(nullptr)},
          {"next_trace_options", f.next_micro_batch && !captured ? nlohmann::json(plan_setup_at(s, *f.next_micro_batch).to_string()) : nlohmann::json(nullptr)}};
}

}  // namespace

nlohmann::json plan_json(const PlanReport& r) {
  const PlanOptions& o = r.options;
  nlohmann::json fits = nlohmann::json::array();
  const Traces traces = o.capture.empty() ? Traces::generated : Traces::captured;
  for (const auto& f : r.fits) fits.push_back(fit_json(f, o.setup, o.capacity, traces));
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& c : r.changes) {
    nlohmann::json per = nlohmann::json::array();
    for (const auto& f : c.fits) per.push_back(fit_json(f, c.change.setup, o.capacity, Traces::generated));
    changes.push_back({{"change", c.change.description},
                       {"options", c.change.options},
                       {"cost", c.change.cost},
                       {"saves_bytes", c.saves},
                       {"helps", c.helps},
                       {"allocators", per}});
  }
  const bool captured = traces == Traces::captured;
  // Every target runs the program alike (the CLI gives them the same flags).
  const replay::FitTarget program = o.targets.empty() ? replay::FitTarget{} : o.targets.front();
  return {{"setup", captured ? nlohmann::json(nullptr) : nlohmann::json(o.setup.to_string())},
          {"capture", captured ? nlohmann::json(o.capture.script) : nlohmann::json(nullptr)},
          {"description", plan_subject(o)},
          {"parameters", captured ? nlohmann::json(nullptr) : nlohmann::json(o.setup.model.parameters())},
          {"capacity_bytes", o.capacity},
          {"step_at_iterations", program.step_at_iterations},
          {"device_lag", program.device_lag},
          {"global_batch", o.setup.effective_global_batch()},
          {"candidates", r.candidates},
          {"allocators", fits},
          {"reference_micro_batch", r.reference_micro_batch},
          {"changes", changes}};
}

// About how many replays make_plan() makes: a bisection over the candidates per allocator, for
// the setup and for each change.
std::uint64_t expected_plan_replays(const PlanOptions& o) {
  std::uint64_t per_search = 0;
  for (std::size_t n = micro_batch_candidates(o.setup).size() + 1; n > 1; n = (n + 1) / 2) ++per_search;
  const std::size_t changes = o.capture.empty() ? workload::setup_changes(o.setup).size() : 0;
  return per_search * o.targets.size() * (1 + changes);
}

int cmd_plan(const PlanOptions& options) {
  PlanOptions o = options;
  Progress progress(Progress::wanted(o.quiet, o.json), expected_plan_replays(o));
  progress.step(fmt::format("plan: {} allocator(s), the setup and its changes", o.targets.size()));
  if (progress.enabled()) o.on_replay = [&progress] { progress.add(1); };
  const PlanReport r = make_plan(o);
  const PlanAnswer answer = plan_answer(r);
  std::size_t page_bytes = 0;
  if (!o.report.empty()) {
    const std::string page = plan_page(r, answer);
    trace::pytorch::write_file_atomically(o.report, page, "plan report");
    page_bytes = page.size();
  }
  progress.finish();
  if (o.json) {
    nlohmann::json out = plan_json(r);
    out["answer"] = answer_json(answer);
    if (!o.report.empty()) out["report"] = {{"output", o.report}, {"bytes", page_bytes}};
    std::cout << out.dump(2) << "\n";
  } else {
    fmt::print("{}\n{}", answer.text, plan_text(r));
    if (!o.report.empty())
      fmt::print(stderr, "wrote {} ({:.1f} KiB)\n", o.report, static_cast<double>(page_bytes) / 1024.0);
  }
  return 0;
}

}  // namespace tensorpool::cli
