// generator.cpp: the synthetic LLM trace (see generator.hpp for the pattern it follows).
#include "tensorpool/workload/generator.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "trace_builder.hpp"

namespace tensorpool::workload {

namespace {

struct Layer {
  std::vector<std::uint64_t> weights;  // bf16 parameters
  std::vector<std::uint64_t> sizes;    // their byte sizes
};

class LlmTrace {
 public:
  LlmTrace(const GeneratorOptions& o, trace::Trace& t) : o_(o), b_(t), rng_(o.seed) {}

  void run() {
    create_weights();
    for (int it = 0; it < o_.iterations; ++it) {
      b_.iteration(static_cast<std::uint64_t>(it));
      const std::uint64_t seq = sequence_length();
      if (o_.training) {
        train_step(seq);
      } else {
        infer_step(seq);
      }
    }
  }

 private:
  std::uint64_t h() const { return o_.hidden; }
  std::uint64_t ffn() const { return o_.hidden * o_.ffn_multiple; }

  std::uint64_t sequence_length() {
    if (!o_.varlen) return o_.seq_len;
    std::uniform_int_distribution<std::uint64_t> d(o_.seq_len / 2, o_.seq_len);
    return std::max<std::uint64_t>(64, d(rng_) / 64 * 64);
  }

  void create_weights() {
    embedding_ = b_.alloc(o_.vocab * h() * 2, "embedding.weight");
    for (int l = 0; l < o_.layers; ++l) {
      Layer layer;
      for (std::uint64_t bytes : {3 * h() * h() * 2, h() * h() * 2, h() * ffn() * 2, ffn() * h() * 2,
                                  h() * 2, h() * 2}) {
        layer.weights.push_back(b_.alloc(bytes, "layer.weight"));
        layer.sizes.push_back(bytes);
      }
      layers_.push_back(layer);
    }
    head_ = b_.alloc(o_.vocab * h() * 2, "lm_head.weight");
    if (o_.training && o_.eager_optimizer) create_optimizer_states();
  }

  std::vector<std::uint64_t> parameter_sizes() const {
    std::vector<std::uint64_t> sizes = {o_.vocab * h() * 2, o_.vocab * h() * 2};
    for (const auto& layer : layers_) sizes.insert(sizes.end(), layer.sizes.begin(), layer.sizes.end());
    return sizes;
  }

  // AdamW exp_avg and exp_avg_sq in fp32.
  void create_optimizer_states() {
    for (std::uint64_t bytes : parameter_sizes()) {
      adam_.push_back(b_.alloc(bytes * 2, "adamw.exp_avg"));
      adam_.push_back(b_.alloc(bytes * 2, "adamw.exp_avg_sq"));
    }
  }

  // Forward of one layer; returns the activations kept for backward.
  std::vector<std::uint64_t> layer_forward(std::uint64_t tokens, std::uint64_t seq, bool keep) {
    const std::uint64_t act = tokens * h() * 2;
    std::vector<std::uint64_t> saved;
    auto keep_or_free = [&](std::uint64_t a) {
      if (keep) saved.push_back(a);
      else b_.free(a);
    };
    const std::uint64_t ln1 = b_.alloc(act, "layer_norm");
    const std::uint64_t qkv = b_.alloc(3 * act, "attention.qkv");
    const std::uint64_t lse = b_.alloc(o_.batch * static_cast<std::uint64_t>(o_.heads) * seq * 4, "flash_attn.lse");
    const std::uint64_t attn = b_.alloc(act, "flash_attn.out");
    const std::uint64_t proj = b_.alloc(act, "attention.proj");
    keep_or_free(ln1);
    keep_or_free(qkv);
    keep_or_free(lse);
    keep_or_free(attn);
    const std::uint64_t resid1 = b_.alloc(act, "residual");
    b_.free(proj);
    const std::uint64_t ln2 = b_.alloc(act, "layer_norm");
    const std::uint64_t up = b_.alloc(tokens * ffn() * 2, "mlp.up");
    const std::uint64_t gelu = b_.alloc(tokens * ffn() * 2, "mlp.gelu");
    const std::uint64_t down = b_.alloc(act, "mlp.down");
    keep_or_free(ln2);
    keep_or_free(up);
    keep_or_free(gelu);
    const std::uint64_t resid2 = b_.alloc(act, "residual");
    b_.free(down);
    keep_or_free(resid1);
    saved.push_back(resid2);  // the next layer's input (freed by the caller in inference)
    return saved;
  }

  void train_step(std::uint64_t seq) {
    const std::uint64_t tokens = o_.batch * seq;
    const std::uint64_t act = tokens * h() * 2;
    std::vector<std::vector<std::uint64_t>> saved;
    const std::uint64_t input = b_.alloc(tokens * 8, "input_ids");
    const std::uint64_t emb = b_.alloc(act, "embedding");
    for (int l = 0; l < o_.layers; ++l) saved.push_back(layer_forward(tokens, seq, true));
    // Loss over the vocabulary: bf16 logits, fp32 upcast and its gradient.
    const std::uint64_t logits = b_.alloc(tokens * o_.vocab * 2, "lm_head.logits");
    const std::uint64_t upcast = b_.alloc(tokens * o_.vocab * 4, "cross_entropy.float");
    const std::uint64_t loss = b_.alloc(4, "loss");
    b_.free(upcast);
    const std::uint64_t dlogits = b_.alloc(tokens * o_.vocab * 2, "cross_entropy.backward");
    b_.free(logits);
    std::vector<std::uint64_t> grads;
    grads.push_back(b_.alloc(o_.vocab * h() * 2, "lm_head.grad"));
    std::uint64_t dx = b_.alloc(act, "grad_input");
    b_.free(dlogits);
    for (int l = o_.layers - 1; l >= 0; --l) {
      const auto idx = static_cast<std::size_t>(l);
      const std::uint64_t tmp = b_.alloc(tokens * ffn() * 2, "mlp.backward");
      for (std::uint64_t bytes : layers_[idx].sizes) grads.push_back(b_.alloc(bytes, "weight.grad"));
      b_.free(tmp);
      const std::uint64_t next_dx = b_.alloc(act, "grad_input");
      b_.free(dx);
      dx = next_dx;
      for (std::uint64_t a : saved[idx]) b_.free(a);
      if (o_.comm_stream) {  // this layer's gradients are reduced on the communication stream
        for (std::size_t g = grads.size() - layers_[idx].sizes.size(); g < grads.size(); ++g)
          b_.record_stream(grads[g], kCommStream);
      }
    }
    grads.push_back(b_.alloc(o_.vocab * h() * 2, "embedding.grad"));
    b_.free(dx);
    b_.free(emb);
    b_.free(input);
    b_.free(loss);
    if (o_.comm_stream) b_.sync(kCommStream);
    optimizer_step();
    for (std::uint64_t g : grads) b_.free(g);  // zero_grad(set_to_none=True)
  }

  void optimizer_step() {
    if (adam_.empty()) create_optimizer_states();  // lazily, at the first step
    for (std::uint64_t bytes : parameter_sizes()) {  // foreach temporaries, one parameter at a time
      const std::uint64_t tmp = b_.alloc(bytes * 2, "adamw.step_tmp");
      b_.free(tmp);
    }
  }

  void infer_step(std::uint64_t seq) {
    const std::uint64_t tokens = o_.batch * seq;
    std::uint64_t x = b_.alloc(tokens * h() * 2, "embedding");
    for (int l = 0; l < o_.layers; ++l) {
      const auto out = layer_forward(tokens, seq, false);
      b_.free(x);
      x = out.back();
    }
    const std::uint64_t logits = b_.alloc(o_.batch * o_.vocab * 2, "lm_head.logits");
    b_.free(x);
    b_.free(logits);
  }

  const GeneratorOptions& o_;
  TraceBuilder b_;
  std::mt19937_64 rng_;
  std::uint64_t embedding_ = 0;
  std::uint64_t head_ = 0;
  std::vector<Layer> layers_;
  std::vector<std::uint64_t> adam_;
};

}  // namespace

const std::vector<std::string>& GeneratorOptions::keys() {
  static const std::vector<std::string> k = {
      "layers", "hidden",     "heads",      "ffn_multiple", "vocab",           "batch", "seq_len",
      "varlen", "training",   "iterations", "comm_stream",  "eager_optimizer", "seed"};
  return k;
}

void GeneratorOptions::apply(std::string_view text, std::string_view origin) {
  constexpr std::uint64_t kMaxInt = std::numeric_limits<int>::max();
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  for (const KeyValue& e : parse_key_values(text, origin)) {
    const auto number = [&](std::uint64_t min, std::uint64_t max) {
      return whole_number(origin, e, min, max);
    };
    if (e.key == "layers") layers = static_cast<int>(number(1, kMaxInt));
    else if (e.key == "hidden") hidden = number(64, kMax);
    else if (e.key == "heads") heads = static_cast<int>(number(1, kMaxInt));
    else if (e.key == "ffn_multiple") ffn_multiple = number(1, kMax);
    else if (e.key == "vocab") vocab = number(1, kMax);
    else if (e.key == "batch") batch = number(1, kMax);
    else if (e.key == "seq_len") seq_len = number(64, kMax);
    else if (e.key == "iterations") iterations = static_cast<int>(number(1, kMaxInt));
    else if (e.key == "seed") seed = number(0, kMax);
    else if (e.key == "varlen") varlen = bool_value(origin, e);
    else if (e.key == "training") training = bool_value(origin, e);
    else if (e.key == "comm_stream") comm_stream = bool_value(origin, e);
    else if (e.key == "eager_optimizer") eager_optimizer = bool_value(origin, e);
    else throw_unknown_key(origin, e, keys());
  }
}

std::string GeneratorOptions::to_string() const {
  auto b = [](bool v) { return v ? "true" : "false"; };
  return "layers:" + std::to_string(layers) + ",hidden:" + std::to_string(hidden) +
         ",heads:" + std::to_string(heads) + ",ffn_multiple:" + std::to_string(ffn_multiple) +
         ",vocab:" + std::to_string(vocab) + ",batch:" + std::to_string(batch) +
         ",seq_len:" + std::to_string(seq_len) + ",varlen:" + b(varlen) + ",training:" + b(training) +
         ",iterations:" + std::to_string(iterations) + ",comm_stream:" + b(comm_stream) +
         ",eager_optimizer:" + b(eager_optimizer) +
         ",seed:" + std::to_string(seed);
}

trace::Trace generate_llm_trace(const GeneratorOptions& options) {
  trace::Trace t;
  t.info.source = "generator:llm";
  t.info.metadata.push_back("generator=" + options.to_string());
  LlmTrace(options, t).run();
  return t;
}

}  // namespace tensorpool::workload
