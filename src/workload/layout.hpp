// layout.hpp: what the training and inference builders share (internal to tensorpool::workload):
// the parameter tensors of one tensor-parallel rank, and lengths drawn from a distribution.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tensorpool/workload/setup.hpp"

namespace tensorpool::workload {

/// A parameter tensor of one tensor-parallel rank: its name (the label after "weights:") and
/// element count. Biases are counted with their weight.
struct Param {
  std::string name;
  std::uint64_t elements = 0;
  /// A weight matrix (in x out, plus a bias row when the model has biases); 0 for norms and
  /// embeddings. LoRA adapts exactly these (finetune:lora|qlora).
  std::uint64_t in = 0, out = 0;
  bool trainable = true;  // false: a frozen base weight (no gradient, no optimizer state)
};

/// One transformer layer: norms, the fused QKV projection, the output projection, the MLP (or
/// the router and every expert). Heads, the MLP's width and the experts' widths are divided by tp.
std::vector<Param> layer_params(const WorkloadSetup& s);
/// The token embedding (vocabulary rows divided by tp) and the learned positions, if any.
std::vector<Param> embedding_params(const WorkloadSetup& s);
/// The final norm and, unless it is tied to the token embedding on the same device, the output
/// layer (a pipeline's last stage keeps its own copy of a tied embedding).
std::vector<Param> head_params(const WorkloadSetup& s);

std::uint64_t total_elements(const std::vector<Param>& params);

/// One optimizer moment of a tensor of n elements, `full` bytes per element at full precision: that,
/// or with optimizer:adamw8bit and at least 4096 elements uint8 with an fp32 scale per block of 256
/// (bitsandbytes' block-wise states; the scales, a tensor of their own there, counted with it).
std::uint64_t moment_bytes(const WorkloadSetup& s, std::uint64_t n, std::uint64_t full);

/// The sequence length of every micro-batch put in the trace, per optimizer step (the same on
/// every pipeline stage): drawn from the setup's distribution, rounded down to 64 from 128 up.
std::vector<std::vector<std::uint64_t>> micro_batch_lengths(const WorkloadSetup& s);

/// A length from `d` (see LengthDistribution); `granule` rounds drawn lengths down (not below
/// d.min, and never for Kind::fixed).
std::uint64_t draw_length(const LengthDistribution& d, std::mt19937_64& rng, std::uint64_t granule = 1);

}  // namespace tensorpool::workload
