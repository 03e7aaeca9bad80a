// commands.hpp: the subcommands of the tensorpool CLI, called with arguments already checked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tensorpool/cost_model.hpp"
#include "tensorpool/replay/fit.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::cli {

/// Options shared by replay and compare.
struct RunOptions {
  std::string trace;
  std::vector<std::string> allocators;
  std::vector<std::string> confs;  // the settings of each allocator: --conf where it takes every
                                   // key (replay::share_conf), then its --allocator-conf
  std::size_t capacity = 80 * GiB;
  std::shared_ptr<const CostModel> cost_model;  // --cost-model FILE (null: flat default)
  int device = -1;
  int warmup = 0;  // passes over the window before the measured one
  bool attempt_ooms = false;  // ReplayOptions::attempt_ooms
  bool step_at_iterations = false;  // ReplayOptions::step_at_iterations
  std::size_t device_lag = 0;  // TargetOptions::device_lag
  bool json = false;
  bool quiet = false;  // no progress bar (progress.hpp)
};

/// The replay of options.allocators[i] with its settings (options.confs[i]).
replay::ReplayOptions replay_options(const RunOptions& options, std::size_t i);

int cmd_info(const std::string& trace, bool json);
int cmd_replay(const RunOptions& options);
int cmd_compare(const RunOptions& options);
int cmd_convert(const std::string& in, const std::string& out, bool allow_truncated);
int cmd_demo(bool json);
int cmd_allocators(bool json);
/// export.cpp: replays against options.allocators[0] and writes a PyTorch memory snapshot.
int cmd_export(const RunOptions& options, const std::string& out, std::size_t max_entries);
/// report_cmd.cpp: replays against options.allocators and writes an HTML report to `out`; with
/// `fit` (--fit), each allocator's smallest device too (its threads and tolerances).
int cmd_report(const RunOptions& options, const std::string& out, const replay::FitOptions* fit);

}  // namespace tensorpool::cli
