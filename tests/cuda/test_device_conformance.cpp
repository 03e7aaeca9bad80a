// tests/cuda/test_device_conformance.cpp: each CUDA backend through the DeviceBackend
// conformance suite (tests/conformance). On the test double by default (work completes only
// when the test says so); with TENSORPOOL_CUDA_REAL_TESTS on the real runtime, where pinned host
// memory is not filled to three quarters of the machine.
#include "harness.hpp"

#include <vector>

#include "conformance/device_backend.hpp"

using namespace tpcuda;
using conformance::BackendUnderTest;

namespace {

constexpr std::size_t kHostCapacity = 64 * GiB;  // the double's pinned host memory (Options)

BackendUnderTest cuda_backend(CudaBackendKind kind) {
  BackendUnderTest t;
  // The pinned host backend gets the double's host capacity, so that filling it means something.
  t.backend = kind == CudaBackendKind::pinned_host && !kReal
                  ? std::make_shared<CudaPinnedHostBackend>(0, kHostCapacity)
                  : make_cuda_backend(kind, 0);
  auto streams = std::make_shared<std::vector<std::unique_ptr<CudaStream>>>();
  t.new_stream = [streams] {
    streams->push_back(std::make_unique<CudaStream>());
    return streams->back()->id();
  };
  t.finish = [](Stream s) { finish(to_cuda_stream(s)); };
  t.work_stays_pending = !kReal;
  t.may_fill_device = !(kReal && kind == CudaBackendKind::pinned_host);
  t.after_each = [] { CHECK(pending_error() == cudaSuccess); };
  return t;
}

}  // namespace

TEST_CASE("conformance: CudaAsyncBackend meets the DeviceBackend contract", "[cuda][conformance]") {
  Env env;
  conformance::check_device_backend([] { return cuda_backend(CudaBackendKind::async_pool); });
}

TEST_CASE("conformance: CudaMallocBackend meets the DeviceBackend contract", "[cuda][conformance]") {
  Env env;
  conformance::check_device_backend([] { return cuda_backend(CudaBackendKind::malloc); });
}

TEST_CASE("conformance: CudaVmmBackend meets the DeviceBackend contract", "[cuda][conformance]") {
  Env env;
  conformance::check_device_backend([] {
    BackendUnderTest t = cuda_backend(CudaBackendKind::vmm);
    REQUIRE(t.backend->virtual_memory() != nullptr);
    return t;
  });
}

TEST_CASE("conformance: CudaPinnedHostBackend meets the DeviceBackend contract", "[cuda][conformance]") {
  Env env;
  conformance::check_device_backend([] { return cuda_backend(CudaBackendKind::pinned_host); });
}
