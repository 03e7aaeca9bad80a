// async_backend.cpp: CudaAsyncBackend, segments from a dedicated stream-ordered memory pool.
//
// The pool is created for the backend's device with a release threshold of UINT64_MAX: the
// driver never trims it at synchronization points on its own. free_segment frees on the
// segment's stream (cudaFreeAsync) and then trims the pool, so that memory the allocator gives
// back (empty_cache, the OOM ladder) is really returned to the device once the free has run.
#include <cstdint>
#include <limits>

#include "cuda_common.hpp"

namespace tensorpool {

using cuda_detail::as_stream;
using cuda_detail::check;
using cuda_detail::DeviceGuard;

namespace {
cudaMemPool_t as_pool(void* p) noexcept { return static_cast<cudaMemPool_t>(p); }
}  // namespace

CudaAsyncBackend::CudaAsyncBackend(int device) : CudaBackend(device, "cudaMallocAsync") {
  DeviceGuard guard(device_);
  int supported = 0;
  check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device_),
        "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)", device_);
  if (supported == 0)
    throw DeviceError("CUDA device " + std::to_string(device_) +
                      " does not support stream-ordered memory pools");
  cudaMemPoolProps pool_props{};
  pool_props.allocType = cudaMemAllocationTypePinned;
  pool_props.handleTypes = cudaMemHandleTypeNone;
  pool_props.location.type = cudaMemLocationTypeDevice;
  pool_props.location.id = device_;
  cudaMemPool_t pool = nullptr;
  check(cudaMemPoolCreate(&pool, &pool_props), "cudaMemPoolCreate", device_);
  pool_ = pool;
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  const cudaError_t err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (err != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool);  // the constructor fails: do not leak the pool
    check(err, "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)", device_);
  }
}

CudaAsyncBackend::~CudaAsyncBackend() {
  if (!alive() || pool_ == nullptr) return;
  try {
    DeviceGuard guard(device_);
    // Outstanding allocations keep the pool's memory until they are freed (CUDA semantics).
    (void)cudaMemPoolDestroy(as_pool(pool_));
  } catch (...) {  // a destructor cannot report
  }
  (void)cudaGetLastError();
}

void* CudaAsyncBackend::allocate_segment(std::size_t bytes, Stream stream) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  const cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes, as_pool(pool_), as_stream(stream));
  if (!cuda_detail::check_alloc(err, "cudaMallocFromPoolAsync", device_, bytes)) return nullptr;
  return ptr;
}

void CudaAsyncBackend::free_segment(void* ptr, std::size_t bytes, Stream stream) {
  if (!alive()) return;
  cuda_detail::ignoring_shutdown([&] {
    DeviceGuard guard(device_);
    check(cudaFreeAsync(ptr, as_stream(stream)), "cudaFreeAsync", device_, bytes);
    check(cudaMemPoolTrimTo(as_pool(pool_), 0), "cudaMemPoolTrimTo", device_);
  });
}

}  // namespace tensorpool
