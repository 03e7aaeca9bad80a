// replay.cpp: the replay engine and the baseline read from a trace's own segment events.
#include "tensorpool/replay/replay.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tensorpool/errors.hpp"

namespace tensorpool::replay {

using trace::TraceEvent;
using trace::Op;

void ReplayResult::finish() noexcept {
  utilization = peak_reserved == 0 ? 1.0 : static_cast<double>(peak_requested) / static_cast<double>(peak_reserved);
  waste = peak_reserved > peak_requested ? peak_reserved - peak_requested : 0;
}

void ReplayResult::add_device(const ReplayResult& d) {
  events += d.events;
  allocs += d.allocs;
  frees += d.frees;
  unmatched_frees += d.unmatched_frees;
  ooms += d.ooms;
  peak_requested += d.peak_requested;
  peak_allocated += d.peak_allocated;
  peak_reserved += d.peak_reserved;
  reserved_at_requested_peak += d.reserved_at_requested_peak;
  final_reserved += d.final_reserved;
  upstream += d.upstream;
  seeding += d.seeding;
  iterations = std::max(iterations, d.iterations);
  upstream_after_first_iteration += d.upstream_after_first_iteration;
  if (per_iteration.size() < d.per_iteration.size()) per_iteration.resize(d.per_iteration.size());
  for (std::size_t i = 0; i < d.per_iteration.size(); ++i) {
    per_iteration[i].upstream += d.per_iteration[i].upstream;
    per_iteration[i].peak_requested += d.per_iteration[i].peak_requested;
    per_iteration[i].peak_reserved += d.per_iteration[i].peak_reserved;
  }
  if (d.first_oom && (!first_oom || d.first_oom->time_us < first_oom->time_us)) first_oom = d.first_oom;
  stopped_at_first_oom = stopped_at_first_oom || d.stopped_at_first_oom;
}

namespace {

bool is_seed(Op op) { return op == Op::seed_segment || op == Op::seed_alloc; }

// The per-device results summed (ReplayResult::add_device).
ReplayResult sum(const std::vector<ReplayResult>& devices, const std::string& name) {
  ReplayResult t;
  t.allocator = name;
  for (const auto& d : devices) t.add_device(d);
  t.finish();
  return t;
}

// The replay of one device of the trace; the view its observer gets.
class DeviceReplay final : public ReplayView {
 public:
  DeviceReplay(const ReplayOptions& options, int device)
      : attempt_ooms_(options.attempt_ooms),
        step_at_iterations_(options.step_at_iterations),
        observed_(options.observer),
        warmup_(options.warmup) {
    TargetOptions opts = options.target;
    opts.device = device;
    target_ = options.make_target ? options.make_target(opts) : make_target(options.allocator, opts);
    pass_ = new_pass(0, device);
    // require_export() let only a registered target whose descriptor says `exports` this far;
    // a target built by options.make_target has no descriptor here and is asked itself.
    if (options.record_history && !target_->record_history()) {
      if (options.make_target)
        throw UsageError("allocator '" + options.allocator + "' cannot export a snapshot (it records no history)");
      throw std::logic_error("replay target '" + options.allocator +
                             "' exports by its descriptor but records no history");
    }
  }

  // --- ReplayView ---
  const ReplayTarget& target() const override { return *target_; }
  std::optional<MemoryMap> memory_map() const override;

  /// The pass has refused an allocation (OnOom::stop ends it there: stop_at_oom()).
  bool refused_any() const noexcept { return pass_.result.ooms != 0; }
  void stop_at_oom() noexcept { pass_.result.stopped_at_first_oom = true; }

  // The target's memory for a snapshot export (ReplayOptions::record_history).
  trace::pytorch::DeviceMemory memory_state() const {
    trace::pytorch::DeviceMemory m = target_->memory_state();
    m.device = pass_.result.device;
    return m;
  }
  std::string settings() const { return target_->settings(); }

  // Inlined into the event loop (run_pass), as it was before the loop had variants.
  [[gnu::always_inline]] void apply(const TraceEvent& e, const EventSource& source) {
    ++pass_.result.events;
    if (!pass_.window_started && !is_seed(e.op)) start_window();
    switch (e.op) {
      case Op::seed_segment:
        if (pass_.number == 0) seed_segment(e);
        break;
      case Op::seed_alloc: allocate(e, true); break;
      case Op::alloc:
        if ((e.flags & trace::kFlagTagged) != 0) [[unlikely]] {
          allocate(e, false, source.label(e.label));
        } else {
          allocate(e, false);
        }
        break;
      case Op::free_requested: free(e, true); break;
      case Op::free_completed: free(e, false); break;
      case Op::record_stream:
        if (auto it = live_.find(e.addr); it != live_.end()) target_->record_stream(it->second.ptr, e.stream);
        break;
      case Op::stream_sync: target_->stream_synchronized(e.stream); break;
      case Op::oom:
        if (attempt_ooms_) attempt_failed(e);
        break;
      case Op::empty_cache: target_->empty_cache(); break;
      case Op::sleep:
        if (e.flags & trace::kFlagWake) {
          target_->wake(source.label(e.label));
        } else {
          target_->sleep(source.label(e.label), (e.flags & trace::kFlagKeepContents) != 0);
        }
        measure();
        break;
      case Op::iteration:
        if (step_at_iterations_) target_->step();
        if (++pass_.result.iterations == 2) pass_.at_second_iteration = target_->upstream();
        start_iteration();
        break;
      default: break;  // the recording allocator's own events: see baseline()
    }
  }

  // After apply(e) in the measured pass, when there is an observer.
  void observe(const TraceEvent& e) const {
    pass_.observer->after_event(ReplayPoint{pass_.result.device, pass_.result.events - 1, &e, requested_,
                                       target_->allocated(), target_->reserved()},
                           *this);
  }

  // A warm-up pass ended: measure the next pass only. The target carries over (the program runs
  // on), and the next pass starts from the window's starting state: every live block is freed,
  // in the trace's address order, and the next pass allocates the seed blocks again. (The blocks
  // the window left live stand for the seeds of the next pass: kept beside them, the next pass
  // would ask for more than the window does. A seed still live would be freed before its
  // allocation anyway; freed here, it lets each allocator start the pass from its cache alone.)
  // The measurements start again from the current state.
  void start_next_pass() {
    if (!pass_.window_started) start_window();
    free_all_live();
    pass_ = new_pass(pass_.number + 1, pass_.result.device);
  }

  ReplayResult finish_result() {
    if (!pass_.window_started) start_window();
    ReplayResult& r = pass_.result;
    const UpstreamCounts now = target_->upstream();
    r.upstream = now - pass_.at_window_start;
    if (r.iterations >= 2) r.upstream_after_first_iteration = now - pass_.at_second_iteration;
    end_iteration(now);
    r.final_reserved = target_->reserved();
    r.finish();
    return r;
  }

 private:
  struct Live {
    void* ptr;
    std::uint64_t size;
    std::uint64_t stream;
    std::uint32_t label;
  };

  void free_all_live() {
    std::vector<std::uint64_t> addrs;
    addrs.reserve(live_.size());
    for (const auto& [addr, live] : live_) addrs.push_back(addr);
    std::sort(addrs.begin(), addrs.end());
    for (const std::uint64_t addr : addrs) free_live(live_.find(addr));
  }


  // What one pass over the window measures: a new value per pass (start_next_pass()).
  struct Pass {
    int number = 0;                      // 0: the first (seed segments are adopted only then)
    ReplayObserver* observer = nullptr;  // ReplayOptions::observer in the measured pass, else null
    bool window_started = false;         // a non-seed event of this pass has been read
    UpstreamCounts at_window_start;      // the target's counts then ...
    UpstreamCounts at_second_iteration;  // ... and at the pass's second iteration marker
    UpstreamCounts at_iteration_start;   // ... and at its latest one
    ReplayResult result;
    std::unordered_set<std::uint64_t> failed;  // addresses whose allocation raised OOM
  };

  Pass new_pass(int number, int device) const {
    Pass p;
    p.number = number;
    p.observer = number == warmup_ ? observed_ : nullptr;
    p.result.allocator = target_->name();
    p.result.device = device;
    return p;
  }

  void start_window() {
    pass_.window_started = true;
    pass_.at_window_start = target_->upstream();
    pass_.at_second_iteration = pass_.at_window_start;
    if (pass_.number == 0) {
      pass_.result.seeding = pass_.at_window_start;
      pass_.result.seeding += target_->seeding_excluded();
    }
  }

  // A model adopting the recording allocator's segment can run out of device memory on a device
  // smaller than what that allocator held: a refused request like any other.
  void seed_segment(const TraceEvent& e) {
    try {
      target_->seed_segment(e);
    } catch (const OutOfMemoryError& oom) {
      refused(e, oom);
    }
    measure();
  }

  void refused(const TraceEvent& e, const OutOfMemoryError& oom) {
    if (++pass_.result.ooms != 1) return;
    pass_.result.first_oom = OomReport{pass_.result.device, pass_.result.events - 1, e.time_us, e.addr, e.label, oom.info()};
    if (pass_.observer != nullptr) pass_.observer->on_first_oom(*pass_.result.first_oom, *this);
  }

  void allocate(const TraceEvent& e, bool seed, std::string_view tag = {}) {
    if (e.size == 0) return;
    if (live_.count(e.addr) != 0) free_live(live_.find(e.addr));  // a reused address: the old block died
    ++pass_.result.allocs;
    try {
      void* p = seed            ? target_->seed_alloc(e)
                : tag.empty()   ? target_->allocate(e.size, e.stream)
                                : target_->allocate_tagged(e.size, e.stream, tag);
      live_.emplace(e.addr, Live{p, e.size, e.stream, e.label});
      requested_ += e.size;
    } catch (const OutOfMemoryError& oom) {
      refused(e, oom);
      pass_.failed.insert(e.addr);
    }
    measure();
  }

  // A request that failed in the recording run (ReplayOptions::attempt_ooms).
  void attempt_failed(const TraceEvent& e) {
    if (e.size == 0) return;
    try {
      target_->deallocate(target_->allocate(e.size, e.stream), e.size, e.stream);
    } catch (const OutOfMemoryError& oom) {
      refused(e, oom);  // an OOM like any other: first_oom is set when ooms > 0
    }
    measure();
  }

  // free_requested ends a block's life; a lone free_completed (a trace without requests) too.
  void free(const TraceEvent& e, bool requested) {
    auto it = live_.find(e.addr);
    if (it == live_.end()) {
      // The free of an allocation that failed (OOM) is expected; any other is the trace's.
      if (pass_.failed.erase(e.addr) == 0 && requested) ++pass_.result.unmatched_frees;
      return;
    }
    free_live(it);
    measure();
  }

  void free_live(std::unordered_map<std::uint64_t, Live>::iterator it) {
    ++pass_.result.frees;
    requested_ -= it->second.size;
    target_->deallocate(it->second.ptr, it->second.size, it->second.stream);
    live_.erase(it);
  }

  void measure() {
    const std::size_t reserved = target_->reserved();
    pass_.result.peak_reserved = std::max(pass_.result.peak_reserved, reserved);
    pass_.result.peak_allocated = std::max(pass_.result.peak_allocated, target_->allocated());
    if (requested_ > pass_.result.peak_requested) {
      pass_.result.peak_requested = requested_;
      pass_.result.reserved_at_requested_peak = reserved;
    }
    if (!pass_.result.per_iteration.empty()) {
      IterationResult& it = pass_.result.per_iteration.back();
      it.peak_requested = std::max(it.peak_requested, requested_);
      it.peak_reserved = std::max(it.peak_reserved, reserved);
    }
  }

  // The iteration underway, if any, ends with the target's counts at `now`: its calls.
  void end_iteration(const UpstreamCounts& now) {
    std::vector<IterationResult>& its = pass_.result.per_iteration;
    if (!its.empty()) its.back().upstream = now - pass_.at_iteration_start;
  }

  // An `iteration` marker: the iteration before it ends (its calls counted), the next begins
  // from what is live and held now.
  void start_iteration() {
    const UpstreamCounts now = target_->upstream();
    end_iteration(now);
    pass_.at_iteration_start = now;
    pass_.result.per_iteration.push_back(
        IterationResult{.upstream = {}, .peak_requested = requested_, .peak_reserved = target_->reserved()});
  }

  const bool attempt_ooms_;
  const bool step_at_iterations_;
  std::unique_ptr<ReplayTarget> target_;
  ReplayObserver* const observed_;   // ReplayOptions::observer
  const int warmup_;
  Pass pass_;
  std::unordered_map<std::uint64_t, Live> live_;  // carried over from pass to pass
  std::size_t requested_ = 0;                     // bytes the live blocks asked for
};

// The target's map with each live block's request and label from the trace.
std::optional<MemoryMap> DeviceReplay::memory_map() const {
  std::optional<MemoryMap> map = target_->memory_map();
  if (!map) return map;
  std::unordered_map<Address, const Live*> by_pointer;
  by_pointer.reserve(live_.size());
  for (const auto& [addr, live] : live_) by_pointer.emplace(reinterpret_cast<Address>(live.ptr), &live);
  for (MapSegment& s : map->segments) {
    for (MapBlock& b : s.blocks) {
      const auto it = b.state == BlockState::allocated ? by_pointer.find(b.address) : by_pointer.end();
      if (it == by_pointer.end()) continue;
      b.requested = it->second->size;
      b.label = it->second->label;
    }
  }
  return map;
}

using Devices = std::map<int, std::unique_ptr<DeviceReplay>>;

struct ProgressCount {
  std::uint64_t read;   // events read, every pass
  std::uint64_t every;  // ReplayOptions::progress_every (at least 1)
  std::uint64_t next;   // the count at which the callback is called next
};

// One pass over the source, or up to its first OOM on any device with OnOom::stop. Without a
// progress callback (kProgress false) nothing is counted, and without an observer of this pass
// (kObserve false) nothing is observed: the loop without either is the loop before they existed.
template <bool kProgress, bool kObserve>
void run_pass(EventSource& source, TraceEvent& e, const ReplayOptions& options, Devices& devices,
              ProgressCount& progress, OnOom on_oom) {
  while (source.next(e)) {
    if constexpr (kProgress) {
      if (++progress.read == progress.next) {
        options.progress(progress.read);
        progress.next += progress.every;
      }
    }
    const int d = e.device;
    if (options.device >= 0 && d != options.device) continue;
    auto& slot = devices[d];
    if (!slot) slot = std::make_unique<DeviceReplay>(options, d);
    slot->apply(e, source);
    if constexpr (kObserve) slot->observe(e);
    if (on_oom == OnOom::stop && slot->refused_any()) {
      slot->stop_at_oom();
      return;
    }
  }
}

}  // namespace

ReplayReport replay(EventSource& source, const ReplayOptions& options) {
  if (options.record_history && !options.make_target) require_export(options.allocator);  // before any work
  Devices devices;
  TraceEvent e;
  ProgressCount progress{0, std::max<std::uint64_t>(options.progress_every, 1), 0};
  progress.next = progress.every;
  auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass <= options.warmup; ++pass) {
    if (pass > 0) {
      source.rewind();
      for (auto& [d, replay] : devices) replay->start_next_pass();
      start = std::chrono::steady_clock::now();
    }
    const bool measured = pass == options.warmup;
    const bool observed = options.observer != nullptr && measured;
    const OnOom on_oom = measured ? options.on_oom : OnOom::go_on;
    if (options.progress) {
      observed ? run_pass<true, true>(source, e, options, devices, progress, on_oom)
               : run_pass<true, false>(source, e, options, devices, progress, on_oom);
    } else {
      observed ? run_pass<false, true>(source, e, options, devices, progress, on_oom)
               : run_pass<false, false>(source, e, options, devices, progress, on_oom);
    }
  }
  const std::uint64_t read = progress.read;
  const auto elapsed = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start);
  if (options.progress) options.progress(read);
  ReplayReport report;
  for (auto& [d, replay] : devices) report.devices.push_back(replay->finish_result());
  report.total = sum(report.devices, options.allocator);
  if (report.devices.size() == 1) report.total.device = report.devices[0].device;
  const auto ops = report.total.allocs + report.total.frees;
  report.total.host_ns_per_op = ops == 0 ? 0.0 : elapsed.count() / static_cast<double>(ops);
  for (auto& d : report.devices) d.host_ns_per_op = report.total.host_ns_per_op;
  if (options.record_history) {
    for (auto& [d, replay] : devices) report.memory.push_back(replay->memory_state());
    if (!devices.empty()) report.settings = devices.begin()->second->settings();
  }
  return report;
}

// --- baseline -------------------------------------------------------------------------------

namespace {

class DeviceBaseline {
 public:
  explicit DeviceBaseline(int device, const std::string& name) {
    b_.result.allocator = name;
    b_.result.device = device;
  }

  void apply(const TraceEvent& e) {
    ReplayResult& r = b_.result;
    ++r.events;
    switch (e.op) {
      case Op::seed_segment:
        reserve(e.size);
        ++r.seeding.allocs;
        break;
      case Op::segment_alloc: reserve(e.size); ++r.upstream.allocs; break;
      case Op::segment_map: reserve(e.size); ++r.upstream.maps; break;
      case Op::segment_free: release(e.size); ++r.upstream.frees; break;
      case Op::segment_unmap: release(e.size); ++r.upstream.unmaps; break;
      case Op::seed_alloc:
      case Op::alloc:
        if (e.size == 0) break;
        ++r.allocs;
        if (auto it = live_.find(e.addr); it != live_.end()) requested_ -= it->second;
        live_[e.addr] = e.size;
        requested_ += e.size;
        if (requested_ > r.peak_requested) {
          r.peak_requested = requested_;
          r.reserved_at_requested_peak = reserved_;
        }
        break;
      case Op::free_requested:
      case Op::free_completed:
        if (auto it = live_.find(e.addr); it != live_.end()) {
          ++r.frees;
          requested_ -= it->second;
          live_.erase(it);
        }
        break;
      case Op::oom: ++r.ooms; break;
      default: break;
    }
  }

  Baseline finish_baseline() {
    b_.result.final_reserved = reserved_;
    b_.result.finish();
    return b_;
  }

 private:
  void reserve(std::uint64_t bytes) {
    b_.present = true;
    reserved_ += bytes;
    b_.result.peak_reserved = std::max(b_.result.peak_reserved, reserved_);
  }
  void release(std::uint64_t bytes) {
    b_.present = true;
    reserved_ = reserved_ >= bytes ? reserved_ - bytes : 0;
  }

  Baseline b_;
  std::unordered_map<std::uint64_t, std::uint64_t> live_;
  std::size_t requested_ = 0;
  std::size_t reserved_ = 0;
};

}  // namespace

BaselineReport baseline(EventSource& source, const std::string& name, int device) {
  std::map<int, std::unique_ptr<DeviceBaseline>> devices;
  TraceEvent e;
  while (source.next(e)) {
    if (device >= 0 && e.device != device) continue;
    auto& slot = devices[e.device];
    if (!slot) slot = std::make_unique<DeviceBaseline>(e.device, name);
    slot->apply(e);
  }
  BaselineReport report;
  std::vector<ReplayResult> results;
  for (auto& [d, b] : devices) {
    report.devices.push_back(b->finish_baseline());
    report.total.present = report.total.present || report.devices.back().present;
    results.push_back(report.devices.back().result);
  }
  report.total.result = sum(results, name);
  if (results.size() == 1) report.total.result.device = results[0].device;
  return report;
}

}  // namespace tensorpool::replay
