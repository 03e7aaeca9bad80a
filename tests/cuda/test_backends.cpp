// tests/cuda/test_backends.cpp: behaviour of the four CUDA backends that holds on the test double
// and on real hardware alike: segments, properties, events, the device guard, the virtual-memory
// calls, and the caching Allocator on each backend (stream-ordered reuse, staging buffers).
#include "harness.hpp"

#include <algorithm>
#include <thread>

using namespace tpcuda;

TEST_CASE("every backend allocates and frees segments", "[cuda][backends]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  auto backend = make_cuda_backend(kind, 0);
  const DeviceProperties& props = backend->properties();
  CudaStream s;
  const std::size_t g = props.segment_granularity;
  void* a = backend->allocate_segment(g, s.id());
  void* b = backend->allocate_segment(3 * g, s.id());
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(a != b);
  REQUIRE(address(a) % props.alignment == 0);
  REQUIRE(address(b) % props.alignment == 0);
  // The two segments do not overlap.
  REQUIRE((address(a) + g <= address(b) || address(b) + 3 * g <= address(a)));
  backend->free_segment(a, g, s.id());
  backend->free_segment(b, 3 * g, s.id());
  REQUIRE(pending_error() == cudaSuccess);
  REQUIRE(backend->alive());
}

TEST_CASE("backend properties describe the device", "[cuda][backends]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  auto backend = make_cuda_backend(kind, 0);
  const DeviceProperties& p = backend->properties();
  REQUIRE(p.ordinal == 0);
  REQUIRE(backend->device() == 0);
  REQUIRE(p.capacity > 0);
  REQUIRE(p.name.find("cuda:0") == 0);
  REQUIRE(p.segment_granularity >= 2 * MiB);
  REQUIRE(p.segment_granularity % (2 * MiB) == 0);
  VirtualMemory* vm = backend->virtual_memory();
  REQUIRE((vm != nullptr) == (kind == CudaBackendKind::vmm));
  if (vm != nullptr) REQUIRE(p.segment_granularity % vm->page_size() == 0);
  const std::size_t free = backend->free_memory();
  REQUIRE(free > 0);
  REQUIRE(free <= p.capacity);
}

TEST_CASE("every backend records, queries, waits for and recycles events", "[cuda][events]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  auto backend = make_cuda_backend(kind, 0);
  CudaStream s1;
  CudaStream s2;
  const DeviceEvent e = backend->create_event();
  REQUIRE(e != 0);
  REQUIRE(backend->query_event(e));  // never recorded: complete
  backend->record_event(e, s1.id());
  backend->stream_wait_event(s2.id(), e);
  finish(s1);
  REQUIRE(backend->query_event(e));
  backend->synchronize_event(e);
  backend->synchronize_stream(s2.id());
  backend->synchronize_device();
  backend->destroy_event(e);
  REQUIRE(backend->pooled_events() == 1);
  REQUIRE(backend->create_event() == e);  // recycled from the pool, not created again
  backend->destroy_event(e);
  REQUIRE(pending_error() == cudaSuccess);
}

TEST_CASE("the default stream handles are accepted", "[cuda][streams]") {
  Env env;
  auto backend = make_cuda_backend(CudaBackendKind::async_pool, 0);
  for (const cudaStream_t special : {cudaStream_t{}, cudaStreamLegacy, cudaStreamPerThread}) {
    const Stream s = to_stream(special);
    void* p = backend->allocate_segment(2 * MiB, s);
    REQUIRE(p != nullptr);
    const DeviceEvent e = backend->create_event();
    backend->record_event(e, s);
    backend->synchronize_stream(s);
    REQUIRE(backend->query_event(e));
    backend->destroy_event(e);
    backend->free_segment(p, 2 * MiB, s);
  }
  REQUIRE(pending_error() == cudaSuccess);
}

TEST_CASE("a backend works on its own device and restores the caller's", "[cuda][guard]") {
  Env env(2);
  if (device_count() < 2) {
    WARN("needs two devices; only the restore of device 0 is checked");
    auto backend = make_cuda_backend(CudaBackendKind::async_pool, 0);
    backend->free_segment(backend->allocate_segment(2 * MiB, 0), 2 * MiB, 0);
    int current = -1;
    TP_CUDA_OK(cudaGetDevice(&current));
    REQUIRE(current == 0);
    return;
  }
  TP_EACH_BACKEND_KIND(kind);
  TP_CUDA_OK(cudaSetDevice(1));
  auto backend = make_cuda_backend(kind, 0);
  auto alloc = make_allocator(backend);
  void* p = alloc->allocate(4 * MiB);  // stream 0: device 0's default stream, not device 1's
  int current = -1;
  TP_CUDA_OK(cudaGetDevice(&current));
  REQUIRE(current == 1);
  alloc->deallocate(p);
  alloc->empty_cache();
  TP_CUDA_OK(cudaGetDevice(&current));
  REQUIRE(current == 1);
  REQUIRE(alloc->stats().upstream_frees == 1);
}

TEST_CASE("a backend rejects a device that does not exist", "[cuda][backends]") {
  Env env;
  REQUIRE_THROWS_AS(make_cuda_backend(CudaBackendKind::malloc, device_count()), DeviceError);
  REQUIRE_THROWS_AS(make_cuda_backend(CudaBackendKind::malloc, -1), DeviceError);
  REQUIRE(pending_error() == cudaSuccess);
}

// --- virtual memory ------------------------------------------------------------------------

TEST_CASE("the VMM backend reserves, creates, maps and unmaps at its granularity", "[cuda][vmm]") {
  Env env;
  CudaVmmBackend vmm(0);
  const DeviceProperties& p = vmm.properties();
  REQUIRE(vmm.virtual_memory() == &vmm);
  const std::size_t page = vmm.page_size();
  REQUIRE(page >= 2 * MiB);
  REQUIRE(p.alignment == page);

  const Address base = vmm.reserve_address_range(4 * page, page);
  REQUIRE(base != 0);
  REQUIRE(base % page == 0);
  const PhysicalHandle h1 = vmm.create_physical(page);
  const PhysicalHandle h2 = vmm.create_physical(2 * page);
  REQUIRE(h1 != 0);
  REQUIRE(h2 != 0);
  // Two physical allocations side by side in one range: one contiguous 3-page window.
  vmm.map(base, page, h1);
  vmm.map(base + page, 2 * page, h2);
  vmm.unmap(base, page);
  vmm.map(base + 3 * page, page, h1);  // a handle can be mapped again elsewhere once unmapped
  vmm.unmap(base + page, 2 * page);
  vmm.unmap(base + 3 * page, page);
  vmm.release_physical(h1);
  vmm.release_physical(h2);
  vmm.release_address_range(base, 4 * page);
  REQUIRE(pending_error() == cudaSuccess);
}

TEST_CASE("VMM segments are whole pages, mapped and released as a unit", "[cuda][vmm]") {
  Env env;
  CudaVmmBackend vmm(0);
  const std::size_t g = vmm.properties().segment_granularity;
  void* a = vmm.allocate_segment(g, 0);
  void* b = vmm.allocate_segment(5 * g, 0);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(vmm.live_segments() == 2);
  REQUIRE(address(b) % vmm.page_size() == 0);
  REQUIRE_THROWS_AS(vmm.free_segment(a, 2 * g, 0), DeviceError);  // wrong size: refused
  REQUIRE(vmm.live_segments() == 2);
  vmm.free_segment(a, g, 0);
  vmm.free_segment(b, 5 * g, 0);
  REQUIRE(vmm.live_segments() == 0);
}

// --- the caching allocator on each backend --------------------------------------------------

TEST_CASE("the caching allocator serves, caches and returns memory on every backend",
          "[cuda][allocator]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s;
  // Fixed segments on every backend (the vmm backend defaults to mode:vmm, tested below).
  auto alloc = make_allocator(make_cuda_backend(kind, 0), Config::parse("mode:fixed"));
  void* small = alloc->allocate(1000, s.id());
  void* large = alloc->allocate(24 * MiB, s.id());
  REQUIRE(small != nullptr);
  REQUIRE(large != nullptr);
  alloc->deallocate(small);
  alloc->deallocate(large);
  REQUIRE(alloc->allocate(24 * MiB, s.id()) == large);  // cached: no new segment
  REQUIRE(alloc->stats().upstream_allocs == 2);
  alloc->deallocate(large);
  alloc->check_invariants();
  alloc->empty_cache();
  REQUIRE(alloc->stats().total[Metric::reserved_bytes].current == 0);
  alloc->check_invariants();
  REQUIRE(pending_error() == cudaSuccess);
}

TEST_CASE("mode:auto, the default, takes vmm on the vmm backend and fixed segments on the others",
          "[cuda][allocator]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  const Mode expected = kind == CudaBackendKind::vmm ? Mode::vmm : Mode::fixed;
  REQUIRE(alloc->config().mode == expected);
  void* p = alloc->allocate(24 * MiB, s.id());
  REQUIRE(p != nullptr);
  const Snapshot snap = alloc->snapshot();
  REQUIRE(snap.segments.size() == 1);
  REQUIRE(snap.segments[0].heap == (expected == Mode::vmm));
  alloc->deallocate(p);
  alloc->empty_cache();
  REQUIRE(alloc->usage().reserved == 0);
}

TEST_CASE("a block used on another stream is reused once that stream's work is done",
          "[cuda][allocator][streams]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  void* p = alloc->allocate(8 * MiB, s1.id());
  alloc->record_stream(p, s2.id());
  alloc->deallocate(p);
  REQUIRE(alloc->stats().events_recorded == 1);
  finish(s2);
  void* q = alloc->allocate(8 * MiB, s1.id());  // the event is collected here
  REQUIRE(q == p);
  REQUIRE(alloc->stats().syncs == 0);
  alloc->deallocate(q);
  alloc->check_invariants();
}

TEST_CASE("pinned staging buffers are reused after the copy stream's event", "[cuda][pinned]") {
  Env env;
  auto host = std::make_shared<CudaPinnedHostBackend>(0, 8 * GiB);
  CudaStream copy;
  auto staging = make_allocator(host);
  void* buf = staging->allocate(4 * MiB);  // filled by the host
  staging->record_stream(buf, copy.id());  // then read by a copy on the copy stream
  staging->deallocate(buf);
  finish(copy);
  REQUIRE(staging->allocate(4 * MiB) == buf);
  REQUIRE(host->held_bytes() ==
          static_cast<std::size_t>(staging->stats().total[Metric::reserved_bytes].current));
  staging->check_invariants();
}

TEST_CASE("a VMM backend can be used from a thread that never touched CUDA", "[cuda][vmm][threads]") {
  Env env;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0));
  void* p = nullptr;
  std::thread worker([&] { p = alloc->allocate(6 * MiB); });
  worker.join();
  REQUIRE(p != nullptr);
  alloc->deallocate(p);
  alloc->empty_cache();
  alloc->check_invariants();
}

TEST_CASE("the caching allocator's vmm mode runs on the VMM backend", "[cuda][vmm][allocator]") {
  Env env;
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  void* small = alloc->allocate(1000, s1.id());
  void* a = alloc->allocate(24 * MiB, s1.id());
  void* b = alloc->allocate(5 * MiB + 3, s2.id());
  REQUIRE(small != nullptr);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  alloc->record_stream(a, s2.id());
  alloc->deallocate(a);
  finish(s2);
  REQUIRE(alloc->allocate(24 * MiB, s1.id()) == a);  // its pages stayed mapped
  alloc->deallocate(a);
  alloc->deallocate(b);
  alloc->deallocate(small);
  alloc->check_invariants();
  alloc->empty_cache();
  REQUIRE(alloc->stats().total[Metric::reserved_bytes].current == 0);
  alloc->check_invariants();
  REQUIRE(pending_error() == cudaSuccess);
}
