// The replay engine: measurements on hand-built traces, targets, baselines, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/skip.hpp"
#include "support/step_traces.hpp"
#include "support/workloads.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/trace/load.hpp"
#include "tensorpool/trace/summary.hpp"
#include "tensorpool/types.hpp"

using namespace tensorpool::replay;
using tptest::generated;
using tensorpool::GiB;
using tensorpool::MiB;
using tensorpool::trace::TraceEvent;
using tensorpool::trace::Op;
namespace trace = tensorpool::trace;

namespace {

TraceEvent ev(Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream = 0, std::uint16_t device = 0) {
  return {.op = op, .device = device, .stream = stream, .addr = addr, .size = size};
}

// Whether the replay calls tensorpool's step() at the trace's iteration markers.
enum class Steps { none, at_iterations };

ReplayReport run(const trace::Trace& t, const std::string& allocator, std::size_t capacity = 80 * GiB,
                 const std::string& conf = "", Steps steps = Steps::none) {
  TraceSource source(t);
  ReplayOptions o;
  o.allocator = allocator;
  o.target.capacity = capacity;
  o.target.conf = conf;
  o.step_at_iterations = steps == Steps::at_iterations;
  return tensorpool::replay::replay(source, o);
}

// The measured pass of a replay at 80 GiB after `warmup` passes over the same window.
ReplayResult measured_pass(const trace::Trace& t, const std::string& allocator, int warmup, Steps steps = Steps::none) {
  TraceSource source(t);
  ReplayOptions o;
  o.allocator = allocator;
  o.target.capacity = 80 * GiB;
  o.warmup = warmup;
  o.step_at_iterations = steps == Steps::at_iterations;
  return tensorpool::replay::replay(source, o).total;
}

// Three blocks live at once (peak requested 7 MiB + 1000 B), then freed; one address reused.
trace::Trace small_trace() {
  trace::Trace t;
  t.events = {ev(Op::alloc, 0x1000, 4 * MiB), ev(Op::alloc, 0x2000, 3 * MiB, 7),
              ev(Op::alloc, 0x3000, 1000), ev(Op::record_stream, 0x1000, 0, 7),
              ev(Op::free_requested, 0x1000, 4 * MiB), ev(Op::free_completed, 0x1000, 4 * MiB),
              ev(Op::free_requested, 0x9999, 16),  // never allocated in the window
              ev(Op::alloc, 0x1000, 2 * MiB), ev(Op::free_requested, 0x1000, 2 * MiB),
              ev(Op::free_requested, 0x2000, 3 * MiB), ev(Op::free_requested, 0x3000, 1000)};
  return t;
}

}  // namespace

TEST_CASE("replay measures requested, allocated and reserved peaks", "[replay]") {
  const trace::Trace t = small_trace();
  const ReplayResult raw = run(t, "raw").total;
  REQUIRE(raw.allocs == 4);
  REQUIRE(raw.frees == 4);
  REQUIRE(raw.unmatched_frees == 1);
  REQUIRE(raw.peak_requested == 7 * MiB + 1000);
  REQUIRE(raw.peak_reserved == 4 * MiB + 4 * MiB + 1024);  // 2 MiB pages above 2 MiB, 512 B below
  REQUIRE(raw.upstream.allocs == 4);
  REQUIRE(raw.upstream.frees == 4);
  REQUIRE(raw.upstream.syncs == 4);  // each cudaFree waits for the device
  REQUIRE(raw.final_reserved == 0);
  REQUIRE(raw.utilization == Approx(static_cast<double>(7 * MiB + 1000) / (8 * MiB + 1024)));
  REQUIRE(raw.waste == raw.peak_reserved - raw.peak_requested);

  const ReplayResult tp = run(t, "tensorpool").total;
  REQUIRE(tp.peak_requested == raw.peak_requested);
  REQUIRE(tp.peak_allocated == 7 * MiB + 1024);
  REQUIRE(tp.peak_reserved == 20 * MiB + 20 * MiB + 2 * MiB);  // two streams, two large segments
  REQUIRE(tp.upstream.allocs == 3);
  REQUIRE(tp.upstream.frees == 0);
  REQUIRE(tp.final_reserved == tp.peak_reserved);  // cached
  REQUIRE(tp.host_ns_per_op > 0.0);
}

TEST_CASE("replay: --step-at-iterations calls tensorpool's step() at each iteration marker", "[replay][step]") {
  // tptest::weights_and_steps(): online the steps reach 96 + 140 MiB; planned around the weights
  // at the step boundaries they need 96 + 100 MiB, and the pages above go once the plan repeats.
  const trace::Trace t = tptest::weights_and_steps();
  const auto replayed = [&](Steps steps) {
    return run(t, "tensorpool-vmm", 80 * GiB, "vmm_max_chunk:2MiB,vmm_idle_divisor:1", steps).total;
  };
  const ReplayResult online = replayed(Steps::none);
  const ReplayResult stepped = replayed(Steps::at_iterations);
  REQUIRE(online.peak_reserved == (96 + 140) * MiB);
  REQUIRE(online.final_reserved == (96 + 140) * MiB);
  REQUIRE(stepped.peak_reserved == (96 + 140) * MiB);  // the first steps run online
  REQUIRE(stepped.final_reserved == (96 + 100) * MiB);
  REQUIRE(stepped.upstream.syncs == 0);
  REQUIRE(replayed(Steps::at_iterations).final_reserved == stepped.final_reserved);  // deterministic
}

TEST_CASE("replay: steps, called or found, never hold more than the online run on a PyTorch loop", "[replay][step]") {
  // GPT-2 small in the PyTorch loop, 16 steps: the kept logits move each step's base, so plans
  // made around two bases take turns, and one's repeat gives back pages the other's height covers.
  // A plan followed with those holes mapped held both, 1.5 GiB above the online peak; such a plan
  // is not followed.
  const trace::Trace t = generated("model:gpt2,framework:pytorch,micro_batch:8,seq:512,steps:16");
  const ReplayResult online = run(t, "tensorpool-vmm").total;
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  const ReplayResult found = run(t, "tensorpool-vmm", 80 * GiB, "vmm_find_steps:true").total;
  REQUIRE(online.per_iteration.size() == 16);
  REQUIRE(called.peak_reserved <= online.peak_reserved);
  REQUIRE(found.peak_reserved <= online.peak_reserved);
  REQUIRE(found.upstream.total() <= online.upstream.total());
}

namespace {

// A loop's iterations from the third on: their calls, their synchronizations, and the highest
// reserved over the highest requested among them.
std::tuple<std::uint64_t, std::uint64_t, double> from_third(const ReplayResult& r) {
  std::uint64_t calls = 0, syncs = 0;
  std::size_t requested = 0, reserved = 0;
  for (std::size_t i = 2; i < r.per_iteration.size(); ++i) {
    calls += r.per_iteration[i].upstream.total();
    syncs += r.per_iteration[i].upstream.syncs;
    requested = std::max(requested, r.per_iteration[i].peak_requested);
    reserved = std::max(reserved, r.per_iteration[i].peak_reserved);
  }
  return {calls, syncs, static_cast<double>(reserved) / static_cast<double>(requested)};
}

// From the third iteration of `r` on: no call, no synchronization, and at most `max_ratio` of
// the requested peak held.
void check_quiet_from_third(const ReplayResult& r, double max_ratio) {
  const auto [calls, syncs, ratio] = from_third(r);
  CHECK(calls == 0);
  CHECK(syncs == 0);
  CHECK(ratio <= max_ratio);
}

}  // namespace

TEST_CASE("replay: a loop whose kept logits take turns follows its mirror from its third step", "[replay][step]") {
  // GPT-2 1.5B in the PyTorch loop, 4 steps: each step makes its logits (412 MB) while the last
  // step's still live, so every step epoch begins with another base. Without step() (or with it,
  // before the mirror) the third and fourth steps hold what the second reached online, 1.42% above
  // what they request. With step() the second step is planned as itself and as its mirror
  // (vmm.md, "Steps"): the third follows the mirror, the fourth the second's own plan, with no
  // call and within 0.5% of their peak requested.
  const trace::Trace t = generated("model:gpt2-xl,framework:pytorch,micro_batch:4,steps:4");
  const ReplayResult online = run(t, "tensorpool-vmm").total;
  SECTION("step() at the start of each step, the first after the weights are made") {
    const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
    REQUIRE(called.per_iteration.size() == 4);
    const auto [online_calls, online_syncs, online_ratio] = from_third(online);
    const auto [calls, syncs, ratio] = from_third(called);
    REQUIRE(online_ratio > 1.005);
    REQUIRE(calls == 0);
    REQUIRE(syncs == 0);
    REQUIRE(ratio <= 1.005);
    REQUIRE(called.peak_reserved <= online.peak_reserved);
  }
  SECTION("step() at the end of each step, as step_after_optimizer() calls it") {
    // Without the first marker, the program's first step() ends its first step: at the
    // program's first boundary every epoch has gone over a whole step, so the second is planned.
    trace::Trace at_end = t;
    const auto first = std::find_if(at_end.events.begin(), at_end.events.end(),
                                    [](const TraceEvent& e) { return e.op == Op::iteration; });
    REQUIRE(first != at_end.events.end());
    at_end.events.erase(first);
    const ReplayResult called = run(at_end, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
    REQUIRE(called.per_iteration.size() == 3);  // steps 2 to 4: the third and fourth from [1]
    ReplayResult from_second = called;
    from_second.per_iteration.insert(from_second.per_iteration.begin(), IterationResult{});
    const auto [calls, syncs, ratio] = from_third(from_second);
    REQUIRE(calls == 0);
    REQUIRE(syncs == 0);
    REQUIRE(ratio <= 1.005);
  }
}

namespace {

// The CS336 Transformer LM with its hand-written AdamW, as the shared traces' runs write it; the
// shape, steps and batch follow.
const std::string kCs336Train =
    "framework:pytorch,mlp:gated,norm:rmsnorm,biases:false,tied_embeddings:false,positions:0,"
    "vocab:10000,attention:eager,loss:written,activation:written,qkv:separate,optimizer_impl:handwritten,";

// The CS336 Transformer LM at its medium shape (24 x 1024) with its hand-written AdamW, 4 steps
// at `shape` (precision, batch, lengths), replayed against tensorpool-vmm online and with step()
// at each iteration.
std::pair<ReplayResult, ReplayResult> cs336_medium_loop(const std::string& shape) {
  const trace::Trace t = generated(kCs336Train + "layers:24,hidden:1024,heads:16,kv_heads:16,ffn:4096,steps:4," + shape);
  ReplayResult online = run(t, "tensorpool-vmm").total;
  ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  REQUIRE(called.per_iteration.size() == 4);
  return {std::move(online), std::move(called)};
}

}  // namespace

TEST_CASE("replay: a loop whose optimizer makes its states anew follows its predictions from its second step",
          "[replay][step]") {
  // The CS336 Transformer LM (24 x 1024, autocast bf16, 8 x 512, 4 steps) with its hand-written
  // AdamW: every step makes each state anew while the old one lives, so no step begins with the
  // base of the step before and no mirror pairs (each new state is made in the place the one
  // before it left). Online, the third and fourth steps hold what the second reached, 1.87% above
  // what they request. With step() the first step (which makes each state as zeros, then anew) is
  // planned as the prediction of the second, without the zeros (step_turns.hpp,
  // predicted_after_creation()), and each step after it as its prediction, around the base the
  // next one will have (vmm.md, "Steps"): the second step follows its plan with under a quarter
  // of the calls it makes online (28 against 208), what its plan (made around the states the
  // first step left online) reaches above the next is given back at the second boundary, and
  // the third and fourth steps hold their live peak within 0.1%, with no call.
  const auto [online, called] = cs336_medium_loop("precision:autocast-bf16,micro_batch:8,seq:512,context:512");
  const auto [online_calls, online_syncs, online_ratio] = from_third(online);
  REQUIRE(online_ratio > 1.005);
  REQUIRE(called.per_iteration[1].upstream.total() * 4 < online.per_iteration[1].upstream.total());
  REQUIRE(called.per_iteration[1].peak_reserved < online.per_iteration[1].peak_reserved);
  check_quiet_from_third(called, 1.001);
  REQUIRE(called.peak_reserved <= online.peak_reserved);
}

TEST_CASE("replay: a prediction above the pages the heap holds is followed and its step maps the rest",
          "[replay][step]") {
  // The same model in fp32 at context 1024, 4 x 1024: the second step's prediction, made from the
  // first step's record around the base it left, reaches above the pages the heap holds (the
  // first step's). Followed, the second step maps the rest as it reaches it; not followed (as a
  // mirror is not), it ran online from that base and grew higher (online throughout, the steps
  // from the third hold 1.61% above what they request, with 20 calls). The third and fourth
  // steps hold theirs within 0.5%.
  const auto [online, called] = cs336_medium_loop("precision:fp32,micro_batch:4,seq:1024,context:1024");
  const auto [online_calls, online_syncs, online_ratio] = from_third(online);
  const auto [calls, syncs, ratio] = from_third(called);
  REQUIRE(called.per_iteration[1].peak_reserved > called.per_iteration[0].peak_reserved);
  REQUIRE(syncs == 0);
  REQUIRE(calls < online_calls);
  REQUIRE(ratio < online_ratio);
  REQUIRE(ratio <= 1.005);
}

TEST_CASE("replay: a chain of predictions gives back what its first plan reached above the later ones",
          "[replay][step]") {
  // The same model in fp32, 8 x 1024, 5 steps. The first prediction (the second step's) is planned
  // around the base the first step left online (its states wherever they came) and reaches 0.92%
  // above what the step requests, 498 MiB above what the later steps hold: their plans are each
  // made around a base the last plan left with its new states placed as low as they go
  // (layout_plan.hpp, RecordedBlock::kept). Once the second step has followed the first, the
  // pages above the later plans go: the third and fourth steps hold their live peak within
  // 0.05%, with no call and no synchronization. The fifth holds it within 0.05% too, after one
  // growth: each plan of the chain is made around another base, and the fifth step's reaches
  // 6 MiB above the others.
  const trace::Trace t = generated(kCs336Train +
                                   "layers:24,hidden:1024,heads:16,kv_heads:16,ffn:4096,steps:5,precision:fp32,"
                                   "micro_batch:8,seq:1024,context:1024");
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  REQUIRE(called.per_iteration.size() == 5);
  const IterationResult& second = called.per_iteration[1];
  REQUIRE(second.peak_reserved > second.peak_requested + second.peak_requested / 200);
  for (std::size_t i = 2; i < 5; ++i) {
    INFO("step " << i + 1);
    const IterationResult& step = called.per_iteration[i];
    if (i < 4) REQUIRE(step.upstream.total() == 0);
    REQUIRE(step.upstream.syncs == 0);
    REQUIRE(step.peak_reserved <= step.peak_requested + step.peak_requested / 2000);
  }
}

namespace {

// The CS336 Transformer LM at its small shape (12 x 768) with its hand-written AdamW, `steps`
// steps at `shape`, replayed against tensorpool-vmm with step() at each iteration or without.
ReplayResult cs336_small_loop(const std::string& shape, bool with_steps) {
  const trace::Trace t = generated(kCs336Train + "layers:12,hidden:768,heads:12,kv_heads:12,ffn:3072," + shape);
  return run(t, "tensorpool-vmm", 80 * GiB, "", with_steps ? Steps::at_iterations : Steps::none).total;
}

}  // namespace

TEST_CASE("replay: a prediction is followed above the pages an online step held and over its holes",
          "[replay][step]") {
  SECTION("above where the step before reached") {
    // fp32, 8 x 256, 4 steps: the first step runs online; the second step's prediction, around
    // the base it left, reaches above where it reached. Followed, the second step maps the rest as
    // it reaches it; the third and fourth hold their live peak within 0.5%, with no call (4,628 MiB
    // against 4,752 without step(): 1.0283 of what they request).
    const ReplayResult called = cs336_small_loop("precision:fp32,micro_batch:8,seq:256,context:256,steps:4", true);
    const ReplayResult online = cs336_small_loop("precision:fp32,micro_batch:8,seq:256,context:256,steps:4", false);
    REQUIRE(called.per_iteration.size() == 4);
    const IterationResult& third = called.per_iteration[2];
    REQUIRE(third.peak_reserved < online.per_iteration[2].peak_reserved);
    REQUIRE(third.upstream.syncs == 0);
    REQUIRE(third.upstream.total() == 0);
    REQUIRE(third.peak_reserved <= third.peak_requested + third.peak_requested / 200);
    REQUIRE(called.per_iteration[3].upstream.total() == 0);
    REQUIRE(called.per_iteration[3].peak_reserved <= third.peak_requested + third.peak_requested / 200);
  }
  SECTION("over the holes the online steps' remaps left under the base") {
    // Autocast, 4 x 1024, 5 steps: the first step runs online and remaps idle pages to grow (2
    // synchronizations), leaving holes under its base larger than a growth step and than the
    // pages above the plan. The second step's prediction's pages are laid out anyway (those above
    // moved into the holes, the rest created); refused, every step ran online, remapping again
    // (1.0328 of what it requested from the third step, with 2 synchronizations). The third and
    // fourth steps hold their live peak within 0.05%, with no call; the fifth within 0.5%, after
    // one growth (its plan, around the base the fourth left, reaches 30 MiB above the others).
    const ReplayResult called =
        cs336_small_loop("precision:autocast-bf16,micro_batch:4,seq:1024,context:1024,steps:5", true);
    REQUIRE(called.per_iteration.size() == 5);
    const auto [calls, syncs, ratio] = from_third(called);
    REQUIRE(syncs == 0);
    REQUIRE(ratio <= 1.005);
    for (std::size_t i = 2; i < 4; ++i) {
      INFO("step " << i + 1);
      const IterationResult& step = called.per_iteration[i];
      REQUIRE(step.upstream.total() == 0);
      REQUIRE(step.peak_reserved <= step.peak_requested + step.peak_requested / 2000);
    }
  }
}

TEST_CASE("replay: two turns of unequal height keep the higher one's pages", "[replay][step]") {
  // GPT-2 small in the PyTorch loop, 16 steps, step() at each: the second step is planned as
  // itself and as its mirror, and the mirror (the live peak's blocks placed first) is the lower
  // of the two turns. The third step follows it; were its pages laid out only to its own height,
  // the pages above would go, and the fourth step (the other turn) would map them again with a
  // synchronization (48 calls and one before the turns' pages were laid out to the higher one).
  const trace::Trace t = generated("model:gpt2,framework:pytorch,micro_batch:8,seq:512,steps:16");
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  REQUIRE(called.per_iteration.size() == 16);
  check_quiet_from_third(called, 1.005);
}

TEST_CASE("replay: forward passes that keep their logits over step() hold their live peak from the third step",
          "[replay][step]") {
  // A 12-layer model's forward passes under autocast (bf16 weight copies alive for the whole
  // pass), each keeping its logits into the next: 4 steps with step() at each. The turns planned
  // with the live peak's blocks first hold 908 MiB from the third step for 902 requested (1.0063);
  // the other candidates' plans held 1.044 of it.
  const trace::Trace t = generated(
      "model:custom,layers:12,hidden:768,heads:12,kv_heads:12,ffn:3072,vocab:10000,mlp:gated,norm:rmsnorm,"
      "biases:false,tied_embeddings:false,positions:0,context:512,framework:pytorch,mode:forward,"
      "precision:autocast-bf16,attention:eager,micro_batch:4,seq:512,steps:4");
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  REQUIRE(called.per_iteration.size() == 4);
  check_quiet_from_third(called, 1.01);
}

TEST_CASE("replay: a loop whose first step left a small hole under its base trades the pages above its plan for it",
          "[replay][step]") {
  // GPT-2 1.5B in the PyTorch loop with full activation checkpointing, 5 steps. Its first step
  // remaps an idle chunk (one synchronization) and leaves a hole of 28 MiB under the base, with
  // 256 MiB of chunks above the height of the second step's plans: map_plan() does not map holes
  // under a base while chunks lie above, so without the trade the steps ran online, 1.72% above
  // what they request from the third on. The hole is less than a growth step and than the chunks
  // above: at the second boundary those chunks are released and the hole mapped (in step()), and
  // the steps follow their plans with no call (vmm.md, "Steps").
  const trace::Trace t = generated("model:gpt2-xl,framework:pytorch,micro_batch:4,checkpointing:full,steps:5");
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  REQUIRE(called.per_iteration.size() == 5);
  check_quiet_from_third(called, 1.006);
  const ReplayResult online = run(t, "tensorpool-vmm").total;
  CHECK(std::get<2>(from_third(online)) > 1.015);
  CHECK(called.peak_reserved <= online.peak_reserved);
  // With growth steps of 1/4096 of the pool (about 7.5 MiB here) the hole is more than a growth
  // step: it is left, and the steps run online, with calls.
  const ReplayResult small_steps =
      run(t, "tensorpool-vmm", 80 * GiB, "vmm_growth_divisor:4096", Steps::at_iterations).total;
  const auto [small_calls, small_syncs, small_ratio] = from_third(small_steps);
  CHECK(small_calls + small_syncs > 0);
  CHECK(small_ratio > 1.015);
}

TEST_CASE("replay: a loop whose step remapped idle pages trades the pages above its plan for larger holes, moving them",
          "[replay][step]") {
  // GPT-2 small in the PyTorch loop, 8 x 1024, 6 steps. The second step's logits (1.6 GB) find no
  // free place: its growth remaps 1.6 GB of idle pages (one synchronization) and leaves a hole of
  // 784 MiB under the next base, more than a growth step (82 MiB), with as much mapped above the
  // plan's height. Left, the steps ran online: the third and fourth quietly, the fifth remapped
  // again (64 calls, one synchronization, 0.68% above the requested peak). A step that remapped
  // would remap again online, so the hole is traded in step(): the chunks above are unmapped and
  // mapped into it (two calls each, no new memory; what does not fit is released), and the steps
  // follow their plans, in turn, with no call.
  const trace::Trace t = generated("model:gpt2,framework:pytorch,micro_batch:8,steps:6");
  const ReplayResult online = run(t, "tensorpool-vmm").total;
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  REQUIRE(called.per_iteration.size() == 6);
  check_quiet_from_third(called, 1.005);
  CHECK(called.peak_reserved <= online.peak_reserved);
  const auto [online_calls, online_syncs, online_ratio] = from_third(online);
  CHECK(online_calls + online_syncs > 0);
  // The trade in the second step's step() moves the chunks above: it releases at most the chunk
  // cut at the plan's height and one the holes left over (released and created again: 14 frees).
  CHECK(called.per_iteration[1].upstream.frees <= 2);
}

TEST_CASE("replay: a whole run laid out on its plan gives back the chunks the layout left over", "[replay]") {
  // The checkpointing loop above, replayed twice (--warmup 1), no step(). Its first step remaps
  // an idle chunk and leaves a hole below the whole run's plan (30,100 MiB high) with chunks above
  // it, so at the end of the warm-up pass the plan is laid out: every chunk unmapped, and the
  // plan's height mapped again from the heap's start. The 450 MiB that are not needed stayed
  // cached, reserved, for good (0.9846 of the requested peak held in the measured pass). They are
  // released with the give-back of the pages above the plan (give_back_cached()).
  const trace::Trace t = generated("model:gpt2-xl,framework:pytorch,micro_batch:4,checkpointing:full,steps:5");
  const ReplayResult r = measured_pass(t, "tensorpool-vmm", 1);
  CHECK(r.upstream.total() == 0);
  CHECK(r.utilization >= 0.999);
}

TEST_CASE("replay: a warm pass with step() at its iterations settles on its plans", "[replay][step]") {
  // The warm pass frees what the window left live: the heap empties inside a step epoch, and the
  // measured pass runs from an empty heap again, as a program that builds its model anew. Two
  // Megatron-LM loops of GPT-2 small with ZeRO-3 over 8 ranks and 2 iterations: with full
  // recomputation (before, the emptying step's own plan was chosen for the next epoch and the
  // pages above it given back: 147 calls and 3 synchronizations in the measured pass), and with
  // 8 experts (top-2, the busiest 1.5x the mean) and no recomputation, whose steps ran online on
  // holes under their base that a layout to the first epoch's height left (548 calls and 3
  // synchronizations; 1,354 and 5 before both changes).
  const std::string gpt2 =
      "layers:12,hidden:768,heads:12,kv_heads:12,ffn:3072,vocab:50257,mlp:gelu,norm:layernorm,biases:true,"
      "dropout:true,tied_embeddings:true,positions:1024,context:1024,zero:3,dp:8,steps:2";
  for (const std::string& shape : {gpt2 + ",checkpointing:full,micro_batch:4,global_batch:64",
                                   gpt2 + ",experts:8,top_k:2,moe_imbalance:1.5,micro_batch:8,global_batch:128"}) {
    INFO(shape);
    const ReplayResult r = measured_pass(generated(shape), "tensorpool-vmm", 1, Steps::at_iterations);
    REQUIRE(r.per_iteration.size() == 2);
    for (const auto& it : r.per_iteration) CHECK(it.upstream.total() == 0);
    CHECK(r.upstream.syncs == 0);
    CHECK(r.upstream.allocs == 0);
    CHECK(r.utilization >= 0.98);
  }
}

TEST_CASE("replay: a server rebuilt after its heap empties runs, with step() per decode step, as it does without",
          "[replay][step]") {
  // Servers with a paged KV cache, step() at each decode step, after a warm pass that frees the
  // model (the heap empties at a step). Their decode steps are each like none before them, so
  // few are planned; the steps' records joined from the empty heap to the step that empties it
  // are planned as one epoch, which the measured pass follows over its boundaries (RunRecord),
  // as the whole pass is one epoch without step(). Before: GPT-2 small (16 requests, batches of
  // 4) gave the pages above two early steps' plans back and grew again, 12 calls in the measured
  // pass (then, with Heap::run_floor, none); Llama 2 7B (the same requests) held what its warm
  // pass reached online, 0.9926 of its requested peak against 0.9998 without step().
  for (const std::string model : {"gpt2", "llama2-7b"}) {
    INFO(model);
    const trace::Trace t = generated("model:" + model + ",mode:inference,requests:16,max_batch:4");
    const ReplayResult pytorch = measured_pass(t, "pytorch", 1);
    const ReplayResult without = measured_pass(t, "tensorpool-vmm", 1);
    const ReplayResult with = measured_pass(t, "tensorpool-vmm", 1, Steps::at_iterations);
    REQUIRE(with.per_iteration.size() > 100);
    REQUIRE(pytorch.upstream.total() == 0);
    REQUIRE(without.upstream.total() == 0);
    CHECK(with.upstream.total() == 0);
    CHECK(with.peak_reserved == without.peak_reserved);
    CHECK(with.utilization >= pytorch.utilization);
  }
}

TEST_CASE("replay: a server whose KV cache grows by concatenation settles, with step() per decode step",
          "[replay][step]") {
  // Llama 2 7B's attention in 4 layers, 16 requests, batches of 4, a DynamicCache KV cache
  // (kv:concat): every decode step replaces each layer's key and value by a tensor one token
  // longer, so sizes never repeat. Decode steps that repeat in a pool (the small pool's
  // temporaries once no request's tensors are under 1 MiB) follow a plan, and the pages above it
  // are given back (in both pools here, in the first warm pass); a later step creates what it
  // needs again, once: from then on the heap keeps its pages (Heap::keeps_pages). So from the
  // second warm pass on, step() costs no call and holds what the run without step() does.
  const trace::Trace t = generated("model:llama2-7b,layers:4,mode:inference,requests:16,max_batch:4,kv:concat");
  const ReplayResult pytorch = measured_pass(t, "pytorch", 2);
  const ReplayResult without = measured_pass(t, "tensorpool-vmm", 2);
  const ReplayResult with = measured_pass(t, "tensorpool-vmm", 2, Steps::at_iterations);
  REQUIRE(with.per_iteration.size() > 100);
  REQUIRE(pytorch.upstream.total() == 0);
  CHECK(without.upstream.total() == 0);
  CHECK(with.upstream.total() == 0);
  CHECK(with.upstream.syncs == 0);
  CHECK(with.peak_reserved <= without.peak_reserved);
  CHECK(with.utilization > pytorch.utilization);
}

TEST_CASE("replay: steps that follow no plan run as the loop does without step()", "[replay][step]") {
  // GPT-2 small, forward passes of 16 x 1024 under no_grad, 12 steps: each step's logits are kept
  // until the next step has made its own, so the base moves every step and no plan is followed.
  // Such steps ran from held pages (a growth replayed from an empty heap), which put the 3 GiB of
  // logits and activations elsewhere than the free index does: 4.11 GiB held and 531 calls from
  // the third step, against 3.95 GiB and 164 calls online.
  const trace::Trace t = generated("model:gpt2,framework:pytorch,mode:forward,micro_batch:16,seq:1024,steps:12");
  const auto calls_from_third = [](const ReplayResult& r) {
    std::uint64_t calls = 0;
    for (std::size_t i = 2; i < r.per_iteration.size(); ++i) calls += r.per_iteration[i].upstream.total();
    return calls;
  };
  const ReplayResult online = run(t, "tensorpool-vmm").total;
  const ReplayResult called = run(t, "tensorpool-vmm", 80 * GiB, "", Steps::at_iterations).total;
  const ReplayResult found = run(t, "tensorpool-vmm", 80 * GiB, "vmm_find_steps:true").total;
  REQUIRE(online.per_iteration.size() == 12);
  for (const ReplayResult* r : {&called, &found}) {
    REQUIRE(r->peak_reserved <= online.peak_reserved);
    REQUIRE(calls_from_third(*r) <= calls_from_third(online));
    REQUIRE(r->upstream.syncs <= online.upstream.syncs);
  }
}

TEST_CASE("replay: --device-lag runs tensorpool's device behind the host", "[replay][plan]") {
  // tptest::plan_that_moves_pages(): at once, the plan's pages move at the end of the first
  // epoch. With a device that completes its work only every 1000 allocations, the event recorded
  // there is still running at the next epoch's first request, which synchronizes the stream once
  // and lays the pages out. Either way every later epoch holds the plan's 100 MiB and makes no call.
  const trace::Trace t = tptest::plan_that_moves_pages();
  const auto replayed = [&](std::size_t lag) {
    TraceSource source(t);
    ReplayOptions o;
    o.allocator = "tensorpool-vmm";
    o.target.conf = "vmm_idle_divisor:1";  // no idle remapping: only the plan moves pages
    o.target.device_lag = lag;
    return tensorpool::replay::replay(source, o).total;
  };
  const ReplayResult at_once = replayed(0);
  const ReplayResult lagging = replayed(1000);
  REQUIRE(lagging.per_iteration.size() == 6);
  REQUIRE(lagging.per_iteration[1].upstream.syncs == 1);  // the layout, at the second epoch's first request
  REQUIRE(at_once.per_iteration[1].upstream.syncs == 0);
  for (std::size_t i = 1; i < 6; ++i) {
    INFO("epoch " << i);
    REQUIRE(lagging.per_iteration[i].peak_reserved == 100 * MiB);
    REQUIRE(at_once.per_iteration[i].peak_reserved == 100 * MiB);
    REQUIRE(at_once.per_iteration[i].upstream.total() == 0);
    if (i >= 2) REQUIRE(lagging.per_iteration[i].upstream.total() + lagging.per_iteration[i].upstream.syncs == 0);
  }
}

TEST_CASE("replay: on a device behind the host, a step whose plan needs pages moved into holes follows it after one wait",
          "[replay][step]") {
  // GPT-2 small in the PyTorch loop, 8 x 1024, 6 steps, step() at each. The second step remaps
  // idle pages online for the loss's upcast, leaving holes under the base; the third step's plan
  // trades the pages above its height for them. With the device 64 allocations behind, that
  // trade waits for the stream's work: it is made at the third step's first request (one
  // synchronization), and every later step follows its plan. Refused instead, the steps ran
  // online, and the fifth remapped idle pages again (64 calls and a synchronization).
  const trace::Trace t = generated("model:gpt2,framework:pytorch,micro_batch:8,steps:6");
  const auto replayed = [&](std::size_t lag) {
    TraceSource source(t);
    ReplayOptions o;
    o.allocator = "tensorpool-vmm";
    o.step_at_iterations = true;
    o.target.device_lag = lag;
    return tensorpool::replay::replay(source, o).total;
  };
  const ReplayResult lagging = replayed(64);
  const ReplayResult at_once = replayed(0);
  REQUIRE(lagging.per_iteration.size() == 6);
  REQUIRE(at_once.per_iteration.size() == 6);
  CHECK(lagging.per_iteration[2].upstream.syncs <= 1);  // the trade's wait, at most
  for (std::size_t i = 3; i < 6; ++i) {
    INFO("step " << i + 1);
    CHECK(lagging.per_iteration[i].upstream.total() == 0);
    CHECK(lagging.per_iteration[i].upstream.syncs == 0);
    CHECK(lagging.per_iteration[i].peak_reserved == at_once.per_iteration[i].peak_reserved);
  }
}

TEST_CASE("replay: per iteration, the calls made and the peaks from one marker to the next", "[replay]") {
  // A block before the first marker (in no iteration), then iterations of 1, 2 and 3 blocks of
  // 4 MiB, each freed within its iteration; raw makes one allocation and one free per block.
  trace::Trace t;
  t.events = {ev(Op::alloc, 1, 2 * MiB)};
  std::uint64_t addr = 10;
  for (std::uint64_t it = 0; it < 3; ++it) {
    t.events.push_back(ev(Op::iteration, 0, it));
    for (std::uint64_t k = 0; k <= it; ++k) t.events.push_back(ev(Op::alloc, addr + k, 4 * MiB));
    for (std::uint64_t k = 0; k <= it; ++k) t.events.push_back(ev(Op::free_requested, addr + k, 4 * MiB));
    addr += 10;
  }
  const ReplayResult r = run(t, "raw").total;
  REQUIRE(r.iterations == 3);
  REQUIRE(r.per_iteration.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("iteration " << i);
    const std::size_t blocks = i + 1;
    REQUIRE(r.per_iteration[i].upstream.allocs == blocks);
    REQUIRE(r.per_iteration[i].upstream.frees == blocks);
    REQUIRE(r.per_iteration[i].peak_requested == 2 * MiB + blocks * 4 * MiB);  // the first block stays
    REQUIRE(r.per_iteration[i].peak_reserved == 2 * MiB + blocks * 4 * MiB);
  }
  // The iterations' calls are the pass's but the first block's allocation.
  REQUIRE(r.upstream.allocs == 1 + 1 + 2 + 3);
  // With a warm-up, the measured pass's iterations only.
  ReplayOptions o;
  o.allocator = "raw";
  o.warmup = 1;
  TraceSource source(t);
  REQUIRE(tensorpool::replay::replay(source, o).total.per_iteration.size() == 3);
  // No markers: no iterations.
  trace::Trace plain;
  plain.events = {ev(Op::alloc, 1, MiB), ev(Op::free_requested, 1, MiB)};
  REQUIRE(run(plain, "raw").total.per_iteration.empty());
}

TEST_CASE("replay counts OOMs against the capacity and skips their frees", "[replay]") {
  trace::Trace t;
  t.events = {ev(Op::alloc, 1, 60 * MiB), ev(Op::alloc, 2, 60 * MiB), ev(Op::free_requested, 2, 60 * MiB),
              ev(Op::free_requested, 1, 60 * MiB)};
  for (const char* a : {"tensorpool", "raw"}) {
    const ReplayResult r = run(t, a, 100 * MiB).total;
    INFO(a);
    REQUIRE(r.ooms == 1);
    REQUIRE(r.frees == 1);
    REQUIRE(r.unmatched_frees == 0);
    REQUIRE(r.peak_requested == 60 * MiB);
  }
}

TEST_CASE("the first OOM is explained by every target, in the trace's terms", "[replay][oom]") {
  // Live blocks pin free memory in their segments on two streams (a small block on stream 5, a
  // 4 MiB block in a 20 MiB segment on stream 0), then a request that fits neither the cache nor
  // the device.
  trace::Trace t;
  t.labels.push_back("big_tensor");
  t.events = {ev(Op::alloc, 1, 30 * MiB), ev(Op::alloc, 2, 1024, 5), ev(Op::alloc, 3, 4 * MiB),
              ev(Op::alloc, 4, 90 * MiB), ev(Op::alloc, 5, 95 * MiB), ev(Op::free_requested, 3, 4 * MiB),
              ev(Op::free_requested, 2, 1024), ev(Op::free_requested, 1, 30 * MiB)};
  t.events[3].label = 1;
  t.events[3].time_us = 1234;
  for (const auto& name : target_names()) {
    INFO(name);
    const ReplayReport report = run(t, name, 100 * MiB);
    const ReplayResult& r = report.total;
    REQUIRE(r.ooms >= 1);
    REQUIRE(r.first_oom.has_value());
    const OomReport& o = *r.first_oom;
    REQUIRE(o.event == 3);  // the 90 MiB request: the first one refused
    REQUIRE(o.addr == 4);
    REQUIRE(o.label == 1);
    REQUIRE(o.time_us == 1234);
    REQUIRE(o.info.requested == 90 * MiB);
    REQUIRE(o.info.capacity == 100 * MiB);
    REQUIRE(o.info.allocated >= 34 * MiB);
    REQUIRE(o.info.reserved >= o.info.allocated);
    REQUIRE(o.info.reserved + o.info.device_free <= 100 * MiB);
    REQUIRE(o.info.reserved_unallocated == o.info.reserved - o.info.allocated);
    std::size_t cached = 0;
    tensorpool::Stream previous = 0;
    for (const auto& c : o.info.cached_per_stream) {
      REQUIRE(c.bytes > 0);
      REQUIRE((cached == 0 || c.stream > previous));  // ascending, one entry per stream
      REQUIRE((c.stream == 0 || c.stream == 5));      // the trace's stream ids
      previous = c.stream;
      cached += c.bytes;
    }
    REQUIRE(cached <= o.info.reserved_unallocated);
    REQUIRE(o.info.largest_free_block <= o.info.reserved_unallocated);
    // RMM's arena keeps its global free space outside any stream's arena; everywhere else every
    // free block is cached on some stream.
    if (name != "rmm-arena") REQUIRE(o.info.largest_free_block <= cached);
    REQUIRE(report.devices.size() == 1);
    REQUIRE(report.devices[0].first_oom.has_value());
  }
  // The real allocator's cache at that moment is exactly its reserved-but-unallocated bytes (its
  // ladder returned every free segment first), on the two streams whose segments pin them.
  const ReplayResult tp = run(t, "tensorpool", 100 * MiB).total;
  std::size_t cached = 0;
  for (const auto& c : tp.first_oom->info.cached_per_stream) cached += c.bytes;
  REQUIRE(cached == tp.first_oom->info.reserved_unallocated);
  REQUIRE(tp.first_oom->info.cached_per_stream.size() == 2);
  // No OOM, no report.
  REQUIRE_FALSE(run(t, "tensorpool", 1 * GiB).total.first_oom.has_value());
}

TEST_CASE("OnOom::stop ends the measured pass at its first OOM, the one a replay that goes on finds", "[replay][oom]") {
  // Two requests refused on 100 MiB (events 1 and 2), then a block that fits, on another stream.
  trace::Trace t;
  t.events = {ev(Op::alloc, 1, 60 * MiB), ev(Op::alloc, 2, 60 * MiB), ev(Op::alloc, 3, 70 * MiB),
              ev(Op::free_requested, 1, 60 * MiB), ev(Op::alloc, 4, 30 * MiB, 7), ev(Op::free_requested, 4, 30 * MiB)};
  const auto replay_with = [&](const std::string& allocator, OnOom on_oom, int warmup, std::uint64_t* read = nullptr) {
    TraceSource source(t);
    ReplayOptions o;
    o.allocator = allocator;
    o.target.capacity = 100 * MiB;
    o.warmup = warmup;
    o.on_oom = on_oom;
    o.progress_every = 1;
    if (read != nullptr) o.progress = [read](std::uint64_t n) { *read = n; };
    return tensorpool::replay::replay(source, o).total;
  };
  for (const auto& name : target_names()) {
    INFO(name);
    const ReplayResult all = replay_with(name, OnOom::go_on, 0);
    const ReplayResult cut = replay_with(name, OnOom::stop, 0);
    REQUIRE(all.ooms >= 2);  // rmm-arena's arena (half the device) refuses the first too
    REQUIRE_FALSE(all.stopped_at_first_oom);
    REQUIRE(cut.ooms == 1);
    REQUIRE(cut.stopped_at_first_oom);
    REQUIRE(cut.first_oom.has_value());
    REQUIRE(all.first_oom.has_value());
    REQUIRE(cut.allocs == cut.first_oom->event + 1);  // nothing after the refused request
    REQUIRE(cut.events == cut.first_oom->event + 1);
    REQUIRE(cut.events < all.events);
    REQUIRE(cut.peak_requested <= all.peak_requested);  // rmm-pool fits only the last block
    CHECK(cut.first_oom->event == all.first_oom->event);
    CHECK(cut.first_oom->info.requested == all.first_oom->info.requested);
    CHECK(cut.first_oom->info.reserved == all.first_oom->info.reserved);
    CHECK(cut.first_oom->info.device_free == all.first_oom->info.device_free);
    // A warm-up pass goes on past its OOMs (they do not count): the whole first pass is read,
    // then the measured one up to its first OOM.
    std::uint64_t read = 0;
    const ReplayResult warm = replay_with(name, OnOom::stop, 1, &read);
    REQUIRE(warm.stopped_at_first_oom);
    REQUIRE(warm.ooms == 1);
    CHECK(read == t.events.size() + warm.events);
  }
  // Fits: nothing to stop.
  const ReplayResult fits = run(t, "tensorpool", GiB).total;
  REQUIRE(fits.ooms == 0);
  REQUIRE_FALSE(fits.stopped_at_first_oom);
}

TEST_CASE("seed events come before the window and are not counted as its upstream calls", "[replay]") {
  trace::Trace t;
  t.events = {ev(Op::seed_segment, 0x100000, 20 * MiB), ev(Op::seed_alloc, 0x100000, 5 * MiB),
              ev(Op::alloc, 0x200000, 5 * MiB), ev(Op::free_requested, 0x100000, 5 * MiB)};
  const ReplayResult r = run(t, "tensorpool").total;
  REQUIRE(r.allocs == 2);
  REQUIRE(r.peak_requested == 10 * MiB);
  REQUIRE(r.upstream.allocs == 0);  // the seed's segment serves the window's allocation
  REQUIRE(r.peak_reserved == 20 * MiB);
  REQUIRE(r.seeding.allocs == 1);  // ... and its creation is counted as building the start state
  REQUIRE(r.seeding.total() == 1);
}

TEST_CASE("each warm-up pass starts from the window's starting state", "[replay]") {
  // A window that begins with a live block A (a seed), frees it, and ends with C allocated and
  // live: the next pass's seed A stands for C, so C is freed when the pass ends (with every other
  // live block). Carried over, C would be live beside A and X, and the measured pass would ask
  // for 60 MiB where the window asks for 30.
  trace::Trace t;
  t.events = {ev(Op::seed_alloc, 0x100000, 10 * MiB), ev(Op::alloc, 0x200000, 20 * MiB),
              ev(Op::free_requested, 0x200000, 20 * MiB), ev(Op::free_requested, 0x100000, 10 * MiB),
              ev(Op::alloc, 0x300000, 30 * MiB)};
  for (const char* allocator : {"tensorpool", "tensorpool-vmm", "pytorch", "raw"}) {
    INFO(allocator);
    const ReplayResult cold = run(t, allocator).total;
    REQUIRE(cold.peak_requested == 30 * MiB);
    for (int warmup : {1, 3}) {
      TraceSource source(t);
      ReplayOptions o;
      o.allocator = allocator;
      o.warmup = warmup;
      const ReplayResult warm = tensorpool::replay::replay(source, o).total;
      REQUIRE(warm.peak_requested == cold.peak_requested);
      REQUIRE(warm.allocs == cold.allocs);
      REQUIRE(warm.frees == cold.frees);
      REQUIRE(warm.unmatched_frees == 0);
      if (std::string(allocator) == "raw") continue;  // no cache: every pass calls the device
      REQUIRE(warm.upstream.total() == 0);  // the cache of the first pass serves the window again
      REQUIRE(warm.peak_reserved <= cold.peak_reserved);
    }
  }
}

TEST_CASE("seeding counts the calls that built the window's start state, for every target", "[replay]") {
  trace::Trace t;
  t.events = {ev(Op::seed_segment, 0x100000, 20 * MiB), ev(Op::seed_segment, 0x2000000, 20 * MiB),
              ev(Op::seed_alloc, 0x100000, 5 * MiB), ev(Op::seed_alloc, 0x2000000, 12 * MiB),
              ev(Op::alloc, 0x4000000, 64 * MiB), ev(Op::free_requested, 0x4000000, 64 * MiB)};
  // The PyTorch model adopts the two recorded segments (one cudaMalloc each, before the window)
  // and needs a third for the 64 MiB block.
  const ReplayResult pt = run(t, "pytorch").total;
  REQUIRE(pt.seeding.allocs == 2);
  REQUIRE(pt.upstream.allocs == 1);
  // tensorpool builds its own start state from the live blocks; its calls land in seeding.
  const ReplayResult tp = run(t, "tensorpool").total;
  REQUIRE(tp.seeding.allocs == 1);  // one 20 MiB segment holds both live blocks
  REQUIRE(tp.upstream.allocs == 1);
  const ReplayResult vmm = run(t, "tensorpool-vmm").total;
  REQUIRE(vmm.seeding.allocs >= 1);
  REQUIRE(vmm.seeding.maps == vmm.seeding.allocs);  // each new chunk is created and mapped once
  // A warm-up pass re-runs no seeds: the measured pass has no seeding of its own.
  TraceSource source(t);
  ReplayOptions o;
  o.allocator = "pytorch";
  o.warmup = 1;
  REQUIRE(tensorpool::replay::replay(source, o).total.seeding.total() == 0);
}

TEST_CASE("devices are replayed separately and summed", "[replay]") {
  trace::Trace t;
  t.events = {ev(Op::alloc, 1, 30 * MiB, 0, 0), ev(Op::alloc, 1, 40 * MiB, 0, 1),
              ev(Op::free_requested, 1, 30 * MiB, 0, 0), ev(Op::free_requested, 1, 40 * MiB, 0, 1)};
  const ReplayReport r = run(t, "raw");
  REQUIRE(r.devices.size() == 2);
  REQUIRE(r.devices[0].device == 0);
  REQUIRE(r.devices[0].peak_requested == 30 * MiB);
  REQUIRE(r.devices[1].peak_requested == 40 * MiB);
  REQUIRE(r.total.peak_requested == 70 * MiB);
  REQUIRE(r.total.device == -1);
  TraceSource source(t);
  ReplayOptions only1;
  only1.allocator = "raw";
  only1.device = 1;
  REQUIRE(tensorpool::replay::replay(source, only1).total.peak_requested == 40 * MiB);
}

TEST_CASE("baseline reads the recording allocator's segment events", "[replay]") {
  trace::Trace t;
  t.events = {ev(Op::seed_segment, 0x1, 20 * MiB), ev(Op::segment_alloc, 0x2, 2 * MiB),
              ev(Op::alloc, 0x2, 1000), ev(Op::segment_map, 0x3, 4 * MiB),
              ev(Op::segment_unmap, 0x3, 2 * MiB), ev(Op::segment_free, 0x1, 20 * MiB),
              ev(Op::oom, 0, 5 * GiB)};
  TraceSource source(t);
  const Baseline b = baseline(source).total;
  REQUIRE(b.present);
  REQUIRE(b.result.allocator == "pytorch-actual");
  REQUIRE(b.result.peak_reserved == 26 * MiB);
  REQUIRE(b.result.final_reserved == 4 * MiB);
  REQUIRE(b.result.upstream.allocs == 1);
  REQUIRE(b.result.seeding.allocs == 1);  // the segment held at window start
  REQUIRE(b.result.upstream.maps == 1);
  REQUIRE(b.result.upstream.unmaps == 1);
  REQUIRE(b.result.upstream.frees == 1);
  REQUIRE(b.result.ooms == 1);
  REQUIRE(b.result.peak_requested == 1000);

  trace::Trace none;
  none.events = {ev(Op::alloc, 1, 10)};
  TraceSource s2(none);
  REQUIRE_FALSE(baseline(s2).total.present);
}

TEST_CASE("unknown allocators and bad settings are errors", "[replay]") {
  const trace::Trace t = small_trace();
  REQUIRE_THROWS_WITH(run(t, "nope"), Catch::Matchers::Contains("unknown allocator 'nope'") &&
                                          Catch::Matchers::Contains("tensorpool"));
  REQUIRE_THROWS_AS(run(t, "tensorpool", 80 * GiB, "max_split_size:huge"), tensorpool::ConfigError);
  REQUIRE_THROWS_AS(run(t, "raw", 80 * GiB, "x:1"), tensorpool::ConfigError);
}

TEST_CASE("the registry describes every target and checks settings without building one", "[replay][registry]") {
  const auto& targets = target_descriptors();
  REQUIRE(targets.size() == target_names().size());
  for (std::size_t i = 0; i < targets.size(); ++i) {
    INFO(targets[i].name);
    CHECK(targets[i].name == target_names()[i]);
    CHECK_FALSE(targets[i].description.empty());
    CHECK(describe_target(targets[i].name).settings == targets[i].settings);
    CHECK(make_target(targets[i].name, {})->name() == targets[i].name);
    CHECK_NOTHROW(validate_target(targets[i].name, ""));
    for (const auto& key : targets[i].settings) CHECK(targets[i].takes(key));
    CHECK_FALSE(targets[i].takes("no_such_key"));
  }
  // The Config keys but `backend` (the per-device registry's choice of device; a replay always
  // runs on a simulated one), which validate_target refuses as an unknown key.
  std::vector<std::string> replay_keys = tensorpool::Config::keys();
  std::erase(replay_keys, "backend");
  REQUIRE(replay_keys.size() + 1 == tensorpool::Config::keys().size());
  CHECK(describe_target("tensorpool").settings == replay_keys);
  CHECK(describe_target("tensorpool-vmm").settings == replay_keys);
  REQUIRE_THROWS_WITH(validate_target("tensorpool", "mode:vmm,backend:vmm"),
                      Catch::Matchers::StartsWith("tensorpool conf: unknown key 'backend'"));
  CHECK(describe_target("raw").settings.empty());
  CHECK(describe_target("pytorch").takes("max_split_size_mb"));
  CHECK(describe_target("cub").takes("bin_growth"));
  CHECK(describe_target("rmm-pool").settings == std::vector<std::string>{"initial_pool_size", "maximum_pool_size"});
  CHECK(describe_target("rmm-arena").settings == std::vector<std::string>{"arena_size", "superblock_size"});
  // Only RMM's resources keep what they take from the device until they are destroyed.
  for (const auto& d : targets)
    CHECK(d.holds_memory_until_destroyed == (d.name == "rmm-pool" || d.name == "rmm-arena"));
  REQUIRE_THROWS_WITH(describe_target("nope"), Catch::Matchers::Contains("unknown allocator 'nope'") &&
                                                   Catch::Matchers::Contains("pytorch-expandable"));
  // validate_target reads the conf as the target would, naming the origin.
  CHECK_NOTHROW(validate_target("tensorpool-vmm", "vmm_max_chunk:64MiB"));
  REQUIRE_THROWS_WITH(validate_target("tensorpool", "max_split_size:huge"),
                      Catch::Matchers::StartsWith("tensorpool conf: bad value 'huge' for key 'max_split_size'"));
  REQUIRE_THROWS_WITH(validate_target("pytorch", "max_split_size:20MiB", "--conf for pytorch"),
                      Catch::Matchers::StartsWith("--conf for pytorch: max_split_size must be above 20 MiB"));
  REQUIRE_THROWS_WITH(validate_target("cub", "bin_growth:1"), Catch::Matchers::Contains("cub conf: bin_growth"));
  REQUIRE_THROWS_WITH(validate_target("raw", "x:1"), Catch::Matchers::Contains("raw conf: unknown key 'x'"));
  // The RMM models: what can be checked without a device (a size beyond it fails when built).
  CHECK_NOTHROW(validate_target("rmm-pool", "initial_pool_size:0,maximum_pool_size:none"));
  CHECK_NOTHROW(validate_target("rmm-arena", "arena_size:1000GiB"));
  REQUIRE_THROWS_WITH(validate_target("rmm-pool", "initial_pool_size:2GiB,maximum_pool_size:1GiB"),
                      Catch::Matchers::StartsWith("rmm-pool conf: initial_pool_size exceeds maximum_pool_size"));
  REQUIRE_THROWS_WITH(validate_target("rmm-pool", "initial_pool_size:none"),
                      Catch::Matchers::StartsWith("rmm-pool conf: bad value 'none' for key 'initial_pool_size'"));
  REQUIRE_THROWS_WITH(validate_target("rmm-arena", "superblock_size:1000", "--conf for rmm-arena"),
                      Catch::Matchers::StartsWith("--conf for rmm-arena: superblock_size must be"));
  REQUIRE_THROWS_AS(validate_target("pytorch", "expandable_segments:true"), tensorpool::ConfigError);
  REQUIRE_THROWS_AS(validate_target("pytorch-expandable", "expandable_segments:false"), tensorpool::ConfigError);
}

TEST_CASE("share_conf gives one settings list to the targets that take all of its keys", "[replay][registry]") {
  const std::vector<std::string> all = target_names();
  const auto confs = share_conf(all, "max_split_size:64MiB", "--conf");
  REQUIRE(confs.size() == all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    INFO(all[i]);
    CHECK(confs[i] == (describe_target(all[i]).takes("max_split_size") ? "max_split_size:64MiB" : ""));
  }
  CHECK(share_conf({"tensorpool", "pytorch"}, "mode:vmm") == std::vector<std::string>{"mode:vmm", ""});
  CHECK(share_conf({"cub", "raw"}, "") == std::vector<std::string>{"", ""});
  REQUIRE_THROWS_WITH(share_conf({"raw", "cub"}, "mode:vmm", "--conf"),
                      Catch::Matchers::StartsWith("--conf: unknown key 'mode' for raw, cub") &&
                          Catch::Matchers::Contains("cub: bin_growth"));
  // Each key taken by someone, but no target takes both: refused, not silently dropped.
  REQUIRE_THROWS_WITH(share_conf({"tensorpool", "cub"}, "mode:vmm,bin_growth:4"),
                      Catch::Matchers::Contains("no allocator of tensorpool, cub takes every key"));
  // A value refused by a target that takes the key names it.
  REQUIRE_THROWS_WITH(share_conf({"tensorpool", "pytorch"}, "max_split_size:20MiB", "--conf"),
                      Catch::Matchers::StartsWith("--conf for pytorch: max_split_size must be above 20 MiB"));
  REQUIRE_THROWS_AS(share_conf({"nope"}, ""), tensorpool::UsageError);
  REQUIRE_THROWS_WITH(share_conf({"tensorpool"}, "mode", "--conf"), Catch::Matchers::Contains("--conf: item 'mode'"));
}

TEST_CASE("trace::summarize's requested peak is the replay engine's", "[replay][summary]") {
  trace::Trace t = generated("layers:3,hidden:512,ffn:2048,vocab:4000,micro_batch:4,seq:2048,seq_dist:uniform,steps:3");
  for (auto e : std::vector<TraceEvent>(t.events.begin(), t.events.begin() + 40)) {
    e.device = 1;  // a second device, with a different peak
    t.events.push_back(e);
  }
  TraceSource source(t);
  CHECK(tensorpool::trace::summarize(t).peak_requested == baseline(source).total.result.peak_requested);
  CHECK(tensorpool::trace::summarize(t).peak_requested == run(t, "raw").total.peak_requested);
}

TEST_CASE("a steady training loop stops growing after its warm-up iterations", "[replay]") {
  const char* const loop = "layers:4,hidden:1024,ffn:4096,vocab:8000,micro_batch:4,seq:2048";
  const ReplayResult warm = run(generated(std::string(loop) + ",steps:3"), "tensorpool").total;
  const trace::Trace t = generated(std::string(loop) + ",steps:8");
  const ReplayResult r = run(t, "tensorpool").total;
  REQUIRE(r.iterations == 8);
  REQUIRE(r.upstream.allocs > 0);
  REQUIRE(r.upstream.allocs == warm.upstream.allocs);  // iterations 4..8 reuse the cache only
  REQUIRE(r.peak_reserved == warm.peak_reserved);
  REQUIRE(r.upstream_after_first_iteration.total() < r.upstream.total());
  const ReplayResult raw = run(t, "raw").total;
  REQUIRE(raw.upstream_after_first_iteration.total() > raw.upstream.total() / 2);
}

TEST_CASE("vmm mode: a repeating training loop makes no upstream calls after its first iteration", "[replay][vmm]") {
  // The optimizer states are created with the weights: every iteration, the first included, has
  // the same demand.
  const trace::Trace t = generated("layers:6,hidden:1024,ffn:4096,vocab:8000,micro_batch:4,seq:2048,steps:5");
  const ReplayResult r = run(t, "tensorpool-vmm").total;
  REQUIRE(r.iterations == 5);
  REQUIRE(r.upstream.maps > 0);
  REQUIRE(r.upstream_after_first_iteration.total() == 0);  // no map, unmap, create or release
  REQUIRE(r.upstream_after_first_iteration.syncs == 0);
}

TEST_CASE("vmm mode on the shared traces: utilization >= 0.97 and above the pytorch model", "[replay][vmm][shared]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  int traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".pickle") continue;
    ++traces;
    const trace::Trace t = tensorpool::trace::load_trace(entry.path().string());
    const ReplayResult vmm = run(t, "tensorpool-vmm").total;
    const ReplayResult pt = run(t, "pytorch").total;
    INFO(entry.path().filename().string() << ": vmm " << vmm.utilization << ", pytorch " << pt.utilization);
    CHECK(vmm.utilization >= 0.97);
    CHECK(vmm.utilization > pt.utilization);
    CHECK(vmm.unmatched_frees == 0);
  }
  REQUIRE(traces >= 7);
}

TEST_CASE("warm-up passes: the measured pass starts from the state the window left", "[replay]") {
  const trace::Trace t = generated("layers:4,hidden:1024,ffn:4096,vocab:8000,micro_batch:4,seq:2048,steps:2");
  for (const char* allocator : {"tensorpool", "tensorpool-vmm", "pytorch"}) {
    INFO(allocator);
    TraceSource source(t);
    ReplayOptions o;
    o.allocator = allocator;
    const ReplayResult cold = tensorpool::replay::replay(source, o).total;
    o.warmup = 2;
    TraceSource again(t);
    const ReplayResult warm = tensorpool::replay::replay(again, o).total;
    REQUIRE(cold.upstream.total() > 0);
    REQUIRE(warm.upstream.total() == 0);  // the window repeats: nothing new is needed
    REQUIRE(warm.events == cold.events);  // only the last pass is counted
    REQUIRE(warm.unmatched_frees == 0);
    REQUIRE(warm.ooms == 0);
    REQUIRE(warm.peak_requested == cold.peak_requested);  // each pass starts where the window does
  }
}
