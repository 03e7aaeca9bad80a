// tests/cuda/test_double_graphs.cpp: CUDA graph capture on the test double. First the double's
// own capture state (what CUDA refuses while a stream is captured, per capture mode), then the
// Allocator on each CUDA backend: a stream captured in global mode is served from its graph pool
// with no CUDA call at all, so the capture ends valid; without a pool, the allocator refuses to
// grow rather than invalidate the capture.
#include "harness.hpp"

#include <map>
#include <random>
#include <thread>

using namespace tpcuda;
namespace dbl = tensorpool::cuda_double;

namespace {

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TP_CUDA_OK(cudaStreamIsCapturing(s, &status));
  return status;
}

// Ends the capture of `s`; its result, with the graph destroyed if one was made.
cudaError_t end_capture(cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) TP_CUDA_OK(cudaGraphDestroy(graph));
  return err;
}

}  // namespace

TEST_CASE("the double: in global mode a cudaMalloc during a capture fails and invalidates it",
          "[cuda][graphs]") {
  Env env;
  CudaStream s;
  REQUIRE(capture_status(s.get()) == cudaStreamCaptureStatusNone);
  TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  REQUIRE(capture_status(s.get()) == cudaStreamCaptureStatusActive);
  REQUIRE(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, MiB) == cudaErrorStreamCaptureUnsupported);
  REQUIRE(p == nullptr);
  REQUIRE(capture_status(s.get()) == cudaStreamCaptureStatusInvalidated);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s.get(), &graph) == cudaErrorStreamCaptureInvalidated);
  REQUIRE(graph == nullptr);
  REQUIRE(end_capture(s.get()) == cudaErrorIllegalState);  // no capture any more
  REQUIRE(dbl::used_bytes(0) == 0);
}

TEST_CASE("the double: capture modes decide which threads' calls are refused", "[cuda][graphs]") {
  Env env;
  CudaStream s;
  SECTION("thread-local: another thread may allocate, the capturing one may not") {
    TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
    cudaError_t other = cudaErrorUnknown;
    void* q = nullptr;
    std::thread([&] { other = cudaMalloc(&q, MiB); }).join();
    REQUIRE(other == cudaSuccess);
    REQUIRE(capture_status(s.get()) == cudaStreamCaptureStatusActive);
    REQUIRE(cudaFree(q) == cudaErrorStreamCaptureUnsupported);  // the capturing thread's call
    REQUIRE(end_capture(s.get()) == cudaErrorStreamCaptureInvalidated);
    TP_CUDA_OK(cudaFree(q));
  }
  SECTION("relaxed: allocation is allowed, synchronizing the captured stream is not") {
    TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeRelaxed));
    void* q = nullptr;
    TP_CUDA_OK(cudaMalloc(&q, MiB));
    TP_CUDA_OK(cudaFree(q));
    REQUIRE(end_capture(s.get()) == cudaSuccess);
    TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeRelaxed));
    REQUIRE(cudaStreamSynchronize(s.get()) == cudaErrorStreamCaptureUnsupported);
    REQUIRE(end_capture(s.get()) == cudaErrorStreamCaptureInvalidated);
  }
  SECTION("the legacy stream cannot be captured") {
    REQUIRE(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal) ==
            cudaErrorStreamCaptureUnsupported);
  }
  REQUIRE(dbl::live_graphs() == 0);
}

TEST_CASE("a stream captured in global mode is served from its graph pool with no CUDA call",
          "[cuda][graphs][allocator]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  const GraphPool pool = alloc->begin_capture(s.id(), 96 * MiB);
  TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  dbl::clear_calls();
  std::mt19937_64 rng(11);
  std::map<void*, std::size_t> live;
  for (int i = 0; i < 300; ++i) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 40)) {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      alloc->deallocate(it->first);
      live.erase(it);
    } else {
      const std::size_t bytes = 1 + rng() % (2 * MiB);
      live.emplace(alloc->allocate(bytes, s.id()), bytes);
    }
  }
  INFO("first call during the capture: " << (dbl::call_log().empty() ? "none" : dbl::call_log().front().api));
  REQUIRE(dbl::total_calls() == 0);
  REQUIRE(end_capture(s.get()) == cudaSuccess);
  alloc->end_capture(s.id());
  alloc->check_invariants();
  for (const auto& [p, n] : live) alloc->deallocate(p);
  alloc->release_graph(pool);
  alloc->empty_cache();
  REQUIRE(alloc->usage().reserved == 0);
  REQUIRE(dbl::used_bytes(0) + dbl::host_used_bytes() == 0);
}

TEST_CASE("without a graph pool, a captured stream is refused growth and the capture stays valid",
          "[cuda][graphs][allocator]") {
  Env env;
  TP_EACH_BACKEND_KIND(kind);
  CudaStream s;
  auto alloc = make_allocator(make_cuda_backend(kind, 0));
  TP_CUDA_OK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  dbl::clear_calls();
  REQUIRE_THROWS_WITH(alloc->allocate(8 * MiB, s.id()), Catch::Contains("before cudaStreamBeginCapture"));
  REQUIRE_THROWS_WITH(alloc->begin_capture(s.id(), 8 * MiB), Catch::Contains("being captured already"));
  for (const dbl::Call& call : dbl::call_log()) {  // the question, and the device guard around it
    INFO(call.api);
    REQUIRE((call.api == "cudaStreamIsCapturing" || call.api == "cudaGetDevice" || call.api == "cudaSetDevice"));
  }
  REQUIRE(dbl::calls("cudaStreamIsCapturing") == 2);
  REQUIRE(capture_status(s.get()) == cudaStreamCaptureStatusActive);
  REQUIRE(end_capture(s.get()) == cudaSuccess);
  alloc->check_invariants();
  REQUIRE(alloc->usage().reserved == 0);
}
