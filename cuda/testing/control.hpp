// testing/control.hpp: the control API of the CUDA-runtime test double (tensorpool::cuda_double).
//
// The double (target tensorpool_cuda_double) defines, with C linkage and the exact signatures
// of cuda_runtime_api.h and cuda.h, the subset of the runtime and driver APIs the backends call
// (plus stream creation for tests), including the _ptsz names the headers map to under
// CUDA_API_PER_THREAD_DEFAULT_STREAM. A test binary links it instead of libcudart/libcuda.
// Memory, streams and events live on one tensorpool::SimulatedDevice per device ordinal (plus
// one for pinned host memory): addresses are never backed and must never be dereferenced.
//
// Modelled semantics (and where the double is stricter than CUDA, to catch backend bugs):
//  - the current device is per thread (default 0); stream 0 and cudaStreamLegacy are the
//    current device's legacy stream, cudaStreamPerThread (and 0 in a _ptsz function) the
//    calling thread's per-thread stream on the current device;
//  - every failing runtime call sets the thread's last error (cudaErrorNotReady included);
//    cudaGetLastError returns and clears it, cudaPeekAtLastError only returns it;
//  - recorded work completes only when the test says so (EventMode::manual) or at once
//    (EventMode::immediate); synchronize calls, cudaFree and cudaDeviceSynchronize complete it;
//  - stricter: cudaEventRecord needs event and stream on the same device,
//    cudaMallocFromPoolAsync needs the stream on the pool's device, cross-device
//    cudaStreamWaitEvent on an incomplete event is cudaErrorNotSupported, cuMemMap maps whole
//    granules of a handle (at an offset into it, a handle at several places) inside one
//    reservation;
//  - stream capture (cudaStreamBeginCapture/EndCapture/IsCapturing, cudaGraphDestroy): while a
//    capture is underway, the calls that may synchronize or change memory (cudaMalloc,
//    cudaFree, cudaHostAlloc, cudaFreeHost, cudaMemcpy, cudaDeviceSynchronize,
//    cudaEventSynchronize, cudaEventQuery, cudaMemPoolTrimTo, cuMem* but the granularity query)
//    fail with cudaErrorStreamCaptureUnsupported (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and
//    invalidate every capture they fall under (global mode: all; thread-local: the caller's;
//    relaxed: none), so that its cudaStreamEndCapture fails; stricter than CUDA for
//    cudaEventQuery, which CUDA refuses only on events of the capture. Synchronizing or querying
//    (cudaStreamQuery) a captured stream fails and invalidates in every mode; an event recorded
//    on it captures nothing; the legacy stream cannot be captured;
//  - the legacy stream's implicit synchronization with other streams is not modelled;
//  - after simulate_driver_shutdown() every call fails with cudaErrorCudartUnloading /
//    CUDA_ERROR_DEINITIALIZED (calls are still counted).
//
// Every function here is thread-safe and makes no counted call.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/simulated_device.hpp"

namespace tensorpool::cuda_double {

struct DeviceOptions {
  std::string name = "Simulated NVIDIA H200";
  std::size_t capacity = 16 * GiB;
  /// cuMemGetAllocationGranularity; a multiple of 2 MiB.
  std::size_t vm_granularity = 2 * MiB;
  /// What cudaMalloc rounds sizes below 2 MiB up to: a power of two from 512 B to 2 MiB (2 MiB,
  /// the default, charges every allocation whole pages; 512 B counts small allocations as a
  /// driver packing them into shared pages would). A device allocation of 2 MiB or more always
  /// takes whole 2 MiB pages, as the replay models' cudaMalloc does (src/replay/models/cuda_malloc_rule.hpp).
  std::size_t malloc_granularity = 2 * MiB;
};

struct Options {
  int device_count = 1;  // 0..6
  DeviceOptions device;  // every device, unless per_device has an entry for it
  std::vector<DeviceOptions> per_device;
  std::size_t host_capacity = 64 * GiB;  // pinned host memory (cudaHostAlloc)
  EventMode event_mode = EventMode::manual;
  bool memory_pools_supported = true;  // cudaDevAttrMemoryPoolsSupported
  bool vmm_supported = true;           // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  int driver_version = 13000;
  int runtime_version = 13000;
};

/// Forgets everything (memory, streams, events, pools, faults, counters, shutdown) and starts
/// over with fresh devices; every thread's current device becomes 0 and its last error success.
void reset(const Options& options = {});
Options options();
/// Resets with `count` devices, other options unchanged.
void set_device_count(int count);
/// Recreates `device` with a new capacity; throws std::logic_error if it has memory in use.
void set_capacity(int device, std::size_t bytes);
/// Memory used by someone else on `device` (lowers cudaMemGetInfo's free memory).
void set_external_usage(int device, std::size_t bytes);

// --- streams and events ---------------------------------------------------------------------
void set_event_mode(EventMode mode);
/// Completes the work captured by `event` (and everything before it on its stream).
void complete_event(cudaEvent_t event);
/// Completes everything submitted to `stream` so far; special handles (0, cudaStreamLegacy,
/// cudaStreamPerThread) mean the calling thread's, on its current device.
void complete_stream(cudaStream_t stream);
void complete_all();
/// Recorded events, on every device, whose work has not completed.
std::size_t incomplete_events();
/// The flags the event was created with; throws std::invalid_argument for an unknown event.
unsigned event_flags(cudaEvent_t event);

// --- faults and shutdown --------------------------------------------------------------------
/// The n-th call (1 = the next) of `api` from now fails with `error` (a cudaError_t for cuda*
/// functions, a CUresult for cu* ones; 0: out of memory of the right family). `api` matches the
/// exact name, or its family: "cudaEventCreate" also matches cudaEventCreateWithFlags, and
/// "cudaMallocFromPoolAsync" also its _ptsz variant. Several faults may be armed at once.
void fail_nth(std::string_view api, std::uint64_t n, int error = 0);
void clear_faults();
/// From now on every call fails with cudaErrorCudartUnloading / CUDA_ERROR_DEINITIALIZED.
void simulate_driver_shutdown(bool on = true);

// --- counters -------------------------------------------------------------------------------
struct Call {
  std::string api;  // the exported name, e.g. "cudaEventRecord_ptsz"
  int device;       // the calling thread's current device when the call was made
};
std::uint64_t calls(std::string_view api);  // exact name
std::uint64_t total_calls();
std::vector<Call> call_log();
void clear_calls();

// --- inspection -----------------------------------------------------------------------------
/// The calling thread's current device / last error, without a counted call.
int current_device();
cudaError_t last_error();
/// Bytes in use on `device` (cudaMalloc, pools, cuMemCreate), rounded as the double rounds.
std::size_t used_bytes(int device);
std::size_t host_used_bytes();
std::size_t live_allocations();  // cudaMalloc + pool + host allocations
std::size_t live_streams();      // created and not destroyed
std::size_t live_events();
std::size_t live_graphs();       // ended captures whose graph is not destroyed
std::size_t live_pools();        // created and not destroyed
std::size_t live_physical();     // cuMemCreate handles not yet freed
std::size_t live_reservations();
std::size_t mapped_bytes();
std::uint64_t pool_release_threshold(cudaMemPool_t pool);
/// The CUmemAccess_flags granted to `device` on the mapping containing `ptr` (0: none).
unsigned access_flags(CUdeviceptr ptr, int device);
/// The device a stream handle belongs to (special handles: the caller's current device).
int stream_device(cudaStream_t stream);
/// The simulated device behind `device` (for its counters).
std::shared_ptr<SimulatedDevice> simulated_device(int device);

}  // namespace tensorpool::cuda_double
