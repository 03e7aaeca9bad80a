// layout.cpp: the parameter tensors of a rank and length distributions (see layout.hpp).
#include "layout.hpp"

#include <algorithm>
#include <cmath>

namespace tensorpool::workload {

namespace {
std::uint64_t norm_elements(const ModelShape& m) { return m.norm == NormKind::layernorm ? 2 * m.hidden : m.hidden; }
}  // namespace

std::vector<Param> layer_params(const WorkloadSetup& s) {
  const ModelShape& m = s.model;
  const std::uint64_t h = m.hidden;
  const auto t = static_cast<std::uint64_t>(s.tp);
  const std::uint64_t qkv = h + 2 * m.kv_dim();
  const std::uint64_t f = m.ffn / t;
  const std::uint64_t bias = m.biases ? 1 : 0;
  std::vector<Param> p = {
      {"attention.norm", norm_elements(m)},
      {"attention.qkv", h * qkv / t + bias * qkv / t, h, qkv / t},
      {"attention.out", h / t * h + bias * h, h / t, h},
      {"mlp.norm", norm_elements(m)},
  };
  const auto expert = [&](const std::string& prefix) {
    if (m.mlp == MlpKind::gated) {
      p.push_back({prefix + "gate", h * f, h, f});
      p.push_back({prefix + "up", h * f, h, f});
      p.push_back({prefix + "down", f * h, f, h});
    } else {
      p.push_back({prefix + "fc1", h * f + bias * f, h, f});
      p.push_back({prefix + "fc2", f * h + bias * h, f, h});
    }
  };
  if (m.experts > 1) {
    p.push_back({"moe.router", h * static_cast<std::uint64_t>(m.experts)});
    for (int e = 0; e < m.experts; ++e) expert("moe.expert" + std::to_string(e) + ".");
  } else {
    expert("mlp.");
  }
  return p;
}

std::vector<Param> embedding_params(const WorkloadSetup& s) {
  std::vector<Param> p = {{"embedding.tokens", s.vocab_per_rank() * s.model.hidden}};
  if (s.model.positions > 0) p.push_back({"embedding.positions", s.model.positions * s.model.hidden});
  return p;
}

std::vector<Param> head_params(const WorkloadSetup& s) {
  std::vector<Param> p = {{"final_norm", norm_elements(s.model)}};
  if (!s.model.tied_embeddings || s.pp > 1) p.push_back({"lm_head", s.vocab_per_rank() * s.model.hidden});
  return p;
}

std::uint64_t total_elements(const std::vector<Param>& params) {
  std::uint64_t n = 0;
  for (const Param& p : params) n += p.elements;
  return n;
}

std::uint64_t moment_bytes(const WorkloadSetup& s, std::uint64_t n, std::uint64_t full) {
  if (s.optimizer != Optimizer::adamw8bit || n < 4096) return full * n;
  return n + 4 * ((n + 255) / 256);
}

std::vector<std::vector<std::uint64_t>> micro_batch_lengths(const WorkloadSetup& s) {
  std::mt19937_64 rng(s.seed);
  const std::uint64_t seq = s.sequence();
  const LengthDistribution d = s.sequence_lengths();
  const std::uint64_t all = s.accumulation();
  const std::uint64_t per_step = s.trace_micro_batches == 0 ? all : std::min(all, s.trace_micro_batches);
  std::vector<std::vector<std::uint64_t>> lengths(static_cast<std::size_t>(s.steps));
  for (auto& step : lengths)
    for (std::uint64_t i = 0; i < per_step; ++i) step.push_back(draw_length(d, rng, seq >= 128 ? 64 : 1));
  return lengths;
}

std::uint64_t draw_length(const LengthDistribution& d, std::mt19937_64& rng, std::uint64_t granule) {
  using Kind = LengthDistribution::Kind;
  if (d.kind == Kind::fixed || d.min >= d.max) return d.max;
  double x = 0.0;
  if (d.kind == Kind::uniform) {
    x = static_cast<double>(std::uniform_int_distribution<std::uint64_t>(d.min, d.max)(rng));
  } else {
    const double lo = std::log(static_cast<double>(d.min));
    const double hi = std::log(static_cast<double>(d.max));
    x = std::exp(std::normal_distribution<double>((lo + hi) / 2, (hi - lo) / 4)(rng));
  }
  auto n = static_cast<std::uint64_t>(std::clamp(x, static_cast<double>(d.min), static_cast<double>(d.max)));
  if (granule > 1) n = n / granule * granule;
  return std::max(n, d.min);
}

}  // namespace tensorpool::workload
