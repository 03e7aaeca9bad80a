// step_turns.cpp: mirrored_step(), predicted_step(), predicted_after_creation(), followed_record()
// (step_turns.hpp).
#include "core/step_turns.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace tensorpool::detail {

namespace {

// Indices into the record: the pinned allocations, and the base blocks freed before its end.
struct Kept {
  std::vector<std::size_t> pinned;  // by size, then in allocation order
  std::vector<std::size_t> freed;   // by size, then in the order of their frees
};

Kept kept_and_freed(std::span<const RecordedBlock> record, std::size_t allocations, std::uint64_t end) {
  Kept k;
  for (std::size_t i = 0; i < record.size(); ++i) {
    const RecordedBlock& b = record[i];
    if (i < allocations && b.pinned) k.pinned.push_back(i);
    if (i >= allocations && b.fixed && b.end < end) k.freed.push_back(i);
  }
  std::stable_sort(k.pinned.begin(), k.pinned.end(), [&](std::size_t a, std::size_t b) {
    return record[a].size < record[b].size;
  });
  std::stable_sort(k.freed.begin(), k.freed.end(), [&](std::size_t a, std::size_t b) {
    return record[a].size != record[b].size ? record[a].size < record[b].size : record[a].end < record[b].end;
  });
  return k;
}

// Whether a block kept (now at the place of a freed base block, alive from its allocation to the
// end) overlaps a base block freed (now at the place of a kept one, alive from the start) while
// both are alive. Kept blocks lie apart from each other (the base blocks whose places they take
// were all alive at the start), so a binary search finds those that reach into a range.
bool kept_meets_freed(std::span<const RecordedBlock> out, const Kept& k) {
  std::vector<std::size_t> by_place = k.pinned;
  std::sort(by_place.begin(), by_place.end(), [&](std::size_t a, std::size_t b) {
    return out[a].recorded < out[b].recorded;
  });
  for (const std::size_t f : k.freed) {
    const std::size_t lo = out[f].recorded;
    const std::size_t hi = lo + out[f].size;
    auto it = std::partition_point(by_place.begin(), by_place.end(), [&](std::size_t p) {
      return out[p].recorded + out[p].size <= lo;
    });
    for (; it != by_place.end() && out[*it].recorded < hi; ++it)
      if (out[*it].start < out[f].end) return true;
  }
  return false;
}

// The record's last tick + 1: the end of every block alive at the boundary.
std::uint64_t end_of(std::span<const RecordedBlock> record) {
  std::uint64_t end = 0;
  for (const RecordedBlock& b : record) end = std::max(end, b.end);
  return end;
}

// The pinned blocks and the freed base blocks of the record, if they pair one for one by size.
std::optional<Kept> paired(std::span<const RecordedBlock> record, std::size_t allocations) {
  if (allocations > record.size()) return std::nullopt;
  Kept k = kept_and_freed(record, allocations, end_of(record));
  if (k.pinned.empty() || k.pinned.size() != k.freed.size()) return std::nullopt;
  for (std::size_t i = 0; i < k.pinned.size(); ++i)
    if (record[k.pinned[i]].size != record[k.freed[i]].size) return std::nullopt;
  return k;
}

}  // namespace

std::optional<std::vector<RecordedBlock>> mirrored_step(std::span<const RecordedBlock> record, std::size_t allocations) {
  const std::optional<Kept> k = paired(record, allocations);
  if (!k) return std::nullopt;
  std::vector<RecordedBlock> out(record.begin(), record.end());
  for (std::size_t i = 0; i < k->pinned.size();) {
    // The base blocks freed of one size: each is alive to the last of their frees.
    std::size_t j = i;
    while (j < k->freed.size() && record[k->freed[j]].size == record[k->freed[i]].size) ++j;
    const std::uint64_t last_free = record[k->freed[j - 1]].end;
    for (; i < j; ++i) {
      const std::size_t p = k->pinned[i];
      const std::size_t f = k->freed[i];
      out[p].recorded = record[f].recorded;
      out[f].recorded = record[p].recorded;
      out[f].end = last_free;
    }
  }
  if (kept_meets_freed(out, *k)) return std::nullopt;
  return out;
}

std::optional<std::vector<RecordedBlock>> predicted_step(std::span<const RecordedBlock> record,
                                                        std::size_t allocations) {
  const std::optional<Kept> k = paired(record, allocations);
  if (!k) return std::nullopt;
  std::vector<RecordedBlock> out(record.begin(), record.end());
  for (std::size_t i = 0; i < k->pinned.size(); ++i) {
    const std::size_t p = k->pinned[i];
    out[k->freed[i]].recorded = record[p].recorded;  // freed when this step freed the one it replaced
    out[p].pinned = false;                           // kept wherever the plan puts it
    out[p].kept = true;                              // as low as it goes
  }
  return out;
}

namespace {

constexpr std::uint32_t kNoBlock = UINT32_MAX;

// Per allocation of the record, the allocation its pinned block replaced (predicted_after_creation()),
// kNoBlock for the others. O(n log n): an event a tick, so kRebindWithin frees at most follow an
// allocation.
std::vector<std::uint32_t> replaced_by_pinned(std::span<const RecordedBlock> record, std::size_t allocations) {
  std::vector<std::pair<std::uint64_t, std::uint32_t>> by_free;  // (free tick, allocation) of those freed
  for (std::size_t i = 0; i < allocations; ++i)
    if (!record[i].pinned) by_free.emplace_back(record[i].end, static_cast<std::uint32_t>(i));
  std::sort(by_free.begin(), by_free.end());
  std::vector<std::uint32_t> replaced(allocations, kNoBlock);
  std::vector<bool> taken(allocations, false);
  for (std::size_t k = 0; k < allocations; ++k) {
    const RecordedBlock& kept = record[k];
    if (!kept.pinned) continue;
    std::uint32_t oldest = kNoBlock;
    for (auto it = std::upper_bound(by_free.begin(), by_free.end(), std::pair{kept.start, UINT32_MAX});
         it != by_free.end() && it->first <= kept.start + kRebindWithin; ++it) {
      const std::uint32_t z = it->second;
      if (taken[z] || record[z].size != kept.size || record[z].start >= kept.start) continue;
      if (oldest == kNoBlock || record[z].start < record[oldest].start) oldest = z;
    }
    if (oldest == kNoBlock) continue;
    replaced[k] = oldest;
    taken[oldest] = true;
  }
  return replaced;
}

}  // namespace

std::optional<std::vector<RecordedBlock>> predicted_after_creation(std::span<const RecordedBlock> record,
                                                                  std::size_t allocations) {
  if (allocations > record.size()) return std::nullopt;
  const std::vector<std::uint32_t> replaced = replaced_by_pinned(record, allocations);
  std::size_t pinned_bytes = 0;
  std::size_t replacing_bytes = 0;
  std::vector<bool> left_out(allocations, false);
  for (std::size_t k = 0; k < allocations; ++k) {
    if (!record[k].pinned) continue;
    pinned_bytes += record[k].size;
    if (replaced[k] == kNoBlock) continue;
    replacing_bytes += record[k].size;
    left_out[replaced[k]] = true;
  }
  if (replacing_bytes == 0 || 2 * replacing_bytes < pinned_bytes) return std::nullopt;
  const std::uint64_t end = end_of(record);
  std::vector<RecordedBlock> out;
  out.reserve(record.size());
  for (std::size_t i = 0; i < allocations; ++i) {
    if (left_out[i]) continue;
    RecordedBlock b = record[i];
    b.kept = b.pinned;  // as low as it goes
    b.pinned = false;
    out.push_back(b);
  }
  const auto base_block = [&](const RecordedBlock& b, std::uint64_t freed) {
    out.push_back(RecordedBlock{.size = b.size, .start = 0, .end = freed, .recorded = b.recorded, .fixed = true});
  };
  for (std::size_t k = 0; k < allocations; ++k)
    if (record[k].pinned) base_block(record[k], replaced[k] == kNoBlock ? end : record[replaced[k]].end);
  for (std::size_t i = allocations; i < record.size(); ++i)
    if (record[i].end == end) base_block(record[i], end);
  return out;
}

std::optional<std::vector<RecordedBlock>> followed_record(std::span<const RecordedBlock> predicted,
                                                         std::size_t allocations,
                                                         std::span<const std::size_t> offsets) {
  if (allocations > predicted.size() || offsets.size() != allocations) return std::nullopt;
  const std::uint64_t end = end_of(predicted);
  std::vector<RecordedBlock> out(predicted.begin(), predicted.end());
  for (std::size_t i = 0; i < allocations; ++i) {
    out[i].recorded = offsets[i];
    out[i].pinned = out[i].end == end;  // alive at the boundary: where the next base has it
    out[i].kept = false;
  }
  return out;
}

std::vector<BaseBlock> base_after(std::span<const RecordedBlock> record) {
  const std::uint64_t end = end_of(record);
  std::vector<BaseBlock> base;
  for (const RecordedBlock& b : record)
    if (b.end == end) base.push_back({b.recorded, b.size});
  std::sort(base.begin(), base.end(), [](const BaseBlock& a, const BaseBlock& b) { return a.offset < b.offset; });
  return base;
}

std::optional<NextStepRecord> next_step_record(std::span<const RecordedBlock> record, std::size_t allocations) {
  if (auto mirror = mirrored_step(record, allocations))
    return NextStepRecord{std::move(*mirror), NextStepKind::mirrored};
  if (auto predicted = predicted_step(record, allocations))
    return NextStepRecord{std::move(*predicted), NextStepKind::predicted};
  if (auto predicted = predicted_after_creation(record, allocations))
    return NextStepRecord{std::move(*predicted), NextStepKind::predicted};
  return std::nullopt;
}

}  // namespace tensorpool::detail
