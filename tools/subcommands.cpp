// subcommands.cpp: each subcommand of the CLI as a small type (subcommands.hpp): its options, the
// checks of what was given, and the call into its implementation. The option groups several
// subcommands share (a trace replayed against allocators: RunArgs; a training setup:
// WorkloadArgs) are types too, each instance owned by one subcommand.
#include "subcommands.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fit.hpp"
#include "plan.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/trace/pytorch_export.hpp"
#include "tensorpool/workload/model.hpp"
#include "workload_args.hpp"

namespace tensorpool::cli {

bool Subcommand::chosen() const { return app_->parsed(); }

namespace {

const char* const kTraceHelp = "PyTorch snapshot (.pickle), RMM log (.csv) or tensorpool trace";

// A count option: digits only (CLI11 reads "-3" into a std::size_t as 2^64 - 3).
const CLI::Validator kCount(
    [](const std::string& text) -> std::string {
      if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) return {};
      return "expected a whole number, 0 or more, got '" + text + "'";
    },
    "");

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

// --- option groups --------------------------------------------------------------------------

/// The allocators' settings and the simulated device's costs: replay, compare, export, report,
/// fit and plan take them.
struct TargetArgs {
  std::string conf;
  std::vector<std::string> allocator_confs;  // NAME=SETTINGS, repeatable
  std::string cost_model;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--conf", conf, "Allocator settings, key:value,...; each allocator that takes "
                                    "every key gets them (see `tensorpool allocators`)");
    cmd->add_option("--allocator-conf", allocator_confs,
                    "NAME=key:value,... settings of allocator NAME only, after --conf's "
                    "(e.g. rmm-pool=initial_pool_size:0); repeatable");
    cmd->add_option("--cost-model", cost_model,
                    "Cost of upstream calls for the simulated devices: a file (format: docs/cli.md), "
                    "`default` (grows with bytes, from published measurements) or `flat` (10-20 us per call)");
  }

  /// run.allocators (checked: UsageError for an unknown one) with their settings in run.confs:
  /// --conf where an allocator takes every key (replay::share_conf), then its --allocator-conf
  /// (a key set in both: the later one wins, as in any key:value list), each whole list checked
  /// as the allocator will read it.
  void resolve(RunOptions& run) const {
    for (const auto& name : run.allocators) replay::describe_target(name);
    run.confs = replay::share_conf(run.allocators, conf, "--conf");
    add_allocator_confs(run);
  }

  /// The --cost-model (null: the device's default); a bad file is a bad input (InputError), read
  /// when the command runs.
  std::shared_ptr<const CostModel> load_cost_model() const {
    if (cost_model.empty()) return nullptr;
    try {
      return std::make_shared<const CostModel>(tensorpool::load_cost_model(cost_model));
    } catch (const Error& e) {
      throw InputError(std::string("--cost-model: ") + e.what());
    }
  }

 private:
  void add_allocator_confs(RunOptions& run) const {
    const std::vector<std::string> shared = run.confs;  // what --conf gave each
    std::vector<bool> extended(run.allocators.size(), false);
    for (const auto& item : allocator_confs) {
      const auto eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw CLI::ValidationError("--allocator-conf", "'" + item + "' is not NAME=key:value,...");
      const std::string name = item.substr(0, eq);
      const auto at = std::find(run.allocators.begin(), run.allocators.end(), name);
      if (at == run.allocators.end()) {
        replay::describe_target(name);  // an unknown name: UsageError
        throw CLI::ValidationError("--allocator-conf", "'" + name + "' is not one of the allocators run (" +
                                                           join(run.allocators) + ")");
      }
      const auto i = static_cast<std::size_t>(at - run.allocators.begin());
      run.confs[i] += (run.confs[i].empty() ? "" : ",") + item.substr(eq + 1);
      extended[i] = true;
    }
    for (std::size_t i = 0; i < run.allocators.size(); ++i)
      if (extended[i])
        replay::validate_target(run.allocators[i], run.confs[i],
                                (shared[i].empty() ? "--allocator-conf " : "--conf and --allocator-conf for ") +
                                    run.allocators[i]);
  }
};

/// --json and -q: every command that replays.
struct OutputArgs {
  bool json = false;
  bool quiet = false;

  void add_to(CLI::App* cmd) {
    cmd->add_flag("--json", json, "Machine-readable output (no progress bar)");
    cmd->add_flag("-q,--quiet", quiet, "No progress bar (drawn on stderr only when it is a terminal)");
  }
};

/// How the program behind a trace runs in every replay: replay, compare, export, report, fit and
/// plan (--step-at-iterations, --device-lag).
struct ProgramArgs {
  bool step_at_iterations = false;
  std::size_t device_lag = 0;

  void add_to(CLI::App* cmd) {
    cmd->add_flag("--step-at-iterations", step_at_iterations,
                  "Call tensorpool's step() at each iteration marker of the trace, as a program that calls "
                  "tensorpool.step() once per step (docs/vmm.md, \"Steps\")");
    cmd->add_option("--device-lag", device_lag,
                    "A device that runs behind the host, for tensorpool's allocators: each allocation queues work on "
                    "its stream, and the work queued on the streams completes only every N allocations, or when the "
                    "allocator synchronizes (default 0: at once; docs/cli.md)")
        ->check(kCount);
  }
  void apply_to(RunOptions& run) const {
    run.step_at_iterations = step_at_iterations;
    run.device_lag = device_lag;
  }
};

/// A trace replayed on a simulated device: replay, compare, export and report.
struct RunArgs {
  std::string trace;
  std::string capacity = "80GiB";
  TargetArgs targets;
  int device = -1;
  int warmup = 0;
  bool attempt_ooms = false;
  ProgramArgs program;
  OutputArgs output;

  void add_to(CLI::App* cmd) {
    cmd->add_option("trace", trace, kTraceHelp)->required();
    cmd->add_option("--capacity", capacity, "Simulated device memory (default 80GiB)");
    targets.add_to(cmd);
    cmd->add_option("--device", device, "Replay only this device of the trace (default: all)");
    cmd->add_option("--warmup", warmup, "Replay the window N times before the measured pass (steady state)")
        ->check(CLI::Range(0, 100));
    cmd->add_flag("--attempt-ooms", attempt_ooms,
                  "Present the requests that failed in the recording (oom events) to the allocator "
                  "too, as a live recording of it saw them");
    program.add_to(cmd);
    output.add_to(cmd);
  }

  RunOptions options(std::vector<std::string> allocators) const {
    RunOptions run;
    run.trace = trace;
    run.capacity = parse_capacity(capacity);
    run.allocators = std::move(allocators);
    run.device = device;
    run.warmup = warmup;
    run.attempt_ooms = attempt_ooms;
    program.apply_to(run);
    run.json = output.json;
    run.quiet = output.quiet;
    targets.resolve(run);
    return run;
  }
};

/// --allocators: every allocator unless given.
struct AllocatorList {
  std::string list;

  void add_to(CLI::App* cmd) { cmd->add_option("--allocators", list, "Comma-separated list (default: all)"); }
  std::vector<std::string> names() const { return list.empty() ? replay::target_names() : split(list); }
};

/// The bisection of fit (and report --fit): --threads, --precision-pct, --precision-bytes.
struct SearchArgs {
  unsigned threads = 0;
  double precision_pct = 0.5;
  std::string precision_bytes = "2MiB";

  void add_threads(CLI::App* cmd) { cmd->add_option("--threads", threads, "Replays at once (default: one per core)"); }
  void add_precision(CLI::App* cmd) {
    cmd->add_option("--precision-pct", precision_pct,
                    "Bisect until the capacities with and without an OOM are this many percent of the "
                    "answer apart (default 0.5)")
        ->check(CLI::Range(0.001, 50.0));
    cmd->add_option("--precision-bytes", precision_bytes,
                    "... or this many bytes, whichever is larger (default 2MiB; 0: the percentage only)");
  }

  replay::FitOptions options() const {
    replay::FitOptions o;
    o.threads = threads;
    o.relative_tolerance = precision_pct / 100.0;
    if (!parse_bytes(precision_bytes, o.absolute_tolerance))
      throw CLI::ValidationError("--precision-bytes", "'" + precision_bytes + "' is not a size such as 2MiB or 0");
    return o;
  }
};

enum class WorkloadFlags : bool { generate, plan };  // plan searches the micro-batch of a training run

/// --model and the flags of the common workload keys (workload_args.hpp); generate also has
/// --mode and --micro-batch.
void add_workload_flags(CLI::App* cmd, WorkloadArgs& a, WorkloadFlags which) {
  cmd->add_option("--model", a.model,
                  "Model preset: " + join(workload::model_preset_names()) + ", or custom (shape by --options)");
  if (which == WorkloadFlags::generate) {
    cmd->add_option("--mode", a.mode, "training, inference or forward (option mode)");
    cmd->add_option("--micro-batch", a.micro_batch, "Sequences per micro-batch (option micro_batch)");
  }
  cmd->add_option("--global-batch", a.global_batch, "Sequences per optimizer step over all data-parallel ranks (option global_batch)");
  cmd->add_option("--seq", a.seq, "Sequence length (option seq; default: the model's context)");
  cmd->add_option("--precision", a.precision,
                  "fp32, bf16, fp16 (mixed precision with fp32 master weights), autocast-bf16 or autocast-fp16 (torch.autocast; "
                  "the default of the PyTorch loop, framework:pytorch)");
  cmd->add_option("--checkpointing", a.checkpointing, "Activation checkpointing: none, selective or full");
  cmd->add_option("--zero", a.zero, "ZeRO stage 0-3 over --dp ranks");
  cmd->add_option("--dp", a.dp, "Data-parallel degree");
  cmd->add_option("--tp", a.tp, "Tensor-parallel degree (divides heads, kv_heads, ffn)");
  cmd->add_option("--pp", a.pp, "Pipeline-parallel degree (divides layers; each stage a device of the trace)");
}

// --- the subcommands ------------------------------------------------------------------------

class DemoCommand final : public Subcommand {
 public:
  explicit DemoCommand(CLI::App& app)
      : Subcommand(app.add_subcommand(
            "demo", "Replay a built-in LLM training trace against every allocator, fit it, plan a micro-batch")) {
    app_->add_flag("--json", json_, "Machine-readable output");
  }
  int run() override { return cmd_demo(json_); }

 private:
  bool json_ = false;
};

class AllocatorsCommand final : public Subcommand {
 public:
  explicit AllocatorsCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("allocators", "List the allocators and the settings each takes")) {
    app_->add_flag("--json", json_, "Machine-readable output");
  }
  int run() override { return cmd_allocators(json_); }

 private:
  bool json_ = false;
};

class InfoCommand final : public Subcommand {
 public:
  explicit InfoCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("info", "Events, devices, streams, size and lifetime histograms of a trace")) {
    app_->add_option("trace", trace_, kTraceHelp)->required();
    app_->add_flag("--json", json_, "Machine-readable output");
  }
  int run() override { return cmd_info(trace_, json_); }

 private:
  std::string trace_;
  bool json_ = false;
};

class ReplayCommand final : public Subcommand {
 public:
  explicit ReplayCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("replay", "Replay a trace against one allocator")) {
    args_.add_to(app_);
    app_->add_option("--allocator", allocator_, "One of " + join(replay::target_names()) + " (default tensorpool)");
  }
  void check() override { run_ = args_.options({allocator_}); }
  int run() override {
    run_.cost_model = args_.targets.load_cost_model();
    return cmd_replay(run_);
  }

 private:
  RunArgs args_;
  std::string allocator_ = "tensorpool";
  RunOptions run_;
};

class CompareCommand final : public Subcommand {
 public:
  explicit CompareCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("compare", "Replay a trace against several allocators, side by side")) {
    args_.add_to(app_);
    allocators_.add_to(app_);
  }
  void check() override { run_ = args_.options(allocators_.names()); }
  int run() override {
    run_.cost_model = args_.targets.load_cost_model();
    return cmd_compare(run_);
  }

 private:
  RunArgs args_;
  AllocatorList allocators_;
  RunOptions run_;
};

class ExportCommand final : public Subcommand {
 public:
  explicit ExportCommand(CLI::App& app)
      : Subcommand(app.add_subcommand(
            "export", "Replay a trace and write the allocator's memory and events as a PyTorch snapshot")) {
    args_.add_to(app_);
    app_->add_option("--allocator", allocator_,
                     "One of " + join(replay::exporting_target_names()) + " (default tensorpool)");
    app_->add_option("-o,--output", out_, "Snapshot to write (.pickle)")->required();
    app_->add_option("--max-entries", max_entries_, "Keep the newest N events (default 1000000)")->check(kCount);
  }
  // Refused before the trace is read: an allocator that cannot export, an unwritable output.
  void check() override {
    run_ = args_.options({allocator_});
    replay::require_export(allocator_);
    trace::pytorch::check_writable(out_);
  }
  int run() override {
    run_.cost_model = args_.targets.load_cost_model();
    return cmd_export(run_, out_, max_entries_);
  }

 private:
  RunArgs args_;
  std::string allocator_ = "tensorpool";
  std::string out_;
  std::size_t max_entries_ = 1'000'000;
  RunOptions run_;
};

class ReportCommand final : public Subcommand {
 public:
  explicit ReportCommand(CLI::App& app)
      : Subcommand(app.add_subcommand(
            "report", "Replay a trace against several allocators and write one self-contained HTML report "
                      "(memory over time, fragmentation, block maps at peak and at the first OOM, histograms)")) {
    args_.add_to(app_);
    allocators_.add_to(app_);
    app_->add_option("-o,--output", out_, "Report to write (.html)")->required();
    app_->add_flag("--fit", fit_, "Also the smallest device each allocator fits (as tensorpool fit: 0.5% or 2 MiB)");
    app_->get_option("--device")->description("Report on this device of the trace (default: the one with the most allocations)");
  }
  void check() override {
    run_ = args_.options(allocators_.names());
    trace::pytorch::check_writable(out_, "report");
  }
  int run() override {
    run_.cost_model = args_.targets.load_cost_model();
    const replay::FitOptions search = SearchArgs{}.options();
    return cmd_report(run_, out_, fit_ ? &search : nullptr);
  }

 private:
  RunArgs args_;
  AllocatorList allocators_;
  std::string out_;
  bool fit_ = false;
  RunOptions run_;
};

class ConvertCommand final : public Subcommand {
 public:
  explicit ConvertCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("convert", "Convert a trace to tensorpool's format (.tptrace or .jsonl)")) {
    app_->add_option("in", in_, "Input trace (any supported kind)")->required();
    app_->add_option("out", out_, "Output file; .tptrace (binary) or .jsonl")->required();
    app_->add_flag("--allow-truncated", allow_truncated_,
                   "Salvage a tensorpool trace that ends early (a killed recording): convert it up "
                   "to the cut and say where it was cut");
  }
  int run() override { return cmd_convert(in_, out_, allow_truncated_); }

 private:
  std::string in_, out_;
  bool allow_truncated_ = false;
};

class GenerateCommand final : public Subcommand {
 public:
  explicit GenerateCommand(CLI::App& app)
      : Subcommand(app.add_subcommand(
            "generate", "Write the trace of a training or inference run of a model (a preset, or custom: the shape by --options)")) {
    app_->add_option("out", out_, "Output file; .tptrace (binary) or .jsonl")->required();
    app_->add_option("--options", workload_.options, "key:value,... of " + join(workload::WorkloadSetup::keys()));
    add_workload_flags(app_, workload_, WorkloadFlags::generate);
  }
  void check() override { setup_ = workload_setup(workload_); }
  int run() override { return cmd_generate_workload(out_, setup_); }

 private:
  std::string out_;
  WorkloadArgs workload_;
  workload::WorkloadSetup setup_;
};

class FitCommand final : public Subcommand {
 public:
  explicit FitCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("fit", "The smallest device capacity each allocator replays a trace on without an OOM")) {
    app_->add_option("trace", trace_, kTraceHelp)->required();
    allocators_.add_to(app_);
    targets_.add_to(app_);
    app_->add_option("--device", device_, "Only this device of the trace (default: each device on its own)");
    app_->add_option("--warmup", warmup_, "Replay the window N times before the measured pass")->check(CLI::Range(0, 100));
    program_.add_to(app_);
    search_.add_threads(app_);
    search_.add_precision(app_);
    output_.add_to(app_);
  }
  void check() override {
    run_.trace = trace_;
    run_.allocators = allocators_.names();
    run_.device = device_;
    run_.warmup = warmup_;
    program_.apply_to(run_);
    run_.json = output_.json;
    run_.quiet = output_.quiet;
    search_options_ = search_.options();
    targets_.resolve(run_);
  }
  int run() override {
    run_.cost_model = targets_.load_cost_model();
    return cmd_fit(run_, search_options_);
  }

 private:
  std::string trace_;
  AllocatorList allocators_;
  TargetArgs targets_;
  int device_ = -1;
  int warmup_ = 0;
  ProgramArgs program_;
  SearchArgs search_;
  OutputArgs output_;
  RunOptions run_;
  replay::FitOptions search_options_;
};

class PlanCommand final : public Subcommand {
 public:
  explicit PlanCommand(CLI::App& app)
      : Subcommand(app.add_subcommand("plan", "The largest micro-batch each allocator fits, and the changes that fit a larger one")) {
    add_workload_flags(app_, workload_, WorkloadFlags::plan);
    app_->add_option("--options", workload_.options, "key:value,... of " + join(workload::WorkloadSetup::keys()));
    app_->add_option("--capacity", capacity_, "Device memory (default 80GiB)");
    allocators_.add_to(app_);
    targets_.add_to(app_);
    program_.add_to(app_);
    search_.add_threads(app_);
    output_.add_to(app_);
    app_->add_option("--report", plan_.report,
                     "Also write the plan as one self-contained HTML page: the answer, and where the bytes go at the peak as stacked bars");
    app_->add_option("--capture", plan_.capture.script,
                     "Plan your own training script instead of a model: SCRIPT and its arguments, with {micro_batch} where the "
                     "micro-batch goes (\"train.py --batch-size {micro_batch}\"); each candidate is captured without a GPU by "
                     "python -m tensorpool.capture (needs torch); --global-batch and --dp apply, the model options do not");
    app_->add_option("--python", plan_.capture.python,
                     "With --capture: the Python that runs it, with torch and the tensorpool package (default: $TENSORPOOL_PYTHON, "
                     "else python3)");
    app_->add_option("--capture-steps", plan_.capture.steps,
                     "With --capture: optimizer steps captured at each micro-batch (default 2: the first makes the optimizer's states)");
  }
  void check() override {
    run_.capacity = parse_capacity(capacity_);
    run_.allocators = allocators_.names();
    program_.apply_to(run_);
    targets_.resolve(run_);
    if (!plan_.report.empty()) trace::pytorch::check_writable(plan_.report, "plan report");
    if (!plan_.capture.empty()) {
      check_capture(plan_.capture);
      for (const char* flag : {"--model", "--options", "--seq", "--precision", "--checkpointing", "--zero", "--tp", "--pp"})
        if (app_->count(flag) > 0)
          throw ConfigError(std::string("plan --capture plans the script's own model and loop: ") + flag + " does not apply");
      if (app_->count("--python") == 0)
        if (const char* python = std::getenv("TENSORPOOL_PYTHON"); python != nullptr && *python != '\0')
          plan_.capture.python = python;
    } else if (app_->count("--python") > 0 || app_->count("--capture-steps") > 0) {
      throw ConfigError("plan: --python and --capture-steps go with --capture");
    }
    plan_.setup = workload_setup(workload_);
    check_plan(plan_.setup);
    plan_.capacity = run_.capacity;
    plan_.threads = search_.threads;
    plan_.json = output_.json;
    plan_.quiet = output_.quiet;
  }
  int run() override {
    run_.cost_model = targets_.load_cost_model();
    plan_.targets = fit_targets(run_);
    return cmd_plan(plan_);
  }

 private:
  WorkloadArgs workload_;
  std::string capacity_ = "80GiB";
  AllocatorList allocators_;
  TargetArgs targets_;
  ProgramArgs program_;
  SearchArgs search_;
  OutputArgs output_;
  RunOptions run_;  // the allocators, their settings, how the program runs
  PlanOptions plan_;
};

template <class Command>
std::unique_ptr<Subcommand> make(CLI::App& app) {
  return std::make_unique<Command>(app);
}

}  // namespace

std::vector<std::unique_ptr<Subcommand>> add_subcommands(CLI::App& app) {
  using Maker = std::unique_ptr<Subcommand> (*)(CLI::App&);
  static constexpr Maker kTable[] = {
      &make<DemoCommand>,   &make<AllocatorsCommand>, &make<InfoCommand>,     &make<ReplayCommand>,
      &make<CompareCommand>, &make<ExportCommand>,    &make<ReportCommand>,   &make<ConvertCommand>,
      &make<GenerateCommand>, &make<FitCommand>,      &make<PlanCommand>,
  };
  std::vector<std::unique_ptr<Subcommand>> commands;
  for (const Maker make_command : kTable) commands.push_back(make_command(app));
  return commands;
}

}  // namespace tensorpool::cli
