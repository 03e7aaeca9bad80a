// plan_page.cpp: the plan's HTML page (plan_page.hpp).
#include "plan_page.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "html_report.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::cli {

namespace {


double gib_value(std::size_t bytes) { return static_cast<double>(bytes) / static_cast<double>(GiB); }

// One colour per kind of PeakBreakdown (in its order), then the allocators' share.
constexpr std::array<const char*, 9> kKindColours = {"#1f4e79", "#2e75b6", "#9dc3e6", "#c55a11", "#8064a2",
                                                     "#f4b183", "#ffd966", "#a9d18e", "#bfbfbf"};
constexpr const char* kWasteColour = "#7f7f7f";
constexpr const char* kWasteKind = "fragmentation and cache";

struct Bar {
  std::string label;
  const PeakBreakdown* breakdown;
  std::size_t waste;  // peak reserved - peak requested (0: the requested bytes alone)
};

constexpr int kBarWidth = 90, kGap = 40, kHeight = 320, kLeft = 70, kTop = 20, kBottom = 70;

std::string bars_svg(const std::vector<Bar>& bars, std::size_t capacity) {
  std::size_t top = capacity;
  for (const Bar& b : bars) top = std::max(top, b.breakdown->peak + b.waste);
  const double scale = static_cast<double>(kHeight) / static_cast<double>(top);
  const int width = kLeft + static_cast<int>(bars.size()) * (kBarWidth + kGap) + kGap;
  const int height = kTop + kHeight + kBottom;
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" width="{}" height="{}" style="max-width:100%;height:auto" role="img">)",
      width, height, width, height);
  const auto y_of = [&](std::size_t bytes) { return kTop + kHeight - static_cast<double>(bytes) * scale; };
  for (int i = 0; i <= 4; ++i) {  // the axis: five ticks
    const std::size_t at = top / 4 * static_cast<std::size_t>(i);
    svg += fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#e0e0e0"/>)", kLeft, width, y_of(at), y_of(at));
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" text-anchor="end">{:.1f} GiB</text>)", kLeft - 6,
                       y_of(at) + 4, gib_value(at));
  }
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const int x = kLeft + kGap + static_cast<int>(i) * (kBarWidth + kGap);
    std::size_t base = 0;
    const auto segment = [&](std::size_t bytes, const char* colour, const std::string& kind) {
      if (bytes == 0) return;
      svg += fmt::format(R"(<rect class="part" data-kind="{}" data-bytes="{}" x="{}" y="{:.2f}" width="{}" height="{:.2f}" fill="{}">)"
                         R"(<title>{}: {} ({:.2f} GiB)</title></rect>)",
                         html_escape(kind), bytes, x, y_of(base + bytes), kBarWidth, static_cast<double>(bytes) * scale, colour,
                         html_escape(b.label), html_escape(kind), gib_value(bytes));
      base += bytes;
    };
    for (std::size_t k = 0; k < b.breakdown->parts.size(); ++k)
      segment(b.breakdown->parts[k].bytes, kKindColours[std::min(k, kKindColours.size() - 1)], b.breakdown->parts[k].kind);
    segment(b.waste, kWasteColour, kWasteKind);
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>)", x + kBarWidth / 2,
                       kTop + kHeight + 16, html_escape(b.label));
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle">{:.2f} GiB</text>)", x + kBarWidth / 2,
                       kTop + kHeight + 32, gib_value(base));
  }
  svg += fmt::format(R"(<line class="capacity" x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#c00000" stroke-width="2" stroke-dasharray="6 3"/>)",
                     kLeft, width, y_of(capacity), y_of(capacity));
  svg += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" fill="#c00000" text-anchor="end">capacity {:.2f} GiB</text>)",
                     width - 4, y_of(capacity) - 4, gib_value(capacity));
  return svg + "</svg>";
}

// The kinds some bar has bytes of, and the allocators' share if some bar has one.
std::string legend(const std::vector<Bar>& bars) {
  std::string out = "<p class=\"legend\">";
  const PeakBreakdown& first = *bars.front().breakdown;
  for (std::size_t k = 0; k < first.parts.size(); ++k) {
    const bool shown = std::any_of(bars.begin(), bars.end(), [&](const Bar& b) { return b.breakdown->parts[k].bytes > 0; });
    if (shown)
      out += fmt::format(R"(<span><i style="background:{}"></i>{}</span> )", kKindColours[std::min(k, kKindColours.size() - 1)],
                         html_escape(first.parts[k].kind));
  }
  if (std::any_of(bars.begin(), bars.end(), [](const Bar& b) { return b.waste > 0; }))
    out += fmt::format(R"(<span><i style="background:{}"></i>{}</span>)", kWasteColour, kWasteKind);
  return out + "</p>";
}

}  // namespace

std::string plan_page(const PlanReport& r, const PlanAnswer& a) {
  const PlanOptions& o = r.options;
  std::vector<Bar> bars;
  std::string caption;
  if (a.micro_batch && a.at_answer) {
    for (const PlanFit& f : r.fits) {
      if (f.micro_batch != a.micro_batch) continue;
      bars.push_back({f.allocator, &*a.at_answer, f.peak_reserved > f.peak_requested ? f.peak_reserved - f.peak_requested : 0});
    }
    caption = fmt::format("Micro-batch {}: the live tensors at their peak, by kind, and what each allocator that fits it "
                          "reserves on top (fragmentation and cache).", *a.micro_batch);
  }
  if (a.next_micro_batch && a.at_next) {
    bars.push_back({fmt::format("micro-batch {}", *a.next_micro_batch), &*a.at_next, 0});
    caption += bars.size() == 1 ? fmt::format("Micro-batch {}, which does not fit: its live tensors alone.", *a.next_micro_batch)
                                : fmt::format(" Micro-batch {} (the last bar): its live tensors alone.", *a.next_micro_batch);
  }
  std::string page = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tensorpool plan</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}
pre{background:#f6f6f6;padding:12px;white-space:pre-wrap}
.legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}
</style></head><body>
)";
  page += fmt::format("<h1>plan: {}</h1>\n<p>{} on a device of {:.2f} GiB</p>\n", html_escape(o.capture.empty() ? o.setup.model.name : "captured script"),
                      html_escape(plan_subject(o)), gib_value(o.capacity));
  page += "<h2>The answer</h2>\n<pre id=\"answer\">" + html_escape(a.text) + "</pre>\n";
  if (!bars.empty()) {
    page += "<h2>Where the bytes go at the peak</h2>\n<p>" + html_escape(caption) + "</p>\n";
    page += legend(bars) + bars_svg(bars, o.capacity) + "\n";
  }
  page += "<h2>Per allocator</h2>\n<table><tr><th>allocator</th><th>micro-batch</th><th>accumulation</th>"
          "<th>peak requested</th><th>peak reserved</th></tr>\n";
  for (const PlanFit& f : r.fits) {
    if (f.micro_batch)
      page += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2f} GiB</td><td>{:.2f} GiB</td></tr>\n",
                          html_escape(f.allocator), *f.micro_batch, f.accumulation, gib_value(f.peak_requested), gib_value(f.peak_reserved));
    else
      page += fmt::format("<tr><td>{}</td><td>none</td><td>-</td><td>-</td><td>-</td></tr>\n", html_escape(f.allocator));
  }
  page += "</table>\n</body></html>\n";
  return page;
}

}  // namespace tensorpool::cli
