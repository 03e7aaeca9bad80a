// training.cpp: the trace of one data-parallel rank training a transformer (what it allocates and
// when: setup.hpp). Each pipeline stage is a device of the trace.
#include <algorithm>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "layout.hpp"
#include "trace_builder.hpp"
#include "builders.hpp"

namespace tensorpool::workload {

namespace {

struct Tensor {
  std::uint64_t addr = 0;  // 0: none
  std::uint64_t stream = kComputeStream;
  explicit operator bool() const { return addr != 0; }
};

// A parameter group whose states live together and are gathered together under ZeRO-3: the
// embedding, one transformer layer, the head.
struct Unit {
  enum class Kind : std::uint8_t { embedding, layer, head } kind;
  std::vector<Param> params;
  std::vector<Tensor> weights;  // per param (a shard of it under ZeRO-3)
  std::vector<Tensor> grads;    // per param during a step (a shard under ZeRO 2-3); empty otherwise
  Tensor gathered;              // ZeRO-3: the whole weights, between an all-gather and their use
};

// What a layer keeps from its forward pass for its backward pass.
enum class Keep : std::uint8_t { all, no_attention_core, input_only };

struct LayerPass {
  std::vector<Tensor> saved;  // freed by the layer's backward
  Tensor output;
};

// One micro-batch between its forward and its backward pass on one stage.
struct Micro {
  std::uint64_t index = 0;  // within the step
  std::uint64_t batch = 1;
  std::uint64_t seq = 1;
  std::uint64_t tokens() const { return batch * seq; }
  Tensor input_ids;
  std::vector<LayerPass> layers;               // per local layer
  std::vector<std::vector<std::uint64_t>> moe;  // per local layer: tokens per expert
  std::vector<Tensor> loss;                     // last stage: kept for the loss backward
};

class StageTrace {
 public:
  StageTrace(const WorkloadSetup& s, TraceBuilder& b, int stage,
             const std::vector<std::vector<std::uint64_t>>& lengths)
      : s_(s), b_(b), stage_(stage), lengths_(lengths),
        rng_(s.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(stage) + 1) {
    e_ = s.element_bytes();
    t_ = static_cast<std::uint64_t>(s.tp);
    h_ = s.model.hidden;
    const int per_stage = s.model.layers / s.pp;
    layers_ = per_stage;
    first_ = stage == 0;
    last_ = stage == s.pp - 1;
    if (first_) units_.push_back(Unit{Unit::Kind::embedding, embedding_params(s), {}, {}, {}});
    for (int l = 0; l < per_stage; ++l) units_.push_back(Unit{Unit::Kind::layer, layer_params(s), {}, {}, {}});
    if (last_) units_.push_back(Unit{Unit::Kind::head, head_params(s), {}, {}, {}});
    layer0_ = first_ ? 1 : 0;
    for (const Param& p : layer_params(s)) {
      if (p.in == 0) continue;
      ++matrices_per_layer_;
      largest_matrix_ = std::max(largest_matrix_, p.elements);
    }
    if (lora()) add_adapters();
  }

  void run() {
    b_.set_device(stage_);
    create_model_states();
    for (int step = 0; step < s_.steps; ++step) {
      b_.iteration(static_cast<std::uint64_t>(step));
      run_step(static_cast<std::size_t>(step));
      optimizer_step();
    }
  }

 private:
  // --- sizes and small helpers -------------------------------------------------------------

  bool mixed() const { return s_.precision != Precision::fp32; }
  bool sharded_states() const { return s_.zero >= 1; }
  bool offloaded() const { return s_.offload == Offload::optimizer; }
  bool lora() const { return s_.finetune != Finetune::full; }

  // LoRA: every base weight frozen; beside each weight matrix of a layer, A (in x r) and B
  // (r x out), trainable.
  void add_adapters() {
    const std::uint64_t r = s_.lora_rank;
    for (Unit& u : units_) {
      std::vector<Param> adapters;
      for (Param& p : u.params) {
        p.trainable = false;
        if (u.kind != Unit::Kind::layer || p.in == 0) continue;
        adapters.push_back({"lora_A." + p.name, p.in * r});
        adapters.push_back({"lora_B." + p.name, r * p.out});
      }
      u.params.insert(u.params.end(), adapters.begin(), adapters.end());
    }
  }
  // The bytes of a weight on the device: the training precision, or a frozen matrix in NF4
  // (qlora: 4 bits per weight, an 8-bit scale per 64, an fp32 scale per 256 of those).
  std::uint64_t weight_bytes(const Param& p, std::uint64_t n) const {
    if (p.trainable || s_.finetune != Finetune::qlora || p.in == 0) return e_ * n;
    const std::uint64_t blocks = (n + 63) / 64;
    return (n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256);
  }
  // QLoRA: the largest matrix of a layer dequantized for its matmul.
  void dequantize_for_matmul() {
    if (s_.finetune != Finetune::qlora) return;
    Tensor w = alloc(e_ * largest_matrix_, "temporaries:qlora.dequantize");
    free(w);
  }
  bool sharded_grads() const { return s_.zero >= 2; }
  bool sharded_weights() const { return s_.zero >= 3; }
  bool data_parallel() const { return s_.dp > 1; }
  std::uint64_t shard(std::uint64_t elements) const {
    const auto n = static_cast<std::uint64_t>(s_.dp);
    return (elements + n - 1) / n;
  }

  Tensor alloc(std::uint64_t bytes, const std::string& label, std::uint64_t stream = kComputeStream) {
    return Tensor{b_.alloc(bytes, label, stream), stream};
  }
  void free(Tensor& t) {
    if (!t) return;
    b_.free(t.addr, t.stream);
    t = Tensor{};
  }
  // A tensor of the forward pass: kept for backward ("activations:", or `prefix`) or a temporary
  // that the pass frees after its last use (release()).
  Tensor tensor(std::uint64_t bytes, const std::string& name, bool keep, LayerPass& p, const std::string& prefix) {
    Tensor t = alloc(bytes, (keep ? prefix : std::string("temporaries:")) + name);
    if (keep) p.saved.push_back(t);
    return t;
  }
  void release(Tensor& t, bool kept) {
    if (!kept) free(t);
  }

  // --- model states ------------------------------------------------------------------------

  void create_model_states() {
    for (Unit& u : units_) {
      for (const Param& p : u.params) {
        const std::uint64_t n = sharded_weights() ? shard(p.elements) : p.elements;
        u.weights.push_back(alloc(weight_bytes(p, n), "weights:" + p.name));
      }
    }
    if (offloaded()) return;  // master weights and moments in host memory
    for (Unit& u : units_) {  // the optimizer's states, created with the weights
      for (const Param& p : u.params) {
        if (!p.trainable) continue;
        const std::uint64_t n = sharded_states() ? shard(p.elements) : p.elements;
        if (mixed()) alloc(4 * n, "optimizer:master." + p.name);
        alloc(moment_bytes(s_, n, 4), "optimizer:exp_avg." + p.name);
        alloc(moment_bytes(s_, n, 4), "optimizer:exp_avg_sq." + p.name);
      }
    }
  }

  // ZeRO-3: all-gathers unit u's weights (on the communication stream) unless they are here.
  void gather(std::size_t u) {
    if (!sharded_weights() || u >= units_.size() || units_[u].gathered) return;
    Unit& unit = units_[u];
    unit.gathered = alloc(e_ * total_elements(unit.params), "zero:allgather");
    b_.record_stream(unit.gathered.addr, kCommStream);
  }
  // Before computing unit u: its weights, and the next unit's prefetched (`next` out of range:
  // none); the host then knows the gathers done.
  void gather_for(std::size_t u, std::size_t next) {
    if (!sharded_weights()) return;
    gather(u);
    gather(next);
    b_.sync(kCommStream);
  }
  void release_gathered(std::size_t u) {
    if (sharded_weights()) free(units_[u].gathered);
  }

  // The gradients of unit u after its backward in micro-batch `micro`: accumulated in place after
  // the first micro-batch; with ZeRO 2-3 reduce-scattered from a bucket freed on the
  // communication stream, without ZeRO all-reduced there after the last micro-batch.
  void gradients(std::size_t u, const Micro& micro) {
    Unit& unit = units_[u];
    const bool first = unit.grads.empty();
    if (sharded_grads()) {
      Tensor bucket = alloc(e_ * total_elements(unit.params), "zero:grad_bucket");
      b_.record_stream(bucket.addr, kCommStream);
      if (first)
        for (const Param& p : unit.params)
          if (p.trainable) unit.grads.push_back(alloc(e_ * shard(p.elements), "grads:" + p.name));
      free(bucket);
      return;
    }
    if (first)
      for (const Param& p : unit.params)
        if (p.trainable) unit.grads.push_back(alloc(e_ * p.elements, "grads:" + p.name));
    if (data_parallel() && micro.index + 1 == trace_micro_batches())
      for (const Tensor& g : unit.grads) b_.record_stream(g.addr, kCommStream);
  }

  void optimizer_step() {
    if (data_parallel()) b_.sync(kCommStream);
    for (Unit& u : units_) {
      if (offloaded()) break;  // the step runs on the host, on copies of the gradients
      for (const Param& p : u.params) {  // the gradient in fp32, one tensor at a time
        if (!p.trainable) continue;
        Tensor tmp = alloc(4 * (sharded_states() ? shard(p.elements) : p.elements), "temporaries:optimizer.step");
        free(tmp);
      }
    }
    for (Unit& u : units_) {  // zero_grad(set_to_none=True)
      for (Tensor& g : u.grads) free(g);
      u.grads.clear();
    }
  }

  // --- the schedule ------------------------------------------------------------------------

  std::uint64_t trace_micro_batches() const {
    const std::uint64_t all = s_.accumulation();
    return s_.trace_micro_batches == 0 ? all : std::min(all, s_.trace_micro_batches);
  }

  // 1F1B: stage s runs pp - s - 1 forward passes ahead, then alternates, then drains.
  void run_step(std::size_t step) {
    const std::uint64_t m = trace_micro_batches();
    const std::uint64_t ahead = std::min<std::uint64_t>(static_cast<std::uint64_t>(s_.pp - stage_ - 1), m);
    std::deque<Micro> in_flight;
    std::uint64_t next = 0;
    for (; next < ahead; ++next) in_flight.push_back(forward(step, next));
    while (!in_flight.empty() || next < m) {
      if (next < m) in_flight.push_back(forward(step, next++));
      backward(in_flight.front());
      in_flight.pop_front();
    }
  }

  Micro start_micro(std::size_t step, std::uint64_t index) {
    Micro mb;
    mb.index = index;
    mb.seq = lengths_[step][index];
    mb.batch = s_.micro_batch;
    if (s_.batching == Batching::dynamic) mb.batch = std::max<std::uint64_t>(1, s_.micro_batch * s_.sequence() / mb.seq);
    for (int l = 0; l < layers_; ++l) mb.moe.push_back(expert_loads(mb.tokens()));
    return mb;
  }

  // --- forward -----------------------------------------------------------------------------

  Micro forward(std::size_t step, std::uint64_t index) {
    Micro mb = start_micro(step, index);
    const std::uint64_t act = mb.tokens() * h_ * e_;
    Tensor x;
    if (first_) {
      gather_for(0, 1);
      mb.input_ids = alloc(mb.tokens() * 8, "inputs:input_ids");
      if (s_.model.positions > 0) {
        Tensor tokens = alloc(act, "temporaries:embedding.tokens");
        x = alloc(act, "activations:embedding");
        free(tokens);
      } else {
        x = alloc(act, "activations:embedding");
      }
      release_gathered(0);
    } else {
      x = alloc(act, "pipeline:recv_activation");
    }
    for (int l = 0; l < layers_; ++l) {
      const std::size_t u = layer0_ + static_cast<std::size_t>(l);
      gather_for(u, u + 1);
      const Keep keep = s_.checkpointing == Checkpointing::full        ? Keep::input_only
                        : s_.checkpointing == Checkpointing::selective ? Keep::no_attention_core
                                                                       : Keep::all;
      mb.layers.push_back(layer_forward(x, mb, static_cast<std::size_t>(l), keep, "activations:", true));
      x = mb.layers.back().output;
      release_gathered(u);
    }
    if (last_) {
      loss_forward(x, mb);
    } else {
      free(x);  // sent to the next stage
    }
    return mb;
  }

  // One layer's forward pass on input x (kept as the first saved tensor when `owns_input`).
  LayerPass layer_forward(Tensor x, const Micro& mb, std::size_t layer, Keep keep, const std::string& prefix,
                          bool owns_input) {
    const ModelShape& m = s_.model;
    const std::uint64_t T = mb.tokens();
    const std::uint64_t act = T * h_ * e_;
    const bool all = keep != Keep::input_only;
    const bool core = keep == Keep::all;
    LayerPass p;
    if (owns_input) p.saved.push_back(x);
    dequantize_for_matmul();
    Tensor ln1 = tensor(act, "attention.norm", all, p, prefix);
    Tensor qkv = tensor(T * (h_ + 2 * m.kv_dim()) / t_ * e_, "attention.qkv", all, p, prefix);
    Tensor adapters;
    if (lora()) adapters = tensor(T * s_.lora_rank * matrices_per_layer_ * e_, "lora.xA", all, p, prefix);
    release(ln1, all);
    Tensor ctx = attention_core(qkv, mb, core, all, p, prefix);
    release(qkv, all);
    Tensor proj = alloc(act, "temporaries:attention.proj");
    release(ctx, all);
    Tensor mask1;
    if (m.dropout) mask1 = tensor(T * h_, "attention.output_dropout_mask", all, p, prefix);
    Tensor resid1 = tensor(act, "attention.residual", all, p, prefix);
    free(proj);
    release(mask1, all);
    Tensor ln2 = tensor(act, "mlp.norm", all, p, prefix);
    Tensor out = m.experts > 1 ? moe_forward(mb.moe[layer], T, all, p, prefix) : mlp_forward(T, T, all, p, prefix, "mlp.");
    release(ln2, all);
    Tensor mask2;
    if (m.dropout) mask2 = tensor(T * h_, "mlp.dropout_mask", all, p, prefix);
    p.output = alloc(act, prefix + "layer_output");
    free(out);
    release(mask2, all);
    release(resid1, all);
    release(adapters, all);
    return p;
  }

  // Attention over qkv: flash attention keeps the output and a log-sum-exp per row; eager
  // attention materializes the s x s scores, softmax and dropout (kept when `core`).
  Tensor attention_core(const Tensor&, const Micro& mb, bool core, bool all, LayerPass& p, const std::string& prefix) {
    const ModelShape& m = s_.model;
    const std::uint64_t heads = static_cast<std::uint64_t>(m.heads) / t_;
    const std::uint64_t T = mb.tokens();
    if (s_.attention == Attention::flash) {
      Tensor ctx = tensor(T * h_ / t_ * e_, "attention.context", all, p, prefix);
      Tensor lse = tensor(mb.batch * heads * mb.seq * 4, "attention.lse", all, p, prefix);
      release(lse, all);
      return ctx;
    }
    const std::uint64_t square = mb.batch * heads * mb.seq * mb.seq;
    Tensor scores = alloc(square * e_, "temporaries:attention.scores");
    Tensor probs = tensor(square * e_, "attention.softmax", core, p, prefix);
    free(scores);
    Tensor mask, dropped;
    if (m.dropout) {
      mask = tensor(square, "attention.dropout_mask", core, p, prefix);
      dropped = tensor(square * e_, "attention.dropout", core, p, prefix);
    }
    Tensor ctx = tensor(T * h_ / t_ * e_, "attention.context", all, p, prefix);
    release(probs, core);
    release(mask, core);
    release(dropped, core);
    return ctx;
  }

  // The MLP over `rows` tokens; returns its output (a temporary of `out_rows` x hidden).
  Tensor mlp_forward(std::uint64_t rows, std::uint64_t out_rows, bool all, LayerPass& p, const std::string& prefix,
                     const std::string& name) {
    const std::uint64_t inner = rows * s_.model.ffn / t_ * e_;
    if (s_.model.mlp == MlpKind::gated) {
      Tensor gate = tensor(inner, name + "gate", all, p, prefix);
      Tensor up = tensor(inner, name + "up", all, p, prefix);
      Tensor silu = tensor(inner, name + "silu", all, p, prefix);
      release(gate, all);
      Tensor product = tensor(inner, name + "product", all, p, prefix);
      release(up, all);
      release(silu, all);
      Tensor down = alloc(out_rows * h_ * e_, "temporaries:" + name + "down");
      release(product, all);
      return down;
    }
    Tensor fc1 = tensor(inner, name + "fc1", all, p, prefix);
    Tensor gelu = tensor(inner, name + "gelu", all, p, prefix);
    release(fc1, all);
    Tensor fc2 = alloc(out_rows * h_ * e_, "temporaries:" + name + "fc2");
    release(gelu, all);
    return fc2;
  }

  Tensor moe_forward(const std::vector<std::uint64_t>& loads, std::uint64_t T, bool all, LayerPass& p,
                     const std::string& prefix) {
    Tensor router = tensor(T * static_cast<std::uint64_t>(s_.model.experts) * 4, "moe.router_logits", all, p, prefix);
    std::vector<Tensor> outputs;
    for (std::uint64_t rows : loads) {
      if (rows == 0) continue;
      Tensor in = tensor(rows * h_ * e_, "moe.expert_input", all, p, prefix);
      outputs.push_back(mlp_forward(rows, rows, all, p, prefix, "moe.expert."));
      release(in, all);
    }
    Tensor combined = alloc(T * h_ * e_, "temporaries:moe.combine");
    for (Tensor& o : outputs) free(o);
    release(router, all);
    return combined;
  }

  // Tokens per expert for T tokens routed to top_k experts each: the busiest gets moe_imbalance
  // times the mean, the others share the rest; which expert is busiest is drawn.
  std::vector<std::uint64_t> expert_loads(std::uint64_t T) {
    const int experts = s_.model.experts;
    if (experts <= 1) return {};
    const auto n = static_cast<std::uint64_t>(experts);
    const std::uint64_t routed = T * static_cast<std::uint64_t>(s_.model.top_k);
    const auto busiest = std::min(T, static_cast<std::uint64_t>(s_.moe_imbalance * static_cast<double>(routed) / static_cast<double>(n)));
    std::vector<std::uint64_t> loads(n, 0);
    const std::uint64_t rest = routed - busiest;
    for (std::uint64_t i = 1; i < n; ++i) loads[i] = rest / (n - 1) + (i - 1 < rest % (n - 1) ? 1 : 0);
    loads[0] = busiest;
    std::swap(loads[0], loads[std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_)]);
    return loads;
  }

  // Final norm, logits over the vocabulary, the loss in fp32 (log-softmax kept for backward).
  void loss_forward(Tensor& x, Micro& mb) {
    const std::size_t head = units_.size() - 1;
    gather_for(head, units_.size());
    const std::uint64_t T = mb.tokens();
    const std::uint64_t logits_elems = T * s_.vocab_per_rank();
    Tensor norm = alloc(T * h_ * e_, "activations:final_norm");
    Tensor logits = alloc(logits_elems * e_, "loss:logits");
    Tensor log_softmax;
    if (e_ == 2) {
      Tensor upcast = alloc(logits_elems * 4, "loss:logits_float");
      free(logits);
      log_softmax = alloc(logits_elems * 4, "loss:log_softmax");
      free(upcast);
    } else {
      log_softmax = alloc(logits_elems * 4, "loss:log_softmax");
      free(logits);
    }
    Tensor loss = alloc(4, "loss:value");
    release_gathered(head);
    mb.loss = {x, norm, log_softmax, loss};
  }

  // --- backward ----------------------------------------------------------------------------

  void backward(Micro& mb) {
    const std::uint64_t act = mb.tokens() * h_ * e_;
    Tensor dy = last_ ? loss_backward(mb) : alloc(act, "pipeline:recv_grad");
    for (int l = layers_ - 1; l >= 0; --l) {
      const std::size_t u = layer0_ + static_cast<std::size_t>(l);
      if (data_parallel()) b_.sync(kCommStream);  // the previous layer's collectives are done
      gather_for(u, u - 1);
      Tensor dx = layer_backward(dy, mb, static_cast<std::size_t>(l));
      gradients(u, mb);
      release_gathered(u);
      dy = dx;
    }
    if (first_) {
      gather_for(0, units_.size());
      gradients(0, mb);
      release_gathered(0);
      free(mb.input_ids);
    }
    free(dy);  // the gradient of the stage's input: sent to the previous stage
  }

  Tensor loss_backward(Micro& mb) {
    const std::size_t head = units_.size() - 1;
    gather_for(head, head - 1);
    const std::uint64_t T = mb.tokens();
    const std::uint64_t logits_elems = T * s_.vocab_per_rank();
    Tensor& x = mb.loss[0];
    Tensor& norm = mb.loss[1];
    Tensor& log_softmax = mb.loss[2];
    free(mb.loss[3]);
    Tensor grad = alloc(logits_elems * 4, "loss:grad");
    free(log_softmax);
    Tensor grad_logits = alloc(logits_elems * e_, "loss:grad_logits");
    free(grad);
    gradients(head, mb);
    if (s_.model.tied_embeddings && s_.pp == 1) gradients(0, mb);  // the embedding is the head
    Tensor d_norm = alloc(T * h_ * e_, "temporaries:backward.final_norm");
    free(grad_logits);
    Tensor dy = alloc(T * h_ * e_, "temporaries:backward.grad_input");
    free(d_norm);
    free(norm);
    free(x);
    release_gathered(head);
    return dy;
  }

  // One layer's backward pass: recomputes what the forward did not keep, frees what it kept,
  // returns the gradient of the layer's input.
  Tensor layer_backward(Tensor& dy, Micro& mb, std::size_t layer) {
    LayerPass& kept = mb.layers[layer];
    dequantize_for_matmul();
    std::vector<Tensor> saved = kept.saved;
    if (s_.checkpointing == Checkpointing::full) {
      LayerPass again = layer_forward(kept.saved.front(), mb, layer, Keep::all, "recompute:", false);
      free(again.output);  // the layer's output is recomputed too, and not needed
      saved.insert(saved.end(), again.saved.begin(), again.saved.end());
    } else if (s_.checkpointing == Checkpointing::selective && s_.attention == Attention::eager) {
      LayerPass core;
      Tensor ctx = attention_core(Tensor{}, mb, true, false, core, "recompute:");
      free(ctx);  // recomputed with the core, not needed again
      saved.insert(saved.end(), core.saved.begin(), core.saved.end());
    }
    const std::uint64_t T = mb.tokens();
    const std::uint64_t act = T * h_ * e_;
    const std::uint64_t inner = T * s_.model.ffn / t_ * e_ * static_cast<std::uint64_t>(s_.model.top_k);
    Tensor d_inner = alloc(inner, "temporaries:backward.mlp_inner");
    Tensor d_inner2 = alloc(inner, "temporaries:backward.mlp_inner");
    free(d_inner);
    Tensor d_norm2 = alloc(act, "temporaries:backward.mlp_input");
    free(d_inner2);
    Tensor d_resid = alloc(act, "temporaries:backward.residual");
    free(d_norm2);
    free(dy);
    Tensor d_ctx = alloc(T * h_ / t_ * e_, "temporaries:backward.attention_context");
    Tensor d_core;
    if (s_.attention == Attention::eager) {
      const std::uint64_t square = mb.batch * static_cast<std::uint64_t>(s_.model.heads) / t_ * mb.seq * mb.seq * e_;
      Tensor d_probs = alloc(square, "temporaries:backward.attention_probs");
      d_core = alloc(square, "temporaries:backward.attention_scores");
      free(d_probs);
    } else {
      d_core = alloc(T * h_ / t_ * 4, "temporaries:backward.flash_dq_accum");
    }
    Tensor d_qkv = alloc(T * (h_ + 2 * s_.model.kv_dim()) / t_ * e_, "temporaries:backward.qkv");
    free(d_core);
    free(d_ctx);
    Tensor d_norm1 = alloc(act, "temporaries:backward.attention_input");
    free(d_qkv);
    for (Tensor& t : saved) free(t);
    kept.saved.clear();
    Tensor dx = alloc(act, "temporaries:backward.grad_input");
    free(d_norm1);
    free(d_resid);
    return dx;
  }

  const WorkloadSetup& s_;
  TraceBuilder& b_;
  int stage_;
  const std::vector<std::vector<std::uint64_t>>& lengths_;
  std::mt19937_64 rng_;
  std::uint64_t e_ = 2;  // bytes per element of weights and activations
  std::uint64_t t_ = 1;  // tensor-parallel degree
  std::uint64_t h_ = 0;
  int layers_ = 0;       // transformer layers on this stage
  bool first_ = false, last_ = false;
  std::vector<Unit> units_;  // [embedding] layers... [head]
  std::size_t layer0_ = 0;   // index of the first layer in units_
  std::uint64_t matrices_per_layer_ = 0;  // weight matrices of a layer (what LoRA adapts)
  std::uint64_t largest_matrix_ = 0;      // elements of a layer's largest weight matrix
};

}  // namespace

trace::Trace generate_training_trace(const WorkloadSetup& s) {
  trace::Trace t;
  const std::vector<std::vector<std::uint64_t>> lengths = micro_batch_lengths(s);
  TraceBuilder b(t);
  for (int stage = 0; stage < s.pp; ++stage) StageTrace(s, b, stage, lengths).run();
  return t;
}

}  // namespace tensorpool::workload
