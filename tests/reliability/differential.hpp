// differential.hpp: the differential test of the allocator against a reference model.
//
// A run is a list of operations (allocate, free, record_stream, user work on streams, event
// completion in random order, empty_cache, memory limits, injected upstream faults, misuse, full
// drains, sleep and wake in vmm mode) executed against a tensorpool Allocator on a SimulatedDevice, while a reference model
// of what must be true judges every step:
//  - live blocks never overlap, are at least the requested size, 512-aligned, and lie in device
//    memory the allocator holds;
//  - a freed block is not handed out again to another stream while a stream that used it has
//    incomplete work, unless that stream's work is ordered first by a stream wait;
//  - memory is never released upstream (segment freed, pages unmapped) while in use (but by
//    sleep(), and by a wake() that fails, under the blocks that sleep);
//  - sleep() puts every live block to sleep, blocks made while they sleep are awake, a wake()
//    wakes every one or throws DeviceError (after an injected fault, or with the device too full)
//    and leaves every one asleep, and record_stream of an asleep block is a UsageError;
//  - statistics equal the model's sums (requested bytes, block count, call and OOM counters,
//    reserved bytes == the device's used bytes, rounding within its bound);
//  - errors are of the right type: OutOfMemoryError only when the request cannot fit (or an
//    injected fault fired), UsageError for every misuse and only then, DeviceError only when an
//    injected map or event-creation fault fired during that call;
//  - after freeing everything, completing all work and empty_cache(), reserved bytes and the
//    device's used bytes return to 0;
//  - check_invariants() holds after every step.
// Operations are generated up front from a seed and never depend on the allocator's answers
// (an operation that names a live block picks it by index modulo the live count), so any
// sub-list is a valid run: that is what lets shrink() delta-debug a failing run.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensorpool/simulated_device.hpp"

namespace tensorpool::reliability {

enum class OpKind : std::uint8_t {
  alloc,            // value: bytes, stream
  free,             // value: index of a live block
  record,           // value: index of a live block, stream: the other stream
  kernel,           // user work submitted to `stream` (an event the test records)
  complete_event,   // completes one outstanding user event of `stream` (value: which)
  complete_stream,  // completes all work on `stream`
  complete_all,
  empty_cache,
  set_limit,        // value: bytes (0: none)
  fault,            // arg: FaultSite, value: n (fail the n-th call from now)
  fail_above,       // value: bytes (0: off)
  misuse,           // arg: which misuse, value: a parameter
  drain,            // free everything, complete all work, empty_cache: nothing may remain
  step,             // Allocator::step(): a training step ends (repeated steps only)
  free_older,       // value: bytes: with two live blocks or more of exactly that size, frees the one
                    // allocated first (a loop's kept output, replaced by the next step's)
  sleep,            // Allocator::sleep() (vmm; a no-op while the model's blocks sleep already)
  wake,             // Allocator::wake()
};

struct Op {
  OpKind kind = OpKind::alloc;
  std::uint8_t stream = 0;  // index into the run's streams
  std::uint8_t arg = 0;
  std::uint64_t value = 0;
};

/// "alloc s1 4096"-style text, and the C++ initializer that rebuilds the op.
std::string describe(const Op& op);
std::string to_cpp(const Op& op);

/// What the generator produces.
struct Profile {
  bool vmm = false;           // fault sites of vmm mode (physical_create, map) or fixed mode
  bool faults = true;         // inject upstream faults
  int streams = 4;            // the default stream and streams - 1 created ones
  std::size_t capacity = 0;   // device capacity (for limits and huge requests)
  /// Steps repeated over a few blocks that stay (now and then changed, or with empty_cache()
  /// after their first allocation, most ended by Allocator::step()), so that vmm heaps follow
  /// plans, from empty heaps and around their base, map holes and give pages back; some steps
  /// keep an output that the next run of the step replaces (PyTorch's loop keeps its logits), so
  /// that step plans take turns with their mirrors (step_turns.hpp); the faults, misuse, limits
  /// and drains of the random mix come between the runs.
  bool repeated_steps = false;
  /// With repeated_steps: no Allocator::step() call, and steps of 64 to 159 allocations run 4 to
  /// 9 times in a row, long enough for vmm_find_steps to find them.
  bool unmarked_steps = false;
};

/// `count` operations from `seed`: LLM-like size mixes in grow and shrink phases.
std::vector<Op> generate(std::uint64_t seed, std::size_t count, const Profile& profile);

struct RunOptions {
  std::string config;                    // Config::parse() text
  std::size_t capacity = std::size_t{2} << 30;
  int streams = 4;
  /// 2: every other operation is made by a second thread while the first waits (the same
  /// sequence, so the same judgments, from two threads with their own thread-local stream caches:
  /// the allocator's shards see frees of other threads' blocks and streams of other shards).
  int threads = 1;
  /// Test of the test: the model forgets that a stream may reuse its own block at once, so the
  /// first same-stream reuse with work outstanding is reported (used to check the shrinker).
  bool sabotage_same_stream = false;
};

/// Figures of one run, summed over runs for the report.
struct RunFigures {
  std::uint64_t ops = 0;
  std::uint64_t faults_injected = 0;  // as counted by the simulated device
  std::uint64_t ooms = 0;
  std::uint64_t device_errors = 0;    // DeviceError from allocate (after an injected fault)
  std::uint64_t usage_errors = 0;     // UsageError from a misuse operation
  std::uint64_t drains = 0;
  std::uint64_t upstream_allocs = 0;
  std::uint64_t stream_waits = 0;
  std::uint64_t syncs = 0;
  std::uint64_t steps_found = 0;  // Stats::steps_found
  std::uint64_t planned_epochs = 0;  // Stats::planned_epochs
  std::uint64_t mirrored_steps = 0;  // Stats::mirrored_steps
  std::uint64_t stitches = 0;        // Stats::stitches
  std::uint64_t sleeps = 0;          // sleep() calls that put blocks to sleep
  std::uint64_t wakes = 0;           // wake() calls that woke them
  std::uint64_t failed_wakes = 0;    // wake() calls that threw DeviceError
  std::array<std::uint64_t, kFaultSiteCount> site_calls{};  // upstream calls per FaultSite
  RunFigures& operator+=(const RunFigures& o);
};

struct Failure {
  std::size_t step = 0;  // index of the failing op; ops.size() for the final teardown checks
  std::string check;     // short name of the violated property
  std::string message;
};

/// Executes `ops`, then drains and destroys the allocator; nullopt when every check held.
std::optional<Failure> run(const RunOptions& options, const std::vector<Op>& ops,
                           RunFigures* figures = nullptr);

/// Delta debugging (ddmin) of a failing list: a 1-minimal sub-list (no single element can be
/// removed) for which `fails` still holds, within `max_tests` calls of `fails`.
std::vector<Op> ddmin(std::vector<Op> ops, const std::function<bool(const std::vector<Op>&)>& fails,
                      std::size_t max_tests);

/// Shrinks a run that failed with `failure`: keeps failures of the same check only.
std::vector<Op> shrink(const RunOptions& options, const std::vector<Op>& ops, const Failure& failure,
                       std::size_t max_tests = 4000);

/// The report printed for a failure: seed, config, the failure, the shrunk list as C++.
std::string report(std::uint64_t seed, const RunOptions& options, const Failure& failure,
                   const std::vector<Op>& shrunk);

}  // namespace tensorpool::reliability
