// tensorpool/workload/setup.hpp: a training or inference run of a model shape (model.hpp), and
// the trace of the allocations one rank of it makes.
//
// Training comes in two loops (framework). framework:pytorch (the default) is a plain PyTorch
// program on one GPU, emulated op by op with autograd's and autocast's rules (torch_loop.cpp;
// docs/workloads.md, "The PyTorch loop"), and mode:forward runs its forward passes only. What
// follows describes framework:megatron, the Megatron-LM/DeepSpeed-style loop:
//
// Training (mode:training): the trace of one data-parallel rank; with pipeline parallelism each
// stage is a device of the trace (device s = stage s, 1F1B schedule, so stage s keeps up to
// pp - s micro-batches of activations). Per optimizer step, micro-batches of micro_batch
// sequences (global_batch / (micro_batch x dp) of them: gradient accumulation), each a forward
// pass that keeps what backward needs and a backward pass in reverse layer order that frees it.
// What a layer keeps follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"): s*b*h*(34 + 5*a*s/h) bytes for a GPT block in 16-bit precision with
// dropout and without recompute; flash attention keeps no s x s tensor (only a log-sum-exp per
// row); selective recompute drops the attention core (recomputed in backward); full recompute
// keeps only each layer's input (2*s*b*h) and runs the layer's forward again in its backward.
// Tensor parallelism (tp) shards heads, the MLP and the vocabulary; layer norms, their inputs and
// the dropout masks outside attention stay whole (sequence parallelism is not modelled).
// Model states (ZeRO paper, Rajbhandari et al. 2020): fp32 training keeps weights, gradients and
// Adam's two moments in fp32 (16 bytes per parameter); bf16/fp16 mixed precision keeps 16-bit
// weights and gradients, an fp32 master copy and the moments (2 + 2 + 12 = 16 bytes per
// parameter). ZeRO over dp ranks shards the optimizer states (stage 1), the gradients too
// (stage 2: each layer's gradients go to a bucket that is reduce-scattered on a communication
// stream and freed there, a cross-stream free) and the weights too (stage 3: each layer's weights
// are all-gathered before its forward and again before its backward, one layer ahead). Without
// ZeRO, dp > 1 all-reduces each layer's gradients on the communication stream (record_stream).
// Optimizer states are created with the weights (as DeepSpeed and Megatron do). optimizer:adamw8bit
// keeps each moment of a tensor of at least 4096 elements in uint8 with one fp32 scale per 256
// elements (bitsandbytes Optimizer2State.init_state, block_wise; Dettmers et al. 2022, "8-bit
// Optimizers via Block-wise Quantization"), smaller tensors in fp32. offload:optimizer keeps the
// fp32 master weights and the moments in host memory and steps there (ZeRO-Offload, Ren et al.
// 2021): the device holds the weights and gradients only, and the optimizer step allocates nothing
// on it. finetune:lora (Hu et al. 2021) freezes every base weight (no gradient, no optimizer
// state) and trains two matrices of rank lora_rank beside each weight matrix of each layer
// (in x r and r x out; the QLoRA paper's setting: every linear layer), with the same model-state
// rules as any trainable weight; each layer keeps its adapters' x A (tokens x r per matrix) for
// backward. finetune:qlora (Dettmers et al. 2023) keeps those frozen matrices in 4-bit NF4 with
// double-quantized constants (an 8-bit scale per 64 weights, an fp32 one per 256 scales: about
// 4.13 bits per weight) and dequantizes a matrix to the compute precision for its matmul (a
// temporary the size of the layer's largest matrix, in forward and in backward).
// Sequence lengths come from a distribution (seq_dist); with batching:dynamic each micro-batch
// holds about micro_batch x seq tokens whatever its length. An MoE layer routes each token to
// top_k of the experts; moe_imbalance is the load of the busiest expert over the mean load.
//
// Inference (mode:inference): the weights, then a stream of requests (arrivals per decode step,
// prompt and output lengths from distributions) served with continuous batching: up to max_batch
// sequences decode together, a new request is admitted (its prompt prefilled) as soon as there is
// room, and a finished one frees its KV cache at once. KV cache: 2 x layers x kv_heads x head_dim
// x bytes per token, either one contiguous tensor per request and layer sized for its prompt and
// output (kv:contiguous), blocks of kv_block tokens for all layers, allocated as the sequence
// grows (kv:paged), or a key and a value tensor per request and layer that every forward pass
// replaces by one a token longer, made at the layer's attention before the old one is freed, as
// Hugging Face's DynamicCache concatenates them (kv:concat).
//
// Every allocation's label says what it is: "weights:...", "grads:...", "optimizer:...",
// "activations:..." (kept for backward), "recompute:..." (kept again during a layer's backward),
// "temporaries:...", "loss:...", "inputs:...", "zero:...", "pipeline:...", "kv_cache:...".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/trace/event.hpp"
#include "tensorpool/workload/model.hpp"

namespace tensorpool::workload {

/// Which training loop the trace is of: a plain PyTorch loop (pytorch: torch_loop.cpp, op by op
/// with autograd's and autocast's rules) or a Megatron-LM/DeepSpeed-style loop (megatron:
/// training.cpp, per layer from Korthikanti et al.'s activation formula, with tp/pp/ZeRO).
enum class Framework : std::uint8_t { pytorch, megatron };
/// training: optimizer steps; inference: requests served with a KV cache; forward: forward passes
/// only (evaluation or scoring, framework:pytorch), under torch.no_grad() or not (no_grad).
enum class Mode : std::uint8_t { training, inference, forward };
/// fp32; bf16/fp16: 16-bit weights, gradients and activations with an fp32 master copy (mixed
/// precision); autocast-bf16/autocast-fp16: torch.autocast (fp32 parameters, gradients and
/// optimizer states; each op's output in the dtype autocast's op lists give it).
enum class Precision : std::uint8_t { fp32, bf16, fp16, autocast_bf16, autocast_fp16 };
enum class Checkpointing : std::uint8_t { none, selective, full };
/// flash: flash-attn's kernels; eager: attention written out (scores, mask, softmax, every tensor
/// autograd keeps); sdpa: F.scaled_dot_product_attention (flash or memory-efficient kernels).
enum class Attention : std::uint8_t { flash, eager, sdpa };
enum class Batching : std::uint8_t { fixed, dynamic };
enum class KvLayout : std::uint8_t { contiguous, paged, concat };
enum class Arrival : std::uint8_t { poisson, fixed, burst };
/// The optimizer's states: AdamW's two moments in fp32 (adamw), or quantized to 8 bits by blocks
/// of 256 elements with an fp32 scale each, as bitsandbytes' AdamW8bit keeps them (adamw8bit).
/// sgd: SGD with momentum (one state, a clone of the gradient at the first step).
enum class Optimizer : std::uint8_t { adamw, adamw8bit, sgd };
/// How torch.optim's AdamW runs (framework:pytorch): foreach (the default on CUDA: one
/// _foreach_sqrt of every state at once, a full-size temporary), fused (one kernel, in place),
/// for-loop (foreach=False: two temporaries of each parameter in turn), handwritten (a per-parameter
/// update written in Python that makes new moment tensors, as the CS336 runs do).
enum class OptimizerImpl : std::uint8_t { foreach, fused, for_loop, handwritten };
/// The loss: F.cross_entropy (log_softmax in fp32, kept) or written out (max, x - max, exp, sum, log).
enum class LossOps : std::uint8_t { cross_entropy, written };
/// The MLP's activation: F.silu / F.gelu (keep their input), or written out (x * sigmoid(x), GELU's
/// tanh form: more tensors kept).
enum class ActivationOps : std::uint8_t { fused, written };
/// Q, K and V as three linear layers (separate, as Llama and the CS336 handout write them) or one
/// (fused, as GPT-2's c_attn and Megatron do).
enum class QkvLayout : std::uint8_t { separate, fused };
/// Where the optimizer's states (and the fp32 master weights) live: on the device (none), or in
/// host memory with the step on the CPU (optimizer: ZeRO-Offload).
enum class Offload : std::uint8_t { none, optimizer };
/// What trains: every weight (full), or low-rank adapters on every weight matrix of each layer
/// with the base weights frozen in the training precision (lora) or in 4-bit NF4 (qlora).
enum class Finetune : std::uint8_t { full, lora, qlora };

/// Lengths (of sequences, prompts, outputs) from a distribution over [min, max]:
///   fixed: always max; uniform: uniform over [min, max];
///   lognormal: median sqrt(min * max), 95% within [min, max] (sigma = ln(max/min) / 4), clipped.
struct LengthDistribution {
  enum class Kind : std::uint8_t { fixed, uniform, lognormal };
  Kind kind = Kind::fixed;
  std::uint64_t min = 1;
  std::uint64_t max = 1;
};

struct WorkloadSetup {
  ModelShape model;  // a preset (model:NAME) and the shape keys on top
  /// The loop; framework:NAME is applied first wherever it is and sets the defaults below that
  /// differ (megatron: precision bf16, attention flash, optimizer_impl fused, qkv fused).
  Framework framework = Framework::pytorch;
  Mode mode = Mode::training;
  Precision precision = Precision::autocast_bf16;
  Attention attention = Attention::sdpa;
  int tp = 1;  // tensor-parallel degree
  std::uint64_t seed = 1;

  // training
  std::uint64_t micro_batch = 1;
  std::uint64_t global_batch = 0;  // 0: micro_batch x dp (no accumulation)
  std::uint64_t seq = 0;           // 0: the model's context; the longest sequence with seq_dist
  std::uint64_t seq_min = 0;       // 0: seq / 2
  LengthDistribution::Kind seq_dist = LengthDistribution::Kind::fixed;
  Batching batching = Batching::fixed;
  Checkpointing checkpointing = Checkpointing::none;
  Optimizer optimizer = Optimizer::adamw;
  OptimizerImpl optimizer_impl = OptimizerImpl::foreach;
  LossOps loss = LossOps::cross_entropy;
  ActivationOps activation = ActivationOps::fused;
  QkvLayout qkv = QkvLayout::separate;
  bool clip_grad = false;  // torch.nn.utils.clip_grad_norm_ before each step
  bool empty_cache = false;  // torch.cuda.empty_cache() at the start of each step (PyTorch loop)
  bool no_grad = true;     // mode:forward under torch.no_grad()
  Offload offload = Offload::none;
  Finetune finetune = Finetune::full;
  std::uint64_t lora_rank = 16;  // the adapters' rank (finetune:lora|qlora)
  int zero = 0;  // ZeRO stage 0-3
  int dp = 1;    // data-parallel degree (what ZeRO shards over)
  int pp = 1;    // pipeline-parallel degree: the trace's devices are the stages
  int steps = 2; // optimizer steps
  /// Micro-batches of each step put in the trace (0: all); the rest repeat what the last one
  /// does, so a few suffice for the peak (what `plan` uses to keep traces short).
  std::uint64_t trace_micro_batches = 0;
  double moe_imbalance = 1.0;

  // inference
  std::uint64_t requests = 64;
  Arrival arrival = Arrival::poisson;
  double arrival_rate = 0.5;  // requests per decode step (poisson, fixed)
  std::uint64_t prompt = 1024, prompt_min = 0;  // prompt tokens; min 0: prompt / 16
  LengthDistribution::Kind prompt_dist = LengthDistribution::Kind::lognormal;
  std::uint64_t output = 512, output_min = 0;   // tokens generated; min 0: output / 16
  LengthDistribution::Kind output_dist = LengthDistribution::Kind::lognormal;
  std::uint64_t max_batch = 32;
  KvLayout kv = KvLayout::paged;
  std::uint64_t kv_block = 16;  // tokens per block (kv:paged)

  /// The preset `name` (or "custom": the shape as it is) with the defaults of a run of it.
  static WorkloadSetup for_model(std::string_view name);

  /// "key:value,..." with the keys of keys(); `model:NAME` is applied first wherever it is.
  /// Throws ConfigError naming `origin`, the key and what was expected (UsageError for an unknown
  /// model, listing the known ones). Call validate() once every option is in.
  void apply(std::string_view text, std::string_view origin = "workload options");
  /// Refuses a setup that cannot run, naming the option: tp not dividing heads, kv_heads, ffn;
  /// pp not dividing layers; micro_batch x dp above global_batch or not dividing it; ... Throws
  /// ConfigError.
  void validate() const;
  static const std::vector<std::string>& keys();
  std::string to_string() const;  // every key, apply() reads it back

  std::uint64_t sequence() const { return seq == 0 ? model.context : seq; }
  /// The length distributions, with their defaults filled in.
  LengthDistribution sequence_lengths() const;
  LengthDistribution prompt_lengths() const;
  LengthDistribution output_lengths() const;
  std::uint64_t effective_global_batch() const;
  /// Micro-batches per optimizer step on each rank.
  std::uint64_t accumulation() const;
  /// Vocabulary rows of one tensor-parallel rank (the vocabulary padded to a multiple of tp).
  std::uint64_t vocab_per_rank() const;
  /// Bytes of the KV cache per token (all layers, one tensor-parallel rank):
  /// 2 x layers x kv_heads / tp x head_dim x bytes per element.
  std::uint64_t kv_bytes_per_token() const;
  /// Bytes of one element of weights and activations in the Megatron loop and inference (4 for
  /// fp32, 2 otherwise).
  std::uint64_t element_bytes() const { return precision == Precision::fp32 ? 4 : 2; }
  bool autocast() const { return precision == Precision::autocast_bf16 || precision == Precision::autocast_fp16; }
  /// One line for people: the model, its parameters and the options that matter for memory.
  std::string describe() const;
};

/// The allocations of `setup` (validated first).
trace::Trace generate_workload(const WorkloadSetup& setup);

/// A change to a training setup that saves memory: what it is, its options, what it costs besides
/// memory, the changed setup.
struct SetupChange {
  std::string description;  // "full activation checkpointing"
  std::string options;      // "checkpointing:full"
  std::string cost;         // "each layer's forward pass again in the backward pass"
  WorkloadSetup setup;
};
/// The changes worth trying on a training setup: autocast or mixed precision (from fp32), selective
/// (Megatron) and full activation checkpointing, sdpa or flash attention (from eager), fused AdamW
/// (from foreach, for-loop or a hand-written update), an 8-bit optimizer (from AdamW's fp32
/// moments), the optimizer in host memory (ZeRO-Offload), LoRA and QLoRA, each higher ZeRO stage
/// (with dp > 1), half the sequence length. From the PyTorch loop, ZeRO-Offload and LoRA switch to
/// the DeepSpeed-style loop (framework:megatron) that models them. Only changes that apply (and
/// pass validate()) are listed.
std::vector<SetupChange> setup_changes(const WorkloadSetup& setup);

std::string to_string(Framework v);
std::string to_string(OptimizerImpl v);
std::string to_string(LossOps v);
std::string to_string(ActivationOps v);
std::string to_string(QkvLayout v);
std::string to_string(Mode v);
std::string to_string(Precision v);
std::string to_string(Checkpointing v);
std::string to_string(Attention v);
std::string to_string(Batching v);
std::string to_string(KvLayout v);
std::string to_string(Arrival v);
std::string to_string(LengthDistribution::Kind v);
std::string to_string(Optimizer v);
std::string to_string(Offload v);
std::string to_string(Finetune v);

}  // namespace tensorpool::workload
