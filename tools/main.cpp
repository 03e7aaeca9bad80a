// main.cpp: the tensorpool command-line tool: argument parsing and exit codes.
//
// Exit codes: 0 success; 1 a bad or unreadable input file (the message names the file and the
// offset or line); 2 bad arguments (unknown allocator, bad size, bad --conf, ...).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "commands.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/target.hpp"

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
  const auto known = replay::target_names();
  for (const auto& n : names)
    if (std::find(known.begin(), known.end(), n) == known.end()) replay::make_target(n, {});  // throws
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensorpool: a GPU caching allocator, its trace tools and allocator comparisons"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tensorpool 0.1.0");

  bool json = false;
  std::string trace_path, out_path, allocators, capacity = "80GiB", conf, gen_options;
  std::string allocator = "tensorpool";
  int device = -1;
  int warmup = 0;
  bool attempt_ooms = false;

  auto* demo = app.add_subcommand("demo", "Replay a built-in LLM training trace against every allocator");
  demo->add_flag("--json", json, "Machine-readable output");

  auto* info = app.add_subcommand("info", "Events, devices, streams, size and lifetime histograms of a trace");
  info->add_option("trace", trace_path, "PyTorch snapshot (.pickle), RMM log (.csv) or tensorpool trace")->required();
  info->add_flag("--json", json, "Machine-readable output");

  auto add_run_options = [&](CLI::App* cmd) {
    cmd->add_option("trace", trace_path, "PyTorch snapshot (.pickle), RMM log (.csv) or tensorpool trace")->required();
    cmd->add_option("--capacity", capacity, "Simulated device memory (default 80GiB)");
    cmd->add_option("--conf", conf, "tensorpool settings, TENSORPOOL_CONF syntax (key:value,...); "
                                    "applies to tensorpool and tensorpool-vmm");
    cmd->add_option("--device", device, "Replay only this device of the trace (default: all)");
    cmd->add_option("--warmup", warmup, "Replay the window N times before the measured pass (steady state)")
        ->check(CLI::Range(0, 100));
    cmd->add_flag("--attempt-ooms", attempt_ooms,
                  "Present the requests that failed in the recording (oom events) to the allocator "
                  "too, as a live recording of it saw them");
    cmd->add_flag("--json", json, "Machine-readable output");
  };
  auto* replay_cmd = app.add_subcommand("replay", "Replay a trace against one allocator");
  add_run_options(replay_cmd);
  replay_cmd->add_option("--allocator", allocator, "tensorpool, tensorpool-vmm, pytorch, pytorch-expandable, cub or raw (default tensorpool)");

  auto* compare = app.add_subcommand("compare", "Replay a trace against several allocators, side by side");
  add_run_options(compare);
  compare->add_option("--allocators", allocators, "Comma-separated list (default: all)");

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
                       "key:value,... of layers, hidden, heads, ffn_multiple, vocab, batch, seq_len, "
                       "varlen, training, iterations, comm_stream, eager_optimizer, seed");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kBadArguments;
  }

  cli::RunOptions run;
  try {
    run.trace = trace_path;
    run.json = json;
    run.device = device;
    run.warmup = warmup;
    run.attempt_ooms = attempt_ooms;
    run.conf = conf;
    run.capacity = parse_capacity(capacity);
    run.allocators = replay_cmd->parsed() ? std::vector<std::string>{allocator}
                     : allocators.empty() ? replay::target_names()
                                          : split(allocators);
    check_allocators(run.allocators);
    if (!conf.empty()) Config::parse(conf, "--conf");
  } catch (const CLI::ValidationError& e) {
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadArguments;
  } catch (const Error& e) {  // UsageError, ConfigError
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadArguments;
  }

  try {
    if (demo->parsed()) return cli::cmd_demo(json);
    if (info->parsed()) return cli::cmd_info(trace_path, json);
    if (replay_cmd->parsed()) return cli::cmd_replay(run);
    if (compare->parsed()) return cli::cmd_compare(run);
    if (convert->parsed()) return cli::cmd_convert(trace_path, out_path, allow_truncated);
    if (generate->parsed()) {
      try {
        return cli::cmd_generate(out_path, gen_options);
      } catch (const ConfigError& e) {
        std::cerr << "tensorpool: error: --options: " << e.what() << "\n";
        return kBadArguments;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "tensorpool: error: " << e.what() << "\n";
    return kBadInput;
  }
  return kBadArguments;
}
