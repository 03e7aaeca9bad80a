// raw_target.cpp: no caching at all: every allocation and free goes to the device, as
// cudaMalloc/cudaFree would. cudaFree waits for the device to be idle (CUDA's documented
// behaviour), so each free is counted as a host synchronization, as in the cub model.
// (cudaMallocAsync with a zero release threshold holds the same memory without those waits.)
//
// Rounding follows what the CUDA driver does with cudaMalloc: requests of 2 MiB and more take
// whole 2 MiB pages; smaller ones are packed into shared pages, modelled as 512-byte rounding.
// The simulated device therefore has a 512-byte granularity.
#include <algorithm>
#include <unordered_map>

#include "replay/models/model_support.hpp"
#include "replay/models/models.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"

namespace tensorpool::replay {

namespace {

// raw takes no settings: any key is unknown.
void check_settings(std::string_view conf, std::string_view origin) {
  for (const KeyValue& item : parse_key_values(conf, origin)) throw_unknown_key(origin, item, {});
}

class RawTarget final : public ReplayTarget {
 public:
  explicit RawTarget(const TargetOptions& o)
      : device_(SimulatedDeviceOptions{.name = "raw" + std::to_string(o.device), .ordinal = o.device,
                                       .capacity = o.capacity, .segment_granularity = 512,
                                       .event_mode = EventMode::immediate,
                                       .cost_model = o.cost_model}) {
    check_settings(o.conf, "raw conf");
  }

  std::string name() const override { return "raw"; }

  void* allocate(std::size_t bytes, Stream stream) override {
    if (bytes > device_.properties().capacity) throw OutOfMemoryError(oom_info(bytes, bytes, stream));
    const std::size_t size = model::cuda_malloc_bytes(bytes);
    void* p = device_.allocate_segment(size, stream);
    if (p == nullptr) throw OutOfMemoryError(oom_info(bytes, size, stream));
    reserved_ += size;
    live_.emplace(reinterpret_cast<Address>(p), Live{size, stream});
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes, Stream stream) override {
    const std::size_t size = model::cuda_malloc_bytes(bytes);
    model::cuda_free(device_, ptr, size, stream);
    reserved_ -= size;
    live_.erase(reinterpret_cast<Address>(ptr));
  }

  // Every allocation is a segment of its own, wholly allocated.
  std::optional<MemoryMap> memory_map() const override {
    MemoryMap m;
    for (const auto& [addr, live] : live_)
      m.segments.push_back(MapSegment{addr, live.size, live.stream, false,
                                      {MapBlock{addr, live.size, BlockState::allocated, true, live.stream, 0, 0}}});
    std::sort(m.segments.begin(), m.segments.end(),
              [](const MapSegment& a, const MapSegment& b) { return a.address < b.address; });
    return m;
  }

  std::size_t reserved() const override { return reserved_; }
  std::size_t allocated() const override { return reserved_; }
  UpstreamCounts upstream() const override { return upstream_of(device_); }

 private:
  OutOfMemoryInfo oom_info(std::size_t bytes, std::size_t size, Stream stream) {
    return model::oom_info(device_, bytes, size, stream, reserved_, reserved_);
  }

  struct Live {
    std::size_t size;  // rounded
    Stream stream;
  };

  SimulatedDevice device_;
  std::size_t reserved_ = 0;  // == the sum of live_ sizes
  std::unordered_map<Address, Live> live_;  // for memory_map()
};

}  // namespace

std::unique_ptr<ReplayTarget> make_raw_target(const TargetOptions& options) {
  return std::make_unique<RawTarget>(options);
}

TargetEntry raw_entry() {
  return {{"raw", "no caching: every allocation and free goes to the device", {},
           /*holds_memory_until_destroyed=*/false, /*exports=*/false, /*maps=*/true},
          check_settings, make_raw_target};
}

}  // namespace tensorpool::replay
