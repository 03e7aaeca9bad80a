// fit.hpp: `tensorpool fit`: the smallest capacity each allocator replays a trace on without an
// OOM (replay::fit), as text and JSON.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tensorpool/replay/fit.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::cli {

/// The targets of a search, one per run.allocators, each as replay_options() gives it to replay
/// and compare (its --conf and --allocator-conf settings, the --cost-model).
std::vector<replay::FitTarget> fit_targets(const RunOptions& run);

/// fit: run.trace, run.allocators, run.confs, run.device, run.warmup, run.json; from `search`
/// its threads and tolerances (--threads, --precision-pct, --precision-bytes).
int cmd_fit(const RunOptions& run, const replay::FitOptions& search);

/// The fit table (one row per allocator and device) and each first OOM just below a fit;
/// `options`: the search's (for the tolerance the legend states).
std::string fit_text(const std::vector<replay::FitResult>& results, const trace::Trace& trace,
                     const replay::FitOptions& options);

/// "0.5% or 2 MiB": the tolerance of a search, as the text output states it.
std::string tolerance_text(const replay::FitOptions& options);
nlohmann::json fit_json(const std::vector<replay::FitResult>& results, const trace::Trace& trace);

/// The end of `tensorpool demo` (demo_fit.cpp): the fit of `trace` per allocator, and a plan where
/// the pytorch model needs a smaller micro-batch than tensorpool. Returns the text; fills *json
/// (keys fit, plan, plan_command) when not null.
std::string demo_fit_and_plan(const trace::Trace& trace, nlohmann::json* json);

}  // namespace tensorpool::cli
