// DeviceAllocator: an Allocator with its backend and its history recorder (see
// device_allocator.hpp).
#include "capi/device_allocator.hpp"

#include <fmt/format.h>

#include "tensorpool/errors.hpp"
#include "tensorpool/registry.hpp"

namespace tensorpool::capi {

namespace {
// Snapshots taken while other threads allocate are retried until no event slipped in between;
// this many tries means the allocator never paused.
constexpr int kSnapshotAttempts = 1000;
}  // namespace

DeviceAllocator::DeviceAllocator(Backend kind, int device, const Config& config,
                                 std::size_t simulated_capacity, bool from_registry,
                                 std::string_view settings_origin)
    : kind_(kind), device_(device), from_registry_(from_registry) {
  check_layers_available(config, settings_origin);
  std::shared_ptr<DeviceBackend> backend = make_backend(kind, device, simulated_capacity);
  simulated_ = std::dynamic_pointer_cast<SimulatedDevice>(backend);
  allocator_ = std::make_unique<Allocator>(with_layers(std::move(backend), config), config);
  attach_layers(*allocator_);
}

DeviceAllocator::~DeviceAllocator() = default;

void DeviceAllocator::record_history(bool enabled, std::size_t max_entries) {
  std::lock_guard lock(hooks_mutex_);
  if (max_entries == 0) max_entries = trace::pytorch::HistoryRecorder::kDefaultMaxEntries;
  if (!enabled) {
    if (observer_ != 0) allocator_->remove_hook(observer_);
    if (oom_observer_ != 0) allocator_->remove_hook(oom_observer_);
    observer_ = oom_observer_ = 0;
    history_.reset();  // a history that stops early would contradict the state that follows it
    return;
  }
  if (history_) {
    history_->set_max_entries(max_entries);
    history_->clear();
    return;
  }
  history_ = std::make_shared<trace::pytorch::HistoryRecorder>(max_entries);
  observer_ = allocator_->add_observer(history_);
  oom_observer_ = allocator_->add_oom_observer(
      [h = history_](const OutOfMemoryInfo& info) { h->on_oom(info); });
}

trace::pytorch::DeviceMemory DeviceAllocator::memory() const {
  trace::pytorch::DeviceMemory m;
  m.device = device_;
  std::shared_ptr<trace::pytorch::HistoryRecorder> history;
  {
    std::lock_guard lock(hooks_mutex_);
    history = history_;
  }
  if (!history) {
    m.state = allocator_->snapshot();
    return m;
  }
  // Events are recorded under the allocator's lock, which snapshot() takes too: if the count
  // did not move across the snapshot, the entries read are exactly those before it.
  for (int attempt = 0; attempt < kSnapshotAttempts; ++attempt) {
    const std::uint64_t before = history->recorded();
    Snapshot state = allocator_->snapshot();
    std::vector<trace::pytorch::HistoryEntry> entries = history->entries();
    if (history->recorded() == before) {
      m.state = std::move(state);
      m.history = std::move(entries);
      return m;
    }
  }
  throw Error(fmt::format("device {}: no consistent snapshot after {} attempts: the allocator is "
                          "never idle; take the snapshot between steps",
                          device_, kSnapshotAttempts));
}

}  // namespace tensorpool::capi
