// rmm_pool_model.cpp: the "rmm-pool" replay target, a model of RMM's pool_memory_resource over
// cuda_memory_resource (cudaMalloc), written from RMM's public documentation:
//
//  - "A coalescing best-fit suballocator which uses a pool of memory allocated from an upstream
//    memory_resource": a free block is merged with free address neighbours; a request takes the
//    smallest free block that fits (lowest address among equals), split from its front.
//  - Sizes are aligned to 256 B (rmm::CUDA_ALLOCATION_ALIGNMENT).
//  - initial_pool_size is allocated from upstream when the resource is built; the pool never
//    returns memory before it is destroyed (empty_cache does nothing). Defaults: half of the
//    device (the default of rmm.reinitialize(pool_allocator=True)) and, for maximum_pool_size,
//    the whole device.
//  - When no free block fits, the pool grows ("try_to_expand": at least the request; "size_to_grow":
//    the larger of the request and the current pool size, capped by what maximum_pool_size leaves)
//    and, when upstream refuses that, tries half as much down to the request itself. A request the
//    maximum cannot hold is an out-of-memory error.
//  - Stream-ordered free lists (stream_ordered_memory_resource): a freed block goes to the free
//    list of its stream and is reused at once by that stream. A request its own stream's list
//    cannot serve takes a block from another stream's list after making its stream wait for that
//    stream (an event, no host synchronization); that whole list then joins the requesting
//    stream's. (How much is taken over is our reading; the GPU check of scripts/gpu compares
//    with the real RMM.)
// Settings (--allocator-conf rmm-pool=...): initial_pool_size, maximum_pool_size (sizes;
// "none": no maximum, so a growth may ask more than the device has and be halved).
//
// Invariants: reserved_ == sum of upstream blocks == initial + growths; for every stream,
// free_[s].total() + live bytes + other streams' free bytes == reserved_; allocated_ == sum of
// the aligned sizes of live blocks.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/models/free_ranges.hpp"
#include "replay/models/model_support.hpp"
#include "replay/models/models.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"

namespace tensorpool::replay {

namespace {

constexpr const char* kName = "rmm-pool";
constexpr const char* kOrigin = "rmm-pool conf";
constexpr std::size_t kAlign = 256;

const std::vector<std::string>& settings_keys() {
  static const std::vector<std::string> keys = {"initial_pool_size", "maximum_pool_size"};
  return keys;
}

// As set in the conf; unset ones take defaults that depend on the device (pool_sizes()).
struct Settings {
  std::optional<std::size_t> initial;
  std::optional<std::size_t> maximum;  // kUnlimited: "none"
};

// What can be checked without a device: the syntax, the alignment, and the order of two sizes
// both given.
Settings parse_settings(std::string_view conf, std::string_view origin) {
  Settings s;
  for (const KeyValue& e : parse_key_values(conf, origin)) {
    if (e.key == "initial_pool_size")
      s.initial = size_value(origin, e);
    else if (e.key == "maximum_pool_size")
      s.maximum = size_or_none(origin, e).value_or(model::kUnlimited);
    else
      throw_unknown_key(origin, e, settings_keys());
  }
  const auto fail = [&](const char* what) { throw ConfigError(std::string(origin) + ": " + what); };
  if (s.initial.value_or(0) % kAlign != 0 ||
      (s.maximum && *s.maximum != model::kUnlimited && *s.maximum % kAlign != 0))
    fail("pool sizes must be multiples of 256 B");
  if (s.initial && s.maximum && *s.initial > *s.maximum)
    fail("initial_pool_size exceeds maximum_pool_size");
  return s;
}

struct PoolSizes {
  std::size_t initial = 0;
  std::size_t maximum = 0;  // kUnlimited: none
};

// The sizes on a device of `capacity` bytes: defaults half the device and the whole device.
PoolSizes pool_sizes(const Settings& s, std::size_t capacity) {
  const PoolSizes p{s.initial.value_or(capacity / 2 / kAlign * kAlign),
                    s.maximum.value_or(capacity / kAlign * kAlign)};
  if (p.initial > p.maximum)
    throw ConfigError(std::string(kOrigin) + ": initial_pool_size (default: half the device) exceeds "
                                            "maximum_pool_size");
  return p;
}

struct Live {
  std::size_t size;  // aligned
  Stream stream;
};

class RmmPoolModel final : public ReplayTarget {
 public:
  explicit RmmPoolModel(const TargetOptions& o)
      : sizes_(pool_sizes(parse_settings(o.conf, kOrigin), o.capacity)),
        device_(device_options(o)) {
    if (sizes_.initial > 0 && !grow_by(sizes_.initial, kDefaultStream))
      throw ConfigError(std::string(kOrigin) + ": the initial pool does not fit the device");
  }

  std::string name() const override { return kName; }
  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  std::size_t reserved() const override { return reserved_; }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override { return upstream_of(device_); }
  std::optional<MemoryMap> memory_map() const override;

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    return model::malloc_device_options(o, "rmm-pool-model", kAlign);
  }

  bool take_from(Stream stream, std::size_t size, Address& out);
  bool take_from_other_stream(Stream stream, std::size_t size, Address& out);
  bool grow_for(std::size_t size, Stream stream);
  bool grow_by(std::size_t bytes, Stream stream);
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Stream stream);

  PoolSizes sizes_;
  SimulatedDevice device_;
  std::map<Stream, model::FreeRanges> free_;  // per stream, ordered for deterministic stealing
  std::map<Address, std::size_t> upstream_blocks_;  // what grow_by() took, by address
  std::unordered_map<Address, Live> live_;
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
};

void* RmmPoolModel::allocate(std::size_t bytes, Stream stream) {
  if (bytes > sizes_.maximum) throw_oom(bytes, bytes, stream);
  const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kAlign);
  Address addr = 0;
  if (!take_from(stream, size, addr) && !take_from_other_stream(stream, size, addr)) {
    if (!grow_for(size, stream) || !take_from(stream, size, addr)) throw_oom(bytes, size, stream);
  }
  live_.emplace(addr, Live{size, stream});
  allocated_ += size;
  return reinterpret_cast<void*>(addr);
}

bool RmmPoolModel::take_from(Stream stream, std::size_t size, Address& out) {
  auto it = free_.find(stream);
  if (it == free_.end()) return false;
  const auto fit = it->second.best_fit(size);
  if (!fit) return false;
  it->second.take_front(*fit, size);
  out = fit->addr;
  return true;
}

// A block of another stream's list: the requesting stream waits for that stream (counted as a
// stream wait on the device, not a host sync) and takes its whole free list over.
bool RmmPoolModel::take_from_other_stream(Stream stream, std::size_t size, Address& out) {
  for (auto& [other, ranges] : free_) {
    if (other == stream || !ranges.best_fit(size)) continue;
    device_.stream_wait_event(0, device_.create_event());  // counted; the simulation has no work
    free_[stream].absorb(ranges);
    return take_from(stream, size, out);
  }
  return false;
}

// Grows by the larger of the request and the pool, within the maximum; halves the attempt down
// to the request when upstream refuses.
bool RmmPoolModel::grow_for(std::size_t size, Stream stream) {
  const bool capped = sizes_.maximum != model::kUnlimited;
  if (capped && reserved_ + size > sizes_.maximum) return false;
  std::size_t attempt = std::max(size, reserved_);
  if (capped) attempt = std::min(attempt, sizes_.maximum - reserved_);
  while (true) {
    if (grow_by(attempt, stream)) return true;
    if (attempt == size) return false;
    attempt = std::max(size, round_up(attempt / 2, kAlign));
  }
}

bool RmmPoolModel::grow_by(std::size_t bytes, Stream stream) {
  void* p = device_.allocate_segment(bytes, stream);
  if (p == nullptr) return false;
  reserved_ += bytes;
  free_[stream].insert(reinterpret_cast<Address>(p), bytes);
  upstream_blocks_.emplace(reinterpret_cast<Address>(p), bytes);
  return true;
}

// The upstream blocks as segments of the pool (no stream's own), tiled by the live blocks and
// each stream's free ranges (a range that spans two adjacent upstream blocks is cut in two).
std::optional<MemoryMap> RmmPoolModel::memory_map() const {
  std::vector<MapSegment> segments;
  for (const auto& [addr, size] : upstream_blocks_) segments.push_back(MapSegment{addr, size, kNoStream, false, {}});
  std::vector<MapBlock> pieces;
  for (const auto& [addr, live] : live_)
    pieces.push_back(MapBlock{addr, live.size, BlockState::allocated, true, live.stream, 0, 0});
  for (const auto& [stream, ranges] : free_)
    ranges.for_each([&, s = stream](Address addr, std::size_t size) {
      pieces.push_back(MapBlock{addr, size, BlockState::free, true, s, 0, 0});
    });
  return model::tile_segments(std::move(segments), std::move(pieces));
}

void RmmPoolModel::deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  const auto it = live_.find(reinterpret_cast<Address>(ptr));
  if (it == live_.end()) throw UsageError(std::string(kName) + ": deallocate of a pointer that is not allocated");
  allocated_ -= it->second.size;
  free_[it->second.stream].insert(it->first, it->second.size);
  live_.erase(it);
}

[[noreturn]] void RmmPoolModel::throw_oom(std::size_t bytes, std::size_t size, Stream stream) {
  OutOfMemoryInfo info = model::oom_info(device_, bytes, size, stream, reserved_, allocated_);
  for (const auto& [s, ranges] : free_) model::add_cached(info, s, ranges.total(), ranges.largest());
  info.memory_limit = sizes_.maximum == model::kUnlimited ? 0 : sizes_.maximum;
  throw OutOfMemoryError(info);
}

}  // namespace

std::unique_ptr<ReplayTarget> make_rmm_pool_target(const TargetOptions& options) {
  return std::make_unique<RmmPoolModel>(options);
}

TargetEntry rmm_pool_entry() {
  return {{kName,
           "a model of RMM's pool_memory_resource (coalescing best fit, grown from cudaMalloc)",
           settings_keys(), /*holds_memory_until_destroyed=*/true, /*exports=*/false, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) { parse_settings(conf, origin); },
          make_rmm_pool_target};
}

}  // namespace tensorpool::replay
