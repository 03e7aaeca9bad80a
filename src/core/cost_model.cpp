// cost_model.cpp: the simulated device's cost of upstream calls: evaluation and the file loader
// (format in tensorpool/cost_model.hpp).
#include "tensorpool/cost_model.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

#include "tensorpool/errors.hpp"

namespace tensorpool {

namespace {

constexpr std::array<const char*, kNumCostedCalls> kCallNames = {
    "segment_alloc", "segment_free", "physical_create", "physical_release",
    "map",           "unmap",        "malloc_async",    "free_async"};

using Points = std::vector<std::pair<std::size_t, std::uint64_t>>;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// The default model, per call, from public measurements (docs/benchmarks.md, "The simulated
// device's cost model", has the sources and the reasoning; cost_model.hpp the summary):
//   2 MiB points: one call on one 2 MiB page, A100 (kvcached's bench_vmm: cuMemCreate 193.3 us,
//     cuMemMap 1.45 + cuMemSetAccess 36.0, cuMemUnmap 25.6);
//   1 GiB points: a 1 GiB pool allocation that creates and releases its memory each time, 31.2 ms
//     (vortex PR 7831), taken as creation; unmapping and releasing at "a few ms per GiB"
//     (torch_memory_saver issue 111), 3 ms, of which 0.5 unmapping; mapping costs per handle
//     more than per byte (PyTorch's expandable-segments notes), 0.5 ms per GiB as unmapping;
//   cudaMalloc = cuMemCreate + cuMemMap of its size (it does that work in the driver), and
//     50 us up to 512 KiB; cudaFree = cuMemUnmap + cuMemRelease.
// The stream-ordered pool calls are charged by no simulated call: 0.
const std::array<Points, kNumCostedCalls>& default_points() {
  static const std::array<Points, kNumCostedCalls> points = {
      Points{{512 * 1024, 50'000}, {2 * kMiB, 230'700}, {kGiB, 31'700'000}},  // segment_alloc
      Points{{2 * kMiB, 30'500}, {kGiB, 3'000'000}},                           // segment_free
      Points{{2 * kMiB, 193'300}, {kGiB, 31'200'000}},                         // physical_create
      Points{{2 * kMiB, 4'900}, {kGiB, 2'500'000}},                            // physical_release
      Points{{2 * kMiB, 37'400}, {kGiB, 500'000}},                             // map
      Points{{2 * kMiB, 25'600}, {kGiB, 500'000}},                             // unmap
      Points{{0, 0}},                                                          // malloc_async
      Points{{0, 0}},                                                          // free_async
  };
  return points;
}

// The flat costs the simulated device charged before the default model grew with bytes.
constexpr std::array<std::uint64_t, kNumCostedCalls> kFlatNs = {20'000, 10'000, 15'000, 0,
                                                                20'000, 15'000, 0,      0};

std::uint64_t clamp_ns(double v) noexcept {
  if (v <= 0) return 0;
  if (v >= 1.8e19) return UINT64_MAX;
  return static_cast<std::uint64_t>(v + 0.5);
}

bool parse_u64(std::string_view s, std::uint64_t& out) noexcept {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

const char* to_string(CostedCall call) noexcept { return kCallNames[static_cast<std::size_t>(call)]; }

bool parse_costed_call(std::string_view name, CostedCall& out) noexcept {
  for (std::size_t i = 0; i < kNumCostedCalls; ++i) {
    if (name == kCallNames[i]) {
      out = static_cast<CostedCall>(i);
      return true;
    }
  }
  return false;
}

CostModel::CostModel() : points_(default_points()) {}

CostModel CostModel::flat() {
  CostModel m;
  for (std::size_t i = 0; i < kNumCostedCalls; ++i) m.points_[i] = {{0, kFlatNs[i]}};
  m.source_ = "flat";
  return m;
}

const CostModel& CostModel::standard() {
  static const CostModel model;
  return model;
}

void CostModel::set(CostedCall call, std::vector<std::pair<std::size_t, std::uint64_t>> points) {
  if (points.empty()) throw ConfigError(std::string("cost model: no points for ") + to_string(call));
  std::stable_sort(points.begin(), points.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<std::size_t, std::uint64_t>> unique;
  for (const auto& p : points) {
    if (!unique.empty() && unique.back().first == p.first) unique.back() = p;
    else unique.push_back(p);
  }
  points_[static_cast<std::size_t>(call)] = std::move(unique);
}

std::uint64_t CostModel::cost(CostedCall call, std::size_t bytes) const noexcept {
  const auto& pts = points_[static_cast<std::size_t>(call)];
  if (pts.size() == 1 || bytes <= pts.front().first) return pts.front().second;
  // The segment [lo, hi] holding bytes, or the last one for extrapolation.
  auto hi = std::upper_bound(pts.begin(), pts.end(), bytes,
                             [](std::size_t b, const auto& p) { return b < p.first; });
  if (hi == pts.end()) --hi;
  const auto lo = std::prev(hi);
  const double slope = (static_cast<double>(hi->second) - static_cast<double>(lo->second)) /
                       static_cast<double>(hi->first - lo->first);
  return clamp_ns(static_cast<double>(lo->second) +
                  slope * (static_cast<double>(bytes) - static_cast<double>(lo->first)));
}

CostModel parse_cost_model(std::string_view text, const std::string& name) {
  std::array<std::vector<std::pair<std::size_t, std::uint64_t>>, kNumCostedCalls> tables;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string call_name, bytes_text, ns_text, extra;
    if (!(fields >> call_name)) continue;  // blank or comment
    auto fail = [&](const std::string& what) {
      throw ConfigError(name + ": line " + std::to_string(number) + ": " + what);
    };
    CostedCall call{};
    if (!parse_costed_call(call_name, call))
      fail("unknown call '" + call_name + "' (known: segment_alloc, segment_free, physical_create, "
           "physical_release, map, unmap, malloc_async, free_async)");
    std::uint64_t bytes = 0, ns = 0;
    if (!(fields >> bytes_text >> ns_text) || !parse_u64(bytes_text, bytes) || !parse_u64(ns_text, ns))
      fail("expected 'CALL BYTES NANOSECONDS' with non-negative integers, got '" + line + "'");
    if (fields >> extra) fail("unexpected field '" + extra + "' after the nanoseconds");
    tables[static_cast<std::size_t>(call)].emplace_back(static_cast<std::size_t>(bytes), ns);
  }
  CostModel model;  // calls the file leaves out keep the default's cost
  for (std::size_t i = 0; i < kNumCostedCalls; ++i)
    if (!tables[i].empty()) model.set(static_cast<CostedCall>(i), std::move(tables[i]));
  model.set_source(name);
  return model;
}

CostModel load_cost_model(const std::string& path) {
  if (path == "default") return CostModel{};
  if (path == "flat") return CostModel::flat();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path + ": cannot open the cost-model file");
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) throw ConfigError(path + ": read error");
  return parse_cost_model(text.str(), path);
}

}  // namespace tensorpool
