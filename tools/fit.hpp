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

/// fit: run.trace, run.allocators, run.confs, run.device, run.warmup, run.json; `threads` replays
/// at once (0: one per core).
int cmd_fit(const RunOptions& run, unsigned threads);

/// The fit table (one row per allocator and device) and each first OOM just below a fit.
std::string fit_text(const std::vector<replay::FitResult>& results, const trace::Trace& trace);
nlohmann::json fit_json(const std::vector<replay::FitResult>& results, const trace::Trace& trace);

}  // namespace tensorpool::cli
