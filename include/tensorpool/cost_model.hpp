// tensorpool/cost_model.hpp: the host cost of each upstream call, as the simulated device charges
// it (DeviceCounters::modelled_ns), as a function of the call's bytes.
//
// Each call has a table of (bytes, ns) points; the cost of a call of `b` bytes is read off the
// piecewise-linear curve through them: the first point's cost below the first point, the line
// through the last two points beyond the last (so a cost that grows with bytes keeps growing),
// never below 0. A call with one point costs the same at every size. The default model is the
// flat one the simulated device has always charged (20 us per segment allocation or map, 10 us
// per segment free, 15 us per physical creation or unmap, physical releases free).
//
// File format (load_cost_model; scripts/gpu-check.sh writes one from real-GPU medians), text,
// one point per line, '#' starts a comment, blank lines ignored:
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
  /// The flat default (see the banner).
  CostModel();

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
/// Reads and parses a cost-model file. Throws ConfigError (unreadable file, bad line).
CostModel load_cost_model(const std::string& path);

}  // namespace tensorpool
