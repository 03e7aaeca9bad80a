// tests/cuda/test_double_backends.cpp: what only the test double can show about the backends:
// which CUDA calls they make and on which device, error and out-of-memory handling through
// injected faults, the VMM rollback, and the double's own stream semantics.
#include "harness.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <thread>

using namespace tpcuda;
namespace dbl = tensorpool::cuda_double;

namespace {
bool is_guard_call(const std::string& api) { return api == "cudaGetDevice" || api == "cudaSetDevice"; }

// The message of the DeviceError that allocating a segment of `backend` throws ("" and a failure
// when it throws none).
std::string segment_error(DeviceBackend& backend) {
  try {
    (void)backend.allocate_segment(2 * MiB, 0);
  } catch (const DeviceError& e) {
    return e.what();
  }
  FAIL("no exception");
  return "";
}
}  // namespace

// --- the double itself ----------------------------------------------------------------------

TEST_CASE("double: stream 0 is the legacy stream and cudaStreamPerThread is per thread",
          "[cuda][double]") {
  Env env;
  cudaEvent_t legacy = nullptr;
  cudaEvent_t mine = nullptr;
  cudaEvent_t theirs = nullptr;
  TP_CUDA_OK(cudaEventCreate(&legacy));
  TP_CUDA_OK(cudaEventCreate(&mine));
  TP_CUDA_OK(cudaEventCreate(&theirs));
  TP_CUDA_OK(cudaEventRecord(legacy, nullptr));
  TP_CUDA_OK(cudaEventRecord(mine, cudaStreamPerThread));
  std::thread([&] { REQUIRE(cudaEventRecord(theirs, cudaStreamPerThread) == cudaSuccess); }).join();
  REQUIRE(dbl::incomplete_events() == 3);
  dbl::complete_stream(cudaStreamLegacy);  // the same stream as 0
  REQUIRE(cudaEventQuery(legacy) == cudaSuccess);
  REQUIRE(cudaEventQuery(mine) == cudaErrorNotReady);
  REQUIRE(cudaGetLastError() == cudaErrorNotReady);  // NotReady is recorded: the backends clear it
  dbl::complete_stream(cudaStreamPerThread);  // this thread's only
  REQUIRE(cudaEventQuery(mine) == cudaSuccess);
  REQUIRE(cudaEventQuery(theirs) == cudaErrorNotReady);
  (void)cudaGetLastError();
  for (cudaEvent_t e : {legacy, mine, theirs}) TP_CUDA_OK(cudaEventDestroy(e));
}

TEST_CASE("double: the current device is per thread and events belong to a device", "[cuda][double]") {
  Env env(2);
  TP_CUDA_OK(cudaSetDevice(1));
  cudaEvent_t e = nullptr;
  TP_CUDA_OK(cudaEventCreate(&e));
  int other_thread_device = -1;
  std::thread([&] { (void)cudaGetDevice(&other_thread_device); }).join();
  REQUIRE(other_thread_device == 0);
  TP_CUDA_OK(cudaSetDevice(0));
  REQUIRE(cudaEventRecord(e, nullptr) == cudaErrorInvalidResourceHandle);  // device 0's stream
  REQUIRE(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  REQUIRE(cudaSetDevice(2) == cudaErrorInvalidDevice);
  REQUIRE(dbl::calls("cudaSetDevice") == 3);
  (void)cudaGetLastError();
  TP_CUDA_OK(cudaEventDestroy(e));
}

TEST_CASE("double: cudaMalloc packs small allocations, and takes whole pages from 2 MiB up",
          "[cuda][double]") {
  Env env;
  dbl::Options o;
  o.device.malloc_granularity = 512;  // as the cub comparison sets it
  dbl::reset(o);
  void* small = nullptr;
  void* large = nullptr;
  TP_CUDA_OK(cudaMalloc(&small, 1000));
  REQUIRE(dbl::used_bytes(0) == 1024);
  TP_CUDA_OK(cudaMalloc(&large, 3 * MiB));
  REQUIRE(dbl::used_bytes(0) == 1024 + 4 * MiB);  // the replay models' cudaMalloc: the same rule
  TP_CUDA_OK(cudaFree(large));
  TP_CUDA_OK(cudaFree(small));
  REQUIRE(dbl::used_bytes(0) == 0);
}

TEST_CASE("double: capacity, device count and immediate completion are configurable",
          "[cuda][double]") {
  Env env;
  dbl::set_device_count(3);
  REQUIRE(device_count() == 3);
  dbl::set_capacity(2, 32 * MiB);
  REQUIRE(make_cuda_backend(CudaBackendKind::malloc, 2)->properties().capacity == 32 * MiB);
  REQUIRE(make_cuda_backend(CudaBackendKind::malloc, 1)->properties().capacity == 16 * GiB);
  void* p = nullptr;
  TP_CUDA_OK(cudaMalloc(&p, 3 * MiB));
  REQUIRE(dbl::used_bytes(0) == 4 * MiB);  // rounded to the 2 MiB granularity
  REQUIRE_THROWS_AS(dbl::set_capacity(0, GiB), std::logic_error);  // memory in use
  TP_CUDA_OK(cudaFree(p));

  dbl::set_event_mode(EventMode::immediate);
  cudaEvent_t e = nullptr;
  TP_CUDA_OK(cudaEventCreate(&e));
  TP_CUDA_OK(cudaEventRecord(e, nullptr));
  REQUIRE(cudaEventQuery(e) == cudaSuccess);
  REQUIRE(dbl::incomplete_events() == 0);
  TP_CUDA_OK(cudaEventDestroy(e));
  REQUIRE(dbl::calls("cudaEventCreate") == 1);
  REQUIRE(dbl::total_calls() == dbl::call_log().size());
}

// --- calls and devices ----------------------------------------------------------------------

TEST_CASE("every backend call runs on the backend's device, the caller's device is restored",
          "[cuda][guard]") {
  Env env(2);
  TP_EACH_BACKEND_KIND(kind);
  TP_CUDA_OK(cudaSetDevice(1));
  auto backend = make_cuda_backend(kind, 0);
  auto alloc = make_allocator(backend);
  cudaStream_t s0 = nullptr;  // a stream of device 0, made while device 0 is current
  TP_CUDA_OK(cudaSetDevice(0));
  TP_CUDA_OK(cudaStreamCreate(&s0));
  TP_CUDA_OK(cudaSetDevice(1));
  dbl::clear_calls();
  void* p = alloc->allocate(3 * MiB, to_stream(s0));
  void* q = alloc->allocate(5 * MiB);  // stream 0: device 0's legacy stream
  alloc->record_stream(p, 0);
  alloc->deallocate(p);
  alloc->deallocate(q);
  alloc->empty_cache();
  REQUIRE(dbl::current_device() == 1);
  const auto log = dbl::call_log();
  REQUIRE(dbl::calls(alloc_api(kind)) >= 2);
  for (const auto& call : log) {
    INFO(call.api);
    if (!is_guard_call(call.api)) REQUIRE(call.device == 0);
  }
  REQUIRE(log.back().api == "cudaSetDevice");  // the guard restored device 1 last
  TP_CUDA_OK(cudaStreamDestroy(s0));
}

TEST_CASE("the async backend allocates from its own pool and frees on the segment's stream",
          "[cuda][async]") {
  Env env;
  auto backend = std::make_shared<CudaAsyncBackend>(0);
  auto* pool = static_cast<cudaMemPool_t>(backend->memory_pool());
  REQUIRE(dbl::live_pools() == 1);
  REQUIRE(dbl::pool_release_threshold(pool) == std::numeric_limits<std::uint64_t>::max());
  CudaStream s;
  dbl::clear_calls();
  void* p = backend->allocate_segment(4 * MiB, s.id());
  REQUIRE(dbl::used_bytes(0) == 4 * MiB);
  backend->free_segment(p, 4 * MiB, s.id());
  REQUIRE(dbl::used_bytes(0) == 0);
  REQUIRE(dbl::calls("cudaMallocFromPoolAsync") == 1);
  REQUIRE(dbl::calls("cudaFreeAsync") == 1);
  REQUIRE(dbl::calls("cudaMemPoolTrimTo") == 1);
  REQUIRE(dbl::calls("cudaMalloc") == 0);
  REQUIRE(dbl::calls("cudaMallocFromPoolAsync_ptsz") == 0);  // built without per-thread streams
  backend.reset();
  REQUIRE(dbl::live_pools() == 0);
}

TEST_CASE("the synchronous backends wait for the segment's stream before freeing", "[cuda][malloc]") {
  Env env;
  for (const CudaBackendKind kind : {CudaBackendKind::malloc, CudaBackendKind::pinned_host}) {
    DYNAMIC_SECTION(to_string(kind)) {
      auto backend = make_cuda_backend(kind, 0);
      CudaStream s;
      void* p = backend->allocate_segment(2 * MiB, s.id());
      const DeviceEvent e = backend->create_event();
      backend->record_event(e, s.id());  // work in flight on s
      REQUIRE_FALSE(backend->query_event(e));
      backend->free_segment(p, 2 * MiB, s.id());
      REQUIRE(backend->query_event(e));  // free_segment synchronized s
      REQUIRE(dbl::live_allocations() == 0);
      backend->destroy_event(e);
      if (kind == CudaBackendKind::pinned_host) REQUIRE(dbl::calls("cudaFreeHost") == 1);
      else REQUIRE(dbl::calls("cudaFree") == 1);
    }
  }
}

TEST_CASE("pinned host segments are host memory, not device memory", "[cuda][pinned]") {
  Env env;
  CudaPinnedHostBackend host(0, 4 * GiB);
  REQUIRE(host.properties().capacity == 4 * GiB);
  void* p = host.allocate_segment(6 * MiB, 0);
  REQUIRE(dbl::host_used_bytes() == 6 * MiB);
  REQUIRE(dbl::used_bytes(0) == 0);
  REQUIRE(host.held_bytes() == 6 * MiB);
  REQUIRE(host.free_memory() <= 4 * GiB - 6 * MiB);
  host.free_segment(p, 6 * MiB, 0);
  REQUIRE(dbl::host_used_bytes() == 0);
}

TEST_CASE("events come from a pool created with cudaEventDisableTiming", "[cuda][events]") {
  Env env;
  auto backend = make_cuda_backend(CudaBackendKind::malloc, 0);
  const DeviceEvent a = backend->create_event();
  const DeviceEvent b = backend->create_event();
  REQUIRE(dbl::event_flags(to_cuda_event(a)) == cudaEventDisableTiming);
  backend->destroy_event(a);
  backend->destroy_event(b);
  REQUIRE(dbl::live_events() == 2);  // pooled, not destroyed
  REQUIRE(dbl::calls("cudaEventCreateWithFlags") == 2);
  (void)backend->create_event();
  REQUIRE(dbl::calls("cudaEventCreateWithFlags") == 2);
  backend.reset();  // the pooled event and the one handed out and never returned
  REQUIRE(dbl::live_events() == 1);
}

TEST_CASE("a query of an incomplete event leaves no error behind", "[cuda][events]") {
  Env env;
  auto backend = make_cuda_backend(CudaBackendKind::async_pool, 0);
  CudaStream s;
  const DeviceEvent e = backend->create_event();
  backend->record_event(e, s.id());
  REQUIRE_FALSE(backend->query_event(e));
  REQUIRE(dbl::last_error() == cudaSuccess);
  dbl::complete_event(to_cuda_event(e));
  REQUIRE(backend->query_event(e));
  backend->destroy_event(e);
}

// --- errors ---------------------------------------------------------------------------------

TEST_CASE("out of memory in CUDA gives nullptr and clears the last error", "[cuda][oom]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  auto backend = make_cuda_backend(kind, 0);
  dbl::fail_nth(alloc_api(kind), 1);
  REQUIRE(backend->allocate_segment(2 * MiB, 0) == nullptr);
  REQUIRE(dbl::last_error() == cudaSuccess);
  REQUIRE(dbl::live_allocations() == 0);
  REQUIRE(dbl::live_physical() == 0);
  REQUIRE(dbl::live_reservations() == 0);  // the VMM backend released its reservation
  void* p = backend->allocate_segment(2 * MiB, 0);  // one fault only
  REQUIRE(p != nullptr);
  backend->free_segment(p, 2 * MiB, 0);
}

TEST_CASE("a device past its capacity answers out of memory", "[cuda][oom]") {
  Env env(1, 64 * MiB);
  for (const CudaBackendKind kind : {CudaBackendKind::async_pool, CudaBackendKind::malloc,
                                     CudaBackendKind::vmm}) {
    DYNAMIC_SECTION(to_string(kind)) {
      auto backend = make_cuda_backend(kind, 0);
      void* p = backend->allocate_segment(48 * MiB, 0);
      REQUIRE(p != nullptr);
      REQUIRE(backend->allocate_segment(32 * MiB, 0) == nullptr);
      REQUIRE(dbl::last_error() == cudaSuccess);
      dbl::set_external_usage(0, 8 * MiB);
      REQUIRE(backend->free_memory() == 8 * MiB);
      dbl::set_external_usage(0, 0);
      backend->free_segment(p, 48 * MiB, 0);
    }
  }
}

TEST_CASE("other CUDA errors throw DeviceError naming the call, the error and the device",
          "[cuda][errors]") {
  Env env(2);
  SECTION("runtime") {
    auto backend = make_cuda_backend(CudaBackendKind::malloc, 1);
    dbl::fail_nth("cudaMalloc", 1, cudaErrorLaunchFailure);
    const std::string what = segment_error(*backend);
    INFO(what);
    REQUIRE(what.find("cudaMalloc") != std::string::npos);
    REQUIRE(what.find("cudaErrorLaunchFailure") != std::string::npos);
    REQUIRE(what.find("unspecified launch failure") != std::string::npos);
    REQUIRE(what.find("device 1") != std::string::npos);
    REQUIRE(dbl::last_error() == cudaSuccess);
  }
  SECTION("driver") {
    auto backend = make_cuda_backend(CudaBackendKind::vmm, 0);
    dbl::fail_nth("cuMemCreate", 1, CUDA_ERROR_INVALID_VALUE);
    const std::string what = segment_error(*backend);
    INFO(what);
    REQUIRE(what.find("cuMemCreate") != std::string::npos);
    REQUIRE(what.find("CUDA_ERROR_INVALID_VALUE") != std::string::npos);
    REQUIRE(what.find("device 0") != std::string::npos);
    REQUIRE(dbl::live_reservations() == 0);
  }
  SECTION("events") {
    auto backend = make_cuda_backend(CudaBackendKind::async_pool, 0);
    dbl::fail_nth("cudaEventCreate", 1);  // the family: matches cudaEventCreateWithFlags
    REQUIRE_THROWS_AS(backend->create_event(), DeviceError);
    REQUIRE(dbl::last_error() == cudaSuccess);
    REQUIRE_NOTHROW(backend->destroy_event(backend->create_event()));
  }
}

TEST_CASE("backends refuse devices without the features they need", "[cuda][errors]") {
  dbl::Options o;
  o.memory_pools_supported = false;
  o.vmm_supported = false;
  dbl::reset(o);
  REQUIRE_THROWS_AS(CudaAsyncBackend(0), DeviceError);
  REQUIRE_THROWS_AS(CudaVmmBackend(0), DeviceError);
  REQUIRE_NOTHROW(CudaMallocBackend(0));
  REQUIRE(dbl::live_pools() == 0);
  dbl::reset();
}

// --- virtual memory -------------------------------------------------------------------------

TEST_CASE("the VMM page size comes from cuMemGetAllocationGranularity", "[cuda][vmm]") {
  dbl::Options o;
  o.device.vm_granularity = 4 * MiB;
  dbl::reset(o);
  CudaVmmBackend vmm(0);
  REQUIRE(vmm.page_size() == 4 * MiB);
  REQUIRE(vmm.properties().segment_granularity == 4 * MiB);
  void* p = vmm.allocate_segment(8 * MiB, 0);
  REQUIRE(dbl::mapped_bytes() == 8 * MiB);
  REQUIRE(dbl::access_flags(reinterpret_cast<CUdeviceptr>(p), 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(dbl::access_flags(reinterpret_cast<CUdeviceptr>(p) + 8 * MiB - 1, 0) ==
          CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  vmm.free_segment(p, 8 * MiB, 0);
  REQUIRE(dbl::mapped_bytes() == 0);
  REQUIRE(dbl::live_physical() == 0);
  REQUIRE(dbl::live_reservations() == 0);
  dbl::reset();
}

TEST_CASE("a failed VMM step undoes the steps before it", "[cuda][vmm][errors]") {
  Env env;
  CudaVmmBackend vmm(0);
  auto nothing_left = [] {
    REQUIRE(dbl::live_physical() == 0);
    REQUIRE(dbl::live_reservations() == 0);
    REQUIRE(dbl::mapped_bytes() == 0);
    REQUIRE(dbl::used_bytes(0) == 0);
  };
  SECTION("cuMemMap out of memory: nullptr") {
    dbl::fail_nth("cuMemMap", 1);
    REQUIRE(vmm.allocate_segment(2 * MiB, 0) == nullptr);
    nothing_left();
  }
  SECTION("cuMemMap failing otherwise: DeviceError") {
    dbl::fail_nth("cuMemMap", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
    REQUIRE_THROWS_AS(vmm.allocate_segment(2 * MiB, 0), DeviceError);
    nothing_left();
  }
  SECTION("cuMemSetAccess failing: unmapped again") {
    dbl::fail_nth("cuMemSetAccess", 1, CUDA_ERROR_INVALID_DEVICE);
    REQUIRE_THROWS_AS(vmm.allocate_segment(2 * MiB, 0), DeviceError);
    REQUIRE(dbl::calls("cuMemUnmap") == 1);
    nothing_left();
  }
  SECTION("address space exhausted: nullptr") {
    dbl::fail_nth("cuMemAddressReserve", 1);
    REQUIRE(vmm.allocate_segment(2 * MiB, 0) == nullptr);
    nothing_left();
  }
  REQUIRE(vmm.live_segments() == 0);
  void* p = vmm.allocate_segment(2 * MiB, 0);  // usable afterwards
  REQUIRE(p != nullptr);
  vmm.free_segment(p, 2 * MiB, 0);
  nothing_left();
}

TEST_CASE("the VMM backend's free_segment waits for the segment's stream, unmap does not",
          "[cuda][vmm]") {
  Env env;
  CudaVmmBackend vmm(0);
  CudaStream s;
  void* p = vmm.allocate_segment(2 * MiB, s.id());
  const DeviceEvent e = vmm.create_event();
  vmm.record_event(e, s.id());
  vmm.free_segment(p, 2 * MiB, s.id());
  REQUIRE(vmm.query_event(e));
  REQUIRE(dbl::calls("cudaStreamSynchronize") == 1);

  // The raw primitives leave ordering to the caller (the allocator's vmm mode syncs first).
  const Address base = vmm.reserve_address_range(2 * MiB, 2 * MiB);
  const PhysicalHandle h = vmm.create_physical(2 * MiB);
  vmm.map(base, 2 * MiB, h);
  vmm.record_event(e, s.id());
  vmm.unmap(base, 2 * MiB);
  REQUIRE_FALSE(vmm.query_event(e));
  REQUIRE(dbl::calls("cudaStreamSynchronize") + dbl::calls("cudaDeviceSynchronize") == 1);
  vmm.release_physical(h);
  vmm.release_address_range(base, 2 * MiB);
  dbl::complete_all();
  vmm.destroy_event(e);
}
