// testing/state.hpp (internal): the state of the CUDA-runtime test double and the wrappers every
// exported function runs its body in.
//
// Invariants (all under State::mutex):
//  - user-visible addresses are the simulated ones moved into a region of their own per
//    simulated device (to_user / to_sim), so devices, host memory and reservations never
//    collide;
//  - allocations, streams, events, pools, physical handles, reservations and mappings hold
//    exactly what is live; handles are never reused within one reset() generation;
//  - a PhysicalRec's memory is returned to its simulated device when it is released and no
//    mapping uses it any more.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "testing/control.hpp"

namespace tensorpool::cuda_double::detail {

inline constexpr int kMaxDevices = 6;
inline constexpr int kHostRegion = 6;
inline constexpr int kVaRegion = 7;
inline constexpr std::size_t kSegmentGranularity = 2 * MiB;

enum class AllocKind : std::uint8_t { device, pool, host };

struct Allocation {
  int device;  // -1: host
  std::size_t bytes;  // as rounded by the simulated device
  AllocKind kind;
};
struct StreamRec {
  int device;
  Stream sim;
};
struct EventRec {
  int device;
  DeviceEvent sim;
  unsigned flags;
};
struct PoolRec {
  int device;
  std::uint64_t release_threshold = 0;
};
struct PhysicalRec {
  int device;
  PhysicalHandle sim;
  std::size_t bytes;
  bool released = false;
  int maps = 0;
  std::vector<unsigned char> contents;  // what cudaMemcpy wrote (made on first use)
};
struct MappingRec {
  std::size_t bytes;
  std::uint64_t handle;
  std::vector<unsigned> access;  // per device
  std::size_t offset = 0;        // into the handle's bytes
};
/// A stream being captured (cudaStreamBeginCapture .. cudaStreamEndCapture).
struct CaptureRec {
  cudaStreamCaptureMode mode;
  std::thread::id thread;    // the thread that began it (thread-local mode's scope)
  bool invalidated = false;  // a call CUDA forbids during the capture was made
};
struct Fault {
  std::string key;
  std::uint64_t countdown;
  int error;
};
/// A stream handle resolved to its device and simulated stream.
struct Resolved {
  int device;
  Stream sim;
};

struct State {
  std::mutex mutex;
  Options options;
  std::uint64_t generation = 1;
  std::vector<std::shared_ptr<SimulatedDevice>> devices;
  std::shared_ptr<SimulatedDevice> host;
  std::shared_ptr<SimulatedDevice> va;  // the process-wide virtual address space
  std::map<Address, Allocation> allocations;  // by user address
  std::unordered_map<std::uintptr_t, StreamRec> streams;
  std::map<std::pair<std::thread::id, int>, Stream> per_thread;  // (thread, device)
  std::unordered_map<std::uintptr_t, EventRec> events;
  std::unordered_map<std::uintptr_t, PoolRec> pools;
  std::unordered_map<std::uint64_t, PhysicalRec> physical;
  std::map<Address, std::size_t> reservations;
  std::map<Address, MappingRec> mappings;
  std::map<std::pair<int, Stream>, CaptureRec> captures;  // by (device, simulated stream)
  std::set<std::uintptr_t> graphs;                         // from cudaStreamEndCapture, not destroyed
  std::map<Address, std::vector<unsigned char>> host_contents;  // cudaHostAlloc'd bytes cudaMemcpy touched
  std::uint64_t next_id = 1;
  bool shutdown = false;
  std::vector<Fault> faults;
  std::map<std::string, std::uint64_t, std::less<>> calls;
  std::vector<Call> log;
  std::uint64_t total_calls = 0;

  State();
  void rebuild(const Options& options);
};

State& state();

/// The calling thread's current device / last error in this generation.
int& current_device(State& s);
cudaError_t& last_error(State& s);

/// Counts a call; true when an armed fault fires for it (its error in `error`).
void record_call(State& s, const char* name);
bool take_fault(State& s, const char* name, bool driver, int& error);

bool valid_device(const State& s, int device) noexcept;
/// The options of device `d` (per_device when it has an entry, else the common ones).
const DeviceOptions& device_options(const Options& o, int d);
SimulatedDevice& device(State& s, int d);
Address to_user(int region, Address sim) noexcept;
Address to_sim(int region, Address user) noexcept;
SimulatedDeviceOptions sim_options(std::size_t capacity, std::size_t granularity,
                                   std::size_t page, EventMode mode);

/// Handles of streams, events and pools: a kind tag in the high bits, an id below.
inline constexpr std::uintptr_t kStreamTag = 0x5157ULL << 32;
inline constexpr std::uintptr_t kEventTag = 0xE7E7ULL << 32;
inline constexpr std::uintptr_t kPoolTag = 0x9001ULL << 32;
inline constexpr std::uintptr_t kGraphTag = 0x6AF0ULL << 32;
inline constexpr std::uint64_t kPhysicalTag = 0xF00DULL << 32;
std::uintptr_t new_handle(State& s, std::uintptr_t tag) noexcept;

/// Resolves 0 / cudaStreamLegacy / cudaStreamPerThread / created streams. `per_thread_api`:
/// the call is a _ptsz one, where 0 means the per-thread stream. False: unknown handle.
bool resolve_stream(State& s, cudaStream_t stream, bool per_thread_api, Resolved& out);

/// Whether `name` is a call CUDA forbids while a stream is captured (one that may synchronize or
/// change memory: cudaMalloc, cudaFree, synchronizations, event queries, cuMem*) and a capture
/// it applies to is underway: every capture in global mode, and the calling thread's in
/// thread-local mode. Those captures are invalidated (their cudaStreamEndCapture fails).
bool capture_forbids(State& s, const char* name);
/// The capture of stream r, or nullptr.
CaptureRec* capture_of(State& s, const Resolved& r);

/// Runs `body(State&)` for the runtime function `name`: locks, counts, applies shutdown and
/// faults, refuses a call a stream capture forbids (cudaErrorStreamCaptureUnsupported), turns a simulated-device exception into cudaErrorInvalidValue, and records a
/// failure as the thread's last error.
/// cudaMemcpy (plain and _ptds): host memory <-> pages mapped with cuMemMap (state.cpp).
cudaError_t memcpy_sync(State& s, void* dst, const void* src, std::size_t count, cudaMemcpyKind kind);

template <class Body>
cudaError_t runtime_call(const char* name, Body&& body) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  record_call(s, name);
  cudaError_t err = cudaSuccess;
  int fault = 0;
  if (s.shutdown) {
    err = cudaErrorCudartUnloading;
  } else if (take_fault(s, name, false, fault)) {
    err = static_cast<cudaError_t>(fault);
  } else if (capture_forbids(s, name)) {
    err = cudaErrorStreamCaptureUnsupported;
  } else {
    try {
      err = body(s);
    } catch (const std::exception&) {
      err = cudaErrorInvalidValue;
    }
  }
  if (err != cudaSuccess) last_error(s) = err;
  return err;
}

/// The driver-API counterpart of runtime_call (the driver keeps no last error).
template <class Body>
CUresult driver_call(const char* name, Body&& body) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  record_call(s, name);
  int fault = 0;
  if (s.shutdown) return CUDA_ERROR_DEINITIALIZED;
  if (take_fault(s, name, true, fault)) return static_cast<CUresult>(fault);
  if (capture_forbids(s, name)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  try {
    return body(s);
  } catch (const std::exception&) {
    return CUDA_ERROR_INVALID_VALUE;
  }
}

// Shared by the plain and _ptsz stream functions (stream_api.cpp is compiled once for each).
cudaError_t malloc_from_pool(State& s, void** ptr, std::size_t size, cudaMemPool_t pool,
                             cudaStream_t stream, bool per_thread_api);
cudaError_t free_async(State& s, void* ptr, cudaStream_t stream, bool per_thread_api);
cudaError_t event_record(State& s, cudaEvent_t event, cudaStream_t stream, bool per_thread_api);
cudaError_t stream_wait_event(State& s, cudaStream_t stream, cudaEvent_t event,
                              bool per_thread_api);
cudaError_t stream_synchronize(State& s, cudaStream_t stream, bool per_thread_api);
cudaError_t stream_query(State& s, cudaStream_t stream, bool per_thread_api);
cudaError_t begin_capture(State& s, cudaStream_t stream, cudaStreamCaptureMode mode, bool per_thread_api);
cudaError_t end_capture(State& s, cudaStream_t stream, cudaGraph_t* graph, bool per_thread_api);
cudaError_t is_capturing(State& s, cudaStream_t stream, cudaStreamCaptureStatus* status, bool per_thread_api);

}  // namespace tensorpool::cuda_double::detail
