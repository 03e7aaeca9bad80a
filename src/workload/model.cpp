// model.cpp: the published shapes of the presets and parameter counting (see model.hpp).
#include "tensorpool/workload/model.hpp"

#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"

namespace tensorpool::workload {

namespace {

ModelShape llama(std::string name, int layers, std::uint64_t hidden, int heads, int kv_heads,
                 std::uint64_t ffn, std::uint64_t vocab, std::uint64_t context) {
  ModelShape m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.context = context;
  return m;  // the defaults are the Llama block: SwiGLU, RMSNorm, rotary, no biases, untied
}

ModelShape gpt2(std::string name, int layers, std::uint64_t hidden, int heads) {
  ModelShape m = llama(std::move(name), layers, hidden, heads, heads, 4 * hidden, 50257, 1024);
  m.mlp = MlpKind::gelu;
  m.norm = NormKind::layernorm;
  m.biases = true;
  m.dropout = true;
  m.tied_embeddings = true;
  m.positions = 1024;
  return m;
}

ModelShape mixtral() {
  ModelShape m = llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096);
  m.experts = 8;
  m.top_k = 2;
  return m;
}

}  // namespace

std::uint64_t ModelShape::layer_parameters() const {
  const std::uint64_t h = hidden;
  const std::uint64_t kv = kv_dim();
  const std::uint64_t norm_params = norm == NormKind::layernorm ? 2 * h : h;
  std::uint64_t attention = h * (h + 2 * kv) + h * h;
  if (biases) attention += h + 2 * kv + h;
  std::uint64_t expert = mlp == MlpKind::gated ? 3 * h * ffn : 2 * h * ffn;
  if (biases) expert += ffn + h;
  const auto n = static_cast<std::uint64_t>(experts);
  const std::uint64_t router = experts > 1 ? h * n : 0;
  return 2 * norm_params + attention + n * expert + router;
}

std::uint64_t ModelShape::embedding_parameters() const {
  const std::uint64_t token = vocab * hidden;
  const std::uint64_t final_norm = norm == NormKind::layernorm ? 2 * hidden : hidden;
  return token + positions * hidden + final_norm + (tied_embeddings ? 0 : token);
}

std::uint64_t ModelShape::parameters() const {
  return static_cast<std::uint64_t>(layers) * layer_parameters() + embedding_parameters();
}

const std::vector<ModelShape>& model_presets() {
  static const std::vector<ModelShape> presets = {
      gpt2("gpt2", 12, 768, 12),
      gpt2("gpt2-xl", 48, 1600, 25),
      llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
      llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
      llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
      llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
      mixtral(),
  };
  return presets;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelShape& m : model_presets()) {
    names.push_back(m.name);
    if (m.name == "gpt2-xl") names.emplace_back("gpt2-1.5b");
  }
  return names;
}

const ModelShape& model_preset(std::string_view name) {
  const std::string_view wanted = name == "gpt2-1.5b" ? "gpt2-xl" : name;
  for (const ModelShape& m : model_presets())
    if (m.name == wanted) return m;
  throw UsageError("unknown model '" + std::string(name) + "'; known models: " +
                   join(model_preset_names()) + " (or 'custom' with the shape given by options)");
}

std::string to_string(MlpKind kind) { return kind == MlpKind::gated ? "gated" : "gelu"; }
std::string to_string(NormKind kind) { return kind == NormKind::layernorm ? "layernorm" : "rmsnorm"; }

}  // namespace tensorpool::workload
