// The process-wide registry of device allocators (tensorpool/registry.hpp).
//
// Invariants:
//  - entries_[d] is null until device d's allocator is created, then points to it forever (the
//    registry and its allocators are never destroyed: see the header on lifetime);
//  - entries_ is written only under mutex_ (creation is serialised, so one allocator per device
//    however many threads race to it); reads are lock-free (acquire loads);
//  - conf_ and the history settings change only under mutex_; conf_ cannot change once any
//    entry exists.
#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "capi/device_allocator.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/registry.hpp"

namespace tensorpool {

namespace {

class Registry {
  static constexpr std::string_view kConfigured = "tensorpool_configure()";

 public:
  capi::DeviceAllocator* existing(int device) const noexcept {
    if (device < 0 || device >= kMaxRegistryDevices) return nullptr;
    return entries_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  }

  capi::DeviceAllocator& entry(int device) {
    if (capi::DeviceAllocator* e = existing(device)) return *e;
    if (device < 0 || device >= kMaxRegistryDevices) {
      throw UsageError("device ordinal " + std::to_string(device) + " is outside 0.." +
                       std::to_string(kMaxRegistryDevices - 1));
    }
    std::lock_guard lock(mutex_);
    auto& slot = entries_[static_cast<std::size_t>(device)];
    if (capi::DeviceAllocator* e = slot.load(std::memory_order_relaxed)) return *e;
    const Config config = settings();
    auto* created = new capi::DeviceAllocator(config.backend, device, config, 0, true, origin());
    if (history_enabled_) created->record_history(true, history_max_);
    slot.store(created, std::memory_order_release);
    return *created;
  }

  void configure(std::optional<std::string> conf) {
    std::lock_guard lock(mutex_);
    if (any_exists()) {
      throw UsageError("the device allocators' settings cannot change: an allocator already exists "
                       "(configure before the first allocation)");
    }
    if (conf) capi::check_layers_available(Config::parse(*conf, kConfigured), kConfigured);  // ConfigError
    conf_ = std::move(conf);
  }

  /// The settings of the next allocator; throws ConfigError naming origin() and the key.
  Config settings() const {
    const Config config = conf_ ? Config::parse(*conf_, kConfigured) : Config::from_env();
    capi::check_layers_available(config, origin());
    return config;
  }
  /// Where settings() comes from, for error messages.
  std::string_view origin() const noexcept { return conf_ ? kConfigured : "TENSORPOOL_CONF"; }

  void check_settings() const {
    std::lock_guard lock(mutex_);
    settings();
  }

  void record_history(bool enabled, std::size_t max_entries) {
    std::lock_guard lock(mutex_);
    history_enabled_ = enabled;
    history_max_ = max_entries;
    for (int d = 0; d < kMaxRegistryDevices; ++d)
      if (capi::DeviceAllocator* e = existing(d)) e->record_history(enabled, max_entries);
  }

 private:
  bool any_exists() const noexcept {
    for (int d = 0; d < kMaxRegistryDevices; ++d)
      if (existing(d) != nullptr) return true;
    return false;
  }

  mutable std::mutex mutex_;
  std::array<std::atomic<capi::DeviceAllocator*>, kMaxRegistryDevices> entries_{};
  std::optional<std::string> conf_;  // nullopt: TENSORPOOL_CONF
  bool history_enabled_ = false;
  std::size_t history_max_ = 0;
};

Registry& the_registry() {
  static Registry* registry = new Registry;  // never destroyed (see the header)
  return *registry;
}

}  // namespace

namespace capi::registry {
DeviceAllocator& entry(int device) { return the_registry().entry(device); }
DeviceAllocator* existing(int device) noexcept { return the_registry().existing(device); }
void check_settings() { the_registry().check_settings(); }
}  // namespace capi::registry

void configure_device_allocators(std::string_view conf) { the_registry().configure(std::string(conf)); }
void configure_device_allocators_from_env() { the_registry().configure(std::nullopt); }

Allocator& device_allocator(int device) { return the_registry().entry(device).allocator(); }

Allocator* existing_device_allocator(int device) noexcept {
  capi::DeviceAllocator* e = the_registry().existing(device);
  return e == nullptr ? nullptr : &e->allocator();
}

std::vector<int> device_allocator_ordinals() {
  std::vector<int> out;
  for (int d = 0; d < kMaxRegistryDevices; ++d)
    if (the_registry().existing(d) != nullptr) out.push_back(d);
  return out;
}

void empty_device_caches() {
  for (int d : device_allocator_ordinals()) the_registry().existing(d)->allocator().empty_cache();
}

void step_device_allocators() {
  for (int d : device_allocator_ordinals()) the_registry().existing(d)->allocator().step();
}

void record_device_history(bool enabled, std::size_t max_entries) {
  the_registry().record_history(enabled, max_entries);
}

void dump_device_snapshot(const std::filesystem::path& path) {
  trace::pytorch::check_writable(path);
  std::vector<trace::pytorch::DeviceMemory> devices;
  std::string conf;
  for (int d : device_allocator_ordinals()) {
    const capi::DeviceAllocator* e = the_registry().existing(d);
    devices.push_back(e->memory());
    if (conf.empty()) conf = e->allocator().config().to_string();
  }
  trace::pytorch::write_file_atomically(
      path, trace::pytorch::snapshot_pickle(devices, trace::pytorch::settings_from_conf(conf)));
}

}  // namespace tensorpool
