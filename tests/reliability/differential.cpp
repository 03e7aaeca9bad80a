// differential.cpp: the operations, their generator, the reference model that judges a run, and
// the delta-debugging shrinker of the differential test (see differential.hpp for the properties).
#include "reliability/differential.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <typeinfo>
#include <unordered_map>

#include "reliability/recording_device.hpp"
#include "support/deterministic.hpp"
#include "tensorpool/tensorpool.hpp"

namespace tensorpool::reliability {

// --- operations -----------------------------------------------------------------------------

namespace {

const char* kind_name(OpKind k) {
  switch (k) {
    case OpKind::alloc: return "alloc";
    case OpKind::free: return "free";
    case OpKind::record: return "record";
    case OpKind::kernel: return "kernel";
    case OpKind::complete_event: return "complete_event";
    case OpKind::complete_stream: return "complete_stream";
    case OpKind::complete_all: return "complete_all";
    case OpKind::empty_cache: return "empty_cache";
    case OpKind::set_limit: return "set_limit";
    case OpKind::fault: return "fault";
    case OpKind::fail_above: return "fail_above";
    case OpKind::misuse: return "misuse";
    case OpKind::drain: return "drain";
    case OpKind::step: return "step";
    case OpKind::free_older: return "free_older";
    case OpKind::sleep: return "sleep";
    case OpKind::wake: return "wake";
  }
  return "?";
}


}  // namespace

std::string describe(const Op& op) {
  std::ostringstream os;
  os << kind_name(op.kind) << " s" << int{op.stream} << " arg " << int{op.arg} << " value " << op.value;
  return os.str();
}

std::string to_cpp(const Op& op) {
  std::ostringstream os;
  os << "{OpKind::" << kind_name(op.kind) << ", " << int{op.stream} << ", " << int{op.arg} << ", "
     << op.value << "u}";
  return os.str();
}

RunFigures& RunFigures::operator+=(const RunFigures& o) {
  ops += o.ops;
  faults_injected += o.faults_injected;
  ooms += o.ooms;
  device_errors += o.device_errors;
  usage_errors += o.usage_errors;
  drains += o.drains;
  upstream_allocs += o.upstream_allocs;
  stream_waits += o.stream_waits;
  syncs += o.syncs;
  steps_found += o.steps_found;
  planned_epochs += o.planned_epochs;
  mirrored_steps += o.mirrored_steps;
  stitches += o.stitches;
  sleeps += o.sleeps;
  wakes += o.wakes;
  failed_wakes += o.failed_wakes;
  for (std::size_t i = 0; i < site_calls.size(); ++i) site_calls[i] += o.site_calls[i];
  return *this;
}

// --- the generator --------------------------------------------------------------------------

namespace {

// Operations in grow and shrink phases of a few hundred to a few thousand steps, so that memory
// pressure comes and goes; sizes mix LLM-like tensors: a palette of repeated "layer" sizes, many
// small activations, fewer medium and large ones, rare huge ones (KV cache, logits).
class Generator {
 public:
  Generator(std::uint64_t seed, const Profile& profile) : rng_(seed), profile_(profile) {
    for (int i = 0; i < 24; ++i) palette_.push_back(fresh_size());
  }

  // Profile::repeated_steps: a few blocks that stay (weights), then each step run 4 to 11 times
  // in a row on stream 0 (after a run of new steps a step epoch is planned from the second of its
  // kind on: Heap::sight_step(); in one count 403 of 1878 step epochs were not planned), most runs
  // ended by Allocator::step() (half of those after stream 0's work completed); between runs, now
  // and then, work completes, a fault is armed (Profile::faults), the allocator is misused, the
  // limit changes, or everything is drained (and new weights are made).
  std::vector<Op> repeated_steps(std::size_t count) {
    std::vector<Op> ops;
    weights(ops);
    while (ops.size() < count) {
      const std::vector<Op> step = make_step();
      const std::uint64_t runs = profile_.unmarked_steps ? 4 + below(6) : 4 + below(8);
      for (std::uint64_t run = runs; run > 0 && ops.size() < count; --run) {
        std::vector<Op> ran = step;
        if (below(8) == 0) ran[below(ran.size())].value += 512;  // a departure (or a bigger free pick)
        if (below(4) == 0) ran.insert(ran.begin() + 1, Op{OpKind::empty_cache, 0, 0, 0});
        ops.insert(ops.end(), ran.begin(), ran.end());
        if (below(8) != 0 && !profile_.unmarked_steps) {
          // Half of them after the step's stream has done its work (a loop that reads its loss,
          // loss.item(), before step()): what step() does only then is judged too.
          if (below(2) == 0) ops.push_back(Op{OpKind::complete_stream, 0, 0, 0});
          ops.push_back(Op{OpKind::step, 0, 0, 0});
        }
        ops.push_back(between_runs());
        if (ops.back().kind == OpKind::drain) weights(ops);
      }
    }
    ops.resize(count);
    return ops;
  }

  Op next() {
    if (phase_left_ == 0) {
      growing_ = !growing_;
      phase_left_ = 200 + below(2800);
    }
    --phase_left_;
    return pick(below(total_weight()));
  }

 private:
  std::uint64_t below(std::uint64_t n) { return rng_() % n; }
  std::uint8_t stream() { return static_cast<std::uint8_t>(below(static_cast<std::uint64_t>(profile_.streams))); }

  std::size_t fresh_size() {
    const std::uint64_t r = below(100);
    if (r < 50) {  // small: 1 B .. 2 MiB, log-uniform
      const std::size_t base = std::size_t{1} << below(21);
      return base + below(base);
    }
    if (r < 80) return MiB + below(31 * MiB);
    if (r < 96) return 32 * MiB + below(128 * MiB);
    return 160 * MiB + below(240 * MiB);
  }

  std::size_t llm_size() { return below(100) < 45 ? palette_[below(palette_.size())] : fresh_size(); }

  // Weights per 1000 of each kind in the current phase, indexed by OpKind (step and free_older
  // come in repeated steps only; sleep and wake in vmm mode only).
  std::array<std::uint64_t, 17> weights() const {
    const std::uint64_t f = profile_.faults ? 1 : 0;
    const std::uint64_t v = profile_.vmm ? 1 : 0;
    return {growing_ ? 430u : 230u, growing_ ? 230u : 430u, 70, 70, 80, 50, 4, 8, 4, 20 * f, 3 * f, 10, 1, 0, 0,
            2 * v, 3 * v};
  }
  std::uint64_t total_weight() const {
    std::uint64_t t = 0;
    for (auto w : weights()) t += w;
    return t;
  }

  Op pick(std::uint64_t r) {
    const auto w = weights();
    std::size_t k = 0;
    while (r >= w[k]) r -= w[k++];
    return make(static_cast<OpKind>(k));
  }

  Op make(OpKind kind) {
    Op op{kind, stream(), 0, 0};
    switch (kind) {
      case OpKind::alloc: op.value = alloc_bytes(); break;
      case OpKind::free:
      case OpKind::record:
      case OpKind::complete_event:
      case OpKind::misuse:
        op.arg = static_cast<std::uint8_t>(below(6));
        op.value = rng_();
        break;
      case OpKind::set_limit:
        op.value = below(10) < 3 ? 0 : round_up(profile_.capacity / 8 + below(profile_.capacity), MiB);
        op.value = std::min<std::uint64_t>(op.value, profile_.capacity);
        break;
      case OpKind::fault: make_fault(op); break;
      case OpKind::fail_above: op.value = below(2) == 0 ? 0 : 16 * MiB + below(240 * MiB); break;
      default: break;
    }
    return op;
  }

  // Blocks that stay while the steps run (up to the next drain; a step's frees may pick them).
  void weights(std::vector<Op>& ops) {
    for (std::uint64_t n = below(4); n > 0; --n) ops.push_back(Op{OpKind::alloc, 0, 0, llm_size()});
  }

  // A step on stream 0: 4 to 43 allocations of the palette's sizes with frees in between, some
  // blocks also used on another stream, and every block freed by its end; half the steps also
  // make an output they keep, freeing the one the step's last run kept as they make it.
  std::vector<Op> make_step() {
    std::vector<Op> step;
    const std::uint64_t allocs = profile_.unmarked_steps ? 64 + below(96) : 4 + below(40);
    std::uint64_t live = 0;
    for (std::uint64_t made = 0; made < allocs;) {
      if (live == 0 || below(3) != 0) {
        step.push_back(Op{OpKind::alloc, 0, 0, llm_size()});
        ++made;
        ++live;
        if (below(10) == 0) step.push_back(Op{OpKind::record, stream(), 0, rng_()});
        if (below(10) == 0) step.push_back(Op{OpKind::kernel, 0, 0, 0});
      } else {
        step.push_back(Op{OpKind::free, 0, 0, rng_()});
        --live;
      }
    }
    for (; live > 0; --live) step.push_back(Op{OpKind::free, 0, 0, rng_()});
    if (below(2) == 0) {
      const std::size_t kept = fresh_size();
      const auto at = step.begin() + static_cast<std::ptrdiff_t>(below(step.size() + 1));
      step.insert(at, {Op{OpKind::alloc, 0, 0, kept}, Op{OpKind::free_older, 0, 0, kept}});
    }
    return step;
  }

  Op between_runs() {
    switch (below(16)) {
      case 0: return profile_.faults ? make(OpKind::fault) : Op{OpKind::complete_all, 0, 0, 0};
      case 1: return make(OpKind::misuse);
      case 2: return make(OpKind::set_limit);
      case 3: return Op{OpKind::drain, 0, 0, 0};
      case 4: case 5: case 6: case 7: return Op{OpKind::complete_stream, 0, 0, 0};
      default: return Op{OpKind::complete_all, 0, 0, 0};
    }
  }

  std::uint64_t alloc_bytes() {
    const std::uint64_t r = below(1000);
    if (r == 0) return 0;                                  // a no-op request
    if (r == 1) return profile_.capacity + 1 + below(GiB);  // can never fit
    if (r == 2) return std::uint64_t{1} << 52;             // beyond kMaxAllocationSize
    return llm_size();
  }

  void make_fault(Op& op) {
    static constexpr FaultSite kFixed[] = {FaultSite::segment_alloc, FaultSite::event_create};
    static constexpr FaultSite kVmm[] = {FaultSite::physical_create, FaultSite::map, FaultSite::event_create,
                                         FaultSite::stream_query};
    const FaultSite site = profile_.vmm ? kVmm[below(4)] : kFixed[below(2)];
    op.arg = static_cast<std::uint8_t>(site);
    op.value = 1 + below(12);
  }

  std::mt19937_64 rng_;
  Profile profile_;
  std::vector<std::size_t> palette_;
  bool growing_ = false;
  std::uint64_t phase_left_ = 0;
};

}  // namespace

std::vector<Op> generate(std::uint64_t seed, std::size_t count, const Profile& profile) {
  Generator g(seed, profile);
  if (profile.repeated_steps) return g.repeated_steps(count);
  std::vector<Op> ops;
  ops.reserve(count);
  for (std::size_t i = 0; i < count; ++i) ops.push_back(g.next());
  return ops;
}

// --- the reference model and the runner -----------------------------------------------------

namespace {

/// A violated property: what execute() turns into a Failure.
struct CheckFailure {
  std::string check;
  std::string message;
};

#define TP_EXPECT(cond, check, what)                \
  do {                                              \
    if (!(cond)) {                                  \
      std::ostringstream os_;                       \
      os_ << what;                                  \
      throw CheckFailure{check, os_.str()};         \
    }                                               \
  } while (0)

std::string hex(Address a) {
  std::ostringstream os;
  os << "0x" << std::hex << a;
  return os.str();
}

bool same_totals(const Stats& a, const Stats& b) {
  for (int m = 0; m < kNumMetrics; ++m) {
    const Stat& x = a.total.metrics[static_cast<std::size_t>(m)];
    const Stat& y = b.total.metrics[static_cast<std::size_t>(m)];
    if (x.current != y.current || x.peak != y.peak || x.allocated != y.allocated || x.freed != y.freed)
      return false;
  }
  return a.alloc_calls == b.alloc_calls && a.free_calls == b.free_calls &&
         a.upstream_allocs == b.upstream_allocs && a.upstream_frees == b.upstream_frees &&
         a.ooms == b.ooms;
}

// Runs functions on a second thread, one at a time, while the caller waits for each: calls
// ordered exactly as on one thread, made from two. An exception comes back to the caller.
class SecondThread {
 public:
  SecondThread() : thread_([this] { loop(); }) {}
  ~SecondThread() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SecondThread(const SecondThread&) = delete;
  SecondThread& operator=(const SecondThread&) = delete;

  void run(const std::function<void()>& f) {
    std::unique_lock lock(mutex_);
    task_ = &f;
    cv_.notify_all();
    cv_.wait(lock, [this] { return task_ == nullptr; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return task_ != nullptr || stop_; });
      if (stop_) return;
      try {
        (*task_)();
      } catch (...) {
        error_ = std::current_exception();
      }
      task_ = nullptr;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  const std::function<void()>* task_ = nullptr;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

class Runner {
 public:
  explicit Runner(const RunOptions& options);
  std::optional<Failure> execute(const std::vector<Op>& ops);
  const RunFigures& figures() const noexcept { return figures_; }

 private:
  // A block the user holds: requested bytes and every stream that used it (the allocation
  // stream first, then the record_stream ones).
  struct LiveBlock {
    std::size_t bytes;
    std::vector<Stream> users;
    std::uint64_t born = 0;  // the allocation's count (alloc_calls_ then)
    bool asleep = false;     // put to sleep by sleep(), not woken since
  };
  // Stream `stream` used a freed range; its work up to sequence `seq` must be complete (or
  // ordered before, by a stream wait) before another stream gets the range.
  struct Protection {
    Stream stream;
    std::uint64_t seq;
  };
  // A freed range [start, end) and what protects it. Guards never overlap each other or a
  // live block: an allocation removes the part it takes (its own free guards it again).
  struct Guard {
    Address end;
    std::vector<Protection> by;
  };
  struct Marker {
    std::uint64_t seq;
    DeviceEvent event;
  };
  struct Before {
    std::uint64_t faults;
  };

  void step(const Op& op);
  void alloc_op(const Op& op);
  void free_op(std::uint64_t pick);
  void free_older_op(std::size_t bytes);
  void free_block(Address a);
  void record_op(const Op& op);
  void kernel_op(Stream s);
  void complete_event_op(const Op& op);
  void fault_op(const Op& op);
  void misuse_op(const Op& op);
  void sleep_op();
  void wake_op();
  void set_asleep(bool asleep);
  void drain();
  void teardown();

  Stream stream_of(const Op& op) const { return streams_[op.stream % streams_.size()]; }
  void expect_oom(std::size_t bytes, const Before& before);
  /// What the allocator may still reserve under the memory limit (all there is without one), and
  /// what the device has free.
  std::size_t room_under_limit() const;
  std::size_t room_on_device() const { return options_.capacity - sim_->used_bytes(); }
  void check_new_block(Address a, std::size_t bytes, Stream t);
  void check_release(Address a, std::size_t bytes, bool unmap);
  void add_live(Address a, std::size_t bytes, Stream t);
  Address take_live(std::uint64_t pick);
  std::size_t waste_bound(std::size_t bytes) const;
  void trim_guards(Address a, Address b);
  void collect_guards();
  bool done(Stream s, std::uint64_t seq);
  std::uint64_t mark(Stream s, bool fresh);
  DeviceEvent marker_event();
  bool fired_since(FaultSite site, std::uint64_t calls_before) const;
  void update_fault_mirror();
  void check_state();
  void expect_usage_error(const std::function<void()>& misuse, const char* what);

  RunOptions options_;
  std::shared_ptr<SimulatedDevice> sim_;
  std::shared_ptr<RecordingDevice> dev_;
  std::unique_ptr<Allocator> alloc_;
  std::vector<Stream> streams_;
  bool vmm_ = false;
  std::size_t unit_ = 0;  // segment granularity (fixed) or page size (vmm)
  std::size_t limit_ = 0;
  Config config_;

  std::unordered_map<Address, LiveBlock> live_;
  std::vector<Address> order_;             // live addresses, for picking by index
  std::map<Address, Address> extents_;     // live block start -> start + round_size(bytes)
  std::map<Address, Guard> guards_;
  std::array<std::deque<Marker>, kMaxStreams> markers_;  // user work not known complete
  std::array<std::uint64_t, kMaxStreams> completed_{};   // known complete through this seq
  std::vector<DeviceEvent> marker_pool_;
  std::vector<Address> freed_;             // recently freed addresses (misuse)
  std::size_t requested_ = 0;              // sums over live blocks
  std::size_t rounded_ = 0;
  std::size_t waste_ = 0;                  // bound on allocated - rounded
  std::uint64_t alloc_calls_ = 0;
  std::uint64_t free_calls_ = 0;
  std::uint64_t ooms_ = 0;
  std::size_t fail_above_ = 0;    // the device refuses physical allocations above this (0: none)
  bool slept_ = false;            // sleep() ran and no wake() succeeded since
  std::size_t asleep_blocks_ = 0;  // live blocks that sleep
  bool releasing_asleep_ = false;  // in sleep() or wake(): pages under asleep blocks may go
  std::size_t last_reserved_ = 0;
  std::size_t next_collect_ = 256;  // guards_.size() at which collect_guards() runs next
  std::array<std::uint64_t, kNumFaultSites> fire_at_{};  // call number an armed fault fails
  RunFigures figures_;
};

Runner::Runner(const RunOptions& options) : options_(options) {
  SimulatedDeviceOptions so;
  so.capacity = options.capacity;
  sim_ = std::make_shared<SimulatedDevice>(so);
  dev_ = std::make_shared<RecordingDevice>(sim_);
  dev_->before_release = [this](Address a, std::size_t n, bool unmap) { check_release(a, n, unmap); };
  config_ = testing::deterministic_config(options.config, "differential");
  alloc_ = std::make_unique<Allocator>(dev_, config_);
  vmm_ = alloc_->config().mode == Mode::vmm;  // the mode taken (mode:auto takes vmm here)
  unit_ = vmm_ ? sim_->page_size() : sim_->properties().segment_granularity;
  limit_ = alloc_->memory_limit();
  streams_.push_back(kDefaultStream);
  for (int i = 1; i < options.streams; ++i) streams_.push_back(sim_->create_stream());
  // Markers are created before any fault is armed: they never consume an injected fault.
  for (int i = 0; i < 4096; ++i) marker_pool_.push_back(sim_->create_event());
}

std::optional<Failure> Runner::execute(const std::vector<Op>& ops) {
  std::size_t i = 0;
  auto fail = [&](std::string check, std::string message) {
    dev_->before_release = nullptr;  // the allocator's destructor must not meet a failing check
    return Failure{i, std::move(check), std::move(message)};
  };
  std::unique_ptr<SecondThread> second;
  if (options_.threads == 2) second = std::make_unique<SecondThread>();
  try {
    for (; i < ops.size(); ++i) {
      if (second != nullptr && i % 2 == 1) {
        second->run([&] { step(ops[i]); });
      } else {
        step(ops[i]);
      }
      update_fault_mirror();
      check_state();
      ++figures_.ops;
      // By the model's size, not the op's index: an inserted no-op (a fault that never fires)
      // must not change which marker a later complete_event picks.
      if (guards_.size() >= next_collect_) {
        collect_guards();
        next_collect_ = 2 * guards_.size() + 256;
      }
    }
    teardown();
  } catch (const CheckFailure& f) {
    return fail(f.check, f.message);
  } catch (const InvariantError& e) {
    return fail("invariants", e.what());
  } catch (const std::exception& e) {
    return fail("unexpected-exception", std::string(typeid(e).name()) + ": " + e.what());
  }
  return std::nullopt;
}

void Runner::step(const Op& op) {
  switch (op.kind) {
    case OpKind::alloc: alloc_op(op); break;
    case OpKind::free: free_op(op.value); break;
    case OpKind::record: record_op(op); break;
    case OpKind::kernel: kernel_op(stream_of(op)); break;
    case OpKind::complete_event: complete_event_op(op); break;
    case OpKind::complete_stream: sim_->complete_stream(stream_of(op)); break;
    case OpKind::complete_all: sim_->complete_all(); break;
    case OpKind::empty_cache: alloc_->empty_cache(); break;
    case OpKind::set_limit:
      alloc_->set_memory_limit(op.value);
      limit_ = op.value;
      break;
    case OpKind::fault: fault_op(op); break;
    case OpKind::fail_above:
      sim_->fail_allocations_above(op.value);
      fail_above_ = op.value;
      break;
    case OpKind::misuse: misuse_op(op); break;
    case OpKind::drain: drain(); break;
    case OpKind::step: alloc_->step(); break;
    case OpKind::free_older: free_older_op(op.value); break;
    case OpKind::sleep: sleep_op(); break;
    case OpKind::wake: wake_op(); break;
  }
}

// --- allocation -----------------------------------------------------------------------------

void Runner::alloc_op(const Op& op) {
  const Stream t = stream_of(op);
  const std::size_t bytes = op.value;
  const Before before{sim_->counters().faults_injected};
  const std::uint64_t map_calls = dev_->calls(FaultSite::map);
  const std::uint64_t event_calls = dev_->calls(FaultSite::event_create);
  if (bytes != 0) ++alloc_calls_;
  void* p = nullptr;
  try {
    p = alloc_->allocate(bytes, t);
  } catch (const OutOfMemoryError&) {
    ++ooms_;
    ++figures_.ooms;
    expect_oom(bytes, before);
    return;
  } catch (const DeviceError& e) {
    // Documented only for device failures other than "out of memory": here, an injected map or
    // event-creation fault that fired during this very call.
    ++figures_.device_errors;
    TP_EXPECT(fired_since(FaultSite::map, map_calls) || fired_since(FaultSite::event_create, event_calls),
              "device-error", "allocate(" << bytes << ", stream " << t
                                          << ") threw DeviceError with no injected fault: " << e.what());
    return;
  }
  if (bytes == 0) {
    TP_EXPECT(p == nullptr, "zero-size", "allocate(0) returned " << p);
    return;
  }
  const auto a = reinterpret_cast<Address>(p);
  check_new_block(a, bytes, t);
  add_live(a, bytes, t);
  if (slept_) TP_EXPECT(!alloc_->is_asleep(p), "sleep", "block " << hex(a) << " made while others sleep is asleep");
}

// OutOfMemoryError is right when an injected fault fired during the call, or when the request
// cannot fit: its size rounded to the device's unit exceeds the room left under the memory limit
// or on the device. (The ladder returned every free segment before giving up, so what is
// reserved now is what the last attempt saw.)
std::size_t Runner::room_under_limit() const {
  const std::size_t reserved = alloc_->usage().reserved;
  if (limit_ == 0) return std::numeric_limits<std::size_t>::max();
  return limit_ > reserved ? limit_ - reserved : 0;
}

void Runner::expect_oom(std::size_t bytes, const Before& before) {
  if (sim_->counters().faults_injected != before.faults) return;
  if (bytes > kMaxAllocationSize || round_size(bytes) > options_.capacity) return;
  const std::size_t need = round_up(round_size(bytes), unit_);
  const std::size_t room_limit = room_under_limit();
  const std::size_t room_device = room_on_device();
  const std::size_t room = std::min(room_limit, room_device);
  TP_EXPECT(need > room, "oom-with-room",
            "OutOfMemoryError for " << bytes << " bytes (" << need << " to map) with "
                                    << room_limit << " bytes left under the limit and " << room_device
                                    << " free on the device, no fault injected");
}

void Runner::check_new_block(Address a, std::size_t bytes, Stream t) {
  const std::size_t size = round_size(bytes);
  TP_EXPECT(a != 0 && a % kMinBlockSize == 0, "alignment", "block " << hex(a) << " is not 512-aligned");
  TP_EXPECT(live_.find(a) == live_.end(), "overlap", "block " << hex(a) << " handed out twice");
  auto next = extents_.lower_bound(a);
  TP_EXPECT(next == extents_.end() || next->first >= a + size, "overlap",
            "new block [" << hex(a) << ", +" << size << ") overlaps live block " << hex(next->first));
  if (next != extents_.begin())
    TP_EXPECT(std::prev(next)->second <= a, "overlap",
              "new block " << hex(a) << " overlaps live block " << hex(std::prev(next)->first));
  TP_EXPECT(dev_->covered(a, size), "no-memory",
            "block [" << hex(a) << ", +" << size << ") is not backed by a live segment or mapping");
  // Reuse: every other stream that used these bytes must be done with them, or ordered first.
  auto g = guards_.upper_bound(a);
  if (g != guards_.begin() && std::prev(g)->second.end > a) --g;
  for (; g != guards_.end() && g->first < a + bytes; ++g) {
    for (const Protection& p : g->second.by) {
      const bool same = p.stream == t && !options_.sabotage_same_stream;
      TP_EXPECT(same || done(p.stream, p.seq) || dev_->waited(t, p.stream) >= p.seq, "stream-order",
                "block [" << hex(a) << ", +" << bytes << ") handed to stream " << t
                          << " while stream " << p.stream << " has incomplete work (through seq "
                          << p.seq << ") on freed range [" << hex(g->first) << ", " << hex(g->second.end)
                          << ") and no stream wait orders it first");
    }
  }
  trim_guards(a, a + bytes);
}

void Runner::add_live(Address a, std::size_t bytes, Stream t) {
  live_.emplace(a, LiveBlock{bytes, {t}, alloc_calls_});
  order_.push_back(a);
  extents_.emplace(a, a + round_size(bytes));
  requested_ += bytes;
  rounded_ += round_size(bytes);
  waste_ += waste_bound(bytes);
}

// allocated - requested-rounded for one block: a block is split when the rest is at least
// 512 B (small pool) or min_split_remainder (large pool), so less is left over; oversize blocks
// are never split, but reused only within oversize_slack and new ones are rounded to the unit.
std::size_t Runner::waste_bound(std::size_t bytes) const {
  const std::size_t size = round_size(bytes);
  if (size <= config_.small_size) return kMinBlockSize - 1;
  if (!vmm_ && config_.max_split_size != 0 && size >= config_.max_split_size)
    return std::max(config_.oversize_slack, unit_);
  return config_.min_split_remainder - 1;
}

// --- free, record_stream, user work ----------------------------------------------------------

Address Runner::take_live(std::uint64_t pick) {
  const std::size_t i = pick % order_.size();
  const Address a = order_[i];
  order_[i] = order_.back();
  order_.pop_back();
  return a;
}

void Runner::free_op(std::uint64_t pick) {
  if (order_.empty()) return;
  free_block(take_live(pick));
}

// Frees the first allocated of the live blocks of exactly `bytes`, when there are two or more
// (O(live blocks): a scan of the model).
void Runner::free_older_op(std::size_t bytes) {
  std::optional<Address> oldest;
  int count = 0;
  for (const auto& [a, b] : live_) {
    if (b.bytes != bytes) continue;
    ++count;
    if (!oldest || b.born < live_.at(*oldest).born) oldest = a;
  }
  if (count < 2) return;
  const auto it = std::find(order_.begin(), order_.end(), *oldest);
  *it = order_.back();
  order_.pop_back();
  free_block(*oldest);
}

// Frees live block a, taken out of order_ already.
void Runner::free_block(Address a) {
  const LiveBlock b = live_.at(a);
  if (b.asleep) --asleep_blocks_;  // forgotten: it gets no pages at wake()
  // The user's work on every stream that used the block precedes the free: mark it first. From
  // the call on, the block is the allocator's, guarded by that work: the free itself may give its
  // pages back (a vmm heap left empty remaps them for its planned layout), once that work is done.
  // An asleep block has had no pages since sleep() waited for the device: no work touches it.
  Guard guard{a + b.bytes, {}};
  if (!b.asleep)
    for (const Stream s : b.users) guard.by.push_back({s, mark(s, false)});
  live_.erase(a);
  extents_.erase(a);
  auto next = guards_.lower_bound(a);
  TP_EXPECT(next == guards_.end() || next->first >= guard.end, "model", "guards overlap at " << hex(a));
  if (next != guards_.begin())
    TP_EXPECT(std::prev(next)->second.end <= a, "model", "guards overlap at " << hex(a));
  guards_.emplace(a, std::move(guard));
  alloc_->deallocate(reinterpret_cast<void*>(a));  // never throws here: any exception fails
  ++free_calls_;
  requested_ -= b.bytes;
  rounded_ -= round_size(b.bytes);
  waste_ -= waste_bound(b.bytes);
  if (freed_.size() < 64) freed_.push_back(a);
  else freed_[free_calls_ % 64] = a;
}

void Runner::record_op(const Op& op) {
  if (order_.empty()) return;
  const Address a = order_[op.value % order_.size()];
  const Stream s = stream_of(op);
  if (live_.at(a).asleep)
    return expect_usage_error([&] { alloc_->record_stream(reinterpret_cast<void*>(a), s); },
                              "record_stream of an asleep block");
  alloc_->record_stream(reinterpret_cast<void*>(a), s);
  auto& users = live_.at(a).users;
  if (std::find(users.begin(), users.end(), s) == users.end()) users.push_back(s);
}

void Runner::kernel_op(Stream s) { mark(s, true); }

void Runner::complete_event_op(const Op& op) {
  const auto& q = markers_[stream_of(op)];
  if (q.empty()) return;
  sim_->complete_event(q[op.value % q.size()].event);
}

// A sequence number on s covering all work submitted to s so far (a new user event unless the
// last one still covers everything, or `fresh` asks for new work).
std::uint64_t Runner::mark(Stream s, bool fresh) {
  auto& q = markers_[s];
  if (!fresh && !q.empty() && q.back().seq == dev_->submitted(s)) return q.back().seq;
  const DeviceEvent e = marker_event();
  dev_->record_event(e, s);
  q.push_back({dev_->submitted(s), e});
  return q.back().seq;
}

DeviceEvent Runner::marker_event() {
  if (marker_pool_.empty()) collect_guards();
  if (marker_pool_.empty()) {  // every marker outstanding: let the device finish its work
    sim_->complete_all();
    collect_guards();
  }
  const DeviceEvent e = marker_pool_.back();
  marker_pool_.pop_back();
  return e;
}

// True once stream s has completed its work through `seq` (markers complete in stream order).
bool Runner::done(Stream s, std::uint64_t seq) {
  auto& q = markers_[s];
  while (!q.empty() && sim_->query_event(q.front().event)) {
    completed_[s] = std::max(completed_[s], q.front().seq);
    marker_pool_.push_back(q.front().event);
    q.pop_front();
  }
  return completed_[s] >= seq;
}

// Removes [a, b) from the guarded ranges (the new block's lifetime guards it from now on: any
// stream that reuses it later is ordered after this one, hence after what this one waited for).
void Runner::trim_guards(Address a, Address b) {
  auto it = guards_.upper_bound(a);
  if (it != guards_.begin() && std::prev(it)->second.end > a) --it;
  while (it != guards_.end() && it->first < b) {
    const Address start = it->first;
    Guard g = it->second;
    it = guards_.erase(it);
    if (start < a) guards_.emplace(start, Guard{a, g.by});
    if (g.end > b) guards_.emplace(b, Guard{g.end, g.by});
  }
}

// Drops guards whose protections have all completed; recycles completed markers.
void Runner::collect_guards() {
  for (std::size_t s = 0; s < kMaxStreams; ++s) done(static_cast<Stream>(s), 0);
  std::erase_if(guards_, [&](const auto& entry) {
    for (const Protection& p : entry.second.by)
      if (!done(p.stream, p.seq)) return false;
    return true;
  });
}

// Memory leaving the allocator: no live block may lie in it, and (vmm) pages are unmapped only
// after every stream that used them is done (unmapping is not stream-ordered, unlike freeing a
// fixed segment, which the driver orders after all work).
void Runner::check_release(Address a, std::size_t bytes, bool unmap) {
  auto it = extents_.lower_bound(a);
  if (it != extents_.begin() && std::prev(it)->second > a) --it;
  for (; it != extents_.end() && it->first < a + bytes; ++it)
    TP_EXPECT(releasing_asleep_ && live_.at(it->first).asleep, "release-live",
              (unmap ? "unmap" : "free_segment") << " of [" << hex(a) << ", +" << bytes << ") while block "
                                                 << hex(it->first) << " is live and awake");
  if (!unmap) return;
  auto g = guards_.upper_bound(a);
  if (g != guards_.begin() && std::prev(g)->second.end > a) --g;
  for (; g != guards_.end() && g->first < a + bytes; ++g)
    for (const Protection& p : g->second.by)
      TP_EXPECT(done(p.stream, p.seq), "unmap-in-use",
                "unmap of [" << hex(a) << ", +" << bytes << ") while stream " << p.stream
                             << " has incomplete work on freed range " << hex(g->first));
}

// --- faults and misuse -----------------------------------------------------------------------

// The sites a `fault` operation arms: every one but the event query (FaultSite::event_query, the
// last, added after the fuzz corpus was recorded, whose operations keep the sites they name).
// Unit tests arm it (test_stream_order.cpp): a refused query leaves the frees waiting.
constexpr int kArmedFaultSites = static_cast<int>(FaultSite::event_query);
static_assert(kArmedFaultSites == kNumFaultSites - 1, "the event query is the last fault site");

void Runner::fault_op(const Op& op) {
  const auto site = static_cast<FaultSite>(op.arg % kArmedFaultSites);
  const std::uint64_t n = std::max<std::uint64_t>(op.value, 1);
  sim_->fail_nth(site, n);
  fire_at_[static_cast<std::size_t>(site)] = dev_->calls(site) + n;
}

bool Runner::fired_since(FaultSite site, std::uint64_t calls_before) const {
  const std::uint64_t at = fire_at_[static_cast<std::size_t>(site)];
  return at != 0 && at > calls_before && at <= dev_->calls(site);
}

// Mirrors the device's countdowns: a fault that fired is disarmed.
void Runner::update_fault_mirror() {
  for (int s = 0; s < kNumFaultSites; ++s) {
    auto& at = fire_at_[static_cast<std::size_t>(s)];
    if (at != 0 && dev_->calls(static_cast<FaultSite>(s)) >= at) at = 0;
  }
}

void Runner::expect_usage_error(const std::function<void()>& misuse, const char* what) {
  const Stats before = alloc_->stats();
  bool thrown = false;
  try {
    misuse();
  } catch (const UsageError&) {
    thrown = true;
  }
  TP_EXPECT(thrown, "usage-error", what << " did not throw UsageError");
  TP_EXPECT(same_totals(before, alloc_->stats()), "usage-error", what << " changed the statistics");
  ++figures_.usage_errors;
}

void Runner::misuse_op(const Op& op) {
  const Address foreign = 0x1000 + (op.value % 4096) * kMinBlockSize;
  Address freed = 0;
  if (!freed_.empty()) freed = freed_[op.value % freed_.size()];
  if (freed != 0 && live_.count(freed) != 0) freed = 0;  // reused since: not a misuse
  switch (op.arg % 6) {
    case 0:
      if (freed == 0) break;
      return expect_usage_error([&] { alloc_->deallocate(reinterpret_cast<void*>(freed)); }, "double free");
    case 1:
      if (order_.empty()) break;
      {
        const Address a = order_[op.value % order_.size()];
        const std::size_t bytes = live_.at(a).bytes;
        if (bytes < 2) break;
        const Address inner = a + 1 + (op.value >> 8) % (bytes - 1);
        return expect_usage_error([&] { alloc_->deallocate(reinterpret_cast<void*>(inner)); },
                                  "free of an interior pointer");
      }
    case 2:
      if (freed == 0) break;
      return expect_usage_error(
          [&] { alloc_->record_stream(reinterpret_cast<void*>(freed), streams_[0]); },
          "record_stream of a freed pointer");
    case 3:
      return expect_usage_error([&] { alloc_->record_stream(nullptr, streams_[0]); },
                                "record_stream(nullptr)");
    case 4: {
      const Stats before = alloc_->stats();
      alloc_->deallocate(nullptr);  // documented as ignored
      TP_EXPECT(same_totals(before, alloc_->stats()), "usage-error", "deallocate(nullptr) changed stats");
      return;
    }
    default: break;
  }
  expect_usage_error([&] { alloc_->deallocate(reinterpret_cast<void*>(foreign)); }, "free of a foreign pointer");
}

// --- drains and teardown ---------------------------------------------------------------------

// sleep() puts every live block to sleep (their pages go, after the device's work on them is
// done: the unmaps are judged as any). A sleep while the model's blocks sleep is not made: the
// heaps asleep already would leave the blocks made since awake.
void Runner::sleep_op() {
  if (slept_) return;
  set_asleep(true);
  releasing_asleep_ = true;
  const SleepReport r = alloc_->sleep();  // never throws here: any exception fails
  releasing_asleep_ = false;
  slept_ = true;
  TP_EXPECT(r.asleep_blocks == live_.size(), "sleep",
            "sleep() put " << r.asleep_blocks << " blocks to sleep, of " << live_.size() << " live");
  for (const Address a : order_)
    TP_EXPECT(alloc_->is_asleep(reinterpret_cast<void*>(a)), "sleep", "live block " << hex(a) << " is awake");
  ++figures_.sleeps;
}

// wake() wakes every asleep block, or throws DeviceError and wakes none. It may fail only after
// an injected fault fired, when the pages it maps back exceed the room on the device and under
// the limit (before it gives the cache back), or when the device refuses allocations smaller
// than they are (fail_above).
void Runner::wake_op() {
  if (!slept_) return expect_usage_error([&] { alloc_->wake(); }, "wake() with nothing asleep");
  const std::size_t needed = alloc_->asleep().asleep_bytes;
  const std::size_t room = std::min(room_under_limit(), room_on_device());
  const std::uint64_t creates = dev_->calls(FaultSite::physical_create);
  const std::uint64_t maps = dev_->calls(FaultSite::map);
  releasing_asleep_ = true;
  try {
    alloc_->wake();
  } catch (const DeviceError& e) {
    releasing_asleep_ = false;
    const bool refused = fail_above_ != 0 && needed > fail_above_;
    TP_EXPECT(fired_since(FaultSite::physical_create, creates) || fired_since(FaultSite::map, maps) ||
                  needed > room || refused,
              "wake", "wake() of " << needed << " bytes threw with " << room << " bytes of room and no fault: "
                                   << e.what());
    for (const Address a : order_)
      if (live_.at(a).asleep)
        TP_EXPECT(alloc_->is_asleep(reinterpret_cast<void*>(a)), "wake", "a failed wake() woke " << hex(a));
    ++figures_.failed_wakes;
    return;
  }
  releasing_asleep_ = false;
  slept_ = false;
  set_asleep(false);
  for (const Address a : order_)
    TP_EXPECT(!alloc_->is_asleep(reinterpret_cast<void*>(a)), "wake", "block " << hex(a) << " still sleeps");
  ++figures_.wakes;
}

void Runner::set_asleep(bool asleep) {
  for (auto& [a, b] : live_) b.asleep = asleep;
  asleep_blocks_ = asleep ? live_.size() : 0;
}

// Free everything, complete all work, empty_cache(): nothing may remain reserved (vmm keeps up
// to vmm_reserve per pool mapped on purpose).
void Runner::drain() {
  for (int s = 0; s < kNumFaultSites; ++s) sim_->fail_nth(static_cast<FaultSite>(s), 0);
  fire_at_ = {};
  sim_->fail_allocations_above(0);
  fail_above_ = 0;
  while (!order_.empty()) free_op(0);
  sim_->complete_all();
  alloc_->empty_cache();
  const MemoryUsage u = alloc_->usage();
  TP_EXPECT(u.allocated == 0 && u.requested == 0 && u.active == 0, "drain",
            "after freeing everything: allocated " << u.allocated << ", requested " << u.requested
                                                   << ", active " << u.active);
  const std::size_t kept = vmm_ ? 2 * config_.vmm_reserve : 0;
  TP_EXPECT(u.reserved <= kept, "drain", "after drain and empty_cache, " << u.reserved << " bytes still reserved");
  TP_EXPECT(sim_->used_bytes() == u.reserved, "drain",
            "device uses " << sim_->used_bytes() << " bytes, allocator reserves " << u.reserved);
  collect_guards();
  ++figures_.drains;
}

void Runner::teardown() {
  // Calls made by the operations themselves (a fault armed by an operation can only hit these:
  // the final drain disarms every fault first).
  for (int i = 0; i < kNumFaultSites; ++i)
    figures_.site_calls[static_cast<std::size_t>(i)] = dev_->calls(static_cast<FaultSite>(i));
  drain();
  check_state();
  const Stats s = alloc_->stats();
  figures_.faults_injected = sim_->counters().faults_injected;
  figures_.upstream_allocs = s.upstream_allocs;
  figures_.stream_waits = s.stream_waits;
  figures_.syncs = s.syncs;
  figures_.steps_found = s.steps_found;
  figures_.planned_epochs = s.planned_epochs;
  figures_.mirrored_steps = s.mirrored_steps;
  figures_.stitches = s.stitches;
  dev_->before_release = nullptr;  // the destructor releases everything, by design
  alloc_.reset();
  const DeviceCounters c = sim_->counters();
  TP_EXPECT(sim_->used_bytes() == 0 && sim_->mapped_bytes() == 0, "teardown",
            "after destruction the device still has " << sim_->used_bytes() << " bytes used, "
                                                      << sim_->mapped_bytes() << " mapped");
  TP_EXPECT(c.segment_allocs == c.segment_frees && c.physical_creates == c.physical_releases &&
                c.address_reserves == c.address_releases,
            "teardown", "unbalanced upstream calls after destruction");
}

// --- after every step --------------------------------------------------------------------------

void Runner::check_state() {
  alloc_->check_invariants();
  const Stats s = alloc_->stats();
  const MemoryUsage u = alloc_->usage();
  const auto cur = [&](Metric m) { return static_cast<std::size_t>(s.total[m].current); };
  TP_EXPECT(cur(Metric::requested_bytes) == requested_, "stats",
            "requested_bytes " << cur(Metric::requested_bytes) << " != model " << requested_);
  TP_EXPECT(cur(Metric::allocations) == live_.size(), "stats",
            "allocations " << cur(Metric::allocations) << " != live blocks " << live_.size());
  const std::size_t allocated = cur(Metric::allocated_bytes);
  TP_EXPECT(allocated >= rounded_ && allocated - rounded_ <= waste_, "stats",
            "allocated_bytes " << allocated << " outside [" << rounded_ << ", " << rounded_ + waste_ << "]");
  TP_EXPECT(cur(Metric::active_bytes) >= allocated && cur(Metric::active_blocks) >= live_.size(), "stats",
            "active below allocated");
  TP_EXPECT(u.reserved == cur(Metric::reserved_bytes) && u.allocated == allocated &&
                u.requested == requested_ && u.active == cur(Metric::active_bytes),
            "stats", "usage() disagrees with stats()");
  TP_EXPECT(u.reserved == sim_->used_bytes(), "stats",
            "reserved " << u.reserved << " != device used bytes " << sim_->used_bytes());
  TP_EXPECT(u.reserved + s.asleep_allocated >= allocated, "stats", "reserved below the awake blocks' bytes");
  TP_EXPECT(alloc_->asleep().asleep_blocks == asleep_blocks_, "sleep",
            alloc_->asleep().asleep_blocks << " blocks sleep, " << asleep_blocks_ << " in the model");
  TP_EXPECT(s.alloc_calls == alloc_calls_ && s.free_calls == free_calls_ && s.ooms == ooms_, "stats",
            "counters: alloc_calls " << s.alloc_calls << "/" << alloc_calls_ << ", free_calls "
                                     << s.free_calls << "/" << free_calls_ << ", ooms " << s.ooms << "/" << ooms_);
  const DeviceCounters c = sim_->counters();
  TP_EXPECT(c.segment_allocs + c.physical_creates == s.upstream_allocs &&
                c.segment_frees + c.physical_releases == s.upstream_frees,
            "stats", "upstream counters disagree with the device's");
  if (u.reserved > last_reserved_ && limit_ != 0)
    TP_EXPECT(u.reserved <= limit_, "limit", "reserved grew to " << u.reserved << " above the limit " << limit_);
  last_reserved_ = u.reserved;
}

}  // namespace

std::optional<Failure> run(const RunOptions& options, const std::vector<Op>& ops, RunFigures* figures) {
  Runner runner(options);
  auto failure = runner.execute(ops);
  if (figures != nullptr) *figures += runner.figures();
  return failure;
}

// --- shrinking ---------------------------------------------------------------------------------

std::vector<Op> ddmin(std::vector<Op> ops, const std::function<bool(const std::vector<Op>&)>& fails,
                      std::size_t max_tests) {
  std::size_t n = 2;
  std::size_t tests = 0;
  while (ops.size() >= 2 && tests < max_tests) {
    const std::size_t chunk = (ops.size() + n - 1) / n;
    bool reduced = false;
    for (std::size_t start = 0; start < ops.size() && tests < max_tests; start += chunk) {
      std::vector<Op> candidate(ops.begin(), ops.begin() + static_cast<std::ptrdiff_t>(start));
      const std::size_t stop = std::min(ops.size(), start + chunk);
      candidate.insert(candidate.end(), ops.begin() + static_cast<std::ptrdiff_t>(stop), ops.end());
      ++tests;
      if (fails(candidate)) {  // the complement still fails: drop the chunk
        ops = std::move(candidate);
        n = std::max<std::size_t>(n - 1, 2);
        reduced = true;
        break;
      }
    }
    if (reduced) continue;
    if (n >= ops.size()) break;  // every single op is needed: 1-minimal
    n = std::min(n * 2, ops.size());
  }
  return ops;
}

std::vector<Op> shrink(const RunOptions& options, const std::vector<Op>& ops, const Failure& failure,
                       std::size_t max_tests) {
  // Operations after the failing one cannot matter (unless the failure is in the teardown).
  std::vector<Op> prefix(ops.begin(), ops.begin() + static_cast<std::ptrdiff_t>(std::min(ops.size(), failure.step + 1)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto fails = [&](const std::vector<Op>& candidate) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    const auto f = run(options, candidate);
    return f.has_value() && f->check == failure.check;
  };
  return ddmin(std::move(prefix), fails, max_tests);
}

std::string report(std::uint64_t seed, const RunOptions& options, const Failure& failure,
                   const std::vector<Op>& shrunk) {
  std::ostringstream os;
  os << "differential test failed: seed " << seed << ", config \"" << options.config << "\"\n"
     << "  at op " << failure.step << ": [" << failure.check << "] " << failure.message << "\n"
     << "  shrunk to " << shrunk.size() << " ops (replay with run(options, ops)):\n";
  for (const Op& op : shrunk) os << "    " << to_cpp(op) << ",  // " << describe(op) << "\n";
  if (const auto f = run(options, shrunk)) os << "  shrunk run fails at op " << f->step << ": " << f->message << "\n";
  return os.str();
}

}  // namespace tensorpool::reliability
