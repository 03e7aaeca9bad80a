// html_report_page.cpp: a report's data as JSON, put into the page template with its inline CSS
// and script (tools/html_report/: page.html, report.css, report.js, embedded at build time by
// embed_assets.cmake). The script draws every panel from that JSON; nothing is fetched.
//
// JSON layout (what report.js reads; numbers are bytes unless named otherwise):
//   trace {path, kind, source, devices, device, events, has_times}, capacity, warmup,
//   columns {first_event[], time_us[]}         the time charts' x axis (shared by all allocators)
//   requested {min[], max[]}                   live requested bytes per column (the trace's)
//   iterations []                              event index of each iteration marker
//   summary {sizes, lifetimes: {bounds[], counts[], bytes[]}, peak_requested, peak_requested_event}
//   recorded                                   the recording allocator's figures, or null
//   top_sites [{label, bytes, blocks}]
//   allocators [{name, conf, result {...}, allocated/reserved/unallocated {min[], max[]},
//                largest_free [] (empty: no map), peak {event, time_us, reserved, allocated},
//                peak_map, oom_map, fit (null without --fit: {fits, capacity, ratio, verified,
//                monotone, replays})}]
//   labels {id: text}                          the labels the rest names
// A map is {segments: [[address, size, stream, heap, [[offset, size, state, stream, label,
// requested], ...]], ...]}; state 0 free, 1 allocated, 2 pending free, 3 unmapped; stream -1:
// held by no stream.
#include <map>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "html_report.hpp"
#include "report.hpp"
#include "tensorpool/types.hpp"
#include "tensorpool/version.hpp"

namespace tensorpool::cli {

// The page's assets (html_report_assets.cpp, generated from tools/html_report/).
const std::string& report_page();
const std::string& report_css();
const std::string& report_js();

namespace {

using nlohmann::json;

json stream_json(Stream s) { return s == replay::kNoStream ? json(-1) : json(s); }

int state_code(const replay::MapBlock& b) {
  if (!b.mapped) return 3;
  switch (b.state) {
    case BlockState::free: return 0;
    case BlockState::allocated: return 1;
    case BlockState::pending_free: return 2;
  }
  return 0;
}

json map_json(const std::optional<replay::MemoryMap>& m, std::set<std::uint32_t>& labels) {
  if (!m) return nullptr;
  json segments = json::array();
  for (const replay::MapSegment& s : m->segments) {
    json blocks = json::array();
    for (const replay::MapBlock& b : s.blocks) {
      blocks.push_back({b.address - s.address, b.size, state_code(b), stream_json(b.stream), b.label, b.requested});
      if (b.label != 0) labels.insert(b.label);
    }
    segments.push_back({s.address, s.size, stream_json(s.stream), s.heap, std::move(blocks)});
  }
  return {{"segments", std::move(segments)}};
}

json fit_json(const std::optional<replay::DeviceFit>& f) {
  if (!f) return nullptr;
  return {{"fits", f->fits},         {"capacity", f->capacity}, {"ratio", f->ratio},
          {"verified", f->verified}, {"monotone", f->monotone}, {"replays", f->replays}};
}

json band_json(const replay::Band& b) { return {{"min", b.min}, {"max", b.max}}; }

json histogram_json(const trace::Histogram& h) {
  return {{"bounds", h.bounds}, {"counts", h.counts}, {"bytes", h.bytes}};
}

json panel_json(const AllocatorPanel& p, const trace::Trace& labels_of, std::set<std::uint32_t>& labels) {
  const replay::Timeline& t = p.timeline;
  json j = {{"name", p.allocator},
            {"conf", p.conf},
            {"result", to_json(p.result, &labels_of)},
            {"allocated", band_json(t.allocated)},
            {"reserved", band_json(t.reserved)},
            {"unallocated", band_json(t.unallocated)},
            {"largest_free", t.largest_free},
            {"peak", {{"event", t.peak_event}, {"time_us", t.peak_time_us}, {"reserved", t.peak_reserved},
                      {"allocated", t.allocated_at_peak}}},
            {"peak_map", map_json(p.peak_map, labels)},
            {"oom_map", map_json(p.oom_map, labels)},
            {"fit", fit_json(p.fit)}};
  if (p.result.first_oom && p.result.first_oom->label != 0) labels.insert(p.result.first_oom->label);
  return j;
}

// The report's JSON, safe inside a <script> element: "</" never appears in it.
std::string data_json(const ReportData& d) {
  trace::Trace labels_of;  // to_json() names the OOM's label through a trace's label table
  labels_of.labels = d.labels;
  std::set<std::uint32_t> labels;
  json allocators = json::array();
  for (const AllocatorPanel& p : d.allocators) allocators.push_back(panel_json(p, labels_of, labels));
  const replay::Timeline* axis = d.allocators.empty() ? nullptr : &d.allocators.front().timeline;
  json sites = json::array();
  for (const SiteAtPeak& s : d.top_sites) {
    sites.push_back({{"label", s.label}, {"bytes", s.bytes}, {"blocks", s.blocks}});
    if (s.label != 0) labels.insert(s.label);
  }
  json label_text = json::object();
  for (std::uint32_t l : labels)
    if (l < d.labels.size()) label_text[std::to_string(l)] = d.labels[l];
  json j = {
      {"tool", "tensorpool " TENSORPOOL_VERSION},
      {"trace", {{"path", d.trace_path}, {"kind", d.kind}, {"source", d.source}, {"devices", d.devices},
                 {"device", d.device}, {"events", d.device_events}, {"has_times", d.has_times}}},
      {"capacity", d.capacity},
      {"warmup", d.warmup},
      {"columns", {{"first_event", axis ? axis->first_event : std::vector<std::uint64_t>{}},
                   {"time_us", axis ? axis->time_us : std::vector<std::int64_t>{}}}},
      {"requested", axis ? band_json(axis->requested) : json(nullptr)},
      {"iterations", axis ? axis->iterations : std::vector<std::uint64_t>{}},
      {"summary", {{"sizes", histogram_json(d.summary.sizes)},
                   {"lifetimes", histogram_json(d.summary.lifetimes)},
                   {"never_freed", d.summary.never_freed},
                   {"peak_requested", d.peak_requested},
                   {"peak_requested_event", d.peak_requested_event}}},
      {"recorded", d.recorded ? to_json(*d.recorded) : json(nullptr)},
      {"top_sites", std::move(sites)},
      {"allocators", std::move(allocators)},
      {"labels", std::move(label_text)},
  };
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string safe;
  safe.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') {
      safe += "<\\/";
      ++i;
    } else {
      safe += text[i];
    }
  }
  return safe;
}


// The template with each `{{NAME}}` replaced by its value, in one pass (a value is never scanned
// for placeholders: a trace path or label may contain anything).
std::string fill(std::string_view page, const std::map<std::string, std::string_view>& values) {
  std::string out;
  out.reserve(page.size() + 64);
  std::size_t at = 0;
  while (at < page.size()) {
    const std::size_t open = page.find("{{", at);
    const std::size_t close = open == std::string_view::npos ? open : page.find("}}", open + 2);
    const auto it = close == std::string_view::npos ? values.end()
                                                     : values.find(std::string(page.substr(open + 2, close - open - 2)));
    if (it == values.end()) {
      const std::size_t end = open == std::string_view::npos ? page.size() : open + 2;
      out.append(page.substr(at, end - at));
      at = end;
      continue;
    }
    out.append(page.substr(at, open - at));
    out.append(it->second);
    at = close + 2;
  }
  return out;
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_html(const ReportData& data) {
  const std::string title = html_escape("tensorpool report: " + data.trace_path);
  const std::string json = data_json(data);
  return fill(report_page(), {{"TITLE", title}, {"CSS", report_css()}, {"DATA", json}, {"JS", report_js()}});
}

}  // namespace tensorpool::cli
