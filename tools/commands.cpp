// commands.cpp: what each subcommand does.
#include "commands.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "report.hpp"
#include "tensorpool/replay/generator.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/load.hpp"

namespace tensorpool::cli {

using nlohmann::json;
using trace::Op;

namespace {

// --- info -----------------------------------------------------------------------------------

struct Histogram {
  std::vector<std::uint64_t> bounds;  // upper bounds (inclusive); the last bucket is open
  std::vector<std::uint64_t> counts;
  std::vector<std::uint64_t> bytes;
  explicit Histogram(std::vector<std::uint64_t> b) : bounds(std::move(b)), counts(bounds.size() + 1), bytes(bounds.size() + 1) {}
  void add(std::uint64_t value, std::uint64_t weight) {
    const auto i = static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
    ++counts[i];
    bytes[i] += weight;
  }
};

std::string bound_text(std::uint64_t b, bool is_bytes) {
  return is_bytes ? format_bytes(b) : std::to_string(b);
}

json histogram_json(const Histogram& h, const char* key) {
  json out = json::array();
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    json row = {{"count", h.counts[i]}, {"bytes", h.bytes[i]}};
    row[key] = i < h.bounds.size() ? json(h.bounds[i]) : json(nullptr);
    out.push_back(row);
  }
  return out;
}

void print_histogram(const Histogram& h, const char* title, bool is_bytes) {
  fmt::print("{}\n", title);
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    if (h.counts[i] == 0) continue;
    const std::string label = i < h.bounds.size() ? "<= " + bound_text(h.bounds[i], is_bytes)
                                                   : "> " + bound_text(h.bounds.back(), is_bytes);
    fmt::print("  {:<14} {:>9} allocations {:>12}\n", label, h.counts[i], format_bytes(h.bytes[i]));
  }
}

}  // namespace

int cmd_info(const std::string& path, bool as_json) {
  const trace::SourceKind kind = trace::detect_source(path);
  const trace::Trace t = trace::load_trace(path);
  std::map<std::string, std::uint64_t> ops;
  std::set<int> devices;
  std::set<std::pair<int, std::uint64_t>> streams;
  Histogram sizes({512, 4 * KiB, 64 * KiB, MiB, 10 * MiB, 100 * MiB, GiB});
  Histogram lifetimes({1, 10, 100, 1000, 10000, 100000});
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::uint64_t>> born;  // addr -> (index, size)
  std::map<std::string, std::uint64_t> label_bytes;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    ++ops[trace::to_string(e.op)];
    devices.insert(e.device);
    if (e.op == Op::alloc || e.op == Op::seed_alloc) {
      streams.insert({e.device, e.stream});
      sizes.add(e.size, e.size);
      born[e.addr ^ (std::uint64_t{e.device} << 56)] = {i, e.size};
      if (e.label != 0) label_bytes[t.labels[e.label]] += e.size;
    } else if (e.op == Op::free_requested) {
      auto it = born.find(e.addr ^ (std::uint64_t{e.device} << 56));
      if (it != born.end()) {
        lifetimes.add(i - it->second.first, it->second.second);
        born.erase(it);
      }
    }
  }
  replay::TraceSource source(t);
  const replay::BaselineReport recorded = replay::baseline(source);
  std::vector<std::pair<std::uint64_t, std::string>> top;
  for (const auto& [label, bytes] : label_bytes) top.emplace_back(bytes, label);
  std::sort(top.rbegin(), top.rend());
  top.resize(std::min<std::size_t>(top.size(), 8));

  if (as_json) {
    json j = {{"trace", path}, {"kind", trace::to_string(kind)}, {"source", t.info.source},
              {"metadata", t.info.metadata}, {"events", t.events.size()}, {"ops", ops},
              {"devices", devices}, {"streams", streams.size()},
              {"size_histogram", histogram_json(sizes, "le_bytes")},
              {"lifetime_histogram", histogram_json(lifetimes, "le_events")},
              {"never_freed", born.size()},
              {"peak_requested_bytes", recorded.total.result.peak_requested}};
    json rec = {{"present", recorded.total.present}};
    if (recorded.total.present) rec.update(to_json(recorded.total.result));
    j["recorded"] = rec;
    json labels = json::array();
    for (const auto& [bytes, label] : top) labels.push_back({{"label", label}, {"bytes", bytes}});
    j["top_labels"] = labels;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("{}: {} ({})\n", path, trace::to_string(kind), t.info.source);
  fmt::print("events: {}\n", t.events.size());
  for (const auto& [op, n] : ops) fmt::print("  {:<16} {:>9}\n", op, n);
  fmt::print("devices: {}   allocating streams: {}\n", devices.size(), streams.size());
  print_histogram(sizes, "allocation sizes:", true);
  print_histogram(lifetimes, "lifetimes (events from alloc to free):", false);
  fmt::print("  never freed in the window: {}\n", born.size());
  fmt::print("peak requested: {}\n", format_bytes(recorded.total.result.peak_requested));
  if (recorded.total.present) {
    const auto& r = recorded.total.result;
    fmt::print("recorded allocator: peak reserved {}, utilization {:.4f}, {} segment allocs, {} frees, "
               "{} maps, {} unmaps, {} OOMs\n",
               format_bytes(r.peak_reserved), r.utilization, r.upstream.allocs, r.upstream.frees,
               r.upstream.maps, r.upstream.unmaps, r.ooms);
  }
  if (!top.empty()) {
    fmt::print("top allocation sites by bytes:\n");
    for (const auto& [bytes, label] : top) fmt::print("  {:>12}  {}\n", format_bytes(bytes), label);
  }
  for (const auto& m : t.info.metadata) fmt::print("metadata: {}\n", m);
  return 0;
}

// --- replay and compare ---------------------------------------------------------------------

namespace {

std::vector<replay::ReplayReport> run_all(const trace::Trace& t, const RunOptions& o) {
  std::vector<replay::ReplayReport> reports;
  for (const auto& name : o.allocators) {
    replay::TraceSource source(t);
    replay::ReplayOptions ro;
    ro.allocator = name;
    ro.device = o.device;
    ro.warmup = o.warmup;
    ro.attempt_ooms = o.attempt_ooms;
    ro.target.capacity = o.capacity;
    ro.target.conf = name.rfind("tensorpool", 0) == 0 ? o.conf : "";  // --conf is tensorpool's
    reports.push_back(replay::replay(source, ro));
  }
  return reports;
}

json report_json(const replay::ReplayReport& r) {
  json devices = json::array();
  for (const auto& d : r.devices) devices.push_back(to_json(d));
  json j = to_json(r.total);
  j["devices"] = devices;
  return j;
}

}  // namespace

int cmd_replay(const RunOptions& o) {
  const trace::Trace t = trace::load_trace(o.trace);
  const auto reports = run_all(t, o);
  const auto& r = reports.front();
  if (o.json) {
    std::cout << report_json(r).dump(2) << "\n";
    return 0;
  }
  std::vector<replay::ReplayResult> rows = {r.total};
  if (r.devices.size() > 1) {
    rows = r.devices;
    rows.push_back(r.total);
  }
  fmt::print("{}\n{}", o.trace, comparison_table(rows));
  return 0;
}

int cmd_compare(const RunOptions& o) {
  const trace::Trace t = trace::load_trace(o.trace);
  replay::TraceSource source(t);
  const replay::BaselineReport recorded = replay::baseline(source, "pytorch-actual", o.device);
  const auto reports = run_all(t, o);
  if (o.json) {
    json j = {{"trace", o.trace}, {"capacity_bytes", o.capacity}, {"warmup", o.warmup}};
    j["recorded"] = recorded.total.present ? to_json(recorded.total.result) : json(nullptr);
    json rows = json::array();
    for (const auto& r : reports) rows.push_back(report_json(r));
    j["allocators"] = rows;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<replay::ReplayResult> rows;
  if (recorded.total.present) rows.push_back(recorded.total.result);
  for (const auto& r : reports) rows.push_back(r.total);
  fmt::print("{} (capacity {})\n{}", o.trace, format_bytes(o.capacity), comparison_table(rows));
  return 0;
}

// --- convert, generate, demo ------------------------------------------------------------------

int cmd_convert(const std::string& in, const std::string& out, bool allow_truncated) {
  const trace::Format format = trace::format_from_extension(out);
  const trace::SourceKind kind = trace::detect_source(in);
  if (kind == trace::SourceKind::native_binary || kind == trace::SourceKind::native_jsonl) {
    // Streamed: memory independent of the length.
    const auto cut = trace::convert_trace(in, out, format, {.allow_truncated = allow_truncated});
    if (cut) {
      const std::string verified =
          cut->verified_bytes == 0 ? "no checkpoint"
                                   : fmt::format("{} verified by the last checkpoint, in the first {} "
                                                 "bytes of {}", cut->verified_events, cut->verified_bytes,
                                                 cut->file_bytes);
      fmt::print(stderr, "{}: cut short: kept the {} events before the cut ({}); the reader says: {}\n",
                 in, cut->events, verified, cut->problem);
    }
  } else if (allow_truncated) {
    throw UsageError(fmt::format("{}: --allow-truncated applies to tensorpool traces (.tptrace or "
                                 ".jsonl), not to a {}", in, trace::to_string(kind)));
  } else {
    trace::write_trace(out, trace::load_trace(in), format);
  }
  fmt::print(stderr, "wrote {} ({})\n", out, trace::to_string(format));
  return 0;
}

int cmd_generate(const std::string& out, const std::string& options) {
  replay::GeneratorOptions g;
  g.apply(options);
  const trace::Trace t = replay::generate_llm_trace(g);
  trace::write_trace(out, t, trace::format_from_extension(out));
  fmt::print(stderr, "wrote {}: {} events ({})\n", out, t.events.size(), g.to_string());
  return 0;
}

int cmd_demo(bool as_json) {
  replay::GeneratorOptions g;  // a 1.0B-parameter decoder, varlen batches, 6 training steps
  const trace::Trace t = replay::generate_llm_trace(g);
  RunOptions o;
  o.allocators = replay::target_names();
  const auto reports = run_all(t, o);
  if (as_json) {
    json rows = json::array();
    for (const auto& r : reports) rows.push_back(report_json(r));
    std::cout << json{{"trace", g.to_string()}, {"events", t.events.size()}, {"allocators", rows}}.dump(2)
              << "\n";
    return 0;
  }
  fmt::print("tensorpool demo: a built-in LLM training trace ({} events)\n  {}\n", t.events.size(),
             g.to_string());
  fmt::print("replayed against each allocator on a simulated 80 GiB device:\n\n");
  std::vector<replay::ReplayResult> rows;
  for (const auto& r : reports) rows.push_back(r.total);
  fmt::print("{}\n", comparison_table(rows));
  fmt::print("req/rsv GiB: peak requested / peak reserved; util = requested / reserved peak;\n"
             "seg+/seg-: device allocations/frees during the trace (start: calls made for the blocks\n"
             "live when a trace begins mid-run); ns/op: host time per alloc or free.\n"
             "Try: tensorpool compare <your PyTorch snapshot.pickle>\n");
  return 0;
}

}  // namespace tensorpool::cli
