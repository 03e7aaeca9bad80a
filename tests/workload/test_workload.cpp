// Workload setups and their traces (workload/model.hpp, workload/setup.hpp): the presets' published
// parameter counts; the memory totals against the published formulas (model states: ZeRO paper;
// activations: Korthikanti et al. 2022; the KV cache); pipeline stages, ZeRO's collectives,
// gradient accumulation, MoE routing, sequence lengths and continuous batching; options read back
// and impossible setups refused, naming the option.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "tensorpool/errors.hpp"
#include "tensorpool/workload/model.hpp"
#include "tensorpool/workload/setup.hpp"

using namespace tensorpool;
using namespace tensorpool::workload;
using Catch::Matchers::Contains;
using trace::Op;

namespace {

constexpr std::uint64_t kCommStream = 0x5eed;

WorkloadSetup setup(std::string_view model, std::string_view options) {
  WorkloadSetup s = WorkloadSetup::for_model(model);
  s.apply(options, "test");
  s.validate();
  return s;
}

// The Megatron-LM/DeepSpeed loop (framework:megatron): what the published formulas describe.
WorkloadSetup megatron_setup(std::string_view model, std::string_view options) {
  return setup(model, "framework:megatron," + std::string(options));
}

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

// Live bytes and blocks of the allocations whose label `pick` accepts, on one device (-1: all).
struct Live {
  std::uint64_t peak = 0;        // the most bytes live at once
  std::uint64_t at_marker = 0;   // bytes live just before the first allocation labelled `marker`
  std::uint64_t most_blocks = 0; // the most such blocks live at once
  std::uint64_t allocations = 0;
  std::uint64_t at_end = 0;
};

Live live(const trace::Trace& t, const std::function<bool(const std::string&)>& pick, const std::string& marker = "",
          int device = -1) {
  Live out;
  std::map<std::uint64_t, std::uint64_t> blocks;  // picked and live: addr -> bytes
  std::uint64_t bytes = 0;
  bool marked = false;
  for (const auto& e : t.events) {
    if (device >= 0 && e.device != device) continue;
    if (e.op == Op::alloc) {
      const std::string& label = t.labels[e.label];
      if (!marked && !marker.empty() && label == marker) {
        out.at_marker = bytes;
        marked = true;
      }
      if (!pick(label)) continue;
      blocks[e.addr] = e.size;
      bytes += e.size;
      ++out.allocations;
      out.peak = std::max(out.peak, bytes);
      out.most_blocks = std::max<std::uint64_t>(out.most_blocks, blocks.size());
    } else if (e.op == Op::free_requested) {
      auto it = blocks.find(e.addr);
      if (it == blocks.end()) continue;
      bytes -= it->second;
      blocks.erase(it);
    }
  }
  out.at_end = bytes;
  return out;
}

std::function<bool(const std::string&)> prefix(std::string p) {
  return [p](const std::string& label) { return starts_with(label, p); };
}

std::uint64_t summarize_peak(const trace::Trace& t) {
  return live(t, [](const std::string&) { return true; }).peak;
}

bool model_state(const std::string& label) {
  return starts_with(label, "weights:") || starts_with(label, "grads:") || starts_with(label, "optimizer:");
}

// The events are consistent: frees and record_stream only of live blocks, sizes positive.
void check_consistent(const trace::Trace& t) {
  std::set<std::pair<int, std::uint64_t>> blocks;
  for (const auto& e : t.events) {
    const auto key = std::make_pair(static_cast<int>(e.device), e.addr);
    switch (e.op) {
      case Op::alloc:
        REQUIRE(e.size > 0);
        REQUIRE(blocks.insert(key).second);
        break;
      case Op::free_requested: REQUIRE(blocks.count(key) == 1); break;
      case Op::free_completed: REQUIRE(blocks.erase(key) == 1); break;
      case Op::record_stream: REQUIRE(blocks.count(key) == 1); break;
      default: break;
    }
  }
}

// A GPT block as Korthikanti et al. count it: GELU MLP of 4h, LayerNorm, dropout.
constexpr const char* kGpt = "hidden:1024,heads:16,kv_heads:16,ffn:4096,vocab:1000,mlp:gelu,norm:layernorm,"
                             "dropout:true,seq:512,micro_batch:2,steps:1";

// Activation bytes per layer at the end of the forward pass: the difference between 4 and 2
// layers (the embedding, the last layer's output and the final norm cancel out).
double activations_per_layer(const std::string& options) {
  const auto at_end_of_forward = [&](int layers) {
    const trace::Trace t = generate_workload(megatron_setup("custom", std::string(kGpt) + ",layers:" + std::to_string(layers) + "," + options));
    return static_cast<double>(live(t, prefix("activations:"), "loss:logits").at_marker);
  };
  return (at_end_of_forward(4) - at_end_of_forward(2)) / 2.0;
}

}  // namespace

TEST_CASE("presets have their published parameter counts", "[workload]") {
  const std::map<std::string, std::uint64_t> published = {
      {"gpt2", 124439808},           {"gpt2-xl", 1557611200},       {"llama2-7b", 6738415616},
      {"llama2-13b", 13015864320},   {"llama2-70b", 68976648192},   {"llama3-8b", 8030261248},
      {"mixtral-8x7b", 46702792704}};
  for (const auto& [name, count] : published) {
    INFO(name);
    CHECK(model_preset(name).parameters() == count);
  }
  CHECK(model_preset("gpt2-1.5b").name == "gpt2-xl");
  CHECK(model_preset("llama2-70b").kv_heads == 8);
  CHECK(model_preset("mixtral-8x7b").experts == 8);
  CHECK(model_preset("mixtral-8x7b").top_k == 2);
  REQUIRE_THROWS_WITH(model_preset("llama9"), Contains("unknown model 'llama9'") &&
                                                  Contains("known models: gpt2, gpt2-xl, gpt2-1.5b, llama2-7b") &&
                                                  Contains("mixtral-8x7b"));
  REQUIRE_THROWS_AS(WorkloadSetup::for_model("llama9"), UsageError);
  WorkloadSetup s;
  REQUIRE_THROWS_WITH(s.apply("model:nope"), Contains("known models"));
}

TEST_CASE("model states: 16 bytes per parameter for Adam, sharded by ZeRO stage (ZeRO paper)", "[workload]") {
  const std::string shape = "layers:4,hidden:1024,heads:16,kv_heads:16,ffn:4096,vocab:8000,seq:256,steps:1";
  const double psi = static_cast<double>(megatron_setup("custom", shape).model.parameters());
  // (option, bytes per parameter on one rank) with N = 4 data-parallel ranks
  const std::vector<std::pair<std::string, double>> cases = {
      {"precision:bf16", 16.0},          {"precision:fp16", 16.0},          {"precision:fp32", 16.0},
      {"zero:1,dp:4", 2 + 2 + 12 / 4.0}, {"zero:2,dp:4", 2 + 14 / 4.0},     {"zero:3,dp:4", 16 / 4.0},
      {"precision:fp32,zero:3,dp:4", 16 / 4.0}, {"dp:4", 16.0},
  };
  for (const auto& [options, per_param] : cases) {
    INFO(options);
    const trace::Trace t = generate_workload(megatron_setup("custom", shape + "," + options));
    CHECK(static_cast<double>(live(t, model_state).peak) == Approx(per_param * psi).epsilon(0.10));
  }
  // Tensor parallelism divides nearly all of them (norms stay whole).
  const trace::Trace tp = generate_workload(megatron_setup("custom", shape + ",tp:2"));
  CHECK(static_cast<double>(live(tp, model_state).peak) == Approx(16.0 * psi / 2).epsilon(0.10));
}

TEST_CASE("activations per layer: s*b*h*(34 + 5*a*s/h) bytes (Korthikanti et al. 2022)", "[workload]") {
  const double s = 512, b = 2, h = 1024, a = 16;
  const double sbh = s * b * h;
  SECTION("eager attention, no recompute") {
    CHECK(activations_per_layer("attention:eager") == Approx(sbh * (34 + 5 * a * s / h)).epsilon(0.10));
  }
  SECTION("flash attention: the 5as/h term goes away") {
    CHECK(activations_per_layer("attention:flash") == Approx(sbh * 34).epsilon(0.10));
  }
  SECTION("selective recompute drops the attention core") {
    CHECK(activations_per_layer("attention:eager,checkpointing:selective") == Approx(sbh * 34).epsilon(0.10));
  }
  SECTION("full recompute keeps about 2*s*b*h") {
    CHECK(activations_per_layer("attention:eager,checkpointing:full") == Approx(2 * sbh).epsilon(0.10));
    CHECK(activations_per_layer("attention:flash,checkpointing:full") == Approx(2 * sbh).epsilon(0.10));
  }
  SECTION("tensor parallelism: s*b*h*(10 + 24/t + 5*a*s/(h*t))") {
    const double t = 2;
    CHECK(activations_per_layer("attention:eager,tp:2") == Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))).epsilon(0.10));
  }
  SECTION("fp32 activations are twice as large (dropout masks stay one byte)") {
    CHECK(activations_per_layer("attention:flash,precision:fp32") == Approx(sbh * (2 * 32 + 2)).epsilon(0.10));
  }
}

TEST_CASE("full recompute runs each layer's forward again in its backward, one layer at a time", "[workload]") {
  const trace::Trace t = generate_workload(megatron_setup("custom", std::string(kGpt) + ",layers:4,attention:eager,checkpointing:full"));
  const Live recompute = live(t, prefix("recompute:"));
  const double s = 512, b = 2, h = 1024, a = 16;
  CHECK(recompute.allocations > 0);
  CHECK(recompute.at_end == 0);
  // At most one layer's activations (less its input) are held again at once.
  CHECK(static_cast<double>(recompute.peak) <= 1.05 * s * b * h * (32 + 5 * a * s / h));
  CHECK(static_cast<double>(recompute.peak) >= 0.9 * s * b * h * (32 + 5 * a * s / h));
}

TEST_CASE("KV cache: 2 x layers x kv_heads x head_dim x bytes per token", "[workload]") {
  // Llama-2-70B's attention (64 heads, 8 KV heads of 128) in 4 layers.
  const std::string base = "layers:4,mode:inference,requests:1,prompt:1000,prompt_dist:fixed,output:200,output_dist:fixed";
  const double per_token = 2.0 * 4 * 8 * 128 * 2;
  const WorkloadSetup contiguous = megatron_setup("llama2-70b", base + ",kv:contiguous");
  CHECK(static_cast<double>(contiguous.kv_bytes_per_token()) == per_token);
  const Live c = live(generate_workload(contiguous), prefix("kv_cache:"));
  CHECK(static_cast<double>(c.peak) == Approx(1200 * per_token).epsilon(0.10));
  CHECK(c.at_end == 0);
  const Live p = live(generate_workload(megatron_setup("llama2-70b", base + ",kv:paged,kv_block:16")), prefix("kv_cache:"));
  CHECK(static_cast<double>(p.peak) == Approx(1200 * per_token).epsilon(0.10));
  CHECK(p.allocations == (1199 + 15) / 16);  // blocks of 16 tokens as the sequence grows
  // Hugging Face's DynamicCache: each forward pass (the prefill, then 199 decode steps) replaces
  // every layer's key and value by a tensor one token longer, made before the old one is freed:
  // at the last layer's value of the last step, all 8 tensors hold 1199 tokens and the old value 1198.
  const Live cat = live(generate_workload(megatron_setup("llama2-70b", base + ",kv:concat")), prefix("kv_cache:"));
  CHECK(cat.allocations == 200 * 4 * 2);
  CHECK(static_cast<double>(cat.peak) == 1199 * per_token + 1198 * per_token / 8);
  CHECK(cat.most_blocks == 4 * 2 + 1);
  CHECK(cat.at_end == 0);
  // bf16 weights: 2 bytes per parameter.
  const WorkloadSetup seven = megatron_setup("llama2-7b", "mode:inference,requests:1,prompt:16,prompt_dist:fixed,output:4,output_dist:fixed");
  CHECK(static_cast<double>(live(generate_workload(seven), prefix("weights:")).peak) ==
        Approx(2.0 * static_cast<double>(seven.model.parameters())).epsilon(0.01));
  CHECK(seven.kv_bytes_per_token() == 2ull * 32 * 32 * 128 * 2);
}

TEST_CASE("continuous batching: at most max_batch requests hold a cache, freed as each finishes", "[workload]") {
  const std::string base = "layers:2,mode:inference,requests:40,max_batch:8,kv:contiguous,prompt:256,output:64";
  const trace::Trace burst = generate_workload(megatron_setup("llama2-7b", base + ",arrival:burst"));
  check_consistent(burst);
  const Live k = live(burst, prefix("kv_cache:"));
  CHECK(k.most_blocks == 8 * 2);  // a full batch, one tensor per layer each
  CHECK(k.allocations == 40 * 2);
  CHECK(k.at_end == 0);
  CHECK(live(burst, prefix("weights:")).at_end > 0);
  // Requests that arrive slowly never fill the batch.
  const Live slow = live(generate_workload(megatron_setup("llama2-7b", base + ",arrival:fixed,arrival_rate:0.01")), prefix("kv_cache:"));
  CHECK(slow.most_blocks < k.most_blocks);
  CHECK(slow.allocations == k.allocations);
}

TEST_CASE("pipeline stages are the trace's devices, stage s keeps pp - s micro-batches in flight", "[workload]") {
  const WorkloadSetup s = megatron_setup("custom", "layers:8,hidden:512,heads:8,kv_heads:8,ffn:2048,vocab:1000,seq:128,"
                                          "micro_batch:1,global_batch:8,pp:4,steps:2");
  const trace::Trace t = generate_workload(s);
  check_consistent(t);
  std::set<int> devices;
  for (const auto& e : t.events) devices.insert(e.device);
  CHECK(devices == std::set<int>{0, 1, 2, 3});
  CHECK(live(t, prefix("inputs:input_ids"), "", 0).most_blocks == 4);
  for (int stage = 1; stage < 4; ++stage) {
    INFO("stage " << stage);
    CHECK(live(t, prefix("pipeline:recv_activation"), "", stage).most_blocks == static_cast<std::uint64_t>(4 - stage));
  }
  CHECK(live(t, prefix("loss:"), "", 3).allocations > 0);
  CHECK(live(t, prefix("loss:"), "", 0).allocations == 0);
  CHECK(live(t, prefix("weights:embedding"), "", 0).allocations > 0);
  CHECK(live(t, prefix("weights:embedding"), "", 3).allocations == 0);
}

TEST_CASE("ZeRO and data parallelism: collectives on the communication stream, cross-stream frees", "[workload]") {
  const std::string shape = "layers:4,hidden:512,heads:8,kv_heads:8,ffn:2048,vocab:1000,seq:128,steps:2";
  for (const char* options : {"zero:3,dp:4", "zero:2,dp:4", "dp:2"}) {
    INFO(options);
    const trace::Trace t = generate_workload(megatron_setup("custom", shape + "," + options));
    check_consistent(t);
    std::set<std::uint64_t> recorded;
    std::uint64_t syncs = 0, cross_stream_frees = 0;
    for (const auto& e : t.events) {
      if (e.op == Op::record_stream && e.stream == kCommStream) recorded.insert(e.addr);
      if (e.op == Op::stream_sync && e.stream == kCommStream) ++syncs;
      if (e.op == Op::free_requested && recorded.count(e.addr) != 0) ++cross_stream_frees;
    }
    CHECK(syncs > 0);
    CHECK(cross_stream_frees > 0);
    const std::string label = std::string(options) == "zero:3,dp:4" ? "zero:allgather"
                              : std::string(options) == "zero:2,dp:4" ? "zero:grad_bucket"
                                                                      : "grads:";
    CHECK(live(t, prefix(label)).allocations > 0);
  }
}

TEST_CASE("gradient accumulation: gradients once per step, a forward pass per micro-batch", "[workload]") {
  const std::string shape = "layers:2,hidden:512,heads:8,kv_heads:8,ffn:2048,vocab:1000,seq:128,steps:3";
  const WorkloadSetup s = megatron_setup("custom", shape + ",micro_batch:2,global_batch:8");
  CHECK(s.accumulation() == 4);
  const trace::Trace t = generate_workload(s);
  check_consistent(t);
  CHECK(live(t, prefix("inputs:input_ids")).allocations == 3 * 4);
  // Per layer 7 tensors (2 norms, qkv, out, gate, up, down); the embedding, final norm, output layer.
  CHECK(live(t, prefix("grads:")).allocations == 3 * (2 * 7 + 3));
  const trace::Trace cut = generate_workload(megatron_setup("custom", shape + ",micro_batch:2,global_batch:8,trace_micro_batches:2"));
  CHECK(live(cut, prefix("inputs:input_ids")).allocations == 3 * 2);
  // A later micro-batch runs forward while the gradients of the first are held: a higher peak.
  const trace::Trace one = generate_workload(megatron_setup("custom", shape + ",micro_batch:2,global_batch:2"));
  CHECK(live(t, [](const std::string&) { return true; }).peak > live(one, [](const std::string&) { return true; }).peak);
}

TEST_CASE("MoE: each token to top_k experts, the busiest with moe_imbalance x the mean load", "[workload]") {
  const std::string shape = "layers:2,hidden:256,heads:4,kv_heads:4,ffn:512,vocab:1000,experts:8,top_k:2,seq:256,"
                            "micro_batch:2,steps:1";
  const WorkloadSetup s = megatron_setup("custom", shape + ",moe_imbalance:2");
  const trace::Trace t = generate_workload(s);
  check_consistent(t);
  const std::uint64_t tokens = 2 * 256;
  const std::uint64_t row = 256 * 2;  // hidden x bf16
  std::uint64_t rows = 0, busiest = 0, per_layer = 0;
  for (const auto& e : t.events) {
    if (e.op != Op::alloc || t.labels[e.label] != "activations:moe.expert_input") continue;
    rows += e.size / row;
    busiest = std::max(busiest, e.size / row);
    ++per_layer;
  }
  CHECK(per_layer == 2 * 8);  // every expert of both layers got tokens
  CHECK(rows == 2 * tokens * 2);
  CHECK(busiest == 2 * tokens * 2 / 8);
  CHECK(s.model.parameters() > megatron_setup("custom", "layers:2,hidden:256,heads:4,kv_heads:4,ffn:512,vocab:1000").model.parameters());
}

TEST_CASE("sequence lengths from a distribution, and dynamic batching by tokens", "[workload]") {
  const std::string shape = "layers:2,hidden:256,heads:4,kv_heads:4,ffn:512,vocab:1000,seq:1024,micro_batch:4,"
                            "global_batch:32,steps:2";
  const auto sizes = [](const trace::Trace& t) {
    std::set<std::uint64_t> out;
    for (const auto& e : t.events)
      if (e.op == Op::alloc && t.labels[e.label] == "inputs:input_ids") out.insert(e.size / 8);
    return out;
  };
  CHECK(sizes(generate_workload(megatron_setup("custom", shape))) == std::set<std::uint64_t>{4 * 1024});
  const auto varied = sizes(generate_workload(megatron_setup("custom", shape + ",seq_dist:uniform,seq_min:256")));
  CHECK(varied.size() > 3);
  for (std::uint64_t tokens : varied) {
    CHECK(tokens % 4 == 0);
    CHECK(tokens / 4 >= 256);
    CHECK(tokens / 4 <= 1024);
  }
  CHECK(sizes(generate_workload(megatron_setup("custom", shape + ",seq_dist:lognormal,seq_min:64"))).size() > 3);
  // Dynamic batching: about micro_batch x seq tokens whatever the length.
  for (std::uint64_t tokens : sizes(generate_workload(megatron_setup("custom", shape + ",seq_dist:uniform,seq_min:256,batching:dynamic")))) {
    CHECK(tokens <= 4 * 1024);
    CHECK(tokens > 4 * 1024 - 1024);
  }
  CHECK(generate_workload(megatron_setup("llama2-7b", "layers:2,seq_dist:uniform")).events ==
        generate_workload(megatron_setup("llama2-7b", "layers:2,seq_dist:uniform")).events);
}

TEST_CASE("workload options read back, and impossible setups are refused naming the option", "[workload]") {
  WorkloadSetup s = megatron_setup("llama2-70b", "tp:8,zero:1,dp:4,global_batch:64,micro_batch:2,moe_imbalance:1,arrival_rate:0.25");
  WorkloadSetup again = WorkloadSetup::for_model("custom");
  again.apply(s.to_string());
  CHECK(again.to_string() == s.to_string());
  CHECK(again.model.name == "llama2-70b");
  CHECK(s.accumulation() == 8);
  WorkloadSetup changed = s;
  changed.apply("layers:2");
  CHECK(changed.model.name == "custom");

  const auto refused = [](std::string_view model, std::string_view options) {
    WorkloadSetup w = WorkloadSetup::for_model(model);
    w.apply(options, "--options");
    w.validate();
  };
  REQUIRE_THROWS_WITH(refused("llama2-7b", "tp:3"), Contains("option 'tp' (3) does not divide heads (32 in llama2-7b)"));
  REQUIRE_THROWS_WITH(refused("llama2-70b", "tp:16"), Contains("option 'tp' (16) does not divide kv_heads (8 in llama2-70b)"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "micro_batch:128,global_batch:64"),
                      Contains("option 'micro_batch' (128) x dp (1) is above global_batch (64)"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "micro_batch:3,global_batch:64"), Contains("option 'global_batch' (64)"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "pp:3"), Contains("option 'pp' (3) does not divide layers (32"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "pp:2,zero:3,dp:2"), Contains("option 'zero' (3) with pp > 1"));
  REQUIRE_THROWS_WITH(refused("mixtral-8x7b", "moe_imbalance:5"), Contains("option 'moe_imbalance' (5) is above experts / top_k (4)"));
  REQUIRE_THROWS_WITH(refused("custom", "heads:16,kv_heads:5"), Contains("kv_heads (5) does not divide heads (16)"));
  REQUIRE_THROWS_WITH(refused("custom", "top_k:2"), Contains("top_k (2) is above experts (1)"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "mode:inference,pp:2"), Contains("option 'pp' (2) is for training"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "seq:512,seq_min:1024"), Contains("option 'seq_min' (1024) is above seq (512)"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "layerz:2"),
                      Contains("--options: unknown key 'layerz'") && Contains("known keys: model, layers, hidden"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "precision:fp8"),
                      Contains("bad value 'fp8' for key 'precision': expected one of fp32, bf16, fp16"));
  REQUIRE_THROWS_WITH(refused("llama2-7b", "zero:4"), Contains("'zero'") && Contains("from 0 to 3"));
  WorkloadSetup bad = WorkloadSetup::for_model("custom");
  bad.apply("tp:3");
  REQUIRE_THROWS_AS(generate_workload(bad), ConfigError);  // validated before anything is built
}

TEST_CASE("setup changes: what saves memory, only where it applies", "[workload]") {
  const WorkloadSetup s = megatron_setup("llama2-7b", "precision:fp32,attention:eager,dp:8,global_batch:64");
  std::set<std::string> options;
  for (const SetupChange& c : setup_changes(s)) {
    options.insert(c.options);
    CHECK(c.setup.to_string() != s.to_string());
    CHECK_NOTHROW(c.setup.validate());
  }
  CHECK(options == std::set<std::string>{"precision:bf16", "attention:flash", "checkpointing:selective",
                                         "checkpointing:full", "optimizer:adamw8bit", "offload:optimizer",
                                         "finetune:lora,lora_rank:16", "finetune:qlora,lora_rank:16", "zero:1",
                                         "zero:2", "zero:3", "seq:2048,seq_min:0"});
  for (const SetupChange& c : setup_changes(s)) CHECK_FALSE(c.cost.empty());
  std::set<std::string> pipelined;
  for (const SetupChange& c : setup_changes(megatron_setup("llama2-7b", "pp:2,dp:8,global_batch:64,checkpointing:full")))
    pipelined.insert(c.options);
  CHECK(pipelined == std::set<std::string>{"optimizer:adamw8bit", "offload:optimizer", "finetune:lora,lora_rank:16",
                                           "finetune:qlora,lora_rank:16", "zero:1", "seq:2048,seq_min:0"});
  // Offloaded, the optimizer's states are no longer on the device: no 8-bit change either.
  std::set<std::string> offloaded;
  for (const SetupChange& c : setup_changes(megatron_setup("gpt2", "offload:optimizer"))) offloaded.insert(c.options);
  CHECK(offloaded == std::set<std::string>{"checkpointing:full", "finetune:lora,lora_rank:16",
                                           "finetune:qlora,lora_rank:16", "seq:512,seq_min:0"});
  // With ZeRO, no LoRA change (not modelled together).
  for (const SetupChange& c : setup_changes(megatron_setup("llama2-7b", "zero:1,dp:8,global_batch:64")))
    CHECK(c.options.find("finetune") == std::string::npos);
}

TEST_CASE("an 8-bit optimizer and an offloaded one: the optimizer's bytes on the device", "[workload]") {
  const std::string shape = "layers:2,hidden:512,heads:8,kv_heads:8,ffn:2048,vocab:1000,seq:128,steps:2";
  const auto optimizer_bytes = [&](const std::string& options) {
    return live(generate_workload(megatron_setup("custom", shape + "," + options)), prefix("optimizer:")).peak;
  };
  // Per parameter tensor of n elements: the fp32 master copy (bf16 mixed precision), and each
  // moment in fp32, or in uint8 with an fp32 scale per 256 elements from 4096 elements up.
  std::uint64_t fp32 = 0, eight_bit = 0;
  const WorkloadSetup base = megatron_setup("custom", shape);
  std::vector<std::uint64_t> sizes;
  const trace::Trace t = generate_workload(base);
  for (const auto& e : t.events) {
    if (e.op != Op::alloc || !starts_with(t.labels[e.label], "weights:")) continue;
    const std::uint64_t n = e.size / 2;  // bf16 weights
    fp32 += 4 * n + 2 * 4 * n;
    eight_bit += 4 * n + 2 * (n >= 4096 ? n + 4 * ((n + 255) / 256) : 4 * n);
    sizes.push_back(n);
  }
  REQUIRE(std::any_of(sizes.begin(), sizes.end(), [](std::uint64_t n) { return n < 4096; }));  // norms stay fp32
  CHECK(optimizer_bytes("optimizer:adamw") == fp32);
  CHECK(optimizer_bytes("optimizer:adamw8bit") == eight_bit);
  CHECK(optimizer_bytes("offload:optimizer") == 0);
  // Offloaded, the step allocates nothing on the device; the weights and gradients stay.
  const trace::Trace off = generate_workload(megatron_setup("custom", shape + ",offload:optimizer"));
  CHECK(live(off, prefix("temporaries:optimizer.step")).allocations == 0);
  CHECK(live(t, prefix("temporaries:optimizer.step")).allocations > 0);
  CHECK(live(off, prefix("grads:")).peak == live(t, prefix("grads:")).peak);
  CHECK(megatron_setup("custom", shape + ",optimizer:adamw8bit,offload:optimizer").to_string().find("offload:optimizer") !=
        std::string::npos);
  REQUIRE_THROWS_WITH(megatron_setup("llama2-7b", "mode:inference,optimizer:adamw8bit"),
                      Contains("options 'optimizer', 'offload' and 'finetune' are for training"));
  REQUIRE_THROWS_WITH(megatron_setup("llama2-7b", "optimizer:adam"),
                      Contains("bad value 'adam' for key 'optimizer': expected one of adamw, adamw8bit"));
}

TEST_CASE("LoRA and QLoRA: frozen base weights, trainable adapters, 4-bit matrices", "[workload]") {
  const std::string shape = "layers:2,hidden:512,heads:8,kv_heads:8,ffn:2048,vocab:1000,seq:128,steps:2,mlp:gated";
  const trace::Trace full = generate_workload(megatron_setup("custom", shape));
  const trace::Trace lora = generate_workload(megatron_setup("custom", shape + ",finetune:lora,lora_rank:8"));
  const trace::Trace qlora = generate_workload(megatron_setup("custom", shape + ",finetune:qlora,lora_rank:8"));
  check_consistent(lora);
  check_consistent(qlora);
  // Per layer, the adapted matrices (in x out): qkv 512 x 1536, out 512 x 512, gate and up
  // 512 x 2048, down 2048 x 512; each gets A (in x 8) and B (8 x out).
  const std::uint64_t r = 8, layers = 2;
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> matrices = {
      {512, 1536}, {512, 512}, {512, 2048}, {512, 2048}, {2048, 512}};
  std::uint64_t adapter = 0, base = 0, nf4 = 0;
  for (const auto& [in, out] : matrices) {
    adapter += r * (in + out);
    base += in * out;
    const std::uint64_t blocks = (in * out + 63) / 64;
    nf4 += in * out / 2 + blocks + 4 * ((blocks + 255) / 256);
  }
  adapter *= layers;
  base *= layers;
  nf4 *= layers;
  // Only the adapters train: their gradients (bf16) and optimizer states (master + moments).
  CHECK(live(lora, prefix("grads:")).peak == 2 * adapter);
  CHECK(live(lora, prefix("optimizer:")).peak == 12 * adapter);
  CHECK(live(lora, prefix("grads:lora_")).peak == 2 * adapter);
  // The base weights as in full training; in QLoRA the matrices in NF4, the rest (norms,
  // embedding, head) unchanged.
  const std::uint64_t full_weights = live(full, prefix("weights:")).peak;
  CHECK(live(lora, prefix("weights:")).peak == full_weights + 2 * adapter);
  CHECK(live(qlora, prefix("weights:")).peak == full_weights - 2 * base + nf4 + 2 * adapter);
  // Each layer keeps its adapters' x A for backward; QLoRA dequantizes a matrix per matmul.
  CHECK(live(lora, [](const std::string& l) { return l == "activations:lora.xA"; }).allocations > 0);
  CHECK(live(qlora, prefix("temporaries:qlora.dequantize")).allocations > 0);
  CHECK(live(lora, prefix("temporaries:qlora.dequantize")).allocations == 0);
  REQUIRE_THROWS_WITH(megatron_setup("llama2-7b", "finetune:lora,zero:1,dp:2"), Contains("LoRA with ZeRO is not modelled"));
  REQUIRE_THROWS_WITH(megatron_setup("llama2-7b", "lora_rank:0"), Contains("'lora_rank'"));
}

TEST_CASE("every kind of workload trace is consistent and deterministic", "[workload]") {
  for (const char* options :
       {"layers:4,zero:3,dp:8,checkpointing:full", "layers:4,pp:2,global_batch:8,tp:2", "layers:4,attention:eager,checkpointing:selective",
        "layers:2,mode:inference,kv:paged,requests:16", "layers:2,mode:inference,kv:contiguous,requests:16,arrival:fixed",
        "layers:2,mode:inference,kv:concat,requests:16,max_batch:4"}) {
    INFO(options);
    const trace::Trace a = generate_workload(megatron_setup("llama2-7b", options));
    check_consistent(a);
    CHECK(a.events == generate_workload(megatron_setup("llama2-7b", options)).events);
    CHECK(a.info.source == "generator:custom");  // a preset with its shape changed
  }
  check_consistent(generate_workload(megatron_setup("mixtral-8x7b", "layers:2,seq:512,zero:2,dp:4,moe_imbalance:3")));
}

// --- the PyTorch loop (framework:pytorch, torch_loop.cpp) ------------------------------------

namespace {

// A small Llama-style model in the PyTorch loop; append keys to change it.
constexpr const char* kTorch = "layers:2,hidden:512,heads:8,kv_heads:8,ffn:1024,vocab:1000,micro_batch:2,steps:1";

// Bytes live just before the first backward allocation: what the forward pass left for backward.
std::uint64_t before_backward(const trace::Trace& t) {
  return live(t, [](const std::string&) { return true; }, "temporaries:backward.grad_output").at_marker;
}

std::uint64_t elements(const WorkloadSetup& s) { return s.model.parameters(); }

}  // namespace

TEST_CASE("the PyTorch loop: autocast keeps fp32 model states and caches each weight's bf16 cast", "[workload]") {
  const WorkloadSetup s = setup("custom", std::string(kTorch) + ",seq:256");
  REQUIRE(s.framework == Framework::pytorch);
  REQUIRE(s.precision == Precision::autocast_bf16);
  const trace::Trace t = generate_workload(s);
  check_consistent(t);
  const std::uint64_t n = elements(s);
  CHECK(live(t, prefix("weights:")).peak == 4 * n + live(t, prefix("weights:rope")).peak);  // fp32 parameters
  CHECK(live(t, prefix("grads:")).peak == 4 * n);
  CHECK(live(t, prefix("optimizer:exp_avg")).peak == 2 * 4 * n);
  // Each matmul weight (every linear layer and the head: not the norms or the embedding, which
  // autocast does not cast) is cast once per forward pass and kept until its backward.
  const std::uint64_t h = s.model.hidden, f = s.model.ffn, v = s.model.vocab;
  const std::uint64_t matmul_weights = static_cast<std::uint64_t>(s.model.layers) * (4 * h * h + 3 * h * f) + v * h;
  const Live casts = live(t, prefix("autocast:"), "temporaries:backward.grad_output");
  CHECK(casts.at_marker == 2 * matmul_weights);
  CHECK(casts.allocations == static_cast<std::uint64_t>(s.model.layers) * 7 + 1);
  CHECK(casts.at_end == 0);
}

TEST_CASE("the PyTorch loop: optimizer states appear at the first step, foreach's temporary is every state at once", "[workload]") {
  const auto first_alloc = [](const trace::Trace& t, const std::string& p) {
    for (std::size_t i = 0; i < t.events.size(); ++i)
      if (t.events[i].op == Op::alloc && starts_with(t.labels[t.events[i].label], p)) return i;
    return t.events.size();
  };
  const auto last_alloc = [](const trace::Trace& t, const std::string& p) {
    std::size_t last = 0;
    for (std::size_t i = 0; i < t.events.size(); ++i)
      if (t.events[i].op == Op::alloc && starts_with(t.labels[t.events[i].label], p)) last = i;
    return last;
  };
  const std::string small = std::string(kTorch) + ",seq:64";  // the model states make the peak
  const WorkloadSetup s = setup("custom", small);
  const std::uint64_t n = elements(s);
  const trace::Trace foreach = generate_workload(s);
  CHECK(first_alloc(foreach, "optimizer:") > last_alloc(foreach, "grads:"));  // lazily, after backward
  const trace::Trace eager_states = generate_workload(megatron_setup("custom", "layers:2,hidden:512,heads:8,kv_heads:8,ffn:1024,vocab:1000,micro_batch:2,steps:1"));
  CHECK(first_alloc(eager_states, "optimizer:") < first_alloc(eager_states, "grads:"));  // with the weights
  CHECK(live(foreach, prefix("temporaries:optimizer.foreach_sqrt")).peak == 4 * n);
  const trace::Trace fused = generate_workload(setup("custom", small + ",optimizer_impl:fused"));
  CHECK(live(fused, prefix("temporaries:optimizer")).allocations == 0);
  CHECK(summarize_peak(foreach) - summarize_peak(fused) >= 4 * n - 4 * n / 10);
  // for-loop: sqrt and the division, two temporaries of one parameter at a time
  const std::uint64_t largest = 4 * std::max<std::uint64_t>(s.model.vocab * s.model.hidden, s.model.hidden * s.model.ffn);
  CHECK(live(generate_workload(setup("custom", std::string(kTorch) + ",optimizer_impl:for-loop")), prefix("temporaries:optimizer")).peak == 2 * largest);
  // hand-written: new moment tensors; old ones freed when rebound
  const trace::Trace hand = generate_workload(setup("custom", std::string(kTorch) + ",optimizer_impl:handwritten,steps:2"));
  CHECK(live(hand, prefix("temporaries:optimizer")).peak == 3 * largest);
  CHECK(live(hand, prefix("optimizer:exp_avg")).at_end == 2 * 4 * n);
  // SGD with momentum: one state per parameter, the gradient's clone at the first step
  CHECK(live(generate_workload(setup("custom", std::string(kTorch) + ",optimizer:sgd")), prefix("optimizer:")).peak == 4 * n);
}

TEST_CASE("the PyTorch loop: attention written out keeps exp and the probabilities of every score", "[workload]") {
  // What the forward pass leaves for backward, at seq s, 2s and 3s: the constant terms and those
  // linear in the tokens cancel in f(3s) - 2 f(2s) + f(s), leaving twice the s x s tensors autograd
  // keeps at seq s (the mask: one byte per score of a sequence, shared by the batch and the heads).
  const auto quadratic = [](const std::string& options, std::uint64_t seq) {
    const auto f = [&](std::uint64_t sq) {
      return before_backward(generate_workload(setup("custom", std::string(kTorch) + ",context:4096," + options + ",seq:" + std::to_string(sq))));
    };
    return static_cast<std::int64_t>(f(3 * seq)) - 2 * static_cast<std::int64_t>(f(2 * seq)) + static_cast<std::int64_t>(f(seq));
  };
  const std::int64_t layers = 2, batch = 2, heads = 8, s = 256;
  const std::int64_t per_byte = layers * 2 * s * s;  // the second difference of one byte per score
  // fp32: exp (kept by exp's backward) and exp / sum (kept by the matmul with V), 4 bytes each
  CHECK(quadratic("precision:fp32,attention:eager", s) == per_byte * (batch * heads * 8 + 1));
  // autocast: exp runs in fp32 (kept), the probabilities are cast to bf16 for the matmul (kept)
  CHECK(quadratic("precision:autocast-bf16,attention:eager", s) == per_byte * (batch * heads * 6 + 1));
  // sdpa keeps one float per row, nothing per score
  CHECK(quadratic("precision:autocast-bf16,attention:sdpa", s) == 0);
}

TEST_CASE("the PyTorch loop: checkpointing, forward passes and gradient accumulation", "[workload]") {
  const WorkloadSetup base = setup("custom", std::string(kTorch) + ",seq:512,precision:fp32");
  const std::uint64_t T = base.micro_batch * 512, h = base.model.hidden;
  const trace::Trace plain = generate_workload(base);
  const auto checkpointed = [](int layers) {
    return generate_workload(setup("custom", std::string(kTorch) + ",seq:512,precision:fp32,checkpointing:full,layers:" + std::to_string(layers)));
  };
  const trace::Trace ckpt = checkpointed(2);
  check_consistent(ckpt);
  const auto activations = [](const trace::Trace& t) {  // all but the weights (no gradient or state yet)
    return live(t, [](const std::string& l) { return !starts_with(l, "weights:"); }, "temporaries:backward.grad_output").at_marker;
  };
  // torch.utils.checkpoint keeps each layer's input only (the fp32 residual stream: T x h x 4 bytes)
  CHECK(activations(checkpointed(4)) - activations(ckpt) == 2 * T * h * 4);
  // without it, a layer keeps more than ten tensors of that size (norms, Q, K, V, the MLP's)
  const trace::Trace plain4 = generate_workload(setup("custom", std::string(kTorch) + ",seq:512,precision:fp32,layers:4"));
  CHECK(activations(plain4) - activations(plain) > 2 * 10 * T * h * 4);
  CHECK(live(ckpt, prefix("grads:")).peak == live(plain, prefix("grads:")).peak);  // every gradient reached
  // under autocast the recompute casts the layer's weights again, as torch.utils.checkpoint
  // restores the autocast state: each matmul weight of a layer twice per step, the head once
  const trace::Trace ckpt_autocast = generate_workload(setup("custom", std::string(kTorch) + ",seq:512,checkpointing:full"));
  check_consistent(ckpt_autocast);
  CHECK(live(ckpt_autocast, prefix("autocast:")).allocations == 2 * 2 * 7 + 1);
  // forward passes: no gradient, no optimizer; under no_grad nothing is kept between ops
  const trace::Trace no_grad = generate_workload(setup("custom", std::string(kTorch) + ",seq:512,mode:forward,steps:3"));
  const trace::Trace with_grad = generate_workload(setup("custom", std::string(kTorch) + ",seq:512,mode:forward,steps:3,no_grad:false"));
  check_consistent(no_grad);
  check_consistent(with_grad);
  CHECK(live(no_grad, prefix("grads:")).allocations == 0);
  CHECK(live(no_grad, prefix("optimizer:")).allocations == 0);
  CHECK(live(no_grad, prefix("activations:")).allocations == 0);
  // with grad on, the graph lives as long as the output does: until the next pass rebinds it
  CHECK(live(with_grad, prefix("activations:")).peak > live(with_grad, prefix("activations:")).at_end);
  CHECK(summarize_peak(with_grad) > summarize_peak(no_grad) + T * h * 4);
  // accumulation: one forward and backward per micro-batch, gradients allocated once
  const trace::Trace accumulated = generate_workload(setup("custom", std::string(kTorch) + ",global_batch:8"));
  CHECK(live(accumulated, prefix("grads:")).allocations == live(plain, prefix("grads:")).allocations);
  CHECK(live(accumulated, prefix("inputs:input_ids")).allocations == 4);
}

TEST_CASE("the PyTorch loop: every allocation says what it is", "[workload]") {
  // plan's breakdown counts each label by its kind (tools/plan_answer.cpp): none is left "other"
  const std::set<std::string> kinds = {"weights", "grads", "optimizer", "activations", "autocast", "loss",
                                       "temporaries", "inputs"};
  for (const char* options : {"attention:eager,loss:written,activation:written", "precision:fp32,checkpointing:full",
                              "mode:forward,no_grad:false", "optimizer_impl:handwritten,clip_grad:true,qkv:fused"}) {
    INFO(options);
    const trace::Trace t = generate_workload(setup("gpt2", std::string("layers:2,seq:128,") + options));
    for (const auto& e : t.events) {
      if (e.op != Op::alloc) continue;
      const std::string& label = t.labels[e.label];
      INFO(label);
      CHECK(kinds.count(label.substr(0, label.find(':'))) == 1);
    }
  }
}

TEST_CASE("the PyTorch loop: options read back, defaults per framework, refusals name what has it", "[workload]") {
  const WorkloadSetup s = setup("llama2-7b", "attention:eager,loss:written,activation:written,qkv:fused,optimizer_impl:handwritten,clip_grad:true");
  WorkloadSetup back = WorkloadSetup::for_model("custom");
  back.apply(s.to_string(), "read back");
  CHECK(back.to_string() == s.to_string());
  CHECK(generate_workload(back).events == generate_workload(s).events);
  check_consistent(generate_workload(setup("gpt2", "layers:2,seq:256,attention:eager,activation:written,loss:written,clip_grad:true")));
  const WorkloadSetup m = setup("llama2-7b", "framework:megatron");
  CHECK(m.precision == Precision::bf16);
  CHECK(m.attention == Attention::flash);
  CHECK(setup("llama2-7b", "mode:inference").precision == Precision::bf16);  // serving: 16-bit weights
  // a mixture of experts starts in the loop that models it
  CHECK(setup("mixtral-8x7b", "layers:2").framework == Framework::megatron);
  CHECK(setup("custom", "model:mixtral-8x7b,layers:2").attention == Attention::flash);
  REQUIRE_THROWS_WITH(setup("mixtral-8x7b", "framework:pytorch"), Contains("a mixture of experts (experts 8) is modelled in the Megatron-LM/DeepSpeed loop"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "tp:2"), Contains("option 'tp' (2) is modelled in the Megatron-LM/DeepSpeed loop: add framework:megatron"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "framework:megatron,precision:autocast-bf16"),
                      Contains("option 'precision' (autocast-bf16) is the PyTorch loop's (framework:pytorch)"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "mode:forward,optimizer_impl:fused"), Contains("mode:forward runs forward passes only"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "mode:inference,precision:autocast-fp16"), Contains("mode:inference serves 16-bit or fp32 weights"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "optimizer_impl:fast"), Contains("one of foreach, fused, for-loop, handwritten"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "checkpointing:selective"), Contains("the PyTorch loop has checkpointing:full"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "framework:megatron,empty_cache:true"),
                      Contains("option 'empty_cache' is the PyTorch loop's (framework:pytorch)"));
  REQUIRE_THROWS_WITH(setup("llama2-7b", "mode:inference,empty_cache:true"),
                      Contains("option 'empty_cache' is for training and forward passes"));
}

TEST_CASE("the PyTorch loop: empty_cache:true calls empty_cache() at the start of every step, and only there",
          "[workload]") {
  for (const char* mode : {"mode:training", "mode:forward"}) {
    INFO(mode);
    const std::string options = std::string("layers:2,seq:128,steps:3,") + mode;
    const trace::Trace plain = generate_workload(setup("gpt2", options));
    const trace::Trace emptied = generate_workload(setup("gpt2", options + ",empty_cache:true"));
    check_consistent(emptied);
    // The same events (but their times), with an empty_cache just after each step's marker.
    std::vector<trace::TraceEvent> without;
    std::size_t calls = 0;
    for (std::size_t i = 0; i < emptied.events.size(); ++i) {
      if (emptied.events[i].op != Op::empty_cache) {
        without.push_back(emptied.events[i]);
        without.back().time_us = plain.events.at(without.size() - 1).time_us;
        continue;
      }
      ++calls;
      REQUIRE(i > 0);
      CHECK(emptied.events[i - 1].op == Op::iteration);
    }
    CHECK(calls == 3);
    CHECK(without == plain.events);
  }
}
