// tensorpool_target.cpp: the real tensorpool Allocator as a replay target ("tensorpool", with the
// mode:fixed preset, and "tensorpool-vmm", the same with mode:vmm, the Allocator's default on a
// device with virtual memory; the target's conf, Config keys but `backend`, applies on top).
//
// Runs on a SimulatedDevice whose stream work completes at once (the replay has no kernels);
// trace stream ids are mapped to simulated streams on first use, and back in OOM reports and
// exported snapshots (the history recorder is attached on record_history()) and memory maps.
#include <algorithm>
#include <unordered_map>

#include "replay/models/models.hpp"
#include "tensorpool/allocator.hpp"
#include "tensorpool/key_values.hpp"

namespace tensorpool::replay {

namespace {

// The Config keys a replay takes: all but `backend`, the per-device registry's choice of device
// (a replay always runs on a SimulatedDevice).
const std::vector<std::string>& replay_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const std::string& k : Config::keys())
      if (k != "backend") out.push_back(k);
    return out;
  }();
  return keys;
}

// The preset of the target's name, then `conf` on top (errors name `origin`).
Config target_config(Mode preset, std::string_view conf, std::string_view origin) {
  for (const KeyValue& item : parse_key_values(conf, origin))
    if (item.key == "backend") throw_unknown_key(origin, item, replay_keys());
  Config c;
  c.mode = preset;
  // Deterministic replays: each epoch is planned by the free that ends it (a planner that keeps
  // up with the program; on a device the default plans in a thread, vmm.md).
  c.vmm_planner = PlannerMode::synchronous;
  c.apply(conf, origin);
  return c;
}

class TensorpoolTarget final : public ReplayTarget {
 public:
  TensorpoolTarget(const TargetOptions& o, std::string name, Mode preset)
      : name_(std::move(name)),
        device_(std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{
            .name = "sim" + std::to_string(o.device), .ordinal = o.device, .capacity = o.capacity,
            .event_mode = o.device_lag == 0 ? EventMode::immediate : EventMode::manual,
            .cost_model = o.cost_model})),
        alloc_(device_, target_config(preset, o.conf, name_ + " conf")),
        history_entries_(o.history_entries),
        device_lag_(o.device_lag),
        kernels_(o.device_lag == 0 ? 0 : device_->create_event()) {}
  ~TensorpoolTarget() override {
    if (kernels_ != 0) device_->destroy_event(kernels_);
  }
  TensorpoolTarget(const TensorpoolTarget&) = delete;
  TensorpoolTarget& operator=(const TensorpoolTarget&) = delete;

  std::string name() const override { return name_; }
  // With a lagging device, each allocation is followed by work on its stream (the kernels that
  // use the block), and the device catches up with all of it every device_lag_ allocations.
  void* allocate(std::size_t bytes, Stream stream) override {
    if (device_lag_ != 0 && ++allocations_ % device_lag_ == 0) device_->complete_all();  // the device catches up
    try {
      void* p = alloc_.allocate(bytes, map(stream));
      if (kernels_ != 0) device_->record_event(kernels_, map(stream));
      return p;
    } catch (const OutOfMemoryError& e) {
      throw OutOfMemoryError(in_trace_streams(e.info()));
    }
  }
  void* allocate_tagged(std::size_t bytes, Stream stream, std::string_view tag) override {
    const Tag scope(tag);
    return allocate(bytes, stream);
  }
  void deallocate(void* ptr, std::size_t, Stream) override { alloc_.deallocate(ptr); }
  // Sleep and wake as the program made them, in vmm mode (fixed segments hold their memory, as
  // the recording would have if it had not slept). A tag this replay never allocated under has
  // nothing to sleep, and a wake with nothing asleep nothing to map: both are skipped.
  void sleep(std::string_view tag, bool keep_contents) override {
    if (alloc_.config().mode != Mode::vmm) return;
    const Contents contents = keep_contents ? Contents::keep : Contents::discard;
    try {
      tag.empty() ? alloc_.sleep(contents) : alloc_.sleep(tag, contents);
    } catch (const UsageError&) {
    }
  }
  void wake(std::string_view tag) override {
    if (alloc_.config().mode != Mode::vmm) return;
    try {
      tag.empty() ? alloc_.wake() : alloc_.wake(tag);
    } catch (const UsageError&) {
    }
  }
  void record_stream(void* ptr, Stream stream) override { alloc_.record_stream(ptr, map(stream)); }
  void stream_synchronized(Stream stream) override { device_->complete_stream(map(stream)); }
  void empty_cache() override { alloc_.empty_cache(); }
  void step() override { alloc_.step(); }
  std::size_t reserved() const override { return alloc_.usage().reserved; }
  std::size_t allocated() const override { return alloc_.usage().allocated; }
  UpstreamCounts upstream() const override { return upstream_of(*device_); }

  bool record_history() override {
    if (!history_) {
      history_ = std::make_shared<trace::pytorch::HistoryRecorder>(history_entries_);
      alloc_.add_observer(history_);
      alloc_.add_oom_observer([h = history_](const OutOfMemoryInfo& i) { h->on_oom(i); });
    }
    return true;
  }

  trace::pytorch::DeviceMemory memory_state() const override {
    trace::pytorch::DeviceMemory m;
    m.state = alloc_.snapshot();
    if (history_) m.history = history_->entries();
    for (auto& seg : m.state.segments) seg.stream = trace_id(seg.stream);
    for (auto& h : m.history) h.event.stream = trace_id(h.event.stream);
    return m;
  }

  std::string settings() const override { return alloc_.config().to_string(); }

  std::optional<MemoryMap> memory_map() const override {
    return map_of_snapshot(alloc_.snapshot(), [this](Stream s) { return trace_id(s); });
  }

 private:
  Stream map(Stream trace_stream) {
    if (trace_stream == 0) return kDefaultStream;
    auto [it, inserted] = streams_.try_emplace(trace_stream, 0);
    if (inserted) it->second = device_->create_stream();
    return it->second;
  }

  // The trace's id of simulated stream `sim` (a trace uses a handful of streams).
  Stream trace_id(Stream sim) const {
    for (const auto& [trace_stream, s] : streams_)
      if (s == sim) return trace_stream;
    return sim;  // the default stream is 0 in both
  }

  // The OOM report in the trace's stream ids instead of the simulated device's.
  OutOfMemoryInfo in_trace_streams(OutOfMemoryInfo info) const {
    info.stream = trace_id(info.stream);
    for (auto& c : info.cached_per_stream) c.stream = trace_id(c.stream);
    std::sort(info.cached_per_stream.begin(), info.cached_per_stream.end(),
              [](const auto& a, const auto& b) { return a.stream < b.stream; });
    return info;
  }

  std::string name_;
  std::shared_ptr<SimulatedDevice> device_;
  Allocator alloc_;
  std::unordered_map<Stream, Stream> streams_;
  std::size_t history_entries_;
  std::size_t device_lag_;         // TargetOptions::device_lag
  std::uint64_t allocations_ = 0;  // made so far, for device_lag_
  DeviceEvent kernels_;            // recorded after each allocation with a lagging device: its
                                   // stream's work (0: no lag)
  std::shared_ptr<trace::pytorch::HistoryRecorder> history_;  // after record_history()
};

}  // namespace

std::unique_ptr<ReplayTarget> make_tensorpool_target(const TargetOptions& options) {
  return std::make_unique<TensorpoolTarget>(options, "tensorpool", Mode::fixed);
}

std::unique_ptr<ReplayTarget> make_tensorpool_vmm_target(const TargetOptions& options) {
  return std::make_unique<TensorpoolTarget>(options, "tensorpool-vmm", Mode::vmm);
}

TargetEntry tensorpool_entry() {
  return {{"tensorpool",
           "tensorpool's allocator with fixed segments (mode:fixed preset: what it does on a device "
           "without virtual memory; settings: include/tensorpool/config.hpp)",
           replay_keys(), /*holds_memory_until_destroyed=*/false,
           /*exports=*/true, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) {
            target_config(Mode::fixed, conf, origin);
          },
          make_tensorpool_target};
}

TargetEntry tensorpool_vmm_entry() {
  return {{"tensorpool-vmm",
           "tensorpool's allocator in virtual-memory mode (mode:vmm preset: its default on a device "
           "with virtual memory)",
           replay_keys(), /*holds_memory_until_destroyed=*/false,
           /*exports=*/true, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) {
            target_config(Mode::vmm, conf, origin);
          },
          make_tensorpool_vmm_target};
}

}  // namespace tensorpool::replay
