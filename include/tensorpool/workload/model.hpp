// tensorpool/workload/model.hpp: the shapes of decoder-only transformers, and presets with the
// published shapes of well-known models.
//
// A shape says what the trace builders (workload/setup.hpp) allocate: the parameter tensors of
// each layer and of the embeddings, and the activations a layer keeps. Presets:
//   gpt2 (124M), gpt2-xl (1.5B; also "gpt2-1.5b"): learned positions, LayerNorm with biases,
//     GELU MLP of 4 x hidden, dropout, the output layer tied to the token embedding;
//   llama2-7b, llama2-13b, llama2-70b (grouped-query attention, 8 KV heads), llama3-8b (GQA,
//     128256-token vocabulary): rotary positions, RMSNorm, SwiGLU MLP, no biases or dropout;
//   mixtral-8x7b: the Llama-style block with 8 SwiGLU experts per layer, 2 routed per token.
// Parameter counts (parameters()) agree with the published ones: 124M, 1.56B, 6.74B, 13.0B, 69.0B,
// 8.03B, 46.7B.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tensorpool::workload {

enum class MlpKind : std::uint8_t { gelu, gated };  // gated: SwiGLU (gate, up, down)
enum class NormKind : std::uint8_t { layernorm, rmsnorm };

struct ModelShape {
  std::string name = "custom";
  int layers = 16;
  std::uint64_t hidden = 2048;
  int heads = 16;
  int kv_heads = 16;          // < heads: grouped-query attention; divides heads
  std::uint64_t ffn = 8192;   // the MLP's inner width (of each expert for MoE)
  std::uint64_t vocab = 32000;
  int experts = 1;            // > 1: a mixture of experts in every layer
  int top_k = 1;              // experts each token is routed to
  MlpKind mlp = MlpKind::gated;
  NormKind norm = NormKind::rmsnorm;
  bool biases = false;            // linear layers have biases
  bool dropout = false;           // dropout after attention, in it, and after the MLP
  bool tied_embeddings = false;   // the output layer shares the token embedding
  std::uint64_t positions = 0;    // rows of a learned position embedding (0: rotary)
  std::uint64_t context = 4096;   // the sequence length the model was trained at

  std::uint64_t head_dim() const { return hidden / static_cast<std::uint64_t>(heads); }
  std::uint64_t kv_dim() const { return head_dim() * static_cast<std::uint64_t>(kv_heads); }
  /// Parameters of one transformer layer, of the embeddings and output layer, and in all.
  std::uint64_t layer_parameters() const;
  std::uint64_t embedding_parameters() const;
  std::uint64_t parameters() const;
};

/// The presets, in the order listed above.
const std::vector<ModelShape>& model_presets();
/// Their names ("gpt2-1.5b" is another name for gpt2-xl and is listed too).
std::vector<std::string> model_preset_names();
/// The preset called `name`; throws UsageError for an unknown one, listing the known ones.
const ModelShape& model_preset(std::string_view name);

std::string to_string(MlpKind kind);
std::string to_string(NormKind kind);

}  // namespace tensorpool::workload
