// report.cpp: tables and JSON for replay results.
#include "report.hpp"

#include <fmt/format.h>

#include "tensorpool/types.hpp"

namespace tensorpool::cli {

namespace {

std::string label_of(const replay::OomReport& o, const trace::Trace* t) {
  return t != nullptr && o.label < t->labels.size() ? t->labels[o.label] : std::string();
}

nlohmann::json oom_json(const replay::OomReport& o, const trace::Trace* t) {
  const OutOfMemoryInfo& i = o.info;
  nlohmann::json cached = nlohmann::json::array();
  for (const auto& c : i.cached_per_stream) cached.push_back({{"stream", c.stream}, {"bytes", c.bytes}});
  return {{"device", o.device},
          {"event", o.event},
          {"time_us", o.time_us},
          {"label", label_of(o, t)},
          {"requested_bytes", i.requested},
          {"rounded_bytes", i.rounded},
          {"stream", i.stream},
          {"capacity_bytes", i.capacity},
          {"device_free_bytes", i.device_free},
          {"reserved_bytes", i.reserved},
          {"allocated_bytes", i.allocated},
          {"reserved_unallocated_bytes", i.reserved_unallocated},
          {"largest_free_block_bytes", i.largest_free_block},
          {"memory_limit_bytes", i.memory_limit},
          {"cached_per_stream", cached}};
}

}  // namespace

nlohmann::json to_json(const replay::ReplayResult& r, const trace::Trace* trace) {
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
  if (!r.per_iteration.empty()) {
    nlohmann::json its = nlohmann::json::array();
    for (const replay::IterationResult& it : r.per_iteration) {
      nlohmann::json one = upstream(it.upstream);
      one["upstream_ops"] = it.upstream.total();
      one["peak_requested_bytes"] = it.peak_requested;
      one["peak_reserved_bytes"] = it.peak_reserved;
      its.push_back(std::move(one));
    }
    j["per_iteration"] = std::move(its);
  }
  j["first_oom"] = r.first_oom ? oom_json(*r.first_oom, trace) : nlohmann::json(nullptr);
  return j;
}

std::string oom_breakdown(const std::vector<replay::ReplayResult>& rows, const trace::Trace& trace) {
  std::string out;
  for (const auto& r : rows) {
    if (!r.first_oom) continue;
    const replay::OomReport& o = *r.first_oom;
    const OutOfMemoryInfo& i = o.info;
    const std::string label = label_of(o, &trace);
    const std::string refused =
        r.stopped_at_first_oom ? "the replay stopped there" : fmt::format("{} refused", r.ooms);
    out += fmt::format("\nfirst OOM of {} ({}): {} ({} bytes) on device {}, stream {}, event {} (t={} us){}\n",
                       r.allocator, refused, format_bytes(i.requested), i.requested, o.device, i.stream,
                       o.event, o.time_us, label.empty() ? "" : ", allocated by " + label);
    out += fmt::format("  capacity {}, device free {}, reserved {}, allocated {}, reserved but unallocated {},\n"
                       "  largest free block {}",
                       format_bytes(i.capacity), format_bytes(i.device_free), format_bytes(i.reserved),
                       format_bytes(i.allocated), format_bytes(i.reserved_unallocated),
                       format_bytes(i.largest_free_block));
    if (i.memory_limit != 0) out += fmt::format(", memory limit {}", format_bytes(i.memory_limit));
    out += "\n  cached free per stream:";
    if (i.cached_per_stream.empty()) out += " none";
    for (const auto& c : i.cached_per_stream) out += fmt::format(" {}={}", c.stream, format_bytes(c.bytes));
    out += "\n";
  }
  return out;
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
