// cub_real_target.cpp: the "cub-real" replay target: every allocate, free, stream sync and
// empty_cache of the trace goes to a real cub::CachingDeviceAllocator, whose cudaMalloc,
// cudaFree and event calls reach the linked CUDA runtime. Trace streams become CUDA streams of
// the target's device (trace stream 0: the legacy default stream).
//
// Invariants: live_ holds exactly the blocks CUB handed out and the trace has not freed, with
// the bytes CUB accounts them at (bin size, or the exact request when unbinned);
// allocated_ == sum of those bytes.
#include "cub_real_target.hpp"

#include <cuda_runtime_api.h>

// CUB wraps its runtime calls in CubDebug(), which also returns any error pending in the
// runtime's last-error state. A runtime that records cudaEventQuery's cudaErrorNotReady there
// (the test double does; PyTorch clears it after the same query for that reason) then makes
// DeviceAllocate(device, ...) fail with cudaErrorNotReady whenever it looked at a block another
// stream still uses and found none to reuse (test "real CUB as shipped" in
// tests/cuda/test_cub_vs_model.cpp).
// This target measures CUB's caching policy, so its calls are left unwrapped. The changed macro
// changes CUB's inline functions: they are compiled in a namespace of their own so they never
// meet (ODR) the unchanged ones of another file of the same program.
#define CubDebug(e) (e)
#define CUB_WRAPPED_NAMESPACE tensorpool_cub_unwrapped
#include <cub/util_allocator.cuh>

#include <string>
#include <unordered_map>

#include "replay/models/cub_settings.hpp"
#include "replay/models/model_support.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::cuda_replay {

namespace {

namespace cub = ::tensorpool_cub_unwrapped::cub;

using replay::UpstreamCounts;
constexpr const char* kName = "cub-real";
constexpr const char* kOrigin = "cub-real conf";

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DeviceError(std::string(kName) + ": " + what + " failed: " + cudaGetErrorString(err));
}

class RealCubTarget final : public replay::ReplayTarget {
 public:
  RealCubTarget(const replay::TargetOptions& o, RealCubProbes probes)
      : device_(o.device), probes_(std::move(probes)) {
    // Settings as the "cub" model reads them; with none, they are the default constructor's
    // (8, 3, 7, (8^7) * 3 - 1), so the bins constructor is the same allocator then.
    const replay::model::CubSettings s = replay::model::parse_cub_settings(o.conf, kOrigin);
    const std::size_t limit = s.max_cached_bytes == replay::model::kUnlimited
                                  ? cub::CachingDeviceAllocator::INVALID_SIZE
                                  : s.max_cached_bytes;
    cub_ = std::make_unique<cub::CachingDeviceAllocator>(s.bin_growth, s.min_bin, s.max_bin, limit);
  }
  ~RealCubTarget() override {
    cub_.reset();  // frees the cached blocks (the trace's live blocks stay with the runtime)
    for (const auto& [id, s] : streams_) cudaStreamDestroy(s);
  }

  std::string name() const override { return kName; }

  void* allocate(std::size_t bytes, Stream stream) override {
    void* p = nullptr;
    const cudaError_t err = cub_->DeviceAllocate(device_, &p, bytes, map(stream));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // CUB leaves the failure as the runtime's last error
      OutOfMemoryInfo info;
      info.requested = bytes;
      info.stream = stream;
      info.device = device_;
      info.reserved = reserved();
      info.allocated = allocated_;
      throw OutOfMemoryError(info);
    }
    check(err, "DeviceAllocate");
    const auto it = cub_->live_blocks.find(cub::CachingDeviceAllocator::BlockDescriptor(p, device_));
    const std::size_t held = it == cub_->live_blocks.end() ? bytes : it->bytes;
    live_[p] = held;
    allocated_ += held;
    return p;
  }

  void deallocate(void* ptr, std::size_t, Stream) override {
    const auto it = live_.find(ptr);
    if (it == live_.end()) throw UsageError(std::string(kName) + ": deallocate of a pointer that is not allocated");
    allocated_ -= it->second;
    live_.erase(it);
    check(cub_->DeviceFree(device_, ptr), "DeviceFree");
  }

  void stream_synchronized(Stream stream) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(map(stream)), "cudaStreamSynchronize");
  }

  void empty_cache() override { check(cub_->FreeAllCached(), "FreeAllCached"); }

  std::size_t reserved() const override {
    if (probes_.reserved) return probes_.reserved(device_);
    const auto it = cub_->cached_bytes.find(device_);
    return it == cub_->cached_bytes.end() ? 0 : it->second.free + it->second.live;
  }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override { return probes_.upstream ? probes_.upstream(device_) : UpstreamCounts{}; }

 private:
  cudaStream_t map(Stream trace_stream) {
    if (trace_stream == 0) return nullptr;
    auto [it, inserted] = streams_.try_emplace(trace_stream, nullptr);
    if (inserted) {
      check(cudaSetDevice(device_), "cudaSetDevice");
      check(cudaStreamCreateWithFlags(&it->second, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    return it->second;
  }

  int device_;
  RealCubProbes probes_;
  std::unique_ptr<cub::CachingDeviceAllocator> cub_;
  std::unordered_map<Stream, cudaStream_t> streams_;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t allocated_ = 0;
};

}  // namespace

const replay::TargetDescriptor& real_cub_descriptor() {
  static const replay::TargetDescriptor d{
      kName, "the real CUB CachingDeviceAllocator (CCCL) over the linked CUDA runtime",
      replay::model::cub_settings_keys()};
  return d;
}

std::unique_ptr<replay::ReplayTarget> make_real_cub_target(const replay::TargetOptions& options,
                                                           RealCubProbes probes) {
  return std::make_unique<RealCubTarget>(options, std::move(probes));
}

}  // namespace tensorpool::cuda_replay
