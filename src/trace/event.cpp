// The names of trace operations and the label table of an in-memory trace.
#include "tensorpool/trace/event.hpp"

#include <array>

namespace tensorpool::trace {

namespace {
constexpr std::array<const char*, kNumOps> kOpNames = {
    "alloc",       "free_requested", "free_completed", "record_stream", "stream_sync",
    "iteration",   "segment_alloc",  "segment_free",   "segment_map",   "segment_unmap",
    "oom",         "seed_segment",   "seed_alloc",     "empty_cache",   "sleep",
    "graph_pool"};
}  // namespace

const char* to_string(Op op) noexcept {
  const auto i = static_cast<std::size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : "unknown";
}

bool parse_op(std::string_view name, Op& out) noexcept {
  for (std::size_t i = 0; i < kOpNames.size(); ++i) {
    if (name == kOpNames[i]) {
      out = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

std::uint32_t Trace::intern(std::string_view text) {
  if (text.empty()) return 0;
  auto it = label_ids.find(std::string(text));
  if (it != label_ids.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(labels.size());
  labels.emplace_back(text);
  label_ids.emplace(labels.back(), id);
  return id;
}

}  // namespace tensorpool::trace
