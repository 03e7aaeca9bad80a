// A Thrust program whose temporary storage comes from tensorpool through ThrustAllocator and
// thrust::cuda::par(alloc).on(stream). Built with nvcc in every CUDA build (so it compiles and
// links in CI); it needs a GPU to run and exits 77 (CTest: skipped) without one.
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cstdio>
#include <functional>
#include <memory>

#include "tensorpool/allocator.hpp"
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/cuda/thrust_allocator.hpp"

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("thrust_allocator: no CUDA device, skipped\n");
    return 77;
  }
  tensorpool::Allocator alloc(std::make_shared<tensorpool::CudaAsyncBackend>(0), tensorpool::Config{});
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return 2;
  bool ok = false;
  {
    const int n = 1 << 22;
    thrust::device_vector<int> keys(n);
    thrust::sequence(keys.begin(), keys.end(), n, -1);  // n, n-1, ..., 1
    tensorpool::ThrustAllocator temp(alloc, stream);
    thrust::sort(thrust::cuda::par(temp).on(stream), keys.begin(), keys.end());
    const bool sorted = thrust::is_sorted(thrust::cuda::par(temp).on(stream), keys.begin(), keys.end());
    cudaStreamSynchronize(stream);
    const int first = keys.front();
    const tensorpool::Stats stats = alloc.stats();
    std::printf("thrust_allocator: sorted %d keys, %llu temporary allocations from tensorpool\n", n,
                static_cast<unsigned long long>(stats.alloc_calls));
    ok = sorted && first == 1 && stats.alloc_calls > 0 && alloc.usage().allocated == 0;
  }
  alloc.empty_cache();
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}
