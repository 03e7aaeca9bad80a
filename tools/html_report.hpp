// html_report.hpp: `tensorpool report`: the data a report shows (ReportData, one panel's worth
// per field, collected by replaying the trace: html_report_data.cpp) and its rendering as one
// self-contained HTML page (inline CSS, JavaScript and SVG, no network: html_report_page.cpp).
// A panel is drawn from its field alone, so a new source (fit's capacities) adds a field and a
// panel without touching the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "progress.hpp"
#include "tensorpool/replay/fit.hpp"
#include "tensorpool/replay/memory_map.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/replay/timeline.hpp"
#include "tensorpool/trace/event.hpp"
#include "tensorpool/trace/summary.hpp"

namespace tensorpool::cli {

/// Columns of the time charts: each holds the min and max of its events (Timeline's buckets).
inline constexpr std::size_t kReportColumns = 1000;

/// What one allocator contributes: its replay of the device, its timeline, its maps.
struct AllocatorPanel {
  std::string allocator;
  std::string conf;                     // its settings ("" : defaults)
  replay::ReplayResult result;          // the device's replay
  replay::Timeline timeline;            // memory over time (TimelineRecorder)
  std::optional<replay::MemoryMap> peak_map;  // at timeline.peak_event (nullopt: keeps no map)
  std::optional<replay::MemoryMap> oom_map;   // at result.first_oom
  std::optional<replay::DeviceFit> fit;       // with --fit: the smallest device it replays on
};

/// Allocation sites by the bytes they held at the trace's peak of requested bytes.
struct SiteAtPeak {
  std::uint32_t label = 0;
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
};

struct ReportData {
  std::string trace_path;
  std::string kind;    // trace::to_string(SourceKind)
  std::string source;  // TraceInfo::source
  std::vector<std::uint16_t> devices;  // every device of the trace
  int device = 0;                      // the one reported on
  std::uint64_t device_events = 0;
  bool has_times = false;              // the device's events carry trace times
  std::size_t capacity = 0;
  int warmup = 0;
  trace::TraceSummary summary;         // of the device's events
  std::optional<replay::ReplayResult> recorded;  // the recording allocator's own figures
  std::size_t peak_requested = 0;
  std::uint64_t peak_requested_event = 0;
  std::vector<SiteAtPeak> top_sites;   // most bytes first
  std::vector<AllocatorPanel> allocators;
  std::vector<std::string> labels;     // the trace's label table (index = label)
};

/// The device a report covers: `requested` when >= 0 (UsageError when the trace has no such
/// device), else the one with the most allocations.
int report_device(const trace::Trace& trace, int requested);

/// Replays the device's events against each allocator twice (the timeline and first OOM, then
/// the map at the peak of reserved) and, with `fit` (--fit: its threads and tolerances), searches
/// each allocator's smallest device (replay::fit), counting every event read on `progress`.
ReportData collect_report(const trace::Trace& trace, const std::string& kind, const RunOptions& options,
                          const replay::FitOptions* fit, Progress& progress);

/// Work units collect_report() counts on its Progress for `trace` (events read by its replays;
/// the fit's replays estimated).
std::uint64_t report_work(const trace::Trace& trace, const RunOptions& options, const replay::FitOptions* fit);

/// The page: inline CSS and script, the data as JSON in the page.
std::string render_html(const ReportData& data);

/// `text` with & < > " as HTML entities (for text and attribute values).
std::string html_escape(std::string_view text);

}  // namespace tensorpool::cli
