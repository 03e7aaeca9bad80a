// main.cpp: the tensorpool command-line tool: argument parsing, their checks (through the
// libraries: allocator names and settings, generator options, what export can write) and exit
// codes.
//
// Exit codes: 0 success; 1 a bad or unreadable input file (the message names the file and the
// offset or line); 2 bad arguments (unknown allocator, bad size, bad --conf, ...).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "fit.hpp"
#include "plan.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/trace/pytorch_export.hpp"
#include "tensorpool/workload/generator.hpp"
#include "workload_args.hpp"

using namespace tensorpool;

namespace {

constexpr int kBadInput = 1;
constexpr int kBadArguments = 2;

std::size_t parse_capacity(const std::string& text) {
  std::size_t bytes = 0;
  if (!parse_bytes(text, bytes) || bytes == 0)
    throw CLI::ValidationError("--capacity", "'" + text + "' is not a size such as 80GiB or 141GB");
  return bytes;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t end = std::min(list.find(',', pos), list.size());
    if (end > pos) out.push_back(list.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

void check_allocators(const std::vector<std::string>& names) {
  for (const auto& n : names) replay::describe_target(n);  // throws UsageError for an unknown name
}

// --allocator-conf NAME=SETTINGS, repeatable: appended to NAME's settings after what --conf gave
// it (a key set in both: the later one wins, as in any key:value list); NAME must be one of the
// allocators run. The whole list each allocator gets is checked as it will read it.
void add_allocator_confs(const std::vector<std::string>& items, cli::RunOptions& run) {
  const std::vector<std::string> shared = run.confs;  // what --conf gave each
  std::vector<bool> extended(run.allocators.size(), false);
  for (const auto& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw CLI::ValidationError("--allocator-conf", "'" + item + "' is not NAME=key:value,...");
    const std::string name = item.substr(0, eq);
    const auto at = std::find(run.allocators.begin(), run.allocators.end(), name);
    if (at == run.allocators.end()) {
      check_allocators({name});
      throw CLI::ValidationError("--allocator-conf", "'" + name + "' is not one of the allocators run (" +
                                                         join(run.allocators) + ")");
    }
    const auto i = static_cast<std::size_t>(at - run.allocators.begin());
    run.confs[i] += (run.confs[i].empty() ? "" : ",") + item.substr(eq + 1);
    extended[i] = true;
  }
  for (std::size_t i = 0; i < run.allocators.size(); ++i) {
    const std::string& name = run.allocators[i];
    if (extended[i])
      replay::validate_target(name, run.confs[i], (shared[i].empty() ? "--allocator-conf " : "--conf and --allocator-conf for ") + name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensorpool: a GPU caching allocator, its trace tools and allocator comparisons"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tensorpool 0.1.0");

  bool json = false;
  bool quiet = false;
  std::string trace_path, out_path, allocators, capacity = "80GiB", conf, gen_options;
  std::string allocator = "tensorpool";
  std::string cost_model_path;
  std::vector<std::string> allocator_confs;
  int device = -1;
  int warmup = 0;
  bool attempt_ooms = false;

  auto* demo = app.add_subcommand("demo", "Replay a built-in LLM training trace against every allocator, fit it, plan a micro-batch");
  demo->add_flag("--json", json, "Machine-readable output");

  auto* allocators_cmd = app.add_subcommand("allocators", "List the allocators and the settings each takes");
  allocators_cmd->add_flag("--json", json, "Machine-readable output");

  auto* info = app.add_subcommand("info", "Events, devices, streams, size and lifetime histograms of a trace");
  info->add_option("trace", trace_path, "PyTorch snapshot (.pickle), RMM log (.csv) or tensorpool trace")->required();
  info->add_flag("--json", json, "Machine-readable output");

  // The allocators' settings and the simulated device's costs: replay, compare, export, fit, plan.
  auto add_target_options = [&](CLI::App* cmd) {
    cmd->add_option("--conf", conf, "Allocator settings, key:value,...; each allocator that takes "
                                    "every key gets them (see `tensorpool allocators`)");
    cmd->add_option("--allocator-conf", allocator_confs,
                    "NAME=key:value,... settings of allocator NAME only, after --conf's "
                    "(e.g. rmm-pool=initial_pool_size:0); repeatable");
    cmd->add_option("--cost-model", cost_model_path,
                    "Cost of upstream calls for the simulated devices: a file (format: docs/cli.md), "
                    "`default` (grows with bytes, from published measurements) or `flat` (10-20 us per call)");
  };
  auto add_run_options = [&](CLI::App* cmd) {
    cmd->add_option("trace", trace_path, "PyTorch snapshot (.pickle), RMM log (.csv) or tensorpool trace")->required();
    cmd->add_option("--capacity", capacity, "Simulated device memory (default 80GiB)");
    add_target_options(cmd);
    cmd->add_option("--device", device, "Replay only this device of the trace (default: all)");
    cmd->add_option("--warmup", warmup, "Replay the window N times before the measured pass (steady state)")
        ->check(CLI::Range(0, 100));
    cmd->add_flag("--attempt-ooms", attempt_ooms,
                  "Present the requests that failed in the recording (oom events) to the allocator "
                  "too, as a live recording of it saw them");
    cmd->add_flag("--json", json, "Machine-readable output (no progress bar)");
    cmd->add_flag("-q,--quiet", quiet, "No progress bar (drawn on stderr only when it is a terminal)");
  };
  auto* replay_cmd = app.add_subcommand("replay", "Replay a trace against one allocator");
  add_run_options(replay_cmd);
  replay_cmd->add_option("--allocator", allocator, "One of " + join(replay::target_names()) + " (default tensorpool)");

  auto* compare = app.add_subcommand("compare", "Replay a trace against several allocators, side by side");
  add_run_options(compare);
  compare->add_option("--allocators", allocators, "Comma-separated list (default: all)");

  std::size_t max_entries = 1'000'000;
  auto* export_cmd = app.add_subcommand("export", "Replay a trace and write the allocator's memory and events as a PyTorch snapshot");
  add_run_options(export_cmd);
  export_cmd->add_option("--allocator", allocator,
                         "One of " + join(replay::exporting_target_names()) + " (default tensorpool)");
  export_cmd->add_option("-o,--output", out_path, "Snapshot to write (.pickle)")->required();
  export_cmd->add_option("--max-entries", max_entries, "Keep the newest N events (default 1000000)");

  auto* report_cmd = app.add_subcommand(
      "report", "Replay a trace against several allocators and write one self-contained HTML report "
                "(memory over time, fragmentation, block maps at peak and at the first OOM, histograms)");
  add_run_options(report_cmd);
  report_cmd->add_option("--allocators", allocators, "Comma-separated list (default: all)");
  report_cmd->add_option("-o,--output", out_path, "Report to write (.html)")->required();
  bool report_fit = false;
  report_cmd->add_flag("--fit", report_fit, "Also the smallest device each allocator fits (as tensorpool fit: 0.5% or 2 MiB)");
  report_cmd->get_option("--device")->description("Report on this device of the trace (default: the one with the most allocations)");

  auto* convert = app.add_subcommand("convert", "Convert a trace to tensorpool's format (.tptrace or .jsonl)");
  convert->add_option("in", trace_path, "Input trace (any supported kind)")->required();
  convert->add_option("out", out_path, "Output file; .tptrace (binary) or .jsonl")->required();
  bool allow_truncated = false;
  convert->add_flag("--allow-truncated", allow_truncated,
                    "Salvage a tensorpool trace that ends early (a killed recording): convert it up "
                    "to the cut and say where it was cut");

  auto* generate = app.add_subcommand("generate", "Write a synthetic LLM-style trace");
  generate->add_option("out", out_path, "Output file; .tptrace (binary) or .jsonl")->required();
  generate->add_option("--options", gen_options,
                       "key:value,... of " + join(workload::GeneratorOptions::keys()) +
                           "; with --model: of " + join(workload::WorkloadSetup::keys()));
  cli::WorkloadArgs gen_args;
  cli::add_workload_flags(generate, gen_args, true);

  unsigned threads = 0;
  double precision_pct = 0.5;
  std::string precision_bytes = "2MiB";
  auto* fit_cmd = app.add_subcommand("fit", "The smallest device capacity each allocator replays a trace on without an OOM");
  fit_cmd->add_option("trace", trace_path, "PyTorch snapshot (.pickle), RMM log (.csv) or tensorpool trace")->required();
  fit_cmd->add_option("--allocators", allocators, "Comma-separated list (default: all)");
  add_target_options(fit_cmd);
  fit_cmd->add_option("--device", device, "Only this device of the trace (default: each device on its own)");
  fit_cmd->add_option("--warmup", warmup, "Replay the window N times before the measured pass")->check(CLI::Range(0, 100));
  fit_cmd->add_option("--threads", threads, "Replays at once (default: one per core)");
  fit_cmd->add_option("--precision-pct", precision_pct,
                      "Bisect until the capacities with and without an OOM are this many percent of the "
                      "answer apart (default 0.5)")
      ->check(CLI::Range(0.001, 50.0));
  fit_cmd->add_option("--precision-bytes", precision_bytes,
                      "... or this many bytes, whichever is larger (default 2MiB; 0: the percentage only)");
  fit_cmd->add_flag("--json", json, "Machine-readable output (no progress bar)");
  fit_cmd->add_flag("-q,--quiet", quiet, "No progress bar (drawn on stderr only when it is a terminal)");

  cli::WorkloadArgs plan_args;
  auto* plan_cmd = app.add_subcommand("plan", "The largest micro-batch each allocator fits, and the changes that fit a larger one");
  cli::add_workload_flags(plan_cmd, plan_args, false);
  plan_cmd->add_option("--options", plan_args.options, "key:value,... of " + join(workload::WorkloadSetup::keys()));
  plan_cmd->add_option("--capacity", capacity, "Device memory (default 80GiB)");
  plan_cmd->add_option("--allocators", allocators, "Comma-separated list (default: all)");
  add_target_options(plan_cmd);
  plan_cmd->add_option("--threads", threads, "Replays at once (default: one per core)");
  plan_cmd->add_flag("--json", json, "Machine-readable output (no progress bar)");
  plan_cmd->add_flag("-q,--quiet", quiet, "No progress bar (drawn on stderr only when it is a terminal)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kBadArguments;
  }

  cli::RunOptions run;
  workload::GeneratorOptions generator;
  workload::WorkloadSetup workload_setup;
  cli::PlanOptions plan;
  replay::FitOptions fit_search;
  try {
    run.trace = trace_path;
    run.json = json;
    run.quiet = quiet;
    run.device = device;
    run.warmup = warmup;
    run.attempt_ooms = attempt_ooms;
    run.capacity = parse_capacity(capacity);
    run.allocators = replay_cmd->parsed() || export_cmd->parsed() ? std::vector<std::string>{allocator}
                     : allocators.empty() ? replay::target_names()
                                          : split(allocators);
    check_allocators(run.allocators);
    run.confs = replay::share_conf(run.allocators, conf, "--conf");
    add_allocator_confs(allocator_confs, run);
    // Refused before the trace is read: an allocator that cannot export, an unwritable output.
    if (export_cmd->parsed()) replay::require_export(allocator);
    if (export_cmd->parsed() || report_cmd->parsed()) trace::pytorch::check_writable(out_path);
    if (generate->parsed() && gen_args.given()) {
      gen_args.options = gen_options;
      workload_setup = cli::workload_setup(gen_args);
    } else {
      generator.apply(gen_options, "--options");
    }
    fit_search.threads = threads;
    fit_search.relative_tolerance = precision_pct / 100.0;
    if (!parse_bytes(precision_bytes, fit_search.absolute_tolerance))
      throw CLI::ValidationError("--precision-bytes", "'" + precision_bytes + "' is not a size such as 2MiB or 0");
    if (plan_cmd->parsed()) {
      plan = {cli::workload_setup(plan_args), {}, run.capacity, threads, json, quiet, {}};
      cli::check_plan(plan.setup);
    }
  } catch (const CLI::ValidationError& e) {
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadArguments;
  } catch (const Error& e) {  // UsageError, ConfigError
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadArguments;
  }

  try {  // a bad cost-model file is a bad input file
    if (!cost_model_path.empty())
      run.cost_model = std::make_shared<const CostModel>(load_cost_model(cost_model_path));
  } catch (const Error& e) {
    std::cerr << "tensorpool: error: --cost-model: " << e.what() << "\n";
    return kBadInput;
  }
  plan.targets = cli::fit_targets(run);

  try {
    if (demo->parsed()) return cli::cmd_demo(json);
    if (allocators_cmd->parsed()) return cli::cmd_allocators(json);
    if (info->parsed()) return cli::cmd_info(trace_path, json);
    if (replay_cmd->parsed()) return cli::cmd_replay(run);
    if (compare->parsed()) return cli::cmd_compare(run);
    if (convert->parsed()) return cli::cmd_convert(trace_path, out_path, allow_truncated);
    if (export_cmd->parsed()) return cli::cmd_export(run, out_path, max_entries);
    if (report_cmd->parsed()) return cli::cmd_report(run, out_path, report_fit ? &fit_search : nullptr);
    if (generate->parsed())
      return gen_args.given() ? cli::cmd_generate_workload(out_path, workload_setup) : cli::cmd_generate(out_path, generator);
    if (fit_cmd->parsed()) return cli::cmd_fit(run, fit_search);
    if (plan_cmd->parsed()) return cli::cmd_plan(plan);
  } catch (const ConfigError& e) {  // a setting the --capacity device cannot hold (rmm-arena's arena_size)
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadArguments;
  } catch (const std::exception& e) {
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadInput;
  }
  return kBadArguments;
}
