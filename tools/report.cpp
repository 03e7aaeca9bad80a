// report.cpp: tables and JSON for replay results.
#include "report.hpp"

#include <fmt/format.h>

#include "tensorpool/types.hpp"

namespace tensorpool::cli {

nlohmann::json to_json(const replay::ReplayResult& r) {
  const auto upstream = [](const replay::UpstreamCounts& u) {
    return nlohmann::json{{"allocs", u.allocs}, {"frees", u.frees}, {"maps", u.maps},
                          {"unmaps", u.unmaps}, {"syncs", u.syncs}, {"modelled_ns", u.modelled_ns}};
  };
  nlohmann::json j = {
      {"allocator", r.allocator},
      {"device", r.device},
      {"events", r.events},
      {"allocs", r.allocs},
      {"frees", r.frees},
      {"unmatched_frees", r.unmatched_frees},
      {"peak_requested_bytes", r.peak_requested},
      {"peak_allocated_bytes", r.peak_allocated},
      {"peak_reserved_bytes", r.peak_reserved},
      {"reserved_at_requested_peak_bytes", r.reserved_at_requested_peak},
      {"final_reserved_bytes", r.final_reserved},
      {"utilization", r.utilization},
      {"waste_bytes", r.waste},
      {"upstream_allocs", r.upstream.allocs},
      {"upstream_frees", r.upstream.frees},
      {"maps", r.upstream.maps},
      {"unmaps", r.upstream.unmaps},
      {"upstream_ops", r.upstream.total()},
      {"seeding_upstream_ops", r.seeding.total()},
      {"upstream_ops_with_seeding", r.seeding.total() + r.upstream.total()},
      {"syncs", r.upstream.syncs},
      {"modelled_upstream_ns", r.upstream.modelled_ns},
      {"ooms", r.ooms},
      {"host_ns_per_op", r.host_ns_per_op},
      {"iterations", r.iterations},
  };
  if (r.iterations >= 2) j["upstream_after_first_iteration"] = upstream(r.upstream_after_first_iteration);
  return j;
}

namespace {
std::string gib(std::size_t bytes) { return fmt::format("{:.3f}", static_cast<double>(bytes) / static_cast<double>(GiB)); }
}  // namespace

std::string comparison_table(const std::vector<replay::ReplayResult>& rows) {
  std::string out = fmt::format("{:<18} {:>10} {:>10} {:>7} {:>10} {:>9} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>5} {:>8}\n",
                                "allocator", "req GiB", "rsv GiB", "util", "rsv@req", "waste",
                                "seg+", "seg-", "map", "unmap", "start", "syncs", "OOMs", "ns/op");
  for (const auto& r : rows) {
    const std::string ns = r.host_ns_per_op > 0 ? fmt::format("{:.0f}", r.host_ns_per_op) : "-";
    out += fmt::format("{:<18} {:>10} {:>10} {:>7.4f} {:>10} {:>9} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>5} {:>8}\n",
                       r.allocator, gib(r.peak_requested), gib(r.peak_reserved), r.utilization,
                       gib(r.reserved_at_requested_peak), gib(r.waste), r.upstream.allocs,
                       r.upstream.frees, r.upstream.maps, r.upstream.unmaps, r.seeding.total(),
                       r.upstream.syncs, r.ooms, ns);
  }
  return out;
}

}  // namespace tensorpool::cli
