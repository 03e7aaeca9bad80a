// capi/device_allocator.hpp (internal): an Allocator together with what it owns (its backend and
// the recorder of its history), the unit behind a C API handle and a registry entry, with the
// optional layers it gets from its settings and the environment (NVTX, TENSORPOOL_TRACE); and
// the registry's internal entry points, shared by registry.cpp, c_api.cpp and the PyTorch library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "tensorpool/allocator.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/trace/pytorch_export.hpp"

namespace tensorpool::capi {

class DeviceAllocator {
 public:
  /// Throws what make_backend() and the Allocator constructor throw, and ConfigError naming
  /// `settings_origin` for an NVTX key this build cannot honour (check_layers_available()).
  DeviceAllocator(Backend kind, int device, const Config& config, std::size_t simulated_capacity,
                  bool from_registry, std::string_view settings_origin);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  Allocator& allocator() noexcept { return *allocator_; }
  const Allocator& allocator() const noexcept { return *allocator_; }
  int device() const noexcept { return device_; }
  Backend kind() const noexcept { return kind_; }
  bool from_registry() const noexcept { return from_registry_; }
  /// The simulated device behind a simulated allocator, else nullptr.
  SimulatedDevice* simulated() const noexcept { return simulated_.get(); }

  /// Attaches (clearing what was recorded) or detaches the history recorder.
  void record_history(bool enabled, std::size_t max_entries);
  /// The segments now and the history that leads to them (the history is read before and after
  /// the snapshot until no event slipped in between, so the two agree).
  trace::pytorch::DeviceMemory memory() const;

 private:
  const Backend kind_;
  const int device_;
  const bool from_registry_;
  std::shared_ptr<SimulatedDevice> simulated_;
  std::unique_ptr<Allocator> allocator_;
  std::shared_ptr<trace::pytorch::HistoryRecorder> history_;
  mutable std::mutex hooks_mutex_;  // guards the two hook ids
  HookId observer_ = 0;
  HookId oom_observer_ = 0;
};

/// The optional layers (layers.cpp). check_layers_available() throws ConfigError, naming
/// `origin` and the key, for nvtx or nvtx_mem on in a build without NVTX (no CUDA toolkit).
/// with_layers() wraps a new allocator's backend for NVTX; attach_layers() attaches the NVTX
/// observer and, when TENSORPOOL_TRACE is set, the process-wide recording.
void check_layers_available(const Config& config, std::string_view origin);
std::shared_ptr<DeviceBackend> with_layers(std::shared_ptr<DeviceBackend> backend, const Config& config);
void attach_layers(Allocator& allocator);

enum class LogLevel : std::uint8_t { warning, error };
/// Writes to tensorpool's logger; never throws (falls back to stderr).
void log_message(LogLevel level, const std::string& message) noexcept;

/// The OutOfMemoryError message with the free cached bytes of each stream appended.
std::string describe_oom(const Allocator& allocator, const OutOfMemoryError& error);

/// PyTorch's memory_stats_as_nested_dict() as JSON.
std::string stats_json(const Allocator& allocator);

namespace registry {
/// The entry of `device`, created on first use (see tensorpool/registry.hpp).
DeviceAllocator& entry(int device);
/// nullptr when it does not exist.
DeviceAllocator* existing(int device) noexcept;
/// Validates the settings the next creation would use (TENSORPOOL_CONF unless configured);
/// throws ConfigError naming the key.
void check_settings();
}  // namespace registry

}  // namespace tensorpool::capi
