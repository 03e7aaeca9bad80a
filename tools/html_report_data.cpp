// html_report_data.cpp: what `tensorpool report` shows, collected: the device's events replayed
// against each allocator with a TimelineRecorder (memory over time, the first OOM and the map at
// that moment), then again with a MapCapture at the moment of peak reserved the first replay found
// (replays are deterministic: the conformance suite checks it); the trace's own histograms, the
// recording allocator's figures, and the allocation sites live at the peak of requested bytes.
#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "html_report.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/timeline.hpp"

namespace tensorpool::cli {

using trace::Op;
using trace::TraceEvent;

namespace {

constexpr std::size_t kTopSites = 12;

bool is_alloc(Op op) { return op == Op::alloc || op == Op::seed_alloc; }
bool is_free(Op op) { return op == Op::free_requested || op == Op::free_completed; }

// The events of one device, as a trace of their own (the same label table); `trace` itself when
// it has no other device.
struct DeviceTrace {
  const trace::Trace* trace = nullptr;
  trace::Trace copy;
};

void device_trace(const trace::Trace& t, int device, DeviceTrace& out) {
  const bool others = std::any_of(t.events.begin(), t.events.end(),
                                  [&](const TraceEvent& e) { return e.device != device; });
  if (!others) {
    out.trace = &t;
    return;
  }
  out.copy.info = t.info;
  out.copy.labels = t.labels;
  out.copy.label_ids = t.label_ids;
  for (const TraceEvent& e : t.events)
    if (e.device == device) out.copy.events.push_back(e);
  out.trace = &out.copy;
}

// Live requested bytes as the replay engine counts them (an allocation at a live address replaces
// the old block), calling at(index, live) after each event.
template <typename At>
void walk_live(const trace::Trace& t, At&& at) {
  std::unordered_map<std::uint64_t, const TraceEvent*> live;
  std::size_t requested = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const TraceEvent& e = t.events[i];
    if (is_alloc(e.op) && e.size > 0) {
      auto [it, fresh] = live.try_emplace(e.addr, &e);
      if (!fresh) {
        requested -= it->second->size;
        it->second = &e;
      }
      requested += e.size;
    } else if (is_free(e.op)) {
      if (auto it = live.find(e.addr); it != live.end()) {
        requested -= it->second->size;
        live.erase(it);
      }
    }
    at(i, requested, live);
  }
}

// The sites holding the most bytes at the first moment of peak requested.
void top_sites_at_peak(const trace::Trace& t, ReportData& data) {
  walk_live(t, [&](std::size_t i, std::size_t requested, const auto&) {
    if (requested > data.peak_requested) {
      data.peak_requested = requested;
      data.peak_requested_event = i;
    }
  });
  std::map<std::uint32_t, SiteAtPeak> sites;
  walk_live(t, [&](std::size_t i, std::size_t, const auto& live) {
    if (i != data.peak_requested_event || data.peak_requested == 0) return;
    for (const auto& [addr, e] : live) {
      SiteAtPeak& s = sites[e->label];
      s.label = e->label;
      s.bytes += e->size;
      ++s.blocks;
    }
  });
  for (const auto& [label, s] : sites) data.top_sites.push_back(s);
  std::sort(data.top_sites.begin(), data.top_sites.end(), [](const SiteAtPeak& a, const SiteAtPeak& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label;
  });
  if (data.top_sites.size() > kTopSites) data.top_sites.resize(kTopSites);
}

AllocatorPanel replay_panel(const trace::Trace& t, int device, const RunOptions& o, std::size_t i,
                            Progress& progress) {
  AllocatorPanel panel;
  panel.allocator = o.allocators[i];
  panel.conf = i < o.confs.size() ? o.confs[i] : "";
  replay::ReplayOptions ro = replay_options(o, i);
  ro.device = device;
  ro.progress = progress.replay_counter();
  const std::string step = fmt::format("report: {} ({}/{})", panel.allocator, i + 1, o.allocators.size());
  progress.step(step + " timeline");
  replay::TimelineRecorder recorder(device, t.events.size(), kReportColumns);
  ro.observer = &recorder;
  replay::TraceSource source(t);
  const replay::ReplayReport report = replay::replay(source, ro);
  panel.result = report.devices.empty() ? report.total : report.devices.front();
  panel.timeline = recorder.timeline();
  panel.oom_map = recorder.oom_map();
  const std::uint64_t pass = t.events.size() * static_cast<std::uint64_t>(o.warmup + 1);
  if (recorder.timeline().largest_free.empty()) {  // no map: nothing to capture at the peak
    progress.add(pass);
    return panel;
  }
  progress.step(step + " map at peak");
  replay::MapCapture capture(device, recorder.timeline().peak_event);
  ro.observer = &capture;
  ro.progress = progress.replay_counter();
  source.rewind();
  replay::replay(source, ro);
  panel.peak_map = capture.map();
  return panel;
}

}  // namespace

int report_device(const trace::Trace& t, int requested) {
  std::map<int, std::uint64_t> allocs;
  for (const TraceEvent& e : t.events) allocs[e.device] += is_alloc(e.op) ? 1 : 0;
  if (requested >= 0) {
    if (allocs.count(requested) != 0) return requested;
    std::string known;
    for (const auto& [d, n] : allocs) known += (known.empty() ? "" : ", ") + std::to_string(d);
    throw UsageError(fmt::format("--device {}: the trace has no events on that device (devices: {})", requested,
                                 known.empty() ? "none" : known));
  }
  int best = allocs.empty() ? 0 : allocs.begin()->first;
  std::uint64_t most = 0;
  for (const auto& [d, n] : allocs) {
    if (n <= most) continue;
    best = d;
    most = n;
  }
  return best;
}

std::uint64_t report_work(const trace::Trace& t, const RunOptions& o) {
  const int device = report_device(t, o.device);
  const auto events = static_cast<std::uint64_t>(
      std::count_if(t.events.begin(), t.events.end(), [&](const TraceEvent& e) { return e.device == device; }));
  return events * static_cast<std::uint64_t>(o.warmup + 1) * 2 * o.allocators.size();
}

ReportData collect_report(const trace::Trace& full, const std::string& kind, const RunOptions& o,
                          Progress& progress) {
  ReportData data;
  data.trace_path = o.trace;
  data.kind = kind;
  data.source = full.info.source;
  data.capacity = o.capacity;
  data.warmup = o.warmup;
  data.labels = full.labels;
  data.device = report_device(full, o.device);
  DeviceTrace dt;
  device_trace(full, data.device, dt);
  const trace::Trace& t = *dt.trace;
  data.devices = trace::summarize(full, 0).devices;
  data.device_events = t.events.size();
  data.has_times = std::any_of(t.events.begin(), t.events.end(), [](const TraceEvent& e) { return e.time_us != 0; });
  data.summary = trace::summarize(t);
  replay::TraceSource source(t);
  if (const replay::Baseline b = replay::baseline(source, "pytorch-actual", data.device).total; b.present)
    data.recorded = b.result;
  top_sites_at_peak(t, data);
  for (std::size_t i = 0; i < o.allocators.size(); ++i)
    data.allocators.push_back(replay_panel(t, data.device, o, i, progress));
  return data;
}

}  // namespace tensorpool::cli
