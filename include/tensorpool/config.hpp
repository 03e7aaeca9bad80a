// tensorpool/config.hpp: allocator settings, from code or from TENSORPOOL_CONF.
//
// TENSORPOOL_CONF="key:value,key:value" uses the same keys as Config::set(). Sizes take binary
// suffixes (512, 64KiB, 20MiB, 1.5GiB; K/M/G/T are binary too, KB/MB/GB decimal). An unknown key
// or a bad value raises ConfigError naming the key, the value and what was expected.
//
//   key                  default   meaning
//   memory_limit         none      cap on reserved bytes: a size (40GiB) or a fraction of the
//                                  device capacity (0.9)
//   max_split_size       none      requests of at least this size get their own "oversize"
//                                  segment; oversize blocks are never split, and smaller
//                                  requests never use them (must be >= large_segment_size)
//   oversize_slack       20MiB     an oversize request reuses a cached oversize block only if the
//                                  block is at most this much larger
//   small_size           1MiB      requests up to this size use the small pool
//   small_segment_size   2MiB      segment size of the small pool
//   large_segment_size   20MiB     segment size for large requests below half of it; larger
//                                  requests get a segment of their own size, rounded to the
//                                  device granularity
//   min_split_remainder  512       a large block is split only if the rest is at least this
//   cross_stream_reuse   true      under memory pressure, take a free block cached for another
//                                  stream after an event wait instead of a full synchronization;
//                                  and, where the OOM ladder or a vmm growth would synchronize the
//                                  host, a block of the requesting stream whose free waits for
//                                  other streams, after the stream waits for them on the device
//   mode                 auto      fixed: segments are upstream allocations that never move;
//                                  vmm: physical pages are the cached resource, mapped into one
//                                  growable address range per stream and pool (needs a device with
//                                  virtual memory; max_split_size does not apply); auto: vmm on a
//                                  device with virtual memory (SimulatedDevice, CudaVmmBackend),
//                                  fixed on the others
//   vmm_reserve          0         vmm: free pages empty_cache() keeps mapped
//   vmm_idle_limit       1GiB      vmm: idle free physical memory beyond which a growth remaps
//                                  free pages instead of creating new ones (it always does when
//                                  nothing more can be created; not pages that cycle with a
//                                  varying step: docs/vmm.md, "Growth") ...
//   vmm_idle_divisor     32        vmm: ... or beyond 1/N of what the pool holds, if that is less
//   vmm_growth_divisor   128       vmm: a growth of the large pool maps at least 1/N of what the
//                                  pool holds (fewer calls; at most 1/N mapped ahead of need);
//                                  also the least a kept output's successor must be to be cut
//                                  from the top of its free block (docs/vmm.md, "Design")
//   vmm_max_growth       128MiB    vmm: ... but never more than this ahead of need
//   vmm_max_chunk        128MiB    vmm: the largest physical chunk (one create + one map each).
//                                  Chunks unmap only whole: smaller chunks let free pages beside
//                                  live blocks be reclaimed near capacity, larger ones cost fewer
//                                  calls for large tensors
//   vmm_chunk_divisor    16        vmm: a new chunk is at most 1/N of the request that makes it
//                                  (a power of two of pages, at most vmm_max_chunk, raised to
//                                  the floor below), and chunks
//                                  end at the pages around where the request's block ends: fits
//                                  closer to the device's capacity, for more calls; 0 = off,
//                                  chunks of vmm_max_chunk (docs/vmm.md)
//   vmm_chunk_floor_divisor 2048   vmm, with vmm_chunk_divisor: a new chunk is at least 1/N of
//                                  the device's capacity (or of memory_limit, if lower; or of
//                                  four times what is left of it, once under a quarter is) in
//                                  whole pages, twice that past the request's block; 0 = no
//                                  floor (chunks down to one page)
//   vmm_plan_max_blocks  131072    vmm: when a heap has nothing allocated any more, the epoch it
//                                  just ended (up to N allocations) is planned offline and, if it
//                                  runs again, served at the planned offsets with no device call;
//                                  0 = never (docs/vmm.md, "Planned layouts"). What planning one
//                                  epoch costs is bounded apart from N (layout_plan.hpp); N bounds
//                                  the host memory reserved per heap for its records (128 bytes an
//                                  allocation: 16 MiB at 131072, and 40 more for the record of a
//                                  whole run in a heap that sees step(); touched only as far as
//                                  epochs reach, but for the background planner's two spare
//                                  records, of which its thread writes the first 65536 places:
//                                  5 MiB)
//   vmm_planner          background  vmm: who plans an epoch: a thread of the allocator's own,
//                                  off the caller's path (the plan is followed from one of the
//                                  heap's next epochs), or `synchronous`: the free that ends the
//                                  epoch, so that the very next epoch can follow it
//                                  (deterministic; what the replay targets use)
//   vmm_find_steps       false     vmm: a program that never calls Allocator::step() gets the
//                                  boundaries of its steps found from its requests (the sizes and
//                                  the bytes in use repeat with the step's period; the boundary
//                                  is put at the step's low point): docs/vmm.md, "Steps". The
//                                  first step() call stops it. Off by default: step plans do not
//                                  beat the online layout on every loop (docs/benchmarks.md)
//   vmm_stitch           true      vmm: where a growth finds no memory left on the device, the
//                                  whole free pages of the heap's partly used chunks are mapped
//                                  again, side by side, where the request needs them (one map
//                                  call per run of pages, no new memory): docs/vmm.md, "Stitching"
//   backend              async     the device backend of the per-device registry
//                                  (tensorpool/registry.hpp, the C API, the PyTorch library):
//                                  async (cudaMallocFromPoolAsync), malloc (cudaMalloc), vmm
//                                  (driver virtual memory) or simulated (a simulated 80 GiB
//                                  device, no GPU). The Allocator itself ignores it, and
//                                  the replay targets refuse it (they run on a simulated device)
//   nvtx                 false     NVTX ranges and marks in a "tensorpool" domain (segment
//                                  allocation and free, map and unmap, OOM, empty_cache)
//   nvtx_mem             false     the NVTX memory API: a heap per segment or mapping, a region
//                                  per block, for Compute Sanitizer and Nsight. The core ignores
//                                  both nvtx keys; tensorpool/cuda/nvtx.hpp acts on them
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tensorpool {

/// Where segments come from. `automatic` (the default): `vmm` on a device with virtual memory
/// (the simulated device, CudaVmmBackend), `fixed` on the others (cudaMalloc, cudaMallocAsync
/// pools); the allocator's config() then says which it took.
enum class Mode : std::uint8_t { fixed, vmm, automatic };
/// Which DeviceBackend the per-device registry makes (see tensorpool/registry.hpp).
enum class Backend : std::uint8_t { async, malloc, vmm, simulated };
/// Who plans a vmm heap's recorded epoch (vmm_planner).
enum class PlannerMode : std::uint8_t { background, synchronous };
const char* to_string(Backend backend) noexcept;

struct Config {
  std::size_t memory_limit_bytes = 0;       // 0: none
  double memory_limit_fraction = 0.0;       // 0: none; applied to the device capacity
  std::size_t max_split_size = 0;           // 0: none
  std::size_t oversize_slack = 20 * 1024 * 1024;
  std::size_t small_size = 1024 * 1024;
  std::size_t small_segment_size = 2 * 1024 * 1024;
  std::size_t large_segment_size = 20 * 1024 * 1024;
  std::size_t min_split_remainder = 512;
  bool cross_stream_reuse = true;
  Mode mode = Mode::automatic;
  std::size_t vmm_reserve = 0;
  std::size_t vmm_idle_limit = 1024 * 1024 * 1024;
  std::size_t vmm_max_growth = 128 * 1024 * 1024;
  std::size_t vmm_growth_divisor = 128;
  std::size_t vmm_max_chunk = 128 * 1024 * 1024;
  std::size_t vmm_idle_divisor = 32;
  std::size_t vmm_chunk_divisor = 16;  // N: chunks of request/N (see above); 0: of vmm_max_chunk
  std::size_t vmm_chunk_floor_divisor = 2048;  // with vmm_chunk_divisor: chunks >= capacity/N (vmm.md)
  std::size_t vmm_plan_max_blocks = 131072;    // epochs of at most N allocations get a planned layout
  PlannerMode vmm_planner = PlannerMode::background;
  bool vmm_find_steps = false;  // without Allocator::step() calls, step boundaries found from the requests
  bool vmm_stitch = true;  // where a growth finds no memory left, free pages of partly used chunks mapped again
  bool nvtx = false;      // read by tensorpool/cuda/nvtx.hpp, not by the core
  bool nvtx_mem = false;  // read by tensorpool/cuda/nvtx.hpp, not by the core
  Backend backend = Backend::async;  // read by the registry only

  /// Sets one key; throws ConfigError for an unknown key or a bad value.
  void set(std::string_view key, std::string_view value);
  /// Applies "key:value,key:value" (tensorpool/key_values.hpp); `origin` names the source in
  /// error messages ("TENSORPOOL_CONF: bad value ...").
  void apply(std::string_view text, std::string_view origin = "tensorpool config");
  /// Throws ConfigError when the settings contradict each other.
  void validate() const;
  /// The settings in TENSORPOOL_CONF syntax (every key).
  std::string to_string() const;

  /// Defaults overridden by TENSORPOOL_CONF when set.
  static Config from_env();
  static Config parse(std::string_view text, std::string_view origin = "tensorpool config");
  static const std::vector<std::string>& keys();

  /// The memory limit in bytes for a device of `capacity` bytes (0: none).
  std::size_t effective_limit(std::size_t capacity) const noexcept;
};

}  // namespace tensorpool
