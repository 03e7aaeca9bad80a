// setup.cpp: reading, checking and describing a workload setup (setup.hpp), and the changes to a
// training setup that save memory.
#include "tensorpool/workload/setup.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "builders.hpp"

namespace tensorpool::workload {

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kMaxInt = std::numeric_limits<int>::max();

// The name of each value of an enum, in value order.
template <class E>
const std::vector<std::string>& names_of();
template <> const std::vector<std::string>& names_of<Framework>() { static const std::vector<std::string> n{"pytorch", "megatron"}; return n; }
template <> const std::vector<std::string>& names_of<Mode>() { static const std::vector<std::string> n{"training", "inference", "forward"}; return n; }
template <> const std::vector<std::string>& names_of<Precision>() { static const std::vector<std::string> n{"fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16"}; return n; }
template <> const std::vector<std::string>& names_of<OptimizerImpl>() { static const std::vector<std::string> n{"foreach", "fused", "for-loop", "handwritten"}; return n; }
template <> const std::vector<std::string>& names_of<LossOps>() { static const std::vector<std::string> n{"cross_entropy", "written"}; return n; }
template <> const std::vector<std::string>& names_of<ActivationOps>() { static const std::vector<std::string> n{"fused", "written"}; return n; }
template <> const std::vector<std::string>& names_of<QkvLayout>() { static const std::vector<std::string> n{"separate", "fused"}; return n; }
template <> const std::vector<std::string>& names_of<Checkpointing>() { static const std::vector<std::string> n{"none", "selective", "full"}; return n; }
template <> const std::vector<std::string>& names_of<Attention>() { static const std::vector<std::string> n{"flash", "eager", "sdpa"}; return n; }
template <> const std::vector<std::string>& names_of<Batching>() { static const std::vector<std::string> n{"fixed", "dynamic"}; return n; }
template <> const std::vector<std::string>& names_of<KvLayout>() { static const std::vector<std::string> n{"contiguous", "paged", "concat"}; return n; }
template <> const std::vector<std::string>& names_of<Arrival>() { static const std::vector<std::string> n{"poisson", "fixed", "burst"}; return n; }
template <> const std::vector<std::string>& names_of<LengthDistribution::Kind>() { static const std::vector<std::string> n{"fixed", "uniform", "lognormal"}; return n; }
template <> const std::vector<std::string>& names_of<MlpKind>() { static const std::vector<std::string> n{"gelu", "gated"}; return n; }
template <> const std::vector<std::string>& names_of<Optimizer>() { static const std::vector<std::string> n{"adamw", "adamw8bit", "sgd"}; return n; }
template <> const std::vector<std::string>& names_of<Offload>() { static const std::vector<std::string> n{"none", "optimizer"}; return n; }
template <> const std::vector<std::string>& names_of<Finetune>() { static const std::vector<std::string> n{"full", "lora", "qlora"}; return n; }
template <> const std::vector<std::string>& names_of<NormKind>() { static const std::vector<std::string> n{"layernorm", "rmsnorm"}; return n; }

template <class E>
E enum_value(std::string_view origin, const KeyValue& item) {
  const auto& names = names_of<E>();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (item.value == names[i]) return static_cast<E>(i);
  throw_bad_value(origin, item, "one of " + join(names, ", "));
}

template <class E>
std::string name_of(E v) {
  return names_of<E>()[static_cast<std::size_t>(v)];
}

[[noreturn]] void refuse(const std::string& message) { throw ConfigError("bad setup: " + message); }

std::string num(std::uint64_t v) { return std::to_string(v); }

// "%.4g" without trailing zeros: what to_string() writes for a decimal and apply() reads back.
std::string decimal_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  std::string t = buf;
  t.erase(t.find_last_not_of('0') + 1);
  if (t.back() == '.') t.pop_back();
  return t;
}

// Sets `field` to `value`; a change of the preset's shape makes the model "custom".
template <class T>
void set_shape(ModelShape& m, T& field, T value) {
  if (field != value) m.name = "custom";
  field = value;
}

}  // namespace

std::string to_string(Framework v) { return name_of(v); }
std::string to_string(OptimizerImpl v) { return name_of(v); }
std::string to_string(LossOps v) { return name_of(v); }
std::string to_string(ActivationOps v) { return name_of(v); }
std::string to_string(QkvLayout v) { return name_of(v); }
std::string to_string(Mode v) { return name_of(v); }
std::string to_string(Precision v) { return name_of(v); }
std::string to_string(Checkpointing v) { return name_of(v); }
std::string to_string(Attention v) { return name_of(v); }
std::string to_string(Batching v) { return name_of(v); }
std::string to_string(KvLayout v) { return name_of(v); }
std::string to_string(Arrival v) { return name_of(v); }
std::string to_string(LengthDistribution::Kind v) { return name_of(v); }
std::string to_string(Optimizer v) { return name_of(v); }
std::string to_string(Offload v) { return name_of(v); }
std::string to_string(Finetune v) { return name_of(v); }

namespace {
void apply_framework_defaults(WorkloadSetup& s);
}  // namespace

WorkloadSetup WorkloadSetup::for_model(std::string_view name) {
  WorkloadSetup s;
  if (name != "custom") s.model = model_preset(name);
  if (s.model.experts > 1) {  // a mixture of experts is modelled in the Megatron-style loop only
    s.framework = Framework::megatron;
    apply_framework_defaults(s);
  }
  return s;
}

const std::vector<std::string>& WorkloadSetup::keys() {
  static const std::vector<std::string> k = {
      "model", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k", "mlp",
      "norm", "biases", "dropout", "tied_embeddings", "positions", "context",
      "framework", "mode", "precision", "attention", "tp", "seed",
      "micro_batch", "global_batch", "seq", "seq_min", "seq_dist", "batching", "checkpointing",
      "optimizer", "optimizer_impl", "loss", "activation", "qkv", "clip_grad", "empty_cache", "no_grad", "offload", "finetune", "lora_rank", "zero", "dp", "pp", "steps", "trace_micro_batches", "moe_imbalance",
      "requests", "arrival", "arrival_rate", "prompt", "prompt_min", "prompt_dist", "output",
      "output_min", "output_dist", "max_batch", "kv", "kv_block"};
  return k;
}

namespace {

// The keys of the first generator (GeneratorOptions, before there was one vocabulary): refused
// with the key or setting that says the same now.
[[noreturn]] void throw_old_key(std::string_view origin, const KeyValue& e, std::string_view instead) {
  throw ConfigError(std::string(origin) + ": '" + e.key + "' was a key of the old generator; use " +
                    std::string(instead) + " (the workload keys: tensorpool generate --help)");
}

const std::vector<std::pair<std::string_view, std::string_view>>& old_generator_keys() {
  static const std::vector<std::pair<std::string_view, std::string_view>> keys = {
      {"batch", "micro_batch"},
      {"seq_len", "seq"},
      {"varlen", "seq_dist:uniform (lengths uniform in [seq_min, seq]; seq_min defaults to seq / 2)"},
      {"iterations", "steps (optimizer steps)"},
      {"training", "mode:training or mode:inference"},
      {"ffn_multiple", "ffn (the MLP's inner width, e.g. ffn:8192 for hidden 2048 x 4)"},
      {"comm_stream", "dp (with dp above 1, gradients are all-reduced on a communication stream)"},
      {"eager_optimizer", "nothing: the optimizer states are created with the weights"},
  };
  return keys;
}

}  // namespace

namespace {

// What framework:NAME sets before the other keys (they may change it).
void apply_framework_defaults(WorkloadSetup& s) {
  const bool megatron = s.framework == Framework::megatron;
  s.precision = megatron ? Precision::bf16 : Precision::autocast_bf16;
  s.attention = megatron ? Attention::flash : Attention::sdpa;
  s.optimizer_impl = megatron ? OptimizerImpl::fused : OptimizerImpl::foreach;
  s.qkv = megatron ? QkvLayout::fused : QkvLayout::separate;
}

bool given(const std::vector<KeyValue>& items, std::string_view key) {
  for (const KeyValue& e : items)
    if (e.key == key) return true;
  return false;
}

}  // namespace

void WorkloadSetup::apply(std::string_view text, std::string_view origin) {
  const std::vector<KeyValue> items = parse_key_values(text, origin);
  for (const KeyValue& e : items) {  // the preset and the framework first: the other keys change them
    if (e.key != "model") continue;
    model = for_model(e.value).model;
    if (model.experts > 1 && !given(items, "framework")) {  // as for_model() does
      framework = Framework::megatron;
      apply_framework_defaults(*this);
    }
  }
  for (const KeyValue& e : items) {
    if (e.key != "framework") continue;
    framework = enum_value<Framework>(origin, e);
    apply_framework_defaults(*this);
  }
  for (const KeyValue& e : items) {
    const auto number = [&](std::uint64_t lo, std::uint64_t hi) { return whole_number(origin, e, lo, hi); };
    const auto count = [&](std::uint64_t lo) { return static_cast<int>(number(lo, kMaxInt)); };
    ModelShape& m = model;
    const std::string& k = e.key;
    if (k == "model" || k == "framework") continue;
    if (k == "layers") set_shape(m, m.layers, count(1));
    else if (k == "hidden") set_shape(m, m.hidden, number(8, kMax));
    else if (k == "heads") set_shape(m, m.heads, count(1));
    else if (k == "kv_heads") set_shape(m, m.kv_heads, count(1));
    else if (k == "ffn") set_shape(m, m.ffn, number(1, kMax));
    else if (k == "vocab") set_shape(m, m.vocab, number(1, kMax));
    else if (k == "experts") set_shape(m, m.experts, count(1));
    else if (k == "top_k") set_shape(m, m.top_k, count(1));
    else if (k == "mlp") set_shape(m, m.mlp, enum_value<MlpKind>(origin, e));
    else if (k == "norm") set_shape(m, m.norm, enum_value<NormKind>(origin, e));
    else if (k == "biases") set_shape(m, m.biases, bool_value(origin, e));
    else if (k == "dropout") set_shape(m, m.dropout, bool_value(origin, e));
    else if (k == "tied_embeddings") set_shape(m, m.tied_embeddings, bool_value(origin, e));
    else if (k == "positions") set_shape(m, m.positions, number(0, kMax));
    else if (k == "context") set_shape(m, m.context, number(1, kMax));
    else if (k == "mode") mode = enum_value<Mode>(origin, e);
    else if (k == "precision") precision = enum_value<Precision>(origin, e);
    else if (k == "attention") attention = enum_value<Attention>(origin, e);
    else if (k == "tp") tp = count(1);
    else if (k == "seed") seed = number(0, kMax);
    else if (k == "micro_batch") micro_batch = number(1, kMax);
    else if (k == "global_batch") global_batch = number(0, kMax);
    else if (k == "seq") seq = number(0, kMax);
    else if (k == "seq_min") seq_min = number(0, kMax);
    else if (k == "seq_dist") seq_dist = enum_value<LengthDistribution::Kind>(origin, e);
    else if (k == "batching") batching = enum_value<Batching>(origin, e);
    else if (k == "checkpointing") checkpointing = enum_value<Checkpointing>(origin, e);
    else if (k == "optimizer") optimizer = enum_value<Optimizer>(origin, e);
    else if (k == "optimizer_impl") optimizer_impl = enum_value<OptimizerImpl>(origin, e);
    else if (k == "loss") loss = enum_value<LossOps>(origin, e);
    else if (k == "activation") activation = enum_value<ActivationOps>(origin, e);
    else if (k == "qkv") qkv = enum_value<QkvLayout>(origin, e);
    else if (k == "clip_grad") clip_grad = bool_value(origin, e);
    else if (k == "empty_cache") empty_cache = bool_value(origin, e);
    else if (k == "no_grad") no_grad = bool_value(origin, e);
    else if (k == "offload") offload = enum_value<Offload>(origin, e);
    else if (k == "finetune") finetune = enum_value<Finetune>(origin, e);
    else if (k == "lora_rank") lora_rank = number(1, 65536);
    else if (k == "zero") zero = static_cast<int>(number(0, 3));
    else if (k == "dp") dp = count(1);
    else if (k == "pp") pp = count(1);
    else if (k == "steps") steps = count(1);
    else if (k == "trace_micro_batches") trace_micro_batches = number(0, kMax);
    else if (k == "moe_imbalance") moe_imbalance = decimal_number(origin, e, 1.0, 1024.0);
    else if (k == "requests") requests = number(1, kMax);
    else if (k == "arrival") arrival = enum_value<Arrival>(origin, e);
    else if (k == "arrival_rate") arrival_rate = decimal_number(origin, e, 0.0001, 1e6);
    else if (k == "prompt") prompt = number(1, kMax);
    else if (k == "prompt_min") prompt_min = number(0, kMax);
    else if (k == "prompt_dist") prompt_dist = enum_value<LengthDistribution::Kind>(origin, e);
    else if (k == "output") output = number(1, kMax);
    else if (k == "output_min") output_min = number(0, kMax);
    else if (k == "output_dist") output_dist = enum_value<LengthDistribution::Kind>(origin, e);
    else if (k == "max_batch") max_batch = number(1, kMax);
    else if (k == "kv") kv = enum_value<KvLayout>(origin, e);
    else if (k == "kv_block") kv_block = number(1, kMax);
    else {
      for (const auto& [old, instead] : old_generator_keys())
        if (k == old) throw_old_key(origin, e, instead);
      throw_unknown_key(origin, e, keys());
    }
  }
  // Serving keeps 16-bit weights: mode:inference without a precision of its own leaves autocast.
  if (mode == Mode::inference && autocast() && !given(items, "precision")) precision = Precision::bf16;
}

std::string WorkloadSetup::to_string() const {
  const ModelShape& m = model;
  const auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  return "model:" + m.name + ",layers:" + num(static_cast<std::uint64_t>(m.layers)) +
         ",hidden:" + num(m.hidden) + ",heads:" + num(static_cast<std::uint64_t>(m.heads)) +
         ",kv_heads:" + num(static_cast<std::uint64_t>(m.kv_heads)) + ",ffn:" + num(m.ffn) +
         ",vocab:" + num(m.vocab) + ",experts:" + num(static_cast<std::uint64_t>(m.experts)) +
         ",top_k:" + num(static_cast<std::uint64_t>(m.top_k)) + ",mlp:" + workload::to_string(m.mlp) +
         ",norm:" + workload::to_string(m.norm) + ",biases:" + b(m.biases) + ",dropout:" + b(m.dropout) +
         ",tied_embeddings:" + b(m.tied_embeddings) + ",positions:" + num(m.positions) +
         ",context:" + num(m.context) + ",framework:" + name_of(framework) + ",mode:" + name_of(mode) +
         ",precision:" + name_of(precision) +
         ",attention:" + name_of(attention) + ",tp:" + num(static_cast<std::uint64_t>(tp)) +
         ",seed:" + num(seed) + ",micro_batch:" + num(micro_batch) + ",global_batch:" + num(global_batch) +
         ",seq:" + num(seq) + ",seq_min:" + num(seq_min) + ",seq_dist:" + name_of(seq_dist) +
         ",batching:" + name_of(batching) + ",checkpointing:" + name_of(checkpointing) +
         ",optimizer:" + name_of(optimizer) + ",optimizer_impl:" + name_of(optimizer_impl) + ",loss:" + name_of(loss) +
         ",activation:" + name_of(activation) + ",qkv:" + name_of(qkv) + ",clip_grad:" + b(clip_grad) +
         ",empty_cache:" + b(empty_cache) + ",no_grad:" + b(no_grad) + ",offload:" + name_of(offload) + ",finetune:" + name_of(finetune) +
         ",lora_rank:" + num(lora_rank) +
         ",zero:" + num(static_cast<std::uint64_t>(zero)) + ",dp:" + num(static_cast<std::uint64_t>(dp)) +
         ",pp:" + num(static_cast<std::uint64_t>(pp)) + ",steps:" + num(static_cast<std::uint64_t>(steps)) +
         ",trace_micro_batches:" + num(trace_micro_batches) + ",moe_imbalance:" + decimal_text(moe_imbalance) +
         ",requests:" + num(requests) + ",arrival:" + name_of(arrival) +
         ",arrival_rate:" + decimal_text(arrival_rate) + ",prompt:" + num(prompt) +
         ",prompt_min:" + num(prompt_min) + ",prompt_dist:" + name_of(prompt_dist) +
         ",output:" + num(output) + ",output_min:" + num(output_min) + ",output_dist:" + name_of(output_dist) +
         ",max_batch:" + num(max_batch) + ",kv:" + name_of(kv) + ",kv_block:" + num(kv_block);
}

LengthDistribution WorkloadSetup::sequence_lengths() const {
  const std::uint64_t longest = sequence();
  return {seq_dist, seq_min == 0 ? std::max<std::uint64_t>(1, longest / 2) : seq_min, longest};
}
LengthDistribution WorkloadSetup::prompt_lengths() const {
  return {prompt_dist, prompt_min == 0 ? std::max<std::uint64_t>(1, prompt / 16) : prompt_min, prompt};
}
LengthDistribution WorkloadSetup::output_lengths() const {
  return {output_dist, output_min == 0 ? std::max<std::uint64_t>(1, output / 16) : output_min, output};
}

std::uint64_t WorkloadSetup::effective_global_batch() const {
  return global_batch == 0 ? micro_batch * static_cast<std::uint64_t>(dp) : global_batch;
}

std::uint64_t WorkloadSetup::accumulation() const {
  return effective_global_batch() / (micro_batch * static_cast<std::uint64_t>(dp));
}

std::uint64_t WorkloadSetup::vocab_per_rank() const {
  const auto t = static_cast<std::uint64_t>(tp);
  return (model.vocab + t - 1) / t;
}

std::uint64_t WorkloadSetup::kv_bytes_per_token() const {
  return 2 * static_cast<std::uint64_t>(model.layers) * model.kv_dim() / static_cast<std::uint64_t>(tp) *
         element_bytes();
}

// --- validate -------------------------------------------------------------------------------

namespace {

void check_divides(const char* option, std::uint64_t degree, const char* what, std::uint64_t value,
                   const std::string& model) {
  if (value % degree != 0)
    refuse("option '" + std::string(option) + "' (" + num(degree) + ") does not divide " + what +
           " (" + num(value) + " in " + model + ")");
}

void check_shape(const ModelShape& m) {
  const auto heads = static_cast<std::uint64_t>(m.heads);
  if (m.hidden % heads != 0)
    refuse("hidden (" + num(m.hidden) + ") is not a multiple of heads (" + num(heads) + ")");
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    refuse("kv_heads (" + num(static_cast<std::uint64_t>(m.kv_heads)) + ") does not divide heads (" +
           num(heads) + ")");
  if (m.top_k > m.experts)
    refuse("top_k (" + num(static_cast<std::uint64_t>(m.top_k)) + ") is above experts (" +
           num(static_cast<std::uint64_t>(m.experts)) + ")");
}

void check_training(const WorkloadSetup& s) {
  const ModelShape& m = s.model;
  check_divides("pp", static_cast<std::uint64_t>(s.pp), "layers", static_cast<std::uint64_t>(m.layers), m.name);
  const std::uint64_t per_step = s.micro_batch * static_cast<std::uint64_t>(s.dp);
  if (s.global_batch != 0 && per_step > s.global_batch)
    refuse("option 'micro_batch' (" + num(s.micro_batch) + ") x dp (" + num(static_cast<std::uint64_t>(s.dp)) +
           ") is above global_batch (" + num(s.global_batch) + ")");
  if (s.global_batch % per_step != 0)
    refuse("option 'global_batch' (" + num(s.global_batch) + ") is not a multiple of micro_batch x dp (" +
           num(per_step) + ")");
  if (s.zero >= 2 && s.pp > 1)
    refuse("option 'zero' (" + num(static_cast<std::uint64_t>(s.zero)) +
           ") with pp > 1: ZeRO stages 2 and 3 shard what the pipeline keeps per stage; use zero:1");
  if (s.finetune != Finetune::full && s.zero != 0)
    refuse("option 'finetune' (" + name_of(s.finetune) + ") with zero:" + num(static_cast<std::uint64_t>(s.zero)) +
           ": LoRA with ZeRO is not modelled; use zero:0");
  const std::uint64_t seq = s.sequence();
  if (s.seq_min > seq)
    refuse("option 'seq_min' (" + num(s.seq_min) + ") is above seq (" + num(seq) + ")");
  const double most = static_cast<double>(m.experts) / static_cast<double>(m.top_k);
  if (s.moe_imbalance > most)
    refuse("option 'moe_imbalance' (" + decimal_text(s.moe_imbalance) + ") is above experts / top_k (" +
           decimal_text(most) + "): an expert gets each token at most once");
}

// The PyTorch loop is one GPU's eager program: what needs Megatron-LM or DeepSpeed is refused,
// naming the framework that has it.
void check_pytorch(const WorkloadSetup& s) {
  const auto needs_megatron = [](const std::string& option) {
    refuse(option + " is modelled in the Megatron-LM/DeepSpeed loop: add framework:megatron");
  };
  if (s.tp != 1) needs_megatron("option 'tp' (" + num(static_cast<std::uint64_t>(s.tp)) + ")");
  if (s.pp != 1) needs_megatron("option 'pp' (" + num(static_cast<std::uint64_t>(s.pp)) + ")");
  if (s.dp != 1) needs_megatron("option 'dp' (" + num(static_cast<std::uint64_t>(s.dp)) + ")");
  if (s.zero != 0) needs_megatron("option 'zero' (" + num(static_cast<std::uint64_t>(s.zero)) + ")");
  if (s.offload != Offload::none) needs_megatron("option 'offload' (ZeRO-Offload)");
  if (s.finetune != Finetune::full) needs_megatron("option 'finetune' (" + name_of(s.finetune) + ")");
  if (s.model.experts > 1) needs_megatron("a mixture of experts (experts " + num(static_cast<std::uint64_t>(s.model.experts)) + ")");
  if (s.checkpointing == Checkpointing::selective)
    needs_megatron("option 'checkpointing' (selective: Megatron-LM's recomputation of the attention core; the PyTorch loop has checkpointing:full, torch.utils.checkpoint per layer)");
}

void check_megatron(const WorkloadSetup& s) {
  const auto pytorch_only = [](const std::string& what) {
    refuse(what + " is the PyTorch loop's (framework:pytorch); framework:megatron has precision fp32|bf16|fp16, "
           "attention flash|eager, optimizer adamw|adamw8bit (fused), F.cross_entropy, fused Q/K/V");
  };
  if (s.autocast()) pytorch_only("option 'precision' (" + name_of(s.precision) + ")");
  if (s.attention == Attention::sdpa) pytorch_only("option 'attention' (sdpa)");
  if (s.optimizer == Optimizer::sgd) pytorch_only("option 'optimizer' (sgd)");
  if (s.optimizer_impl != OptimizerImpl::fused) pytorch_only("option 'optimizer_impl' (" + name_of(s.optimizer_impl) + ")");
  if (s.loss != LossOps::cross_entropy) pytorch_only("option 'loss' (written)");
  if (s.activation != ActivationOps::fused) pytorch_only("option 'activation' (written)");
  if (s.qkv != QkvLayout::fused) pytorch_only("option 'qkv' (separate)");
  if (s.clip_grad) pytorch_only("option 'clip_grad'");
  if (s.empty_cache) pytorch_only("option 'empty_cache'");
  if (s.mode == Mode::forward) pytorch_only("mode:forward");
}

void check_forward(const WorkloadSetup& s) {
  if (s.optimizer != Optimizer::adamw || s.offload != Offload::none || s.finetune != Finetune::full ||
      s.optimizer_impl != OptimizerImpl::foreach || s.clip_grad)
    refuse("options 'optimizer', 'optimizer_impl', 'clip_grad', 'offload' and 'finetune' are for training; mode:forward runs forward passes only");
  if (s.checkpointing != Checkpointing::none) refuse("option 'checkpointing' is for training; mode:forward keeps nothing for a backward pass");
}

void check_inference(const WorkloadSetup& s) {
  if (s.autocast())
    refuse("option 'precision' (" + name_of(s.precision) + ") is for training and forward passes; mode:inference serves 16-bit or fp32 weights (bf16, fp16, fp32)");
  if (s.pp != 1) refuse("option 'pp' (" + num(static_cast<std::uint64_t>(s.pp)) + ") is for training; inference runs with pp:1");
  if (s.dp != 1 || s.zero != 0) refuse("options 'dp' and 'zero' are for training; inference runs with dp:1, zero:0");
  if (s.checkpointing != Checkpointing::none) refuse("option 'checkpointing' is for training; inference keeps no activations");
  if (s.optimizer != Optimizer::adamw || s.offload != Offload::none || s.finetune != Finetune::full)
    refuse("options 'optimizer', 'offload' and 'finetune' are for training; inference has no optimizer");
  if (s.prompt_min > s.prompt) refuse("option 'prompt_min' (" + num(s.prompt_min) + ") is above prompt (" + num(s.prompt) + ")");
  if (s.output_min > s.output) refuse("option 'output_min' (" + num(s.output_min) + ") is above output (" + num(s.output) + ")");
  if (s.empty_cache) refuse("option 'empty_cache' is for training and forward passes (the PyTorch loop)");
}

}  // namespace

void WorkloadSetup::validate() const {
  check_shape(model);
  const auto t = static_cast<std::uint64_t>(tp);
  check_divides("tp", t, "heads", static_cast<std::uint64_t>(model.heads), model.name);
  check_divides("tp", t, "kv_heads", static_cast<std::uint64_t>(model.kv_heads), model.name);
  check_divides("tp", t, "ffn", model.ffn, model.name);
  if (framework == Framework::megatron) check_megatron(*this);
  if (mode == Mode::inference) {
    check_inference(*this);
    return;
  }
  check_training(*this);
  if (framework == Framework::pytorch) check_pytorch(*this);
  if (mode == Mode::forward) check_forward(*this);
}

std::string WorkloadSetup::describe() const {
  const double billions = static_cast<double>(model.parameters()) / 1e9;
  char params[32];
  std::snprintf(params, sizeof params, "%.3gB", billions);
  std::string out = model.name + " (" + params + " parameters): " + name_of(mode) + ", " + name_of(precision);
  if (mode == Mode::forward) {
    return out + ", the PyTorch loop" + (no_grad ? " under no_grad" : " with grad on") + ", seq " + num(sequence()) +
           ", batch " + num(micro_batch) + ", " + name_of(attention) + " attention" +
           (empty_cache ? ", empty_cache() at each step" : "");
  }
  if (mode == Mode::training) {
    out += framework == Framework::pytorch ? ", the PyTorch loop (AdamW " + name_of(optimizer_impl) + ")" : ", the Megatron-LM/DeepSpeed loop";
    if (empty_cache) out += ", empty_cache() at each step";
    out += ", seq " + num(sequence()) + (seq_dist == LengthDistribution::Kind::fixed ? "" : " (" + name_of(seq_dist) + ")") +
           ", global batch " + num(effective_global_batch()) + ", " + name_of(attention) + " attention" +
           ", checkpointing " + name_of(checkpointing) + ", ZeRO " + num(static_cast<std::uint64_t>(zero)) +
           ", dp " + num(static_cast<std::uint64_t>(dp)) + ", tp " + num(static_cast<std::uint64_t>(tp)) +
           ", pp " + num(static_cast<std::uint64_t>(pp));
    if (optimizer != Optimizer::adamw) out += ", optimizer " + name_of(optimizer);
    if (offload != Offload::none) out += ", optimizer offloaded to host";
    if (finetune != Finetune::full) out += std::string(finetune == Finetune::lora ? ", LoRA" : ", QLoRA") + " rank " + num(lora_rank);
  } else {
    out += ", " + num(requests) + " requests, prompts up to " + num(prompt) + ", outputs up to " + num(output) +
           ", batch up to " + num(max_batch) + ", " + name_of(kv) + " KV cache, tp " + num(static_cast<std::uint64_t>(tp));
  }
  return out;
}

trace::Trace generate_workload(const WorkloadSetup& s) {
  s.validate();
  trace::Trace t = s.mode == Mode::inference          ? generate_inference_trace(s)
                   : s.framework == Framework::pytorch ? generate_torch_trace(s)
                                                       : generate_training_trace(s);
  t.info.source = "generator:" + s.model.name;
  t.info.metadata.push_back("workload=" + s.to_string());
  return t;
}

// --- setup changes --------------------------------------------------------------------------

std::vector<SetupChange> setup_changes(const WorkloadSetup& s) {
  std::vector<SetupChange> out;
  const auto add = [&](std::string description, const std::string& options, std::string cost) {
    WorkloadSetup changed = s;
    changed.apply(options, "setup change");
    try {
      changed.validate();
    } catch (const ConfigError&) {
      return;  // a change that does not apply to this setup
    }
    out.push_back({std::move(description), options, std::move(cost), std::move(changed)});
  };
  if (s.mode != Mode::training) return out;
  const bool torch = s.framework == Framework::pytorch;
  // What needs DeepSpeed (ZeRO-Offload) or is modelled in its loop (LoRA) runs there.
  const std::string deepspeed = torch ? "framework:megatron," : "";
  const std::string in_deepspeed = torch ? " (modelled in the DeepSpeed-style loop: bf16 weights, fp32 master weights)" : "";
  if (s.precision == Precision::fp32) {
    if (torch)
      add("autocast (bf16) instead of fp32", "precision:autocast-bf16",
          "matmuls in bf16 under torch.autocast: most activations in 16 bits and a bf16 copy of each weight cached for the forward pass; parameters, gradients and optimizer states stay fp32");
    else
      add("bf16 mixed precision", "precision:bf16", "16-bit weights and activations beside fp32 master weights");
  }
  if (s.attention == Attention::eager)
    add(torch ? "F.scaled_dot_product_attention instead of attention written out" : "flash attention",
        torch ? "attention:sdpa" : "attention:flash", "recomputes the attention scores in the backward pass, in a fused kernel");
  if (s.checkpointing == Checkpointing::none && s.attention == Attention::eager && !torch)
    add("selective activation recomputation", "checkpointing:selective",
        "recomputes the attention core in the backward pass");
  if (s.checkpointing != Checkpointing::full)
    add("full activation checkpointing", "checkpointing:full",
        torch ? "torch.utils.checkpoint around each layer: its forward pass runs again in the backward pass (about a third more compute)"
              : "runs each layer's forward pass again in the backward pass (about a third more compute)");
  if (torch && s.optimizer == Optimizer::adamw && s.optimizer_impl != OptimizerImpl::fused)
    add("fused AdamW instead of " + name_of(s.optimizer_impl), "optimizer_impl:fused",
        "none: torch.optim.AdamW(fused=True) updates every state in place in one kernel, without the " +
            std::string(s.optimizer_impl == OptimizerImpl::foreach ? "full-size temporary of _foreach_sqrt" : "per-parameter temporaries"));
  if (s.optimizer == Optimizer::adamw && s.offload == Offload::none)
    add("8-bit AdamW states (bitsandbytes AdamW8bit)", "optimizer:adamw8bit",
        "moments quantized by blocks of 256 (Dettmers et al. 2022 report no loss of accuracy)");
  if (s.offload == Offload::none) {
    const std::uint64_t host = 2 * (s.precision == Precision::fp32 ? 4 : 2);
    add("optimizer states in host memory (ZeRO-Offload)", deepspeed + "offload:optimizer",
        "the step on the CPU; per step " + num(host) + " bytes per parameter over PCIe (gradients out, weights back)" + in_deepspeed);
  }
  if (s.finetune == Finetune::full && s.zero == 0) {
    add("LoRA adapters of rank 16, base weights frozen", deepspeed + "finetune:lora,lora_rank:16",
        "a different job: fine-tunes low-rank adapters instead of every weight (Hu et al. 2021)" + in_deepspeed);
    add("QLoRA: 4-bit base weights and LoRA adapters of rank 16", deepspeed + "finetune:qlora,lora_rank:16",
        "a different job: fine-tunes adapters over 4-bit weights, dequantized for each matmul (Dettmers et al. 2023)" + in_deepspeed);
  }
  if (s.dp > 1)
    for (int stage = s.zero + 1; stage <= 3; ++stage)
      add("ZeRO stage " + std::to_string(stage), "zero:" + std::to_string(stage),
          stage == 3 ? "all-gathers each layer's weights twice per step" : "a reduce-scatter instead of an all-reduce");
  const std::uint64_t half = s.sequence() / 2;
  if (half >= 64)
    add("sequence length " + num(half), "seq:" + num(half) + ",seq_min:0", "a different job: shorter sequences");
  return out;
}

}  // namespace tensorpool::workload
