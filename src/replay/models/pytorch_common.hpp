// pytorch_common.hpp: the machinery shared by the two models of PyTorch's CUDA caching allocator,
// "pytorch" (native cudaMalloc segments, pytorch_model.cpp) and "pytorch-expandable" (expandable
// segments, pytorch_expandable_model.cpp): the block structure, the best-fit set, the block
// bookkeeping (split, merge, take), freeing with record_stream and the stream clock, the
// out-of-memory report and the placement of blocks live at window start. The rules they share
// live in pytorch_rules.hpp; each model keeps what differs: where segments come from (grow()),
// when a block is split (should_split()) and how cached memory is released (release_cached())
// (internal to tensorpool::replay).
//
// Invariants (both models; each states its own in its banner):
//  - every block in free_[p] is free (mapped, not allocated, not pending), and belongs to pool p;
//  - allocated_ == sum of the sizes of allocated blocks;
//  - address neighbours (prev/next) are never both free after free_block(): they were merged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "replay/models/model_support.hpp"
#include "replay/models/pytorch_rules.hpp"
#include "tensorpool/replay/target.hpp"
#include "tensorpool/simulated_device.hpp"

namespace tensorpool::replay::pytorch_common {

struct Segment;  // an expandable segment or native seed of "pytorch-expandable" (defined there)

struct Block {
  Address addr = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;  // the stream of its segment (blocks never change stream)
  Pool pool = Pool::large;
  Segment* segment = nullptr;  // "pytorch-expandable" only: the segment it lies in
  Block* prev = nullptr;  // address neighbours inside the same segment (nullptr at its ends)
  Block* next = nullptr;
  bool mapped = true;  // false: address space of an expandable segment with no pages behind it
  bool allocated = false;
  bool pending = false;  // freed, waiting for the streams in `uses` to pass `marks`
  std::size_t requested = 0;  // bytes asked for, while allocated or pending (snapshot export)
  std::vector<Stream> uses;          // other streams it was used on (record_stream)
  std::vector<std::uint64_t> marks;  // StreamClock marks taken when it was freed

  bool whole_segment() const noexcept { return prev == nullptr && next == nullptr; }
  // Neither in use nor waiting: a free block, or unmapped space.
  bool available() const noexcept { return !allocated && !pending; }
  bool is_free() const noexcept { return mapped && available(); }
};

// What a free block can grow to: with unmapped space after it, its size plus that space (native
// segments are mapped throughout: there it is the block's size).
inline std::size_t growable_size(const Block* b) noexcept {
  return b->next == nullptr || b->next->mapped ? b->size : b->size + b->next->size;
}

// Best fit: by stream, then size, then address (PyTorch's own ordering of its free blocks).
struct BySize {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};

/// The device options both models start from; each sets its virtual-memory support.
SimulatedDeviceOptions device_options(const TargetOptions& o, const char* device_name);

/// The pool a seed's flags name.
Pool seed_pool(const trace::TraceEvent& seed) noexcept;

class CachingModel : public ReplayTarget {
 public:
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes, Stream stream) override;
  /// An allocation under a tag is one of a private pool (a torch.cuda.MemPool, a graph's pool):
  /// PyTorch serves a pool from segments of its own, per stream, which no other pool or stream
  /// reuses. Modelled as a stream of its own per (stream, tag) (pool_stream()).
  void* allocate_tagged(std::size_t bytes, Stream stream, std::string_view tag) override {
    return allocate(bytes, pool_stream(stream, tag));
  }
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  void record_stream(void* ptr, Stream stream) override;
  void stream_synchronized(Stream stream) override { clock_.synchronized(stream); }
  void empty_cache() override { release_cached(); }

  std::size_t reserved() const override { return reserved_; }
  std::size_t allocated() const override { return allocated_; }
  UpstreamCounts upstream() const override;
  UpstreamCounts seeding_excluded() const override { return baseline_; }
  /// The blocks as segments (chains of address neighbours) and the history, if recorded.
  trace::pytorch::DeviceMemory memory_state() const override;
  /// The same segments, each block with its stream.
  std::optional<MemoryMap> memory_map() const override;
  std::string settings() const override { return std::string("model:") + name_ + "," + conf_; }

 protected:
  /// `name` is the target's (a static string); `expandable` the mode it models (for its conf).
  CachingModel(const TargetOptions& options, const char* name, bool expandable,
               const SimulatedDeviceOptions& device);

  std::size_t round_size(std::size_t bytes) const noexcept {
    return pytorch_rules::round_size(bytes, settings_.divisions);
  }
  std::set<Block*, BySize>& free_set(Pool p) { return free_[static_cast<int>(p)]; }

  // --- what differs between the models ---
  /// A free block of at least `size` bytes of `stream` in `pool` from new memory, out of its free
  /// set, freeing cached memory when the device is full; nullptr: out of memory.
  virtual Block* grow(Pool pool, Stream stream, std::size_t size) = 0;
  /// Whether `b`, about to serve `size` bytes, is split (the rest stays free).
  virtual bool should_split(const Block& b, std::size_t size) const noexcept = 0;
  /// Waits for pending frees and returns cached memory to the device (empty_cache()).
  virtual void release_cached() = 0;
  /// Takes `b` out of the set of its kind, if it is there (keys are unique: addresses).
  virtual void unindex(Block* b) { free_set(b->pool).erase(b); }

  // --- shared operations ---
  Block* find_free(Pool pool, Stream stream, std::size_t size);
  Block* take(Block* b, std::size_t size);
  Block* new_block(Address addr, std::size_t size, Stream stream, Pool pool, Segment* segment,
                   bool mapped);
  Block* split_at(Block* b, std::size_t offset);
  Block* free_block(Block* b);
  Block* absorb(Block* low, Block* high);
  void process_pending();
  void complete_all_pending();
  Block* carve_free(Block* f, Address x, std::size_t size);
  /// The seeded segment or range that holds trace address `addr`: its model address, its size
  /// and `addr`'s offset in it; nullopt when no seeded one holds it.
  struct SeededPlace {
    Address start;
    std::size_t length;
    std::uint64_t offset;
  };
  std::optional<SeededPlace> seeded_place(std::uint64_t addr) const;
  void exclude_from_window(const UpstreamCounts& before);
  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, Stream stream);
  /// Calls visit(head) for the first block of each segment (chain of neighbours), by address.
  template <typename Visit>
  void for_each_segment(Visit&& visit) const;
  /// Snapshot export: attaches the history recorder (record_history() of a model that exports).
  void start_history();
  /// Records an event in the history, when there is one.
  void note(EventType type, Address addr, std::size_t requested, std::size_t size, Stream stream);
  /// The model's stream of the private pool `tag` on trace stream `stream` (made on first use).
  Stream pool_stream(Stream stream, std::string_view tag);
  /// The trace's stream of a model stream (a private pool's is the stream it was made for).
  Stream trace_stream(Stream s) const;
  /// `b` (pending or just freed) becomes reusable: free_completed, then free_block().
  Block* complete_free(Block* b);

  const char* name_;
  std::string conf_;
  std::size_t history_entries_;
  std::shared_ptr<trace::pytorch::HistoryRecorder> history_;  // after start_history()
  pytorch_rules::Settings settings_;
  SimulatedDevice device_;
  UpstreamCounts baseline_;        // the device calls of seeding, not part of the window
  std::uint64_t event_syncs_ = 0;  // host waits on pending frees (release_cached)
  model::StreamClock clock_;
  std::unordered_map<Address, std::unique_ptr<Block>> blocks_;  // every block, by address
  std::set<Block*, BySize> free_[kNumPools];
  std::vector<Block*> pending_;  // freed blocks waiting for other streams
  // Seeded segments or ranges: trace address -> (model address, size), to place seed_alloc
  // blocks exactly.
  std::map<std::uint64_t, std::pair<Address, std::size_t>> seeds_;
  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
  // Private pools: (trace stream, tag) -> model stream, at kPoolStreams and above (trace streams
  // are pointers or small ids, below 2^62), and back.
  static constexpr Stream kPoolStreams = Stream{1} << 62;
  std::map<std::pair<Stream, std::string>, Stream, std::less<>> pool_streams_;
  std::vector<Stream> pool_stream_of_;  // model stream - kPoolStreams -> trace stream
};

}  // namespace tensorpool::replay::pytorch_common
