// cub_model.cpp: the "cub" replay target, a model of CUB's CachingDeviceAllocator as its
// documentation describes it. Its cudaMalloc/cudaFree calls go to a SimulatedDevice of its own,
// whose counters are the target's upstream calls.
//
// The rules modelled (defaults are those of the default-constructed allocator):
//  - bin_growth 8, min_bin 3, max_bin 7: bins of 512 B, 4 KiB, 32 KiB, 256 KiB and 2 MiB.
//    A request is rounded up to the next power of bin_growth (at least bin_growth^min_bin).
//  - A request above bin_growth^max_bin is not binned: it is cudaMalloc'ed at its exact size
//    and cudaFree'd when it is freed, never cached.
//  - A request reuses a cached block of its own bin only (never a larger bin), the first one
//    cached (oldest first) that was freed on the same stream, or whose stream has completed the
//    work recorded at the free (CUB records an event there; in a replay, the host synchronizing
//    that stream after the free is what completes it).
//  - max_cached_bytes 6 MiB - 1 B: a freed block whose caching would take the cached total above
//    it is cudaFree'd instead ("none" in the conf: no limit). Setting any bin key models CUB's
//    constructor that takes bins, whose limit defaults to none.
//  - When cudaMalloc fails, every cached block of the device is cudaFree'd and cudaMalloc is
//    retried once; a second failure is an OutOfMemoryError. A request larger than the device
//    fails the same way (its cudaMalloc fails), so it too empties the cache first.
//  - cudaFree waits for the device to be idle (CUDA's documented behaviour): every cudaFree is
//    counted as a host synchronization and completes the work of every stream, so blocks cached
//    by other streams become reusable after it. (Found by replaying the shared traces through
//    the real CUB code on the CUDA-runtime test double: cuda/replay/cub_real_target.cpp and the
//    test tests/cuda/test_cub_vs_model.cpp keep the two in step.)
//
// Device sizes: each block is one cudaMalloc, charged as the raw target charges one
// (model::cuda_malloc_bytes): blocks of 2 MiB or more take whole 2 MiB pages, smaller ones are
// packed by the driver into shared pages (512-byte rounding), so a 512 B bin is not charged a
// page. An unbinned request of 3 MiB holds 4 MiB of the device. reserved() counts device sizes,
// as the raw target counts the same cudaMalloc calls.
//
// Invariants:
//  - reserved_ == sum of device sizes of live and cached blocks;
//  - allocated_ == sum of CUB sizes (bin size, or exact size when unbinned) of live blocks;
//  - cached_bytes_ == sum of CUB sizes of cached blocks <= max_cached_bytes.
#include <algorithm>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/models/cub_settings.hpp"
#include "replay/models/model_support.hpp"
#include "replay/models/models.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::replay {

namespace {

using model::kUnlimited;

constexpr const char* kName = "cub";
constexpr std::size_t kGranule = 512;  // of the simulated device: its allocation granularity
constexpr unsigned kUnbinned = ~0U;

// bin_growth^power, or kUnlimited when it does not fit in size_t.
std::size_t power_of(std::size_t base, unsigned power) noexcept {
  std::size_t v = 1;
  for (unsigned i = 0; i < power; ++i) {
    if (v > kUnlimited / base) return kUnlimited;
    v *= base;
  }
  return v;
}

struct Block {
  Address addr = 0;
  std::size_t bytes = 0;         // CUB's size: the bin size, or the exact request when unbinned
  std::size_t device_bytes = 0;  // what the device holds for it (model::cuda_malloc_bytes)
  unsigned bin = kUnbinned;
  Stream stream = kDefaultStream;  // the stream it was last allocated on
  std::uint64_t mark = 0;          // StreamClock mark of `stream` when it was cached
};

class CubModel final : public ReplayTarget {
 public:
  explicit CubModel(const TargetOptions& options)
      : settings_(model::parse_cub_settings(options.conf, std::string(kName) + " conf")),
        device_(device_options(options)),
        cache_(settings_.max_bin - settings_.min_bin + 1) {}

  std::string name() const override { return kName; }
  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  void stream_synchronized(Stream stream) override { clock_.synchronized(stream); }
  void empty_cache() override { free_all_cached(); }

  std::size_t reserved() const override { return reserved_; }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override { return upstream_of(device_); }
  std::optional<MemoryMap> memory_map() const override;

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    return model::malloc_device_options(o, "cub-model", kGranule);
  }

  Block bin_for(std::size_t bytes) const noexcept;
  bool reuse_cached(Block& want);
  void* device_malloc(const Block& b);
  void device_free(const Block& b);
  void free_all_cached();
  std::list<Block>& bin_list(unsigned bin) { return cache_[bin - settings_.min_bin]; }
  [[noreturn]] void throw_oom(std::size_t bytes, const Block& b, Stream stream);

  model::CubSettings settings_;
  SimulatedDevice device_;
  model::StreamClock clock_;
  std::vector<std::list<Block>> cache_;  // per bin (min_bin..max_bin), in caching order
  std::unordered_map<Address, Block> live_;
  std::size_t cached_bytes_ = 0;
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
};

// The bin of a request: the smallest power of bin_growth >= bytes, no less than min_bin; above
// max_bin the request is unbinned and keeps its exact size.
Block CubModel::bin_for(std::size_t bytes) const noexcept {
  Block b;
  unsigned power = 0;
  std::size_t rounded = 1;
  bool binned = true;
  while (rounded < bytes) {
    if (power == settings_.max_bin) {
      binned = false;
      break;
    }
    rounded *= settings_.bin_growth;  // cannot overflow: bin_growth^max_bin fits (checked)
    ++power;
  }
  if (!binned) {
    b.bytes = bytes;
  } else if (power < settings_.min_bin) {
    b.bin = settings_.min_bin;
    b.bytes = power_of(settings_.bin_growth, settings_.min_bin);
  } else {
    b.bin = power;
    b.bytes = rounded;
  }
  b.device_bytes = model::cuda_malloc_bytes(b.bytes);
  return b;
}

void* CubModel::allocate(std::size_t bytes, Stream stream) {
  // Beyond any device: fail before the rounding arithmetic could overflow.
  if (bytes > device_.properties().capacity) {
    free_all_cached();  // CUB's failed cudaMalloc empties the cache before it gives up
    throw_oom(bytes, Block{.bytes = bytes}, stream);
  }
  Block b = bin_for(bytes);
  b.stream = stream;
  if (b.bin == kUnbinned || !reuse_cached(b)) {
    void* p = device_malloc(b);
    if (p == nullptr) {
      free_all_cached();  // CUB's one retry after freeing the whole cache
      p = device_malloc(b);
    }
    if (p == nullptr) throw_oom(bytes, b, stream);
    b.addr = reinterpret_cast<Address>(p);
    reserved_ += b.device_bytes;
  }
  allocated_ += b.bytes;
  live_.emplace(b.addr, b);
  return reinterpret_cast<void*>(b.addr);
}

// Takes the first usable block cached in `want`'s bin; fills in its address. False: none.
bool CubModel::reuse_cached(Block& want) {
  auto& list = bin_list(want.bin);
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (it->stream != want.stream && !clock_.completed(it->stream, it->mark)) continue;
    want.addr = it->addr;
    want.device_bytes = it->device_bytes;
    cached_bytes_ -= it->bytes;
    list.erase(it);
    return true;
  }
  return false;
}

void CubModel::deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  const auto it = live_.find(reinterpret_cast<Address>(ptr));
  if (it == live_.end())
    throw UsageError(std::string(kName) + ": deallocate of a pointer that is not allocated");
  Block b = it->second;
  live_.erase(it);
  allocated_ -= b.bytes;
  const bool fits = settings_.max_cached_bytes == kUnlimited ||
                    cached_bytes_ + b.bytes <= settings_.max_cached_bytes;
  if (b.bin != kUnbinned && fits) {
    b.mark = clock_.mark(b.stream);  // CUB records its ready event on the stream here
    cached_bytes_ += b.bytes;
    bin_list(b.bin).push_back(b);
    return;
  }
  device_free(b);
}

void* CubModel::device_malloc(const Block& b) {
  return device_.allocate_segment(b.device_bytes, b.stream);
}

void CubModel::device_free(const Block& b) {
  model::cuda_free(device_, reinterpret_cast<void*>(b.addr), b.device_bytes, b.stream);
  reserved_ -= b.device_bytes;
  clock_.synchronized_all();
}

void CubModel::free_all_cached() {
  for (auto& list : cache_) {
    for (const Block& b : list) device_free(b);
    list.clear();
  }
  cached_bytes_ = 0;
}

// Every block is a cudaMalloc of its own: one segment each, live or cached (free, held by the
// stream it was last allocated on), of its device size.
std::optional<MemoryMap> CubModel::memory_map() const {
  std::vector<MapSegment> segments;
  const auto add = [&](const Block& b, BlockState state) {
    segments.push_back(MapSegment{b.addr, b.device_bytes, b.stream, false,
                                  {MapBlock{b.addr, b.device_bytes, state, true, b.stream, 0, 0}}});
  };
  for (const auto& [addr, b] : live_) add(b, BlockState::allocated);
  for (const auto& list : cache_)
    for (const Block& b : list) add(b, BlockState::free);
  std::sort(segments.begin(), segments.end(),
            [](const MapSegment& a, const MapSegment& b) { return a.address < b.address; });
  return MemoryMap{std::move(segments)};
}

[[noreturn]] void CubModel::throw_oom(std::size_t bytes, const Block& b, Stream stream) {
  OutOfMemoryInfo info = model::oom_info(device_, bytes, b.bytes, stream, reserved_, allocated_);
  for (const auto& list : cache_)
    for (const Block& c : list) model::add_cached(info, c.stream, c.bytes, c.bytes);
  throw OutOfMemoryError(info);
}

}  // namespace

namespace model {

const std::vector<std::string>& cub_settings_keys() {
  static const std::vector<std::string> keys = {"bin_growth", "min_bin", "max_bin",
                                                "max_cached_bytes"};
  return keys;
}

// Any bin key selects CUB's constructor that takes bins (unset bin keys keep 8, 3 and 7).
CubSettings parse_cub_settings(std::string_view conf, std::string_view origin) {
  CubSettings s;
  bool bins_set = false;
  bool limit_set = false;
  for (const KeyValue& e : parse_key_values(conf, origin)) {
    bins_set = bins_set || e.key == "bin_growth" || e.key == "min_bin" || e.key == "max_bin";
    if (e.key == "bin_growth")
      s.bin_growth = static_cast<unsigned>(whole_number(origin, e, 0, 1U << 20));
    else if (e.key == "min_bin")
      s.min_bin = static_cast<unsigned>(whole_number(origin, e, 0, 64));
    else if (e.key == "max_bin")
      s.max_bin = static_cast<unsigned>(whole_number(origin, e, 0, 64));
    else if (e.key == "max_cached_bytes")
      s.max_cached_bytes = size_or_none(origin, e).value_or(kUnlimited), limit_set = true;
    else
      throw_unknown_key(origin, e, cub_settings_keys());
  }
  if (bins_set && !limit_set) s.max_cached_bytes = kUnlimited;
  const auto fail = [&](const char* what) { throw ConfigError(std::string(origin) + ": " + what); };
  if (s.bin_growth < 2) fail("bin_growth must be at least 2");
  if (s.min_bin > s.max_bin) fail("min_bin must not exceed max_bin");
  if (power_of(s.bin_growth, s.max_bin) == kUnlimited) fail("bin_growth^max_bin does not fit in 64 bits");
  return s;
}

}  // namespace model

std::unique_ptr<ReplayTarget> make_cub_target(const TargetOptions& options) {
  return std::make_unique<CubModel>(options);
}

TargetEntry cub_entry() {
  return {{kName, "a model of CUB's CachingDeviceAllocator", model::cub_settings_keys(),
           /*holds_memory_until_destroyed=*/false, /*exports=*/false, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) { model::parse_cub_settings(conf, origin); },
          make_cub_target};
}

}  // namespace tensorpool::replay
