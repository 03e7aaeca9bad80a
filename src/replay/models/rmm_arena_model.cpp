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
#include <unordered_map>

#include "replay/model_support.hpp"
#include "replay/models.hpp"
#include "replay/models/free_ranges.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::replay {

namespace {

constexpr const char* kName = "rmm-arena";
constexpr std::size_t kAlign = 256;

struct Settings {
  std::size_t arena_size = 0;
  std::size_t superblock_size = 256 * KiB;
};

Settings parse_settings(const TargetOptions& o) {
  Settings s;
  s.arena_size = o.capacity / 2 / kAlign * kAlign;
  for (const model::ConfEntry& e : model::parse_conf(o.conf, kName)) {
    if (e.key == "arena_size")
      s.arena_size = model::conf_size(kName, e, false);
    else if (e.key == "superblock_size")
      s.superblock_size = model::conf_size(kName, e, false);
    else
      model::unknown_conf_key(kName, e, "arena_size, superblock_size");
  }
  if (s.arena_size == 0 || s.arena_size % kAlign != 0 || s.arena_size > o.capacity)
    throw ConfigError("rmm-arena conf: arena_size must be a non-zero multiple of 256 B no larger than the device");
  if (s.superblock_size == 0 || s.superblock_size % kAlign != 0)
    throw ConfigError("rmm-arena conf: superblock_size must be a non-zero multiple of 256 B");
  return s;
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
  explicit RmmArenaModel(const TargetOptions& o) : settings_(parse_settings(o)), device_(device_options(o)) {
    void* base = device_.allocate_segment(settings_.arena_size, kDefaultStream);
    if (base == nullptr) throw ConfigError("rmm-arena conf: the arena does not fit the device");
    global_.insert(reinterpret_cast<Address>(base), settings_.arena_size);
  }

  std::string name() const override { return kName; }
  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;

  std::size_t reserved() const override { return settings_.arena_size; }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override { return upstream_of(device_); }

 private:
  static SimulatedDeviceOptions device_options(const TargetOptions& o) {
    return model::malloc_device_options(o, "rmm-arena-model", kAlign);
  }

  bool place_large(std::size_t size, Address& out);
  bool place_small(Arena& arena, std::size_t size, Address& out);
  void free_small(Arena& arena, Address addr, std::size_t size);
  void defragment();
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Stream stream);

  Settings settings_;
  SimulatedDevice device_;
  model::FreeRanges global_;
  std::map<Stream, Arena> arenas_;
  std::unordered_map<Address, Live> live_;
  std::size_t allocated_ = 0;
};

void* RmmArenaModel::allocate(std::size_t bytes, Stream stream) {
  if (bytes > settings_.arena_size) throw_oom(bytes, bytes, stream);
  const std::size_t size = model::round_up(std::max<std::size_t>(bytes, 1), kAlign);
  const bool large = size > settings_.superblock_size;
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
  const auto fit = global_.first_fit(settings_.superblock_size);
  if (!fit) return false;
  global_.take_front(*fit, settings_.superblock_size);
  Superblock& sb = arena[fit->addr];
  sb.size = settings_.superblock_size;
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

// RMM synchronizes the device and cleans every arena before giving up. Superblocks go back as
// soon as they are free here, so only the synchronization remains to count.
void RmmArenaModel::defragment() { device_.synchronize_device(); }

[[noreturn]] void RmmArenaModel::throw_oom(std::size_t bytes, std::size_t size, Stream stream) {
  OutOfMemoryInfo info = model::oom_info(device_, bytes, size, stream, settings_.arena_size, allocated_);
  info.largest_free_block = global_.largest();
  info.memory_limit = settings_.arena_size;
  throw OutOfMemoryError(info);
}

}  // namespace

std::unique_ptr<ReplayTarget> make_rmm_arena_target(const TargetOptions& options) {
  return std::make_unique<RmmArenaModel>(options);
}

}  // namespace tensorpool::replay
