// The OutOfMemoryError message: every figure an engineer needs to explain the OOM, and a hint.
#include <string>

#include "tensorpool/errors.hpp"

namespace tensorpool {

namespace {

std::string hint_for(const OutOfMemoryInfo& i) {
  if (i.rounded > i.capacity) return "the request is larger than the whole device";
  if (i.memory_limit != 0 && i.reserved + i.rounded > i.memory_limit &&
      i.device_free >= i.rounded)
    return "the memory_limit setting is what stops this allocation; raise it";
  if (i.reserved_unallocated >= i.rounded && i.page_size != 0)
    return "reserved but unallocated memory exceeds the request, in pieces no request can join: "
           "free bytes on pages that live blocks share (memory moves in whole pages of " +
           format_bytes(i.page_size) + "), or cached for other streams; lower the peak";
  if (i.reserved_unallocated >= i.rounded)
    return "reserved but unallocated memory exceeds the request: it is fragmented across "
           "segments and streams; try a smaller max_split_size, or the virtual-memory mode";
  if (i.device_free + i.reserved_unallocated >= i.rounded)
    return "memory is split between free device memory and cached segments; "
           "empty_cache() before large allocations, or lower the peak";
  return "live allocations use almost all memory: lower the batch size or free tensors earlier";
}

std::string describe(const OutOfMemoryInfo& i) {
  std::string m = "tensorpool: out of memory: cannot allocate " + format_bytes(i.requested) + " (" +
                  std::to_string(i.requested) + " bytes, rounded to " + format_bytes(i.rounded) +
                  ") on device " + std::to_string(i.device) + ", stream " +
                  std::to_string(i.stream) + ". capacity " + format_bytes(i.capacity) +
                  ", device free " + format_bytes(i.device_free) + ", reserved " +
                  format_bytes(i.reserved) + ", allocated " + format_bytes(i.allocated) +
                  ", reserved but unallocated " + format_bytes(i.reserved_unallocated) +
                  ", largest free block " + format_bytes(i.largest_free_block);
  if (i.memory_limit != 0) m += ", memory limit " + format_bytes(i.memory_limit);
  if (!i.cached_per_stream.empty()) {
    m += ", cached free per stream:";
    for (const auto& c : i.cached_per_stream)
      m += " " + std::to_string(c.stream) + "=" + format_bytes(c.bytes);
  }
  return m + ". Hint: " + hint_for(i) + ".";
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(const OutOfMemoryInfo& info) : info_(info), message_(describe(info)) {}

}  // namespace tensorpool
