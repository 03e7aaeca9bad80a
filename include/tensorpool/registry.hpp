// tensorpool/registry.hpp: one process-wide Allocator per device, created on first use.
//
// The registry is what a framework plugs into: libtensorpool_torch.so (PyTorch), the C API's
// tensorpool_device_allocator() and C++ code that wants "the allocator of device N" all share it.
//
//   tensorpool::Allocator& a = tensorpool::device_allocator(0);  // from TENSORPOOL_CONF
//   void* p = a.allocate(1 << 20, stream);
//
// Each device's allocator is created on first use with the settings given to
// configure_device_allocators(), or else those of TENSORPOOL_CONF; the "backend" key
// (Config::backend: async, malloc, vmm or simulated) picks the DeviceBackend. Creation is
// thread-safe (one allocator per device however many threads race to it); a failed creation
// (bad settings, no such device) throws and is retried by the next call. Each allocator is
// recorded when TENSORPOOL_TRACE is set (tensorpool/record.hpp) and gets the NVTX annotations
// of the nvtx / nvtx_mem keys in builds with the CUDA toolkit (without it, those keys on are a
// ConfigError); the C API's own allocators too.
//
// Lifetime: the allocators are never destroyed (they outlive static destructors, so that
// memory freed during process exit, e.g. by a framework's own teardown, is still accepted;
// the CUDA backends stop calling CUDA once the process is exiting).
//
// Link tensorpool::registry (it brings tensorpool::trace, and tensorpool::cuda when tensorpool
// was built with CUDA).
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "tensorpool/allocator.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/device.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool {

/// Device ordinals the registry accepts: 0 .. kMaxRegistryDevices - 1.
inline constexpr int kMaxRegistryDevices = 64;
/// The capacity of a simulated device when none is given.
inline constexpr std::size_t kDefaultSimulatedCapacity = 80ULL << 30;

/// make_backend() was asked for a kind this build does not have.
class BackendUnavailableError : public UsageError {
 public:
  using UsageError::UsageError;
};

/// True when `kind` is built in (the CUDA kinds need tensorpool built with the CUDA toolkit).
bool backend_available(Backend kind) noexcept;
/// A backend of `kind` for device `device`. simulated: a SimulatedDevice of `simulated_capacity`
/// bytes whose stream work completes at once. Throws BackendUnavailableError naming the kind when
/// it is not built in, DeviceError when the device cannot be used.
std::shared_ptr<DeviceBackend> make_backend(Backend kind, int device,
                                            std::size_t simulated_capacity = kDefaultSimulatedCapacity);

/// Sets the settings (TENSORPOOL_CONF syntax) of device allocators created from now on; empty
/// text means the defaults. Throws ConfigError naming the bad key, UsageError when an allocator
/// already exists (settings cannot change under live memory).
void configure_device_allocators(std::string_view conf);
/// Forgets configure_device_allocators(): TENSORPOOL_CONF is read again at the next creation.
/// Throws UsageError when an allocator already exists.
void configure_device_allocators_from_env();

/// The allocator of `device`, created on first use. Throws UsageError for a device outside
/// 0..kMaxRegistryDevices-1 or an unavailable backend, ConfigError for bad settings (naming
/// the key and TENSORPOOL_CONF), DeviceError when the device cannot be used.
Allocator& device_allocator(int device);
/// The allocator of `device` if it was created, else nullptr. Never creates one.
Allocator* existing_device_allocator(int device) noexcept;
/// Ordinals whose allocator exists, ascending.
std::vector<int> device_allocator_ordinals();

/// empty_cache() on every existing device allocator.
void empty_device_caches();
/// step() on every existing device allocator.
void step_device_allocators();
/// Starts or stops recording the events of every device allocator (existing and future) for
/// dump_device_snapshot(); keeps the newest `max_entries` per device. Starting clears what was
/// recorded before.
void record_device_history(bool enabled, std::size_t max_entries = 100000);
/// Writes a PyTorch memory snapshot of every existing device allocator to `path`
/// (tensorpool/trace/pytorch_export.hpp), through a temporary file and a rename.
void dump_device_snapshot(const std::filesystem::path& path);

}  // namespace tensorpool
