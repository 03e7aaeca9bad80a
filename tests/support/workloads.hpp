// tests/support/workloads.hpp: generated traces for the tests, as `tensorpool generate` makes them.
#pragma once

#include <string_view>

#include "tensorpool/trace/event.hpp"
#include "tensorpool/workload/setup.hpp"

namespace tptest {

/// The trace of the run `options` (workload keys, tensorpool/workload/setup.hpp) describes, from
/// the shape `--model custom` starts with, in the Megatron-LM/DeepSpeed loop unless `options` name
/// another (the replay tests were written against its traces: optimizer states created with the
/// weights, so every iteration has the same demand): what `tensorpool generate OUT --options
/// framework:megatron,OPTIONS` writes.
inline tensorpool::trace::Trace generated(std::string_view options) {
  tensorpool::workload::WorkloadSetup s = tensorpool::workload::WorkloadSetup::for_model("custom");
  s.apply("framework:megatron," + std::string(options), "test workload");
  s.validate();
  return tensorpool::workload::generate_workload(s);
}

/// A small training loop: 4 layers of hidden 1024 (SwiGLU 4096), vocabulary 8000, micro-batch 4,
/// sequence lengths uniform in [1024, 2048]; append more keys to change it ("...,steps:8").
inline constexpr std::string_view kSmallTraining =
    "layers:4,hidden:1024,ffn:4096,vocab:8000,micro_batch:4,seq:2048,seq_dist:uniform";

}  // namespace tptest
