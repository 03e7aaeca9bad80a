// tensorpool/workload/generator.hpp: synthetic LLM-style allocation traces.
//
// The allocation pattern of a decoder-only transformer as PyTorch produces it: bf16 weights at
// start, then per iteration a forward pass that keeps activations for backward (with flash
// attention: no s x s scores), a loss over the vocabulary in fp32, a backward pass that frees
// activations layer by layer in reverse and allocates gradients (set to None after each step,
// so they are allocated again every iteration), gradient buckets used on a communication stream
// (record_stream), and AdamW states created at the first step (or with the weights, when
// eager_optimizer is set: then every iteration, the first included, has the same demand). With `varlen`, each iteration's
// sequence length is drawn from [seq_len / 2, seq_len], which is what fragments fixed segments.
// Inference mode runs forward passes only, freeing activations as soon as they are consumed.
// Every iteration starts with an `iteration` marker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/trace/event.hpp"

namespace tensorpool::workload {

struct GeneratorOptions {
  int layers = 16;
  std::size_t hidden = 2048;
  int heads = 16;
  std::size_t ffn_multiple = 4;   // MLP width = hidden * ffn_multiple
  std::size_t vocab = 32000;
  std::size_t batch = 4;
  std::size_t seq_len = 2048;
  bool varlen = true;
  bool training = true;
  int iterations = 6;
  bool comm_stream = true;        // gradients also used on a second stream
  bool eager_optimizer = false;   // AdamW states created with the weights (Megatron/DeepSpeed
                                  // style) instead of at the first step (PyTorch's default)
  std::uint64_t seed = 1;

  /// "key:value,..." with the field names above (tensorpool/key_values.hpp); throws ConfigError
  /// naming `origin`, the key, the value and what was expected.
  void apply(std::string_view text, std::string_view origin = "generator options");
  std::string to_string() const;
  /// The keys apply() accepts, in to_string()'s order.
  static const std::vector<std::string>& keys();
};

trace::Trace generate_llm_trace(const GeneratorOptions& options);

}  // namespace tensorpool::workload
