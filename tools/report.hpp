// report.hpp: rendering replay results as an aligned table or as JSON with stable keys.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensorpool/replay/replay.hpp"

namespace tensorpool::cli {

/// The stable JSON keys of one result (documented in docs/cli.md).
nlohmann::json to_json(const replay::ReplayResult& r);

/// One table, a row per result, columns: allocator, peak requested, peak reserved, utilization,
/// reserved at the requested peak, waste, upstream allocs/frees, maps/unmaps, syncs, OOMs, ns/op.
std::string comparison_table(const std::vector<replay::ReplayResult>& rows);

}  // namespace tensorpool::cli
