// report_cmd.cpp: `tensorpool report TRACE -o report.html`: replays a trace against several
// allocators and writes what it saw as one self-contained HTML page (html_report.hpp).
// ReportCommand (subcommands.cpp) has checked, before the trace is read, the allocators, their
// settings and that the output can be written; the page goes through a temporary file and a rename, so a failed report leaves
// nothing behind.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "html_report.hpp"
#include "progress.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/trace/load.hpp"
#include "tensorpool/trace/pytorch_export.hpp"

namespace tensorpool::cli {

int cmd_report(const RunOptions& o, const std::string& out, const replay::FitOptions* fit) {
  const trace::LoadedTrace loaded = trace::load(o.trace);
  try {
    report_device(loaded.trace, o.device);
  } catch (const UsageError& e) {  // a --device the trace does not have: a bad argument
    fmt::print(stderr, "tensorpool: error: {}\n", e.what());
    return 2;
  }
  Progress progress(Progress::wanted(o.quiet, o.json), report_work(loaded.trace, o, fit));
  const ReportData data = collect_report(loaded.trace, trace::to_string(loaded.kind), o, fit, progress);
  const std::string page = render_html(data);
  trace::pytorch::write_file_atomically(out, page, "report");
  progress.finish();
  if (o.json) {
    const nlohmann::json j = {{"output", out}, {"bytes", page.size()}, {"device", data.device},
                              {"events", data.device_events}, {"allocators", o.allocators}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print(stderr, "wrote {} ({:.1f} KiB): device {}, {} events, {} allocators\n", out,
               static_cast<double>(page.size()) / 1024.0, data.device, data.device_events, data.allocators.size());
  }
  return 0;
}

}  // namespace tensorpool::cli
