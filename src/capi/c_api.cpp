// The C API (tensorpool/tensorpool.h): every function catches everything at the boundary, maps
// the exception to a status and keeps its message as the calling thread's last error.
#include "tensorpool/tensorpool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/device_allocator.hpp"
#include "capi/stats_figures.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/registry.hpp"

using tensorpool::capi::DeviceAllocator;

namespace {

struct LastError {
  tensorpool_status status = TENSORPOOL_OK;
  std::string message;
};
thread_local LastError t_last_error;

tensorpool_status fail(tensorpool_status status, const char* function, const char* what) noexcept {
  try {
    t_last_error.message = std::string(function) + ": " + what;
  } catch (...) {
    t_last_error.message.clear();  // no memory for the message; the status still tells
  }
  t_last_error.status = status;
  return status;
}

/// Runs `body` and turns whatever it throws into a status. An OutOfMemoryError is explained by
/// `oom_source` when given (its allocator's free cached bytes per stream).
template <class Body>
tensorpool_status guarded(const char* function, Body&& body,
                          const DeviceAllocator* oom_source = nullptr) noexcept {
  using namespace tensorpool;
  try {
    body();
    return TENSORPOOL_OK;
  } catch (const GraphPoolExhaustedError& e) {  // its own message: how much to reserve
    return fail(TENSORPOOL_ERROR_OUT_OF_MEMORY, function, e.what());
  } catch (const OutOfMemoryError& e) {
    std::string message = e.what();
    try {
      if (oom_source != nullptr) message = capi::describe_oom(oom_source->allocator(), e);
    } catch (...) {
    }
    return fail(TENSORPOOL_ERROR_OUT_OF_MEMORY, function, message.c_str());
  } catch (const ConfigError& e) {
    return fail(TENSORPOOL_ERROR_CONFIG, function, e.what());
  } catch (const BackendUnavailableError& e) {
    return fail(TENSORPOOL_ERROR_UNAVAILABLE, function, e.what());
  } catch (const UsageError& e) {
    return fail(TENSORPOOL_ERROR_USAGE, function, e.what());
  } catch (const DeviceError& e) {
    return fail(TENSORPOOL_ERROR_DEVICE, function, e.what());
  } catch (const InvariantError& e) {
    return fail(TENSORPOOL_ERROR_INTERNAL, function, e.what());
  } catch (const Error& e) {  // file errors of the snapshot writer
    return fail(TENSORPOOL_ERROR_IO, function, e.what());
  } catch (const std::bad_alloc&) {
    return fail(TENSORPOOL_ERROR_OUT_OF_MEMORY, function, "host memory exhausted");
  } catch (const std::exception& e) {
    return fail(TENSORPOOL_ERROR_INTERNAL, function, e.what());
  } catch (...) {
    return fail(TENSORPOOL_ERROR_INTERNAL, function, "unknown exception");
  }
}

DeviceAllocator* impl(tensorpool_allocator* a) { return reinterpret_cast<DeviceAllocator*>(a); }
tensorpool_allocator* handle(DeviceAllocator* a) { return reinterpret_cast<tensorpool_allocator*>(a); }

/// Fails with INVALID_ARGUMENT unless every pointer is non-null.
#define TP_REQUIRE(ptr)                                                                  \
  do {                                                                                   \
    if ((ptr) == nullptr)                                                                \
      return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__, #ptr " is NULL");         \
  } while (0)

bool valid_kind(tensorpool_backend kind) {
  return kind >= TENSORPOOL_BACKEND_SIMULATED && kind <= TENSORPOOL_BACKEND_CUDA_VMM;
}

tensorpool::Backend to_backend(tensorpool_backend kind) {
  switch (kind) {
    case TENSORPOOL_BACKEND_CUDA_ASYNC: return tensorpool::Backend::async;
    case TENSORPOOL_BACKEND_CUDA_MALLOC: return tensorpool::Backend::malloc;
    case TENSORPOOL_BACKEND_CUDA_VMM: return tensorpool::Backend::vmm;
    case TENSORPOOL_BACKEND_SIMULATED:
    case TENSORPOOL_BACKEND_INT_RANGE_: break;
  }
  return tensorpool::Backend::simulated;
}

tensorpool_backend to_c(tensorpool::Backend kind) {
  switch (kind) {
    case tensorpool::Backend::async: return TENSORPOOL_BACKEND_CUDA_ASYNC;
    case tensorpool::Backend::malloc: return TENSORPOOL_BACKEND_CUDA_MALLOC;
    case tensorpool::Backend::vmm: return TENSORPOOL_BACKEND_CUDA_VMM;
    case tensorpool::Backend::simulated: break;
  }
  return TENSORPOOL_BACKEND_SIMULATED;
}

tensorpool_stat to_c(const tensorpool::Stat& s) { return {s.current, s.peak, s.allocated, s.freed}; }

void fill_pool(tensorpool_pool_stats& out, const tensorpool::PoolStats& p,
               const tensorpool::capi::SnapshotFigures::Bytes& split) {
  using tensorpool::Metric;
  out.allocated_bytes = to_c(p[Metric::allocated_bytes]);
  out.requested_bytes = to_c(p[Metric::requested_bytes]);
  out.active_bytes = to_c(p[Metric::active_bytes]);
  out.reserved_bytes = to_c(p[Metric::reserved_bytes]);
  out.allocations = to_c(p[Metric::allocations]);
  out.active_blocks = to_c(p[Metric::active_blocks]);
  out.segments = to_c(p[Metric::segments]);
  out.inactive_split_bytes = static_cast<int64_t>(split.bytes);
  out.inactive_split_blocks = static_cast<int64_t>(split.blocks);
}

}  // namespace

extern "C" {

const char* tensorpool_last_error(void) { return t_last_error.message.c_str(); }
tensorpool_status tensorpool_last_status(void) { return t_last_error.status; }
int tensorpool_api_version(void) { return TENSORPOOL_C_API_VERSION; }

const char* tensorpool_status_name(tensorpool_status status) {
  switch (status) {
    case TENSORPOOL_OK: return "TENSORPOOL_OK";
    case TENSORPOOL_ERROR_INVALID_ARGUMENT: return "TENSORPOOL_ERROR_INVALID_ARGUMENT";
    case TENSORPOOL_ERROR_CONFIG: return "TENSORPOOL_ERROR_CONFIG";
    case TENSORPOOL_ERROR_OUT_OF_MEMORY: return "TENSORPOOL_ERROR_OUT_OF_MEMORY";
    case TENSORPOOL_ERROR_USAGE: return "TENSORPOOL_ERROR_USAGE";
    case TENSORPOOL_ERROR_DEVICE: return "TENSORPOOL_ERROR_DEVICE";
    case TENSORPOOL_ERROR_UNAVAILABLE: return "TENSORPOOL_ERROR_UNAVAILABLE";
    case TENSORPOOL_ERROR_IO: return "TENSORPOOL_ERROR_IO";
    case TENSORPOOL_ERROR_INTERNAL: return "TENSORPOOL_ERROR_INTERNAL";
  }
  return "unknown status";
}

int tensorpool_backend_available(tensorpool_backend kind) {
  return valid_kind(kind) && tensorpool::backend_available(to_backend(kind)) ? 1 : 0;
}

tensorpool_status tensorpool_create(tensorpool_backend kind, int device, size_t simulated_capacity,
                                    const char* config, tensorpool_allocator** out) {
  TP_REQUIRE(out);
  *out = nullptr;
  if (!valid_kind(kind))
    return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__, "unknown backend kind");
  if (device < 0) return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__, "device is negative");
  return guarded(__func__, [&] {
    constexpr std::string_view origin = "tensorpool_create() config";
    const tensorpool::Config c = tensorpool::Config::parse(config == nullptr ? "" : config, origin);
    *out = handle(new DeviceAllocator(to_backend(kind), device, c, simulated_capacity, false, origin));
  });
}

tensorpool_status tensorpool_destroy(tensorpool_allocator* allocator) {
  if (allocator == nullptr) return TENSORPOOL_OK;
  if (impl(allocator)->from_registry()) {
    return fail(TENSORPOOL_ERROR_USAGE, __func__,
                "a device allocator of the registry cannot be destroyed (it lives until exit)");
  }
  return guarded(__func__, [&] { delete impl(allocator); });
}

tensorpool_status tensorpool_configure(const char* config) {
  return guarded(__func__, [&] {
    if (config == nullptr) {
      tensorpool::configure_device_allocators_from_env();
      tensorpool::capi::registry::check_settings();
    } else {
      tensorpool::configure_device_allocators(config);
    }
  });
}

tensorpool_status tensorpool_device_allocator(int device, tensorpool_allocator** out) {
  TP_REQUIRE(out);
  *out = nullptr;
  if (device < 0 || device >= tensorpool::kMaxRegistryDevices)
    return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__, "device is outside 0..63");
  return guarded(__func__, [&] { *out = handle(&tensorpool::capi::registry::entry(device)); });
}

tensorpool_status tensorpool_existing_device_allocator(int device, tensorpool_allocator** out) {
  TP_REQUIRE(out);
  *out = handle(tensorpool::capi::registry::existing(device));
  return TENSORPOOL_OK;
}

tensorpool_status tensorpool_empty_cache_all(void) {
  return guarded(__func__, [] { tensorpool::empty_device_caches(); });
}

tensorpool_status tensorpool_step_all(void) {
  return guarded(__func__, [] { tensorpool::step_device_allocators(); });
}

tensorpool_status tensorpool_record_history_all(int enabled, size_t max_entries) {
  return guarded(__func__, [&] { tensorpool::record_device_history(enabled != 0, max_entries); });
}

tensorpool_status tensorpool_dump_snapshot(const char* path) {
  TP_REQUIRE(path);
  return guarded(__func__, [&] { tensorpool::dump_device_snapshot(path); });
}

tensorpool_status tensorpool_alloc(tensorpool_allocator* allocator, size_t size,
                                   tensorpool_stream stream, void** out) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(out);
  *out = nullptr;
  DeviceAllocator* a = impl(allocator);
  return guarded(__func__, [&] { *out = a->allocator().allocate(size, stream); }, a);
}

tensorpool_status tensorpool_free(tensorpool_allocator* allocator, void* ptr) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().deallocate(ptr); });
}

tensorpool_status tensorpool_record_stream(tensorpool_allocator* allocator, void* ptr,
                                           tensorpool_stream stream) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(ptr);
  return guarded(__func__, [&] { impl(allocator)->allocator().record_stream(ptr, stream); });
}

tensorpool_status tensorpool_empty_cache(tensorpool_allocator* allocator) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().empty_cache(); });
}

tensorpool_status tensorpool_step(tensorpool_allocator* allocator) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().step(); });
}

namespace {

tensorpool_sleep_report to_c(const tensorpool::SleepReport& r) {
  return {r.released_bytes, r.asleep_bytes, r.asleep_blocks, r.asleep_allocated, r.kept_bytes};
}

}  // namespace

tensorpool_status tensorpool_sleep(tensorpool_allocator* allocator, const char* tag, int keep_contents,
                                   tensorpool_sleep_report* out) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] {
    tensorpool::Allocator& a = impl(allocator)->allocator();
    const auto contents = keep_contents != 0 ? tensorpool::Contents::keep : tensorpool::Contents::discard;
    const tensorpool::SleepReport r = tag != nullptr ? a.sleep(tag, contents) : a.sleep(contents);
    if (out != nullptr) *out = to_c(r);
  });
}

tensorpool_status tensorpool_wake(tensorpool_allocator* allocator, const char* tag) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] {
    tensorpool::Allocator& a = impl(allocator)->allocator();
    if (tag != nullptr) {
      a.wake(tag);
    } else {
      a.wake();
    }
  });
}

namespace {

thread_local std::vector<std::unique_ptr<tensorpool::Tag>> tag_scopes;  // the C caller's, innermost last

}  // namespace

tensorpool_status tensorpool_push_tag(const char* name) {
  TP_REQUIRE(name);
  return guarded(__func__, [&] { tag_scopes.push_back(std::make_unique<tensorpool::Tag>(name)); });
}

tensorpool_status tensorpool_pop_tag(void) {
  if (tag_scopes.empty())
    return fail(TENSORPOOL_ERROR_USAGE, __func__, "no tag was pushed on this thread");
  tag_scopes.pop_back();
  return TENSORPOOL_OK;
}

tensorpool_status tensorpool_asleep(tensorpool_allocator* allocator, tensorpool_sleep_report* out) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(out);
  return guarded(__func__, [&] { *out = to_c(impl(allocator)->allocator().asleep()); });
}

tensorpool_status tensorpool_is_asleep(tensorpool_allocator* allocator, const void* ptr, int* out) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(out);
  return guarded(__func__, [&] { *out = impl(allocator)->allocator().is_asleep(ptr) ? 1 : 0; });
}

tensorpool_status tensorpool_begin_capture(tensorpool_allocator* allocator, tensorpool_stream stream,
                                           size_t reserve, tensorpool_graph_pool* out) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(out);
  return guarded(__func__, [&] { *out = impl(allocator)->allocator().begin_capture(stream, reserve).id; });
}

tensorpool_status tensorpool_join_capture(tensorpool_allocator* allocator, tensorpool_stream stream,
                                          tensorpool_graph_pool pool, size_t more) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().begin_capture(stream, tensorpool::GraphPool{pool}, more); });
}

tensorpool_status tensorpool_end_capture(tensorpool_allocator* allocator, tensorpool_stream stream) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().end_capture(stream); });
}

tensorpool_status tensorpool_release_graph(tensorpool_allocator* allocator, tensorpool_graph_pool pool) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().release_graph(tensorpool::GraphPool{pool}); });
}

tensorpool_status tensorpool_graph_pools(tensorpool_allocator* allocator, tensorpool_graph_pool_info* out,
                                         size_t capacity, size_t* count) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(count);
  if (capacity != 0 && out == nullptr)
    return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__, "out is NULL but capacity is not 0");
  return guarded(__func__, [&] {
    const std::vector<tensorpool::GraphPoolInfo> pools = impl(allocator)->allocator().graph_pools();
    *count = pools.size();
    for (std::size_t i = 0; i < pools.size() && i < capacity; ++i) {
      const tensorpool::GraphPoolInfo& p = pools[i];
      out[i] = {p.id, p.reserved, p.allocated, p.peak_allocated, p.blocks, p.largest_free,
                p.capturing.size(), p.released ? 1 : 0};
    }
  });
}

tensorpool_status tensorpool_set_memory_fraction(tensorpool_allocator* allocator, double fraction) {
  TP_REQUIRE(allocator);
  if (!(fraction >= 0.0 && fraction <= 1.0))  // NaN fails too
    return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__, "fraction must be in [0, 1]");
  return guarded(__func__, [&] {
    tensorpool::Allocator& a = impl(allocator)->allocator();
    const std::size_t capacity = a.device().properties().capacity;
    // A limit of 0 means "none": a zero fraction allows nothing, so it becomes one byte.
    const auto bytes = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(capacity)));
    a.set_memory_limit(fraction >= 1.0 ? capacity : std::max<std::size_t>(bytes, 1));
  });
}

tensorpool_status tensorpool_set_memory_limit(tensorpool_allocator* allocator, size_t bytes) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().set_memory_limit(bytes); });
}

tensorpool_status tensorpool_reset_peaks(tensorpool_allocator* allocator) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().reset_peaks(); });
}

tensorpool_status tensorpool_check_invariants(tensorpool_allocator* allocator) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->allocator().check_invariants(); });
}

tensorpool_status tensorpool_info(tensorpool_allocator* allocator, int* device, tensorpool_backend* kind) {
  TP_REQUIRE(allocator);
  if (device != nullptr) *device = impl(allocator)->device();
  if (kind != nullptr) *kind = to_c(impl(allocator)->kind());
  return TENSORPOOL_OK;
}

tensorpool_status tensorpool_create_stream(tensorpool_allocator* allocator, tensorpool_stream* out) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(out);
  tensorpool::SimulatedDevice* sim = impl(allocator)->simulated();
  if (sim == nullptr) {
    return fail(TENSORPOOL_ERROR_UNAVAILABLE, __func__,
                "streams of a CUDA backend come from cudaStreamCreate(), not from tensorpool");
  }
  return guarded(__func__, [&] { *out = sim->create_stream(); });
}

tensorpool_status tensorpool_get_stats(tensorpool_allocator* allocator, tensorpool_stats* out) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(out);
  return guarded(__func__, [&] {
    const tensorpool::Allocator& a = impl(allocator)->allocator();
    const tensorpool::Stats s = a.stats();
    const tensorpool::capi::SnapshotFigures f = tensorpool::capi::snapshot_figures(a.snapshot());
    tensorpool_stats r;
    std::memset(&r, 0, sizeof r);
    fill_pool(r.all, s.total, f.inactive_split_all);
    fill_pool(r.small_pool, s.of(tensorpool::Pool::small), f.inactive_split[0]);
    fill_pool(r.large_pool, s.of(tensorpool::Pool::large), f.inactive_split[1]);
    r.alloc_calls = s.alloc_calls;
    r.free_calls = s.free_calls;
    r.device_allocs = s.upstream_allocs;
    r.device_alloc_failures = s.upstream_alloc_failures;
    r.device_frees = s.upstream_frees;
    r.device_maps = s.vm_maps;
    r.device_unmaps = s.vm_unmaps;
    r.syncs = s.syncs;
    r.stream_waits = s.stream_waits;
    r.retries = s.retries;
    r.ooms = s.ooms;
    r.memory_limit = a.memory_limit();
    r.capacity = a.device().properties().capacity;
    r.largest_free_block = a.fragmentation().largest_free;
    r.oversize_allocations = f.oversize_allocations;
    r.oversize_segments = f.oversize_segments;
    *out = r;
  });
}

tensorpool_status tensorpool_stats_json(tensorpool_allocator* allocator, char* buffer, size_t capacity,
                                        size_t* length) {
  TP_REQUIRE(allocator);
  if (buffer == nullptr && capacity != 0) TP_REQUIRE(buffer);
  std::string json;
  const tensorpool_status st =
      guarded(__func__, [&] { json = tensorpool::capi::stats_json(impl(allocator)->allocator()); });
  if (st != TENSORPOOL_OK) return st;
  if (length != nullptr) *length = json.size();
  if (capacity <= json.size()) {
    return fail(TENSORPOOL_ERROR_INVALID_ARGUMENT, __func__,
                ("buffer of " + std::to_string(capacity) + " bytes; " +
                 std::to_string(json.size() + 1) + " needed")
                    .c_str());
  }
  std::memcpy(buffer, json.c_str(), json.size() + 1);
  return TENSORPOOL_OK;
}

tensorpool_status tensorpool_record_history(tensorpool_allocator* allocator, int enabled,
                                            size_t max_entries) {
  TP_REQUIRE(allocator);
  return guarded(__func__, [&] { impl(allocator)->record_history(enabled != 0, max_entries); });
}

tensorpool_status tensorpool_write_snapshot(tensorpool_allocator* allocator, const char* path) {
  TP_REQUIRE(allocator);
  TP_REQUIRE(path);
  return guarded(__func__, [&] {
    namespace tp = tensorpool::trace::pytorch;
    tp::check_writable(path);
    const DeviceAllocator* a = impl(allocator);
    const std::string bytes = tp::snapshot_pickle(
        {a->memory()}, tp::settings_from_conf(a->allocator().config().to_string()));
    tp::write_file_atomically(path, bytes);
  });
}

}  // extern "C"
