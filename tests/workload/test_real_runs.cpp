// The PyTorch loop against the real runs behind three of the shared traces (../shared/traces/
// README.md, "The jobs behind three of them"): each job generated from its published setup, and
// the peak of live requested bytes in the step the real window holds compared with the trace's
// (docs/workloads.md, "Checked against real runs"). Skipped where ../shared is absent.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "support/skip.hpp"
#include "tensorpool/trace/load.hpp"
#include "tensorpool/trace/summary.hpp"
#include "tensorpool/workload/setup.hpp"

using namespace tensorpool;

namespace {

// The CS336 handout's Transformer LM as the runs write it: RMSNorm, SwiGLU, rotary positions,
// separate bias-free Q, K, V, untied head, attention and cross-entropy written out (x * sigmoid(x)
// in the MLP), the authors' own AdamW (moments made at the first step, new tensors per update).
constexpr const char* kCs336 = "mlp:gated,norm:rmsnorm,biases:false,tied_embeddings:false,positions:0,vocab:10000,"
                               "attention:eager,loss:written,activation:written,qkv:separate,optimizer_impl:handwritten,"
                               "micro_batch:4,seq:128,context:128";
constexpr const char* kMedium = "layers:24,hidden:1024,heads:16,kv_heads:16,ffn:4096";
constexpr const char* kTwoPointSevenB = "layers:32,hidden:2560,heads:32,kv_heads:32,ffn:10240";

// The peak of live requested bytes from the first event of optimizer step `from_step` on.
std::uint64_t peak_from_step(const trace::Trace& t, std::uint64_t from_step) {
  std::uint64_t live = 0, peak = 0;
  bool counting = from_step == 0;
  std::unordered_map<std::uint64_t, std::uint64_t> blocks;
  for (const trace::TraceEvent& e : t.events) {
    if (e.op == trace::Op::iteration && e.size >= from_step) counting = true;
    if (e.op == trace::Op::alloc) {
      blocks[e.addr] = e.size;
      live += e.size;
    } else if (e.op == trace::Op::free_requested) {
      const auto it = blocks.find(e.addr);
      if (it == blocks.end()) continue;
      live -= it->second;
      blocks.erase(it);
    }
    if (counting) peak = std::max(peak, live);
  }
  return peak;
}

double error_of(const std::string& options, std::uint64_t from_step, std::uint64_t real) {
  workload::WorkloadSetup s = workload::WorkloadSetup::for_model("custom");
  s.apply(options, "real run");
  const double predicted = static_cast<double>(peak_from_step(workload::generate_workload(s), from_step));
  return predicted / static_cast<double>(real) - 1.0;
}

}  // namespace

TEST_CASE("the PyTorch loop predicts the peak of the real CS336 runs within 3%", "[workload][shared]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  const auto real_peak = [&](const char* name) { return trace::summarize(trace::load_trace((dir / name).string())).peak_requested; };

  SECTION("2.7B, fp32, 4 x 128, the first step (its moments made inside the window)") {
    const std::uint64_t real = real_peak("cs336-2.7b-seq128-fullstep.pickle");
    REQUIRE(real == 54802667524ULL);  // the README's figure: the same window
    const double error = error_of(std::string(kCs336) + "," + kTwoPointSevenB + ",precision:fp32,steps:1", 0, real);
    INFO("error " << error * 100 << "%");
    CHECK(std::abs(error) <= 0.03);
  }
  SECTION("medium, 4 x 128, a later step: as published (autocast bf16) and as the trace shows it ran (no cast: fp32)") {
    const std::uint64_t real = real_peak("cs336-medium-seq128-train.pickle");
    REQUIRE(real == 7013335044ULL);
    for (const char* precision : {"autocast-bf16", "fp32"}) {
      const double error = error_of(std::string(kCs336) + "," + kMedium + ",steps:2,precision:" + precision, 1, real);
      INFO(precision << ": error " << error * 100 << "%");
      CHECK(std::abs(error) <= 0.03);
    }
  }
  SECTION("medium, a forward pass at seq 1024 under no_grad (batch 4: its T x h activations are 16 MiB in fp32)") {
    const std::uint64_t real = real_peak("cs336-medium-seq1024-infer.pickle");
    const double error = error_of(std::string(kCs336) + "," + kMedium +
                                      ",mode:forward,optimizer_impl:foreach,seq:1024,context:1024,precision:fp32,steps:1",
                                  0, real);
    INFO("error " << error * 100 << "%");
    CHECK(std::abs(error) <= 0.03);
  }
}
