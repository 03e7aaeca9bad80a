// demo_fit.cpp: the end of `tensorpool demo`: does the built-in trace fit (the smallest device per
// allocator), and which micro-batch fits a device (a plan where the pytorch model needs a smaller
// micro-batch than tensorpool).
#include <fmt/format.h>

#include "fit.hpp"
#include "plan.hpp"
#include "report.hpp"
#include "tensorpool/replay/target.hpp"

namespace tensorpool::cli {

namespace {

// The plan of the demo: GPT-2 1.5B training with sequence lengths uniform in [512, 1024] (blocks
// of many sizes come and go, which is what fragments a cache) on a 32.5 GiB device.
constexpr const char* kPlanCommand = "tensorpool plan --model gpt2-xl --capacity 32.5GiB --global-batch 60 --options seq_dist:uniform";

PlanOptions demo_plan_options() {
  PlanOptions o;
  o.setup = workload::WorkloadSetup::for_model("gpt2-xl");
  o.setup.apply("seq_dist:uniform,global_batch:60", "demo");
  o.setup.validate();
  o.targets = replay::fit_targets(replay::target_names(), {});
  o.capacity = 65 * GiB / 2;
  return o;
}

const PlanFit* fit_of(const PlanReport& r, const std::string& allocator) {
  for (const auto& f : r.fits)
    if (f.allocator == allocator) return &f;
  return nullptr;
}

std::string mb_text(const PlanFit& f) {
  return f.micro_batch ? fmt::format("micro-batch {} ({} accumulation steps)", *f.micro_batch, f.accumulation)
                       : std::string("no micro-batch");
}

// One sentence on pytorch against the best of tensorpool's modes, from the figures.
std::string verdict(const PlanReport& r) {
  const PlanFit* pytorch = fit_of(r, "pytorch");
  const PlanFit* best = nullptr;
  for (const char* name : {"tensorpool", "tensorpool-vmm"}) {
    const PlanFit* f = fit_of(r, name);
    if (f != nullptr && f->micro_batch && (best == nullptr || !best->micro_batch || *f->micro_batch > *best->micro_batch)) best = f;
  }
  if (pytorch == nullptr || best == nullptr) return "";
  const bool smaller = !pytorch->micro_batch || *pytorch->micro_batch < *best->micro_batch;
  return smaller ? fmt::format("PyTorch's allocator (the pytorch model) fits {}; {} fits {}.\n", mb_text(*pytorch),
                               best->allocator, mb_text(*best))
                 : fmt::format("Here the pytorch model fits {}, as large as tensorpool's {}.\n", mb_text(*pytorch),
                               mb_text(*best));
}

}  // namespace

std::string demo_fit_and_plan(const trace::Trace& trace, nlohmann::json* json) {
  replay::FitOptions fo;
  fo.targets = replay::fit_targets(replay::target_names(), {});
  const auto fits = replay::fit(trace, fo);
  const PlanReport plan = make_plan(demo_plan_options());
  if (json != nullptr) {
    (*json)["fit"] = fit_json(fits, trace);
    (*json)["plan"] = plan_json(plan);
    (*json)["plan_command"] = kPlanCommand;
  }
  std::string out = fmt::format("\nDoes it fit? The smallest device each allocator replays this trace on without running out\n"
                                "of memory (tensorpool fit; bisection to {}, checked 1% below):\n\n",
                                tolerance_text(fo));
  out += fmt::format("  {:<18} {:>10} {:>18}\n", "allocator", "fits GiB", "x peak requested");
  for (const auto& r : fits)
    out += fmt::format("  {:<18} {:>10.3f} {:>18.4f}\n", r.allocator, static_cast<double>(r.capacity) / static_cast<double>(GiB),
                       r.devices.empty() ? 0.0 : r.devices[0].ratio);
  out += "(rmm-pool and rmm-arena at their defaults, sized by the device: an initial pool, an arena, of half\n"
         " of it; the arena must hold the peak, so its device is twice that.)\n";
  out += fmt::format("\nWhich micro-batch fits? {}\n({}):\n\n", kPlanCommand, plan.options.setup.describe());
  out += fmt::format("  {:<18} {:>11} {:>12} {:>14}\n", "allocator", "micro-batch", "accumulation", "peak reserved");
  for (const auto& f : plan.fits)
    out += fmt::format("  {:<18} {:>11} {:>12} {:>14}\n", f.allocator, f.micro_batch ? std::to_string(*f.micro_batch) : "none",
                       f.micro_batch ? std::to_string(f.accumulation) : "-",
                       f.micro_batch ? fmt::format("{:.2f} GiB", static_cast<double>(f.peak_reserved) / static_cast<double>(GiB))
                                     : std::string("-"));
  out += "\n" + verdict(plan);
  for (const auto& c : plan.changes) {
    if (!c.helps) continue;
    out += fmt::format("The change that saves most: {} ({}), {:.2f} GiB less at micro-batch {}.\n", c.change.description,
                       c.change.options, static_cast<double>(c.saves) / static_cast<double>(GiB), plan.reference_micro_batch);
    break;
  }
  return out;
}

}  // namespace tensorpool::cli
