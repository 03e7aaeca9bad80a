// tests/cuda/test_double_allocator.cpp: the caching Allocator on each CUDA backend, where only the
// test double can steer the outcome: work that completes when the test says so, out-of-memory in
// the middle of a multi-stream sequence, failed event creation, and the driver going away.
#include "harness.hpp"

#include <algorithm>
#include <vector>

using namespace tpcuda;
namespace dbl = tensorpool::cuda_double;

namespace {

// A backend of `kind` whose capacity is what the double was reset with.
std::shared_ptr<CudaBackend> backend_for(CudaBackendKind kind, std::size_t host_capacity = 0) {
  if (kind == CudaBackendKind::pinned_host)
    return std::make_shared<CudaPinnedHostBackend>(0, host_capacity);
  return make_cuda_backend(kind, 0);
}

void reset_with_capacity(std::size_t bytes) {
  dbl::Options o;
  o.device.capacity = bytes;
  o.host_capacity = bytes;
  dbl::reset(o);
}

std::size_t used(CudaBackendKind kind) {
  return kind == CudaBackendKind::pinned_host ? dbl::host_used_bytes() : dbl::used_bytes(0);
}
}  // namespace

TEST_CASE("a cross-stream free is reused only after the other stream's event completes",
          "[cuda][allocator][streams]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  void* p = alloc->allocate(8 * MiB, s1.id());
  alloc->record_stream(p, s2.id());
  dbl::clear_calls();
  alloc->deallocate(p);
  REQUIRE(dbl::calls("cudaEventRecord") == 1);
  void* q = alloc->allocate(8 * MiB, s1.id());
  REQUIRE(q != p);  // s2 may still be using p
  REQUIRE(dbl::incomplete_events() == 1);
  dbl::complete_stream(s2.get());
  alloc->deallocate(q);
  void* r = alloc->allocate(8 * MiB, s1.id());
  REQUIRE((r == p || r == q));
  REQUIRE(alloc->stats().total[Metric::active_bytes].current == static_cast<std::int64_t>(8 * MiB));
  REQUIRE(alloc->stats().syncs == 0);
  alloc->deallocate(r);
  alloc->check_invariants();
}

TEST_CASE("under pressure a block cached for another stream is taken after a device-side wait",
          "[cuda][allocator][streams]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(make_cuda_backend(kind, 0), Config::parse("mode:fixed,memory_limit:20MiB"));
  void* p = alloc->allocate(16 * MiB, s1.id());
  alloc->deallocate(p);
  dbl::clear_calls();
  REQUIRE(alloc->allocate(8 * MiB, s2.id()) == p);
  REQUIRE(dbl::calls("cudaStreamWaitEvent") == 1);
  REQUIRE(dbl::calls("cudaEventSynchronize") + dbl::calls("cudaStreamSynchronize") == 0);
  alloc->deallocate(p);
  alloc->check_invariants();
}

TEST_CASE("an OOM in the middle of a multi-stream sequence goes through the ladder and leaves "
          "the allocator usable", "[cuda][allocator][oom]") {
  TP_EACH_BACKEND_KIND(kind);
  Env env;
  reset_with_capacity(128 * MiB);
  CudaStream s1;
  CudaStream s2;
  CudaStream s3;
  // Fixed segments on every backend (the vmm backend's ladder unmaps under syncs of its own).
  auto alloc = make_allocator(backend_for(kind, 128 * MiB), Config::parse("mode:fixed"));
  const Stream streams[] = {s1.id(), s2.id(), s3.id()};
  // A cross-stream free still in flight when memory runs out: the ladder reuses it for its own
  // stream after a wait on the device (s1 waits for s2's event), not on the host.
  void* shared = alloc->allocate(20 * MiB, s1.id());
  alloc->record_stream(shared, s2.id());
  alloc->deallocate(shared);
  std::vector<std::pair<void*, Stream>> live;
  std::size_t n = 0;
  OutOfMemoryInfo info;
  bool oom = false;
  try {
    for (;; ++n) {
      const Stream s = streams[n % 3];
      live.emplace_back(alloc->allocate(12 * MiB, s), s);
    }
  } catch (const OutOfMemoryError& e) {
    oom = true;
    info = e.info();
  }
  REQUIRE(oom);
  REQUIRE(n >= 9);  // 128 MiB: the shared 20 MiB segment and nine 12 MiB ones
  REQUIRE(info.device == 0);
  REQUIRE(info.requested == 12 * MiB);
  const Stats st = alloc->stats();
  REQUIRE(st.ooms == 1);
  REQUIRE(st.upstream_alloc_failures >= 2);
  REQUIRE(st.syncs == 0);
  REQUIRE(st.stream_waits == 1);  // the in-flight free served s1 instead of failing
  REQUIRE(dbl::last_error() == cudaSuccess);
  alloc->check_invariants();

  // Usable: a freed block serves the next request of its stream.
  const auto [last, stream] = live.back();
  live.pop_back();
  alloc->deallocate(last);
  REQUIRE(alloc->allocate(12 * MiB, stream) == last);
  live.emplace_back(last, stream);
  for (const auto& [p, s] : live) alloc->deallocate(p);
  alloc->empty_cache();
  alloc->check_invariants();
  REQUIRE(used(kind) == 0);
  REQUIRE(dbl::last_error() == cudaSuccess);
}

TEST_CASE("a transient out-of-memory from CUDA is absorbed by the ladder", "[cuda][allocator][oom]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(backend_for(kind, 8 * GiB), Config::parse("mode:fixed"));
  alloc->deallocate(alloc->allocate(12 * MiB, s1.id()));  // a free 12 MiB segment on s1
  dbl::fail_nth(alloc_api(kind), 1);
  void* p = alloc->allocate(16 * MiB, s2.id());  // fails once; s1's segment is too small
  REQUIRE(p != nullptr);
  const Stats st = alloc->stats();
  REQUIRE(st.upstream_alloc_failures == 1);
  REQUIRE(st.upstream_frees == 1);  // the ladder returned s1's segment, then grew again
  REQUIRE(st.ooms == 0);
  REQUIRE(dbl::last_error() == cudaSuccess);
  alloc->deallocate(p);
  alloc->check_invariants();
}

TEST_CASE("a failed event creation on a cross-stream free neither throws nor synchronizes",
          "[cuda][allocator][faults]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  void* p = alloc->allocate(MiB, s1.id());
  alloc->record_stream(p, s2.id());
  dbl::fail_nth("cudaEventCreate", 1);
  dbl::clear_calls();
  REQUIRE_NOTHROW(alloc->deallocate(p));
  REQUIRE(dbl::calls("cudaStreamSynchronize") == 0);
  REQUIRE(alloc->stats().syncs == 0);
  REQUIRE(dbl::last_error() == cudaSuccess);
  void* q = alloc->allocate(MiB, s1.id());
  REQUIRE(q != p);  // p waits for s2
  alloc->deallocate(q);
  alloc->empty_cache();  // may wait: s2 is synchronized, p is free
  REQUIRE(dbl::calls("cudaStreamSynchronize") >= 1);
  REQUIRE(alloc->stats().total[Metric::active_bytes].current == 0);
  alloc->check_invariants();
}

TEST_CASE("pinned staging buffers wait for the copy stream before reuse", "[cuda][pinned]") {
  Env env;
  auto host = std::make_shared<CudaPinnedHostBackend>(0, GiB);
  CudaStream compute;
  CudaStream copy;
  auto staging = make_allocator(host);
  void* buf = staging->allocate(4 * MiB, compute.id());  // filled by the host
  staging->record_stream(buf, copy.id());  // cudaMemcpyAsync(dev, buf, ..., copy) reads it
  staging->deallocate(buf);
  void* other = staging->allocate(4 * MiB, compute.id());
  REQUIRE(other != buf);  // the copy may still be reading buf
  dbl::complete_stream(copy.get());
  staging->deallocate(other);
  void* a = staging->allocate(4 * MiB, compute.id());
  void* b = staging->allocate(4 * MiB, compute.id());
  REQUIRE(((a == buf && b == other) || (a == other && b == buf)));
  const auto reserved = staging->stats().total[Metric::reserved_bytes].current;
  REQUIRE(dbl::host_used_bytes() == static_cast<std::size_t>(reserved));
  REQUIRE(dbl::used_bytes(0) == 0);
  REQUIRE(staging->stats().syncs == 0);
  staging->deallocate(a);
  staging->deallocate(b);
  staging->check_invariants();
}

TEST_CASE("at process exit, destroying the allocator makes no CUDA call", "[cuda][shutdown]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  auto backend = make_cuda_backend(kind, 0);
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(backend);
  (void)alloc->allocate(4 * MiB, s1.id());  // still allocated at exit
  void* q = alloc->allocate(30 * MiB, s1.id());
  alloc->record_stream(q, s2.id());
  alloc->deallocate(q);  // a free waiting for s2's event
  alloc->deallocate(alloc->allocate(MiB, s1.id()));  // and a cached free block
  SECTION("the exit hook ran before the driver went away") {
    cuda_detail::mark_cuda_shutdown();  // what the atexit hook does
    dbl::simulate_driver_shutdown();
  }
  SECTION("CUDA reported the shutdown first") {
    dbl::simulate_driver_shutdown();
    REQUIRE_THROWS_AS(alloc->allocate(64 * MiB, s1.id()), DeviceError);
    REQUIRE_NOTHROW(backend->free_segment(reinterpret_cast<void*>(Address{1} << 40), 2 * MiB, 0));
  }
  REQUIRE_FALSE(backend->alive());
  REQUIRE_FALSE(cuda_runtime_alive());
  dbl::clear_calls();
  alloc.reset();
  backend.reset();
  REQUIRE(dbl::total_calls() == 0);
}

TEST_CASE("a backend shared by two allocators serves both", "[cuda][allocator]") {
  Env env;
  auto backend = make_cuda_backend(CudaBackendKind::async_pool, 0);
  auto a = make_allocator(backend);
  auto b = make_allocator(backend);
  void* p = a->allocate(3 * MiB);
  void* q = b->allocate(3 * MiB);
  REQUIRE(p != q);
  REQUIRE(dbl::used_bytes(0) == 40 * MiB);  // a 20 MiB large segment each
  a->deallocate(p);
  b->deallocate(q);
  a.reset();
  REQUIRE(dbl::used_bytes(0) == 20 * MiB);
  b.reset();
  REQUIRE(dbl::used_bytes(0) == 0);
}

// --- the allocator's vmm mode on the VMM backend --------------------------------------------

TEST_CASE("vmm mode: pages are mapped with access and unmapped only after the heap's stream",
          "[cuda][vmm][allocator]") {
  Env env;
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  void* p = alloc->allocate(30 * MiB, s.id());
  REQUIRE(dbl::mapped_bytes() >= 30 * MiB);
  REQUIRE(dbl::access_flags(reinterpret_cast<CUdeviceptr>(p), 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  REQUIRE(dbl::live_reservations() == 1);  // one heap for the stream's large pool
  alloc->deallocate(p);
  dbl::clear_calls();
  alloc->empty_cache();
  REQUIRE(dbl::mapped_bytes() == 0);
  REQUIRE(dbl::live_physical() == 0);
  // The heap's stream was synchronized before the first unmap.
  const auto log = dbl::call_log();
  const auto sync = std::find_if(log.begin(), log.end(),
                                 [](const dbl::Call& c) { return c.api == "cudaStreamSynchronize"; });
  const auto unmap = std::find_if(log.begin(), log.end(),
                                  [](const dbl::Call& c) { return c.api == "cuMemUnmap"; });
  REQUIRE(sync != log.end());
  REQUIRE(unmap != log.end());
  REQUIRE(sync < unmap);
  alloc.reset();
  REQUIRE(dbl::live_reservations() == 0);
  REQUIRE(dbl::used_bytes(0) == 0);
}

TEST_CASE("vmm mode: an OOM across streams leaves the allocator consistent and usable",
          "[cuda][vmm][allocator][oom]") {
  Env env;
  reset_with_capacity(128 * MiB);
  CudaStream s1;
  CudaStream s2;
  CudaStream s3;
  const Stream streams[] = {s1.id(), s2.id(), s3.id()};
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  std::vector<std::pair<void*, Stream>> live;
  bool oom = false;
  try {
    for (std::size_t n = 0;; ++n) {
      const Stream st = streams[n % 3];
      live.emplace_back(alloc->allocate(12 * MiB, st), st);
    }
  } catch (const OutOfMemoryError&) {
    oom = true;
  }
  REQUIRE(oom);
  REQUIRE(live.size() >= 8);
  REQUIRE(alloc->stats().ooms == 1);
  REQUIRE(dbl::last_error() == cudaSuccess);
  alloc->check_invariants();
  const auto [p, s] = live.back();
  live.pop_back();
  alloc->deallocate(p);
  void* again = alloc->allocate(12 * MiB, s);
  REQUIRE(again != nullptr);
  live.emplace_back(again, s);
  for (const auto& [q, st] : live) alloc->deallocate(q);
  alloc->empty_cache();
  alloc->check_invariants();
  REQUIRE(dbl::used_bytes(0) == 0);
}

TEST_CASE("vmm mode: after the driver shuts down, teardown makes no CUDA call", "[cuda][vmm][shutdown]") {
  Env env;
  CudaStream s;
  auto backend = make_cuda_backend(CudaBackendKind::vmm, 0);
  auto alloc = make_allocator(backend, Config::parse("mode:vmm"));
  (void)alloc->allocate(40 * MiB, s.id());
  alloc->deallocate(alloc->allocate(3 * MiB, s.id()));
  cuda_detail::mark_cuda_shutdown();
  dbl::simulate_driver_shutdown();
  dbl::clear_calls();
  alloc.reset();
  backend.reset();
  REQUIRE(dbl::total_calls() == 0);
}

TEST_CASE("vmm mode: sleep gives every page back after the device's work, wake maps pages at the "
          "same addresses, 100 times", "[cuda][vmm][allocator][sleep]") {
  Env env;
  CudaStream s1;
  CudaStream s2;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  std::vector<std::pair<void*, Stream>> live;
  std::size_t next_size = 0;
  for (int cycle = 0; cycle < 100; ++cycle) {
    INFO("cycle " << cycle);
    for (int i = 0; i < 3; ++i) {
      const Stream st = i % 2 == 0 ? s1.id() : s2.id();
      const std::size_t n = next_size++;
      const std::size_t size = (n % 7 + 1) * 3 * MiB + 512 * (n % 5);
      live.emplace_back(alloc->allocate(size, st), st);
    }
    while (live.size() > 8) {
      alloc->deallocate(live.front().first);
      live.erase(live.begin());
    }
    dbl::clear_calls();
    const SleepReport r = alloc->sleep();
    REQUIRE(r.asleep_blocks == live.size());
    REQUIRE(dbl::mapped_bytes() == 0);
    REQUIRE(dbl::live_physical() == 0);
    REQUIRE(dbl::used_bytes(0) == 0);
    const auto log = dbl::call_log();
    const auto sync = std::find_if(log.begin(), log.end(),
                                   [](const dbl::Call& c) { return c.api == "cudaDeviceSynchronize"; });
    const auto unmap =
        std::find_if(log.begin(), log.end(), [](const dbl::Call& c) { return c.api == "cuMemUnmap"; });
    REQUIRE(sync != log.end());
    REQUIRE(unmap != log.end());
    REQUIRE(sync < unmap);
    for (const auto& [p, st] : live) REQUIRE(alloc->is_asleep(p));
    alloc->check_invariants();
    alloc->wake();
    REQUIRE(dbl::mapped_bytes() == r.asleep_bytes);
    for (const auto& [p, st] : live) {
      REQUIRE_FALSE(alloc->is_asleep(p));
      REQUIRE(dbl::access_flags(reinterpret_cast<CUdeviceptr>(p), 0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }
    alloc->check_invariants();
  }
  for (const auto& [p, st] : live) alloc->deallocate(p);
  alloc->empty_cache();
  REQUIRE(dbl::live_physical() == 0);
  alloc.reset();
  REQUIRE(dbl::live_reservations() == 0);
}

TEST_CASE("vmm mode: contents kept in pinned host memory come back at wake", "[cuda][vmm][allocator][sleep]") {
  Env env;
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::vmm, 0), Config::parse("mode:vmm"));
  std::vector<std::pair<void*, std::vector<unsigned char>>> live;
  for (int cycle = 0; cycle < 100; ++cycle) {
    INFO("cycle " << cycle);
    if (live.size() == 6) {  // some blocks live on, others come and go
      alloc->deallocate(live[1].first);
      live.erase(live.begin() + 1);
    }
    const std::size_t n = (static_cast<std::size_t>(cycle) % 5 + 1) * MiB + 777;
    std::vector<unsigned char> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + static_cast<std::size_t>(cycle));
    void* p = alloc->allocate(n, s.id());
    REQUIRE(cudaMemcpy(p, bytes.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
    live.emplace_back(p, std::move(bytes));
    dbl::clear_calls();
    const SleepReport r = alloc->sleep(Contents::keep);
    REQUIRE(r.kept_bytes > 0);
    REQUIRE(dbl::live_physical() == 0);
    const auto log = dbl::call_log();
    REQUIRE(std::any_of(log.begin(), log.end(), [](const dbl::Call& c) { return c.api == "cudaHostAlloc"; }));
    alloc->wake();
    for (const auto& [q, want] : live) {
      std::vector<unsigned char> back(want.size());
      REQUIRE(cudaMemcpy(back.data(), q, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
      REQUIRE(back == want);
    }
    alloc->check_invariants();
  }
  for (const auto& [p, want] : live) alloc->deallocate(p);
  alloc->empty_cache();
  REQUIRE(dbl::live_physical() == 0);
}

TEST_CASE("the fixed-segment CUDA backends refuse to sleep, with nothing changed", "[cuda][allocator][sleep]") {
  Env env;
  for (const CudaBackendKind kind : {CudaBackendKind::async_pool, CudaBackendKind::malloc}) {
    INFO(to_string(kind));
    auto alloc = make_allocator(make_cuda_backend(kind, 0), Config::parse("mode:fixed"));
    void* p = alloc->allocate(8 * MiB);
    const std::size_t used_before = dbl::used_bytes(0);
    REQUIRE_THROWS_WITH(alloc->sleep(), Catch::Contains("mode:vmm"));
    REQUIRE_THROWS_AS(alloc->wake(), UsageError);
    REQUIRE(dbl::used_bytes(0) == used_before);
    alloc->check_invariants();
    alloc->deallocate(p);
  }
}
