// graph_pools.hpp: the private pools of CUDA graphs (Allocator::begin_capture), as data: which
// streams are captured into which pool, and each pool's ranges, free space and live blocks.
//
// A pool's memory is one or more ranges, each an ordinary live block of the allocator (its
// "backing" block, allocated under the tag kGraphPoolsTag before the capture began, so that the
// device was asked for memory then and never during the capture). A captured allocation is cut
// from the pool's free space by best fit, with no device call; freed, it coalesces with its free
// neighbours of the same range and stays the pool's until the pool is released and empty. Nothing
// here talks to the device or to the allocator's blocks: graph_capture.cpp does (docs/graphs.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorpool/stats.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool::detail {

/// The tag the ranges of every graph pool are allocated under (their own heaps in vmm mode, so
/// that the streams' heaps keep their epochs; sleep("tensorpool:graphs") puts them alone to sleep).
inline constexpr std::string_view kGraphPoolsTag = "tensorpool:graphs";

/// Free space of a pool, over its ranges. Invariants: free pieces do not overlap, lie in one
/// range each, and no two free pieces of one range touch (they are merged); by_size_ lists exactly
/// the pieces of by_addr_; bytes_ is their sum.
class FreeRanges {
 public:
  /// A new range [addr, addr + bytes), free.
  void add_range(Address addr, std::size_t bytes);
  /// The start of the smallest free piece of at least `bytes` (which are cut from its start), or
  /// nullopt.
  std::optional<Address> take(std::size_t bytes);
  /// [addr, addr + bytes), taken before, is free again.
  void give_back(Address addr, std::size_t bytes);

  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t largest() const noexcept { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  /// The range that contains addr (start, size), or nullopt.
  std::optional<std::pair<Address, std::size_t>> range_of(Address addr) const;
  const std::map<Address, std::size_t>& ranges() const noexcept { return ranges_; }

 private:
  void insert(Address addr, std::size_t bytes);
  void erase(std::map<Address, std::size_t>::iterator it);

  std::map<Address, std::size_t> ranges_;   // every range, by start
  std::map<Address, std::size_t> by_addr_;  // free pieces
  std::set<std::pair<std::size_t, Address>> by_size_;
  std::size_t bytes_ = 0;
};

/// One graph pool.
struct GraphPoolRec {
  std::uint64_t id = 0;
  FreeRanges space;
  std::unordered_map<Address, std::size_t> live;  // live blocks (start, rounded bytes)
  std::size_t reserved = 0;   // the sum of its ranges
  std::size_t allocated = 0;  // the sum of live
  std::size_t peak_allocated = 0;
  std::size_t capture_peak = 0;  // the highest `allocated` since its last capture began
  std::vector<Stream> capturing;  // streams it serves now
  bool released = false;          // release_graph(): given back once `live` is empty
};

/// The pools of one allocator and the streams captured into them. Changed in the exclusive mode
/// only; captures() is also read by the fast path under a shard lock (shards.hpp: the exclusive
/// mode holds them all while it changes).
class GraphPools {
 public:
  GraphPoolRec& create();
  /// The pool with this id, or nullptr (released pools included until they are gone).
  GraphPoolRec* find(std::uint64_t id) noexcept;
  const GraphPoolRec* find(std::uint64_t id) const noexcept;
  /// The pool `stream` is captured into, or nullptr.
  GraphPoolRec* capturing(Stream stream) noexcept;
  /// The pool a range of which contains addr, or nullptr.
  GraphPoolRec* owner_of(Address addr) noexcept;
  const GraphPoolRec* owner_of(Address addr) const noexcept;
  void start_capture(Stream stream, GraphPoolRec& pool);
  void end_capture(Stream stream);
  /// Forgets a pool (its ranges were given back).
  void erase(std::uint64_t id);
  /// Records that `pool` now has range [addr, addr + bytes).
  void add_range(GraphPoolRec& pool, Address addr, std::size_t bytes);

  std::size_t captures() const noexcept { return by_stream_.size(); }
  bool empty() const noexcept { return pools_.empty(); }
  GraphPoolInfo info(const GraphPoolRec& pool) const;
  std::vector<GraphPoolInfo> infos() const;
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [id, pool] : pools_) f(pool);
  }

 private:
  std::map<std::uint64_t, GraphPoolRec> pools_;
  std::unordered_map<Stream, std::uint64_t> by_stream_;  // streams being captured
  std::map<Address, std::uint64_t> by_range_;           // every pool's ranges, by start
  std::uint64_t next_id_ = 1;                           // ids are never reused
};

}  // namespace tensorpool::detail
