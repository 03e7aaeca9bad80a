// tensorpool/cost_model.hpp: the host cost of each upstream call, as the simulated device charges
// it (DeviceCounters::modelled_ns), as a function of the call's bytes.
//
// Each call has a table of (bytes, ns) points; the cost of a call of `b` bytes is read off the
// piecewise-linear curve through them: the first point's cost below the first point, the line
// through the last two points beyond the last (so a cost that grows with bytes keeps growing),
// never below 0. A call with one point costs the same at every size.
//
// The default model (CostModel{}, `--cost-model default`) grows with bytes, from public
// measurements (sources and reasoning: docs/benchmarks.md, "The simulated device's cost model"):
//
//     call                           2 MiB      1 GiB     (below 2 MiB: the 2 MiB cost)
//     physical_create (cuMemCreate)  193.3 us   31.2 ms
//     map (cuMemMap + SetAccess)     37.4 us    0.5 ms
//     unmap (cuMemUnmap)             25.6 us    0.5 ms
//     physical_release (cuMemRelease) 4.9 us    2.5 ms
//     segment_alloc (cudaMalloc)     230.7 us   31.7 ms   (create + map; 50 us up to 512 KiB)
//     segment_free (cudaFree)        30.5 us    3.0 ms    (unmap + release)
//
// CostModel::flat() (`--cost-model flat`) is the flat model the simulated device charged before
// (20 us per segment allocation or map, 10 us per segment free, 15 us per physical creation or
// unmap, physical releases free). scripts/gpu-check.sh measures these calls on a real GPU and
// writes them in the file format below; a file replaces the default for the calls it lists.
//
// File format (load_cost_model), text, one point per line, '#' starts a comment, blank lines
// ignored:
//
//     # tensorpool cost model v1
//     segment_alloc 2097152 9500
//     segment_alloc 1073741824 310000
//
// Fields: a call name (segment_alloc = cudaMalloc, segment_free = cudaFree, physical_create =
// cuMemCreate, physical_release = cuMemRelease, map = cuMemMap + cuMemSetAccess, unmap =
// cuMemUnmap, malloc_async = cudaMallocAsync, free_async = cudaFreeAsync), bytes, nanoseconds
// (non-negative integers). Calls not in the file keep the default cost. The async calls are
// recorded for comparison and charged by no simulated call today.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tensorpool {

enum class CostedCall : std::uint8_t {
  segment_alloc,
  segment_free,
  physical_create,
  physical_release,
  map,
  unmap,
  malloc_async,
  free_async,
};
inline constexpr std::size_t kNumCostedCalls = 8;

const char* to_string(CostedCall call) noexcept;
bool parse_costed_call(std::string_view name, CostedCall& out) noexcept;

class CostModel {
 public:
  /// The default model, which grows with bytes (see the banner); source() "default".
  CostModel();
  /// The flat model the simulated device charged before; source() "flat".
  static CostModel flat();
  /// The default model, shared (what a simulated device without a model of its own charges).
  static const CostModel& standard();

  /// ns for one call of `bytes` bytes.
  std::uint64_t cost(CostedCall call, std::size_t bytes) const noexcept;

  /// Replaces the points of `call` (sorted by bytes; equal bytes: the last one wins).
  void set(CostedCall call, std::vector<std::pair<std::size_t, std::uint64_t>> points);
  const std::vector<std::pair<std::size_t, std::uint64_t>>& points(CostedCall call) const noexcept {
    return points_[static_cast<std::size_t>(call)];
  }
  /// Where the model came from ("default" or the file's path).
  const std::string& source() const noexcept { return source_; }
  void set_source(std::string s) { source_ = std::move(s); }

 private:
  // Invariant: each table is non-empty and sorted by strictly increasing bytes.
  std::array<std::vector<std::pair<std::size_t, std::uint64_t>>, kNumCostedCalls> points_;
  std::string source_ = "default";
};

/// Parses the text of a cost-model file; `name` is used in errors ("NAME: line N: PROBLEM").
/// Throws ConfigError.
CostModel parse_cost_model(std::string_view text, const std::string& name);
/// Reads and parses a cost-model file; the names "default" and "flat" give those models.
/// Throws ConfigError (unreadable file, bad line).
CostModel load_cost_model(const std::string& path);

}  // namespace tensorpool
