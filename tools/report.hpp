// report.hpp: rendering replay results as an aligned table or as JSON with stable keys.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::cli {

/// The stable JSON keys of one result (documented in docs/cli.md). With the trace, the first
/// OOM's allocation label is given by name.
nlohmann::json to_json(const replay::ReplayResult& r, const trace::Trace* trace = nullptr);

/// The first OOM of each row that had one, explained: the request, where it was in the trace,
/// reserved, allocated, device free, largest free block, cached bytes per stream. "" if none.
std::string oom_breakdown(const std::vector<replay::ReplayResult>& rows, const trace::Trace& trace);

/// One table, a row per result, columns: allocator, peak requested, peak reserved, utilization,
/// reserved at the requested peak, waste, upstream allocs/frees, maps/unmaps, syncs, OOMs, ns/op.
std::string comparison_table(const std::vector<replay::ReplayResult>& rows);

}  // namespace tensorpool::cli
