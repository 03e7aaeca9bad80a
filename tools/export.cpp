// export.cpp: `tensorpool export TRACE --allocator NAME -o snapshot.pickle`: replays a trace
// against one allocator while recording its events, then writes its final memory and that
// history as a PyTorch memory snapshot (pytorch.org/memory_viz, torch.cuda._memory_viz).
// ExportCommand (subcommands.cpp) has checked, before the trace is read, that the allocator
// exports and the output can be written.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "progress.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/load.hpp"
#include "tensorpool/trace/pytorch_export.hpp"

namespace tensorpool::cli {

int cmd_export(const RunOptions& o, const std::string& out, std::size_t max_entries) {
  replay::ReplayOptions ro = replay_options(o, 0);
  ro.record_history = true;
  ro.target.history_entries = max_entries;
  const trace::Trace t = trace::load_trace(o.trace);
  const std::uint64_t work = t.events.size() * static_cast<std::uint64_t>(o.warmup + 1);
  Progress progress(work >= kProgressFromEvents && Progress::wanted(o.quiet, o.json), work);
  progress.step("export " + ro.allocator);
  ro.progress = progress.replay_counter();
  replay::TraceSource source(t);
  const replay::ReplayReport r = replay::replay(source, ro);
  progress.finish();
  trace::pytorch::write_file_atomically(
      out, trace::pytorch::snapshot_pickle(r.memory, trace::pytorch::settings_from_conf(r.settings)));
  std::size_t events = 0, segments = 0;
  for (const auto& d : r.memory) {
    events += d.history.size();
    segments += d.state.segments.size();
  }
  if (o.json) {
    const nlohmann::json j = {{"output", out}, {"allocator", ro.allocator},
                              {"devices", r.memory.size()}, {"events", events},
                              {"segments", segments}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print(stderr, "wrote {}: {} device(s), {} events, {} segments at the end ({} replayed)\n",
               out, r.memory.size(), events, segments, ro.allocator);
  }
  return 0;
}

}  // namespace tensorpool::cli
