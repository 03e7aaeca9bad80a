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

#include "replay/model_support.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::cuda_replay {

namespace {

namespace cub = ::tensorpool_cub_unwrapped::cub;

using replay::UpstreamCounts;
constexpr const char* kName = "cub-real";

// As the "cub" model reads them: any bin key selects CUB's bins constructor (all three passed,
// unset ones 8, 3, 7; its limit defaults to none), else the default constructor.
struct CubSettings {
  unsigned bin_growth = 8, min_bin = 3, max_bin = 7;
  bool bins_set = false;
  bool limit_set = false;
  std::size_t max_cached_bytes = 0;  // with limit_set; kUnlimited: none
};

CubSettings parse(const std::string& conf) {
  namespace m = replay::model;
  CubSettings s;
  for (const m::ConfEntry& e : m::parse_conf(conf, kName)) {
    s.bins_set = s.bins_set || e.key == "bin_growth" || e.key == "min_bin" || e.key == "max_bin";
    if (e.key == "bin_growth") s.bin_growth = static_cast<unsigned>(m::conf_uint(kName, e, 1U << 20));
    else if (e.key == "min_bin") s.min_bin = static_cast<unsigned>(m::conf_uint(kName, e, 64));
    else if (e.key == "max_bin") s.max_bin = static_cast<unsigned>(m::conf_uint(kName, e, 64));
    else if (e.key == "max_cached_bytes") {
      s.max_cached_bytes = m::conf_size(kName, e, true);
      s.limit_set = true;
    } else {
      m::unknown_conf_key(kName, e, "bin_growth, min_bin, max_bin, max_cached_bytes");
    }
  }
  if (s.bin_growth < 2 || s.min_bin > s.max_bin) throw ConfigError("cub-real conf: bad bins");
  return s;
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DeviceError(std::string(kName) + ": " + what + " failed: " + cudaGetErrorString(err));
}

class RealCubTarget final : public replay::ReplayTarget {
 public:
  RealCubTarget(const replay::TargetOptions& o, RealCubProbes probes)
      : device_(o.device), probes_(std::move(probes)) {
    const CubSettings s = parse(o.conf);
    const std::size_t limit = !s.limit_set || s.max_cached_bytes == replay::model::kUnlimited
                                  ? cub::CachingDeviceAllocator::INVALID_SIZE
                                  : s.max_cached_bytes;
    if (s.bins_set) {
      cub_ = std::make_unique<cub::CachingDeviceAllocator>(s.bin_growth, s.min_bin, s.max_bin, limit);
    } else {
      cub_ = std::make_unique<cub::CachingDeviceAllocator>();
      if (s.limit_set) cub_->SetMaxCachedBytes(limit);
    }
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

std::unique_ptr<replay::ReplayTarget> make_real_cub_target(const replay::TargetOptions& options,
                                                           RealCubProbes probes) {
  return std::make_unique<RealCubTarget>(options, std::move(probes));
}

}  // namespace tensorpool::cuda_replay
