// cuda_backend.cpp: what the CUDA backends share: properties, free memory, streams, the event
// pool, the shutdown check, and the make_cuda_backend factory.
//
// Invariants:
//  - event_pool_ holds events created by this backend on device_ that no one else uses;
//  - no CUDA call is made once cuda_runtime_alive() is false (destroy paths check it first).
#include <string>

#include "cuda_common.hpp"

namespace tensorpool {

using cuda_detail::as_event;
using cuda_detail::as_stream;
using cuda_detail::check;
using cuda_detail::DeviceGuard;

namespace {

// The answer of a query (cudaEventQuery, cudaStreamQuery) that returned `err` on `device`: true
// when the work is done, false when it is not yet (not an error: it is not left as the last
// error), else the error, thrown.
bool work_done(cudaError_t err, const char* call, int device) {
  if (err == cudaSuccess) return true;
  if (err != cudaErrorNotReady) cuda_detail::throw_runtime_error(err, call, device, 0);
  (void)cudaGetLastError();
  return false;
}

}  // namespace

const char* to_string(CudaBackendKind kind) noexcept {
  switch (kind) {
    case CudaBackendKind::async_pool: return "async_pool";
    case CudaBackendKind::malloc: return "malloc";
    case CudaBackendKind::vmm: return "vmm";
    case CudaBackendKind::pinned_host: return "pinned_host";
  }
  return "unknown";
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

CudaBackend::CudaBackend(int device, const char* kind) : device_(device) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", device);
  if (device < 0 || device >= count)
    throw DeviceError("CUDA device " + std::to_string(device) + " does not exist (" +
                      std::to_string(count) + " devices)");
  DeviceGuard guard(device_);  // initialises the device's primary context
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties", device_);
  props_.name = "cuda:" + std::to_string(device_) + " " + prop.name + " [" + kind + "]";
  props_.ordinal = device_;
  props_.capacity = prop.totalGlobalMem;
  props_.segment_granularity = 2 * MiB;
  props_.alignment = 256;  // what cudaMalloc and the memory pools guarantee
  cuda_detail::register_exit_hook();  // after CUDA initialised: see register_exit_hook()
}

CudaBackend::~CudaBackend() {
  if (!alive()) return;  // process teardown: the driver reclaims the events
  try {
    DeviceGuard guard(device_);
    for (const DeviceEvent e : event_pool_) (void)cudaEventDestroy(as_event(e));
  } catch (...) {  // a destructor cannot report; the events die with the context
  }
  (void)cudaGetLastError();
}

bool CudaBackend::alive() const noexcept { return cuda_runtime_alive(); }

std::size_t CudaBackend::free_memory() {
  DeviceGuard guard(device_);
  std::size_t free = 0;
  std::size_t total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", device_);
  return free;
}

std::size_t CudaBackend::pooled_events() const {
  std::lock_guard lock(events_mutex_);
  return event_pool_.size();
}

DeviceEvent CudaBackend::create_event() {
  {
    std::lock_guard lock(events_mutex_);
    if (!event_pool_.empty()) {
      const DeviceEvent e = event_pool_.back();
      event_pool_.pop_back();
      return e;
    }
  }
  DeviceGuard guard(device_);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", device_);
  return to_event(e);
}

void CudaBackend::destroy_event(DeviceEvent event) {
  if (!alive()) return;
  std::lock_guard lock(events_mutex_);
  event_pool_.push_back(event);
}

void CudaBackend::record_event(DeviceEvent event, Stream stream) {
  DeviceGuard guard(device_);
  check(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord", device_);
}

bool CudaBackend::query_event(DeviceEvent event) {
  DeviceGuard guard(device_);
  return work_done(cudaEventQuery(as_event(event)), "cudaEventQuery", device_);
}

void CudaBackend::synchronize_event(DeviceEvent event) {
  DeviceGuard guard(device_);
  check(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize", device_);
}

void CudaBackend::stream_wait_event(Stream stream, DeviceEvent event) {
  DeviceGuard guard(device_);
  check(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent", device_);
}

void CudaBackend::synchronize_stream(Stream stream) {
  DeviceGuard guard(device_);
  check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize", device_);
}

bool CudaBackend::query_stream(Stream stream) {
  DeviceGuard guard(device_);
  return work_done(cudaStreamQuery(as_stream(stream)), "cudaStreamQuery", device_);
}

void CudaBackend::synchronize_device() {
  DeviceGuard guard(device_);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device_);
}

bool CudaBackend::is_capturing(Stream stream) {
  DeviceGuard guard(device_);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(as_stream(stream), &status), "cudaStreamIsCapturing", device_);
  return status != cudaStreamCaptureStatusNone;
}

void CudaBackend::copy_to_host(void* dst, Address src, std::size_t bytes) {
  DeviceGuard guard(device_);
  check(cudaMemcpy(dst, reinterpret_cast<const void*>(src), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", device_);
}

void CudaBackend::copy_to_device(Address dst, const void* src, std::size_t bytes) {
  DeviceGuard guard(device_);
  check(cudaMemcpy(reinterpret_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy", device_);
}

void* CudaBackend::allocate_host(std::size_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // an allocation refused leaves no sticky error behind
    return nullptr;
  }
  return p;
}

void CudaBackend::free_host(void* ptr, std::size_t) noexcept {
  if (ptr != nullptr && alive()) (void)cudaFreeHost(ptr);
}

std::shared_ptr<CudaBackend> make_cuda_backend(CudaBackendKind kind, int device) {
  switch (kind) {
    case CudaBackendKind::async_pool: return std::make_shared<CudaAsyncBackend>(device);
    case CudaBackendKind::malloc: return std::make_shared<CudaMallocBackend>(device);
    case CudaBackendKind::vmm: return std::make_shared<CudaVmmBackend>(device);
    case CudaBackendKind::pinned_host: return std::make_shared<CudaPinnedHostBackend>(device);
  }
  throw UsageError("make_cuda_backend: unknown backend kind");
}

}  // namespace tensorpool
