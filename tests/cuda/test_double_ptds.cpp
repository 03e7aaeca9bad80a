// tests/cuda/test_double_ptds.cpp: the backends compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM
// (as in a program built with nvcc --default-stream per-thread), on the test double. They call
// the _ptsz entry points, and tensorpool's stream 0 is then each thread's per-thread stream.
#include "harness.hpp"

#include <thread>

using namespace tpcuda;
namespace dbl = tensorpool::cuda_double;

TEST_CASE("backends built for per-thread default streams call the _ptsz entry points",
          "[cuda][ptds]") {
  Env env;
  auto backend = make_cuda_backend(CudaBackendKind::async_pool, 0);
  dbl::clear_calls();
  void* p = backend->allocate_segment(2 * MiB, kDefaultStream);
  const DeviceEvent e = backend->create_event();
  backend->record_event(e, kDefaultStream);
  backend->stream_wait_event(kDefaultStream, e);
  backend->synchronize_stream(kDefaultStream);
  backend->free_segment(p, 2 * MiB, kDefaultStream);
  backend->destroy_event(e);
  for (const char* api : {"cudaMallocFromPoolAsync", "cudaEventRecord", "cudaStreamWaitEvent",
                          "cudaStreamSynchronize", "cudaFreeAsync"}) {
    INFO(api);
    REQUIRE(dbl::calls(api) == 0);
    REQUIRE(dbl::calls(std::string(api) + "_ptsz") == 1);
  }
}

TEST_CASE("with per-thread default streams, stream 0 is each thread's own stream", "[cuda][ptds]") {
  Env env;
  auto backend = make_cuda_backend(CudaBackendKind::malloc, 0);
  const DeviceEvent mine = backend->create_event();
  const DeviceEvent theirs = backend->create_event();
  backend->record_event(mine, kDefaultStream);
  std::thread([&] { backend->record_event(theirs, kDefaultStream); }).join();
  dbl::complete_stream(cudaStreamLegacy);  // not the per-thread streams
  REQUIRE_FALSE(backend->query_event(mine));
  dbl::complete_stream(cudaStreamPerThread);  // this thread's
  REQUIRE(backend->query_event(mine));
  REQUIRE_FALSE(backend->query_event(theirs));
  REQUIRE(dbl::last_error() == cudaSuccess);
  dbl::complete_all();
  REQUIRE(backend->query_event(theirs));
  backend->destroy_event(mine);
  backend->destroy_event(theirs);
}

TEST_CASE("the caching allocator on per-thread default streams", "[cuda][ptds][allocator]") {
  Env env;
  auto alloc = make_allocator(make_cuda_backend(CudaBackendKind::async_pool, 0));
  void* p = alloc->allocate(8 * MiB);  // stream 0: this thread's per-thread stream
  alloc->record_stream(p, to_stream(cudaStreamLegacy));
  alloc->deallocate(p);
  void* q = alloc->allocate(8 * MiB);
  REQUIRE(q != p);  // the legacy stream may still use p
  dbl::complete_stream(cudaStreamLegacy);
  alloc->deallocate(q);
  void* r = alloc->allocate(8 * MiB);
  REQUIRE((r == p || r == q));
  alloc->deallocate(r);
  alloc->check_invariants();
  REQUIRE(dbl::calls("cudaMallocFromPoolAsync_ptsz") >= 1);
}
