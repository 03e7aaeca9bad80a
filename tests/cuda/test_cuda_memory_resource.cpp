// CudaMemoryResource (tensorpool/cuda/cuda_memory_resource.hpp) on the simulated device: it
// models CCCL's cuda::mr concepts (static_asserts, here and in the header), works through the
// type-erased cuda::mr::async_resource_ref that RMM-style code takes, and frees stream-ordered.
#include <catch2/catch.hpp>

#include <memory>

#include "tensorpool/cuda/cuda_memory_resource.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

static_assert(cuda::mr::resource<CudaMemoryResource>);
static_assert(cuda::mr::async_resource<CudaMemoryResource>);
static_assert(cuda::mr::async_resource_with<CudaMemoryResource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<CudaMemoryResource, cuda::mr::host_accessible>);

namespace {

cudaStream_t as_cuda(Stream s) { return to_cuda_stream(s); }

}  // namespace

TEST_CASE("CudaMemoryResource through cuda::mr::async_resource_ref", "[cuda][adapters]") {
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 256 * MiB});
  Allocator alloc(device, Config{});
  const Stream s = device->create_stream();
  const Stream other = device->create_stream();
  CudaMemoryResource mr(alloc, s);
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{mr};

  void* p = ref.allocate(1000, 256);  // on the resource's stream
  CHECK(alloc.usage().requested == 1000);
  ref.deallocate(p, 1000, 256);
  void* q = ref.allocate_async(1000, 256, cuda::stream_ref{as_cuda(s)});
  CHECK(q == p);  // cached for s, reused on s
  // Freed on another stream: the block waits for that stream's work before it is reused.
  ref.deallocate_async(q, 1000, 256, cuda::stream_ref{as_cuda(other)});
  void* r = ref.allocate_async(1000, 256, cuda::stream_ref{as_cuda(s)});
  CHECK(r != q);
  device->complete_stream(other);
  void* t = ref.allocate_async(1000, 256, cuda::stream_ref{as_cuda(s)});
  CHECK(t == q);
  ref.deallocate_async(r, 1000, 256, cuda::stream_ref{as_cuda(s)});
  ref.deallocate_async(t, 1000, 256, cuda::stream_ref{as_cuda(s)});
  CHECK(alloc.usage().allocated == 0);
  CHECK_THROWS_WITH(mr.allocate(64, 1024), Catch::Contains("CudaMemoryResource") && Catch::Contains("1024"));

  Allocator other_alloc(std::make_shared<SimulatedDevice>(), Config{});
  CHECK(mr == CudaMemoryResource(alloc, other));
  CHECK(mr != CudaMemoryResource(other_alloc, s));
  alloc.check_invariants();
}
