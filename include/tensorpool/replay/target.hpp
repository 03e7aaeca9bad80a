// tensorpool/replay/target.hpp: an allocator under test, as the replay engine drives it.
//
// Every target runs on its own SimulatedDevice, so upstream calls are counted the same way for
// all of them. The registry (target_descriptors()) lists each target with what it is and the
// settings it takes: "tensorpool" and "tensorpool-vmm" (the real allocator; Config keys),
// "pytorch" and "pytorch-expandable" (models of PyTorch's CUDA caching allocator), "cub" (a
// model of CUB's CachingDeviceAllocator), "rmm-pool" and "rmm-arena" (models of RMM's
// pool_memory_resource and arena_memory_resource), "raw" (no caching: every alloc/free goes to
// the device). The implementations are in src/replay/models/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorpool/replay/memory_map.hpp"
#include "tensorpool/simulated_device.hpp"
#include "tensorpool/trace/event.hpp"
#include "tensorpool/trace/pytorch_export.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::replay {

/// What a target has asked of its device so far (cumulative).
struct UpstreamCounts {
  std::uint64_t allocs = 0;  // segment allocations (cudaMalloc, cudaMallocAsync) + physical pages created
  std::uint64_t frees = 0;   // segment frees + physical pages released
  std::uint64_t maps = 0;    // virtual-memory map calls
  std::uint64_t unmaps = 0;
  std::uint64_t syncs = 0;   // host synchronizations
  std::uint64_t modelled_ns = 0;  // the simulated device's modelled cost of those calls
  std::uint64_t total() const noexcept { return allocs + frees + maps + unmaps; }

  UpstreamCounts& operator+=(const UpstreamCounts& o) noexcept {
    allocs += o.allocs;
    frees += o.frees;
    maps += o.maps;
    unmaps += o.unmaps;
    syncs += o.syncs;
    modelled_ns += o.modelled_ns;
    return *this;
  }
  /// The calls made between two readings of the same cumulative counters (a taken after b).
  friend UpstreamCounts operator-(const UpstreamCounts& a, const UpstreamCounts& b) noexcept {
    return {a.allocs - b.allocs, a.frees - b.frees, a.maps - b.maps,
            a.unmaps - b.unmaps, a.syncs - b.syncs, a.modelled_ns - b.modelled_ns};
  }
};

/// Options every target gets.
struct TargetOptions {
  std::size_t capacity = 80 * GiB;  // of the simulated device
  int device = 0;                   // ordinal of the simulated device
  std::string conf;                 // target-specific settings ("key:value,..."): the keys of
                                    // the target's descriptor
  /// The simulated device's cost of upstream calls (null: its flat default); see cost_model.hpp.
  std::shared_ptr<const CostModel> cost_model = nullptr;
  std::size_t history_entries = 1'000'000;  // record_history(): the newest events kept
  /// tensorpool's targets: a device that runs behind the host. The work queued on its streams
  /// (events) completes only every `device_lag` allocations, or when the allocator synchronizes;
  /// 0: at once, an infinitely fast device (the models of the other allocators always).
  std::size_t device_lag = 0;
};

class ReplayTarget {
 public:
  virtual ~ReplayTarget() = default;

  virtual std::string name() const = 0;
  /// Called for each seed_segment event before any allocation: a segment the recording allocator
  /// held at window start. Models of that allocator adopt it; others ignore it.
  virtual void seed_segment(const trace::TraceEvent& /*seed*/) {}
  /// A block live at window start (seed_alloc event), replayed after the seed segments. Models
  /// of the recording allocator place it where it was; the default allocates it.
  virtual void* seed_alloc(const trace::TraceEvent& seed) { return allocate(seed.size, seed.stream); }
  /// Throws tensorpool::OutOfMemoryError when the request cannot be served.
  virtual void* allocate(std::size_t bytes, Stream stream) = 0;
  /// An allocation the program made under a Tag (trace flag kFlagTagged, the tag's name in the
  /// label): a target with tags gives it memory of the tag's own; the default ignores the tag.
  virtual void* allocate_tagged(std::size_t bytes, Stream stream, std::string_view tag) {
    (void)tag;
    return allocate(bytes, stream);
  }
  /// `bytes` and `stream` are those of the allocation.
  virtual void deallocate(void* ptr, std::size_t bytes, Stream stream) = 0;
  /// The program put the memory of `tag` ("": all of it) to sleep, or woke it (sleep op): a
  /// target that can give pages back while blocks keep their addresses (tensorpool-vmm) does so;
  /// the default holds its memory, as an allocator without sleep would.
  virtual void sleep(std::string_view tag, bool keep_contents) { (void)tag, (void)keep_contents; }
  virtual void wake(std::string_view tag) { (void)tag; }
  virtual void record_stream(void* /*ptr*/, Stream /*stream*/) {}
  /// The host waited for `stream`: its pending work is complete.
  virtual void stream_synchronized(Stream /*stream*/) {}
  virtual void empty_cache() {}
  /// The program ended a training step (Allocator::step(); ReplayOptions::step_at_iterations).
  virtual void step() {}

  /// Bytes held from the device now (segments or physical pages). Called after every event:
  /// must be O(1).
  virtual std::size_t reserved() const = 0;
  /// Bytes in live blocks now, as rounded by the target. O(1).
  virtual std::size_t allocated() const = 0;
  virtual UpstreamCounts upstream() const = 0;
  /// Device calls made while seeding that upstream() leaves out (models that adopt the recording
  /// allocator's segments count them here, one per segment); zero for the others.
  virtual UpstreamCounts seeding_excluded() const { return {}; }

  // --- snapshot export (`tensorpool export`) ---
  /// Starts recording the target's allocator events; called before the first event. False (the
  /// default): the target cannot export a snapshot. True exactly for the targets whose
  /// descriptor says `exports` ("tensorpool", "tensorpool-vmm" and "pytorch").
  virtual bool record_history() { return false; }
  /// Its segments and blocks now and the events recorded since record_history(), with the
  /// trace's stream ids (device left 0: the engine sets it). Only after record_history() is true.
  virtual trace::pytorch::DeviceMemory memory_state() const { return {}; }
  /// Its settings as "key:value,..." text (the snapshot's allocator_settings).
  virtual std::string settings() const { return {}; }

  // --- memory map (`tensorpool report`) ---
  /// Its segments and blocks now, with the trace's stream ids (labels and requests are left 0:
  /// the engine fills them in, ReplayView::memory_map()). nullopt (the default): the target keeps
  /// no map it can show; a value exactly for the targets whose descriptor says `maps`. Not on the
  /// hot path: may take time linear in its blocks.
  virtual std::optional<MemoryMap> memory_map() const { return std::nullopt; }
};

/// What the registry knows of a target before building one: its name, a line saying what it is,
/// the settings keys its TargetOptions::conf accepts, whether it can export a snapshot and
/// whether it can show its memory map.
struct TargetDescriptor {
  std::string name;
  std::string description;
  std::vector<std::string> settings;  // empty: the target takes no settings
  /// True for a target that never gives memory back to its device before it is destroyed (no
  /// device free at all; empty_cache() does nothing), as RMM's pool and arena resources; it may
  /// also take memory when it is built (an initial pool). False: empty_cache() with nothing
  /// allocated gives every byte back.
  bool holds_memory_until_destroyed = false;
  bool exports = false;               // its record_history() is true (`tensorpool export`)
  bool maps = false;                  // its memory_map() has a value (`tensorpool report`)

  bool takes(const std::string& key) const;
};

/// Every target, in the registry's order (the order of target_names()).
const std::vector<TargetDescriptor>& target_descriptors();
/// Names accepted by make_target().
std::vector<std::string> target_names();
/// Throws tensorpool::UsageError for an unknown name, listing the known ones.
const TargetDescriptor& describe_target(const std::string& name);
/// Checks `conf` as target `name` would read it, without building the target (no device, no
/// allocator). Throws UsageError for an unknown name and ConfigError, naming `origin` (by
/// default "NAME conf"), for a bad conf.
void validate_target(const std::string& name, std::string_view conf, std::string_view origin = {});
/// Throws tensorpool::UsageError for an unknown name (listing the known ones) and ConfigError
/// for a bad conf.
std::unique_ptr<ReplayTarget> make_target(const std::string& name, const TargetOptions& options);

/// Names of the targets whose descriptor says they export (those `tensorpool export` takes).
std::vector<std::string> exporting_target_names();
/// Throws UsageError for an unknown name, and for a target that cannot export a snapshot
/// (naming those that can).
void require_export(const std::string& name);
/// One settings list for several targets (the CLI's --conf): each target in `names` gets `conf`
/// when its descriptor takes every key of it, "" otherwise; returns the conf of each name, in
/// order. Throws UsageError for an unknown name, and ConfigError naming `origin` for a
/// malformed list, for a non-empty list that no target in `names` takes (naming the first key
/// none of them takes, and what each takes), and for a value a target that takes it refuses.
std::vector<std::string> share_conf(const std::vector<std::string>& names, std::string_view conf,
                                    std::string_view origin = "conf");

/// Upstream counts of a simulated device (helper for targets).
UpstreamCounts upstream_of(const SimulatedDevice& device);

}  // namespace tensorpool::replay
