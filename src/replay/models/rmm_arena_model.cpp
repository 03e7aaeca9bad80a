// rmm_arena_model.cpp: the "rmm-arena" replay target, a model of RMM's arena_memory_resource
// over cuda_memory_resource, written from RMM's public documentation:
//
//  - "GPU memory is divided into a global arena, per-thread arenas for default streams, and
//    per-stream arenas for non-default streams. Each arena allocates memory from the global arena
//    in chunks called superblocks." The replay has one host thread: trace stream 0 has the
//    thread's arena, every other stream one of its own.
//  - "Blocks in each arena are allocated using address-ordered first fit. When a block is freed,
//    it is coalesced with neighbouring free blocks if the addresses are contiguous. Free
//    superblocks are returned to the global arena." A block never spans two superblocks; a
//    superblock whose blocks are all free goes back at once.
//  - The resource takes a fixed amount of memory from upstream when it is built ("allocates a
//    fixed but configurable amount of memory from CUDA", rapidsai/rmm#916): arena_size, by default
//    half of the device. It never grows and never returns memory: reserved is arena_size from the
//    start, and a request the global arena cannot place is an out-of-memory error.
//  - Requests larger than a superblock are placed by the global arena itself (address-ordered
//    first fit over its coalesced free ranges), not through a thread or stream arena.
//  - Before failing, the resource synchronizes the device and has every arena hand its free
//    superblocks back (counted as one host synchronization), then tries once more.
//  - Sizes are aligned to 256 B.
// Settings (--allocator-conf rmm-arena=...): arena_size (a size, at most the device),
// superblock_size (default 256 KiB: the superblock size and the threshold above which requests
// go to the global arena; our reading of RMM's minimum superblock size).
//
// Invariants: global free + sum of superblock sizes + large live bytes == arena_size; a
// superblock's free ranges + its live blocks == its size; allocated_ == sum of live sizes.
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

constexpr const char* kName = "rmm-arena";
constexpr const char* kOrigin = "rmm-arena conf";
constexpr std::size_t kAlign = 256;

const std::vector<std::string>& settings_keys() {
  static const std::vector<std::string> keys = {"arena_size", "superblock_size"};
  return keys;
}

struct Settings {
  std::optional<std::size_t> arena_size;  // unset: half the device (arena_size_on())
  std::size_t superblock_size = 256 * KiB;
};

// What can be checked without a device; arena_size_on() checks the arena against the device.
Settings parse_settings(std::string_view conf, std::string_view origin) {
  Settings s;
  for (const KeyValue& e : parse_key_values(conf, origin)) {
    if (e.key == "arena_size")
      s.arena_size = size_value(origin, e);
    else if (e.key == "superblock_size")
      s.superblock_size = size_value(origin, e);
    else
      throw_unknown_key(origin, e, settings_keys());
  }
  const auto fail = [&](const char* what) { throw ConfigError(std::string(origin) + ": " + what); };
  if (s.arena_size && (*s.arena_size == 0 || *s.arena_size % kAlign != 0))
    fail("arena_size must be a non-zero multiple of 256 B");
  if (s.superblock_size == 0 || s.superblock_size % kAlign != 0)
    fail("superblock_size must be a non-zero multiple of 256 B");
  return s;
}

std::size_t arena_size_on(const Settings& s, std::size_t capacity) {
  const std::size_t size = s.arena_size.value_or(capacity / 2 / kAlign * kAlign);
  if (size == 0 || size > capacity)
    throw ConfigError(std::string(kOrigin) + ": arena_size must be a non-zero multiple of 256 B no "
                                             "larger than the device");
  return size;
}

struct Superblock {
  std::size_t size = 0;
  model::FreeRanges free;
};

// A thread's or stream's arena: its superblocks by address.
using Arena = std::map<Address, Superblock>;

struct Live {
  std::size_t size;
  Stream stream;
  bool large;  // placed by the global arena
};

class RmmArenaModel final : public ReplayTarget {
 public:
  explicit RmmArenaModel(const TargetOptions& o) : RmmArenaModel(o, parse_settings(o.conf, kOrigin)) {}
  RmmArenaModel(const TargetOptions& o, const Settings& s)
      : arena_size_(arena_size_on(s, o.capacity)), superblock_size_(s.superblock_size),
        device_(device_options(o)) {
    void* base = device_.allocate_segment(arena_size_, kDefaultStream);
    if (base == nullptr) throw ConfigError(std::string(kOrigin) + ": the arena does not fit the device");
    base_ = reinterpret_cast<Address>(base);
    global_.insert(base_, arena_size_);
  }

  std::string name() const override { return kName; }
  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  std::size_t reserved() const override { return arena_size_; }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override { return upstream_of(device_); }
  std::optional<MemoryMap> memory_map() const override;

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    return model::malloc_device_options(o, "rmm-arena-model", kAlign);
  }

  bool place_large(std::size_t size, Address& out);
  bool place_small(Arena& arena, std::size_t size, Address& out);
  void free_small(Arena& arena, Address addr, std::size_t size);
  void defragment();
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Stream stream);

  std::size_t arena_size_;       // held from the device for the model's lifetime, at base_
  Address base_ = 0;
  std::size_t superblock_size_;  // also the threshold above which the global arena places a request
  SimulatedDevice device_;
  model::FreeRanges global_;
  std::map<Stream, Arena> arenas_;
  std::unordered_map<Address, Live> live_;
  std::size_t allocated_ = 0;
};

void* RmmArenaModel::allocate(std::size_t bytes, Stream stream) {
  if (bytes > arena_size_) throw_oom(bytes, bytes, stream);
  const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kAlign);
  const bool large = size > superblock_size_;
  Address addr = 0;
  auto place = [&] { return large ? place_large(size, addr) : place_small(arenas_[stream], size, addr); };
  if (!place()) {
    defragment();
    if (!place()) throw_oom(bytes, size, stream);
  }
  live_.emplace(addr, Live{size, stream, large});
  allocated_ += size;
  return reinterpret_cast<void*>(addr);
}

bool RmmArenaModel::place_large(std::size_t size, Address& out) {
  const auto fit = global_.first_fit(size);
  if (!fit) return false;
  global_.take_front(*fit, size);
  out = fit->addr;
  return true;
}

// First fit over the arena's superblocks in address order; else a new superblock.
bool RmmArenaModel::place_small(Arena& arena, std::size_t size, Address& out) {
  for (auto& [base, sb] : arena) {
    if (const auto fit = sb.free.first_fit(size)) {
      sb.free.take_front(*fit, size);
      out = fit->addr;
      return true;
    }
  }
  const auto fit = global_.first_fit(superblock_size_);
  if (!fit) return false;
  global_.take_front(*fit, superblock_size_);
  Superblock& sb = arena[fit->addr];
  sb.size = superblock_size_;
  sb.free.insert(fit->addr + size, sb.size - size);
  out = fit->addr;
  return true;
}

void RmmArenaModel::deallocate(void* ptr, std::size_t /*bytes*/, Stream /*stream*/) {
  const auto it = live_.find(reinterpret_cast<Address>(ptr));
  if (it == live_.end()) throw UsageError(std::string(kName) + ": deallocate of a pointer that is not allocated");
  const Live b = it->second;
  live_.erase(it);
  allocated_ -= b.size;
  if (b.large) global_.insert(reinterpret_cast<Address>(ptr), b.size);
  else free_small(arenas_[b.stream], reinterpret_cast<Address>(ptr), b.size);
}

// Coalesces within the block's superblock; a superblock left wholly free returns to the global arena.
void RmmArenaModel::free_small(Arena& arena, Address addr, std::size_t size) {
  auto sb = std::prev(arena.upper_bound(addr));  // the superblock holding addr
  sb->second.free.insert(addr, size);
  if (sb->second.free.total() == sb->second.size) {
    global_.insert(sb->first, sb->second.size);
    arena.erase(sb);
  }
}

// The arena as one segment: live blocks, the free ranges of each stream's superblocks, and the
// global arena's free ranges, which no stream holds.
std::optional<MemoryMap> RmmArenaModel::memory_map() const {
  std::vector<MapBlock> pieces;
  for (const auto& [addr, live] : live_)
    pieces.push_back(MapBlock{addr, live.size, BlockState::allocated, true, live.stream, 0, 0});
  const auto add_free = [&](const model::FreeRanges& ranges, Stream stream) {
    ranges.for_each([&](Address addr, std::size_t size) {
      pieces.push_back(MapBlock{addr, size, BlockState::free, true, stream, 0, 0});
    });
  };
  add_free(global_, kNoStream);
  for (const auto& [stream, arena] : arenas_)
    for (const auto& [base, sb] : arena) add_free(sb.free, stream);
  return model::tile_segments({MapSegment{base_, arena_size_, kNoStream, false, {}}}, std::move(pieces));
}

// RMM synchronizes the device and cleans every arena before giving up. Superblocks go back as
// soon as they are free here, so only the synchronization remains to count.
void RmmArenaModel::defragment() { device_.synchronize_device(); }

[[noreturn]] void RmmArenaModel::throw_oom(std::size_t bytes, std::size_t size, Stream stream) {
  OutOfMemoryInfo info = model::oom_info(device_, bytes, size, stream, arena_size_, allocated_);
  info.largest_free_block = global_.largest();
  for (const auto& [s, arena] : arenas_)  // the global arena's free space belongs to no stream
    for (const auto& [base, sb] : arena) model::add_cached(info, s, sb.free.total(), sb.free.largest());
  info.memory_limit = arena_size_;
  throw OutOfMemoryError(info);
}

}  // namespace

std::unique_ptr<ReplayTarget> make_rmm_arena_target(const TargetOptions& options) {
  return std::make_unique<RmmArenaModel>(options);
}

TargetEntry rmm_arena_entry() {
  return {{kName,
           "a model of RMM's arena_memory_resource (a fixed global arena, per-stream arenas of "
           "superblocks)",
           settings_keys(), /*holds_memory_until_destroyed=*/true, /*exports=*/false, /*maps=*/true},
          [](std::string_view conf, std::string_view origin) { parse_settings(conf, origin); },
          make_rmm_arena_target};
}

}  // namespace tensorpool::replay
