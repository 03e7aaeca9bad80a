// graph_pools.cpp: the free space of a graph pool (best fit, merged within a range) and the
// registry of pools and captured streams (graph_pools.hpp).
#include "core/graph_pools.hpp"

#include <algorithm>
#include <iterator>

namespace tensorpool::detail {

// --- FreeRanges -------------------------------------------------------------------------------

void FreeRanges::add_range(Address addr, std::size_t bytes) {
  ranges_.emplace(addr, bytes);
  insert(addr, bytes);
}

std::optional<Address> FreeRanges::take(std::size_t bytes) {
  const auto best = by_size_.lower_bound({bytes, 0});
  if (best == by_size_.end()) return std::nullopt;
  const auto [size, addr] = *best;
  erase(by_addr_.find(addr));
  if (size > bytes) insert(addr + bytes, size - bytes);
  return addr;
}

void FreeRanges::give_back(Address addr, std::size_t bytes) {
  const auto range = range_of(addr);
  Address start = addr;
  std::size_t size = bytes;
  // Merge with the free pieces just before and just after, when they lie in the same range.
  auto next = by_addr_.lower_bound(addr);
  if (next != by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start && prev->first >= range->first) {
      start = prev->first;
      size += prev->second;
      erase(prev);
    }
  }
  next = by_addr_.lower_bound(addr);
  if (next != by_addr_.end() && next->first == addr + bytes && next->first < range->first + range->second) {
    size += next->second;
    erase(next);
  }
  insert(start, size);
}

std::optional<std::pair<Address, std::size_t>> FreeRanges::range_of(Address addr) const {
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return std::nullopt;
  --it;
  if (addr >= it->first + it->second) return std::nullopt;
  return *it;
}

void FreeRanges::insert(Address addr, std::size_t bytes) {
  by_addr_.emplace(addr, bytes);
  by_size_.emplace(bytes, addr);
  bytes_ += bytes;
}

void FreeRanges::erase(std::map<Address, std::size_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  bytes_ -= it->second;
  by_addr_.erase(it);
}

// --- GraphPools -------------------------------------------------------------------------------

GraphPoolRec& GraphPools::create() {
  const std::uint64_t id = next_id_++;
  GraphPoolRec& pool = pools_[id];
  pool.id = id;
  return pool;
}

const GraphPoolRec* GraphPools::find(std::uint64_t id) const noexcept {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : &it->second;
}

GraphPoolRec* GraphPools::find(std::uint64_t id) noexcept {
  return const_cast<GraphPoolRec*>(std::as_const(*this).find(id));
}

GraphPoolRec* GraphPools::capturing(Stream stream) noexcept {
  auto it = by_stream_.find(stream);
  return it == by_stream_.end() ? nullptr : find(it->second);
}

const GraphPoolRec* GraphPools::owner_of(Address addr) const noexcept {
  auto it = by_range_.upper_bound(addr);
  if (it == by_range_.begin()) return nullptr;
  const GraphPoolRec* pool = find(std::prev(it)->second);
  return pool != nullptr && pool->space.range_of(addr) ? pool : nullptr;
}

GraphPoolRec* GraphPools::owner_of(Address addr) noexcept {
  return const_cast<GraphPoolRec*>(std::as_const(*this).owner_of(addr));
}

void GraphPools::start_capture(Stream stream, GraphPoolRec& pool) {
  by_stream_.emplace(stream, pool.id);
  if (pool.capturing.empty()) pool.capture_peak = pool.allocated;
  pool.capturing.push_back(stream);
}

void GraphPools::end_capture(Stream stream) {
  auto it = by_stream_.find(stream);
  GraphPoolRec& pool = pools_.at(it->second);
  std::erase(pool.capturing, stream);
  by_stream_.erase(it);
}

void GraphPools::erase(std::uint64_t id) {
  auto it = pools_.find(id);
  for (const auto& [addr, bytes] : it->second.space.ranges()) by_range_.erase(addr);
  pools_.erase(it);
}

void GraphPools::add_range(GraphPoolRec& pool, Address addr, std::size_t bytes) {
  pool.space.add_range(addr, bytes);
  pool.reserved += bytes;
  by_range_.emplace(addr, pool.id);
}

GraphPoolInfo GraphPools::info(const GraphPoolRec& pool) const {
  GraphPoolInfo info{.id = pool.id,
                     .capturing = pool.capturing,
                     .reserved = pool.reserved,
                     .allocated = pool.allocated,
                     .peak_allocated = pool.peak_allocated,
                     .blocks = pool.live.size(),
                     .largest_free = pool.space.largest(),
                     .ranges = {},
                     .released = pool.released};
  info.ranges.assign(pool.space.ranges().begin(), pool.space.ranges().end());
  return info;
}

std::vector<GraphPoolInfo> GraphPools::infos() const {
  std::vector<GraphPoolInfo> out;
  for (const auto& [id, pool] : pools_) out.push_back(info(pool));
  return out;
}

}  // namespace tensorpool::detail
