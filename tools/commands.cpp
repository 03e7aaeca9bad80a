// commands.cpp: what each subcommand does: calls into the libraries, and the printing of their
// results (text and JSON).
#include "commands.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fit.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/load.hpp"
#include "tensorpool/trace/summary.hpp"
#include "tensorpool/workload/setup.hpp"

namespace tensorpool::cli {

using nlohmann::json;
using trace::Op;

namespace {

// --- info -----------------------------------------------------------------------------------

std::string bound_text(std::uint64_t b, bool is_bytes) {
  return is_bytes ? format_bytes(b) : std::to_string(b);
}

json histogram_json(const trace::Histogram& h, const char* key) {
  json out = json::array();
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    json row = {{"count", h.counts[i]}, {"bytes", h.bytes[i]}};
    row[key] = i < h.bounds.size() ? json(h.bounds[i]) : json(nullptr);
    out.push_back(row);
  }
  return out;
}

void print_histogram(const trace::Histogram& h, const char* title, bool is_bytes) {
  fmt::print("{}\n", title);
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    if (h.counts[i] == 0) continue;
    const std::string label = i < h.bounds.size() ? "<= " + bound_text(h.bounds[i], is_bytes)
                                                   : "> " + bound_text(h.bounds.back(), is_bytes);
    fmt::print("  {:<14} {:>9} allocations {:>12}\n", label, h.counts[i], format_bytes(h.bytes[i]));
  }
}

// Events per operation name, for the operations present (alphabetical, as JSON objects are).
std::map<std::string, std::uint64_t> ops_by_name(const trace::TraceSummary& s) {
  std::map<std::string, std::uint64_t> ops;
  for (int op = 0; op < trace::kNumOps; ++op)
    if (s.ops[static_cast<std::size_t>(op)] != 0)
      ops[trace::to_string(static_cast<Op>(op))] = s.ops[static_cast<std::size_t>(op)];
  return ops;
}

void print_info_json(const std::string& path, const trace::LoadedTrace& loaded,
                     const trace::TraceSummary& s, const replay::Baseline& recorded) {
  const trace::Trace& t = loaded.trace;
  json j = {{"trace", path}, {"kind", trace::to_string(loaded.kind)}, {"source", t.info.source},
            {"metadata", t.info.metadata}, {"events", s.events}, {"ops", ops_by_name(s)},
            {"devices", s.devices}, {"streams", s.streams},
            {"size_histogram", histogram_json(s.sizes, "le_bytes")},
            {"lifetime_histogram", histogram_json(s.lifetimes, "le_events")},
            {"never_freed", s.never_freed},
            {"peak_requested_bytes", s.peak_requested}};
  json rec = {{"present", recorded.present}};
  if (recorded.present) rec.update(to_json(recorded.result));
  j["recorded"] = rec;
  json labels = json::array();
  for (const auto& l : s.top_labels) labels.push_back({{"label", l.label}, {"bytes", l.bytes}});
  j["top_labels"] = labels;
  std::cout << j.dump(2) << "\n";
}

void print_info_text(const std::string& path, const trace::LoadedTrace& loaded,
                     const trace::TraceSummary& s, const replay::Baseline& recorded) {
  const trace::Trace& t = loaded.trace;
  fmt::print("{}: {} ({})\n", path, trace::to_string(loaded.kind), t.info.source);
  fmt::print("events: {}\n", s.events);
  for (const auto& [op, n] : ops_by_name(s)) fmt::print("  {:<16} {:>9}\n", op, n);
  fmt::print("devices: {}   allocating streams: {}\n", s.devices.size(), s.streams);
  print_histogram(s.sizes, "allocation sizes:", true);
  print_histogram(s.lifetimes, "lifetimes (events from alloc to free):", false);
  fmt::print("  never freed in the window: {}\n", s.never_freed);
  fmt::print("peak requested: {}\n", format_bytes(s.peak_requested));
  if (recorded.present) {
    const auto& r = recorded.result;
    fmt::print("recorded allocator: peak reserved {}, utilization {:.4f}, {} segment allocs, {} frees, "
               "{} maps, {} unmaps, {} OOMs\n",
               format_bytes(r.peak_reserved), r.utilization, r.upstream.allocs, r.upstream.frees,
               r.upstream.maps, r.upstream.unmaps, r.ooms);
  }
  if (!s.top_labels.empty()) {
    fmt::print("top allocation sites by bytes:\n");
    for (const auto& l : s.top_labels) fmt::print("  {:>12}  {}\n", format_bytes(l.bytes), l.label);
  }
  for (const auto& m : t.info.metadata) fmt::print("metadata: {}\n", m);
}

}  // namespace

int cmd_info(const std::string& path, bool as_json) {
  const trace::LoadedTrace loaded = trace::load(path);
  const trace::TraceSummary summary = trace::summarize(loaded.trace);
  replay::TraceSource source(loaded.trace);
  const replay::Baseline recorded = replay::baseline(source).total;
  if (as_json) {
    print_info_json(path, loaded, summary, recorded);
  } else {
    print_info_text(path, loaded, summary, recorded);
  }
  return 0;
}

// --- replay and compare ---------------------------------------------------------------------

replay::ReplayOptions replay_options(const RunOptions& o, std::size_t i) {
  replay::ReplayOptions ro;
  ro.allocator = o.allocators.at(i);
  ro.device = o.device;
  ro.warmup = o.warmup;
  ro.attempt_ooms = o.attempt_ooms;
  ro.step_at_iterations = o.step_at_iterations;
  ro.target.capacity = o.capacity;
  ro.target.conf = i < o.confs.size() ? o.confs[i] : "";
  ro.target.cost_model = o.cost_model;
  ro.target.device_lag = o.device_lag;
  return ro;
}

namespace {

std::vector<replay::ReplayReport> run_all(const trace::Trace& t, const RunOptions& o) {
  const std::uint64_t work = t.events.size() * static_cast<std::uint64_t>(o.warmup + 1) * o.allocators.size();
  Progress progress(work >= kProgressFromEvents && Progress::wanted(o.quiet, o.json), work);
  std::vector<replay::ReplayReport> reports;
  for (std::size_t i = 0; i < o.allocators.size(); ++i) {
    progress.step(fmt::format("replay {} ({}/{})", o.allocators[i], i + 1, o.allocators.size()));
    replay::ReplayOptions ro = replay_options(o, i);
    ro.progress = progress.replay_counter();
    replay::TraceSource source(t);
    reports.push_back(replay::replay(source, ro));
  }
  progress.finish();
  return reports;
}

json report_json(const replay::ReplayReport& r, const trace::Trace& t) {
  json devices = json::array();
  for (const auto& d : r.devices) devices.push_back(to_json(d, &t));
  json j = to_json(r.total, &t);
  j["devices"] = devices;
  return j;
}

}  // namespace

int cmd_replay(const RunOptions& o) {
  const trace::Trace t = trace::load_trace(o.trace);
  const auto reports = run_all(t, o);
  const auto& r = reports.front();
  if (o.json) {
    std::cout << report_json(r, t).dump(2) << "\n";
    return 0;
  }
  std::vector<replay::ReplayResult> rows = {r.total};
  if (r.devices.size() > 1) {
    rows = r.devices;
    rows.push_back(r.total);
  }
  fmt::print("{}\n{}{}", o.trace, comparison_table(rows), oom_breakdown(rows, t));
  return 0;
}

int cmd_compare(const RunOptions& o) {
  const trace::Trace t = trace::load_trace(o.trace);
  replay::TraceSource source(t);
  const replay::BaselineReport recorded = replay::baseline(source, "pytorch-actual", o.device);
  const auto reports = run_all(t, o);
  if (o.json) {
    json j = {{"trace", o.trace},
              {"capacity_bytes", o.capacity},
              {"warmup", o.warmup},
              {"step_at_iterations", o.step_at_iterations},
              {"device_lag", o.device_lag}};
    j["recorded"] = recorded.total.present ? to_json(recorded.total.result) : json(nullptr);
    json rows = json::array();
    for (const auto& r : reports) rows.push_back(report_json(r, t));
    j["allocators"] = rows;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<replay::ReplayResult> rows;
  if (recorded.total.present) rows.push_back(recorded.total.result);
  for (const auto& r : reports) rows.push_back(r.total);
  fmt::print("{} (capacity {})\n{}{}", o.trace, format_bytes(o.capacity), comparison_table(rows),
             oom_breakdown(rows, t));
  return 0;
}

// --- convert, generate, demo ------------------------------------------------------------------

int cmd_convert(const std::string& in, const std::string& out, bool allow_truncated) {
  const trace::Format format = trace::format_from_extension(out);
  // Native inputs streamed, the others imported.
  const auto converted = trace::convert_to_native(in, out, format, {.allow_truncated = allow_truncated});
  if (const auto& cut = converted.truncation) {
    const std::string verified =
        cut->verified_bytes == 0 ? "no checkpoint"
                                 : fmt::format("{} verified by the last checkpoint, in the first {} "
                                               "bytes of {}", cut->verified_events, cut->verified_bytes,
                                               cut->file_bytes);
    fmt::print(stderr, "{}: cut short: kept the {} events before the cut ({}); the reader says: {}\n",
               in, cut->events, verified, cut->problem);
  }
  fmt::print(stderr, "wrote {} ({})\n", out, trace::to_string(format));
  return 0;
}

// The demo's built-in trace: the shape `--model custom` starts from (a 1.2B-parameter Llama-style
// decoder: 16 layers, hidden 2048, SwiGLU 8192, vocabulary 32000), six optimizer steps of
// micro-batch 4 with sequence lengths uniform in [1024, 2048], on one of two data-parallel ranks
// (gradients all-reduced on a communication stream).
constexpr const char* kDemoWorkload = "model:custom,framework:megatron,micro_batch:4,seq:2048,seq_dist:uniform,steps:6,dp:2";

workload::WorkloadSetup demo_setup() {
  workload::WorkloadSetup s = workload::WorkloadSetup::for_model("custom");
  s.apply(kDemoWorkload, "demo");
  s.validate();
  return s;
}

int cmd_demo(bool as_json) {
  const workload::WorkloadSetup setup = demo_setup();
  const trace::Trace t = workload::generate_workload(setup);
  RunOptions o;
  o.allocators = replay::target_names();
  o.json = as_json;
  const auto reports = run_all(t, o);
  if (as_json) {
    json rows = json::array();
    for (const auto& r : reports) rows.push_back(report_json(r, t));
    json j{{"trace", setup.describe()},
           {"generate_command", std::string("tensorpool generate demo.tptrace --options ") + kDemoWorkload},
           {"events", t.events.size()},
           {"allocators", rows}};
    demo_fit_and_plan(t, &j);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("tensorpool demo: a built-in LLM training trace ({} events)\n  {}\n  (tensorpool generate demo.tptrace --options {})\n",
             t.events.size(), setup.describe(), kDemoWorkload);
  fmt::print("replayed against each allocator on a simulated 80 GiB device:\n\n");
  std::vector<replay::ReplayResult> rows;
  for (const auto& r : reports) rows.push_back(r.total);
  fmt::print("{}\n", comparison_table(rows));
  fmt::print("req/rsv GiB: peak requested / peak reserved; util = requested / reserved peak;\n"
             "seg+/seg-: device allocations/frees during the trace (start: calls made for the blocks\n"
             "live when a trace begins mid-run); ns/op: host time per alloc or free.\n");
  fmt::print("{}\nTry: tensorpool compare <your PyTorch snapshot.pickle>, tensorpool fit <it>,\n"
             "     tensorpool plan --model llama2-7b --capacity 80GiB --global-batch 64 --zero 3 --dp 8 --options framework:megatron\n",
             demo_fit_and_plan(t, nullptr));
  return 0;
}

// --- allocators ---------------------------------------------------------------------------------

int cmd_allocators(bool as_json) {
  const auto& targets = replay::target_descriptors();
  if (as_json) {
    json rows = json::array();
    for (const auto& d : targets)
      rows.push_back({{"name", d.name},
                      {"description", d.description},
                      {"settings", d.settings},
                      {"holds_memory_until_destroyed", d.holds_memory_until_destroyed},
                      {"exports", d.exports},
                      {"maps", d.maps}});
    std::cout << rows.dump(2) << "\n";
    return 0;
  }
  for (const auto& d : targets) {
    fmt::print("{:<20} {}\n", d.name, d.description);
    fmt::print("{:<20} settings: {}\n", "", d.settings.empty() ? "none" : fmt::format("{}", fmt::join(d.settings, ", ")));
    if (d.holds_memory_until_destroyed)
      fmt::print("{:<20} holds its memory until destroyed (empty_cache gives nothing back)\n", "");
    if (d.exports) fmt::print("{:<20} exports a snapshot (tensorpool export)\n", "");
    if (d.maps) fmt::print("{:<20} shows its segments and blocks (tensorpool report)\n", "");
  }
  return 0;
}

}  // namespace tensorpool::cli
