// empty_cache.cpp: the pass that marks a recorded run's empty_cache() calls (rules in
// tensorpool/trace/empty_cache.hpp). Self-contained: it reads only the converted trace's events.
#include "tensorpool/trace/empty_cache.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <vector>

namespace tensorpool::trace {

namespace {

// The live blocks of one device, by address, to tell whether a segment is wholly free.
class LiveBlocks {
 public:
  void apply(const TraceEvent& e) {
    switch (e.op) {
      case Op::alloc:
      case Op::seed_alloc: blocks_[e.addr] = e.size; break;
      case Op::free_completed: blocks_.erase(e.addr); break;
      default: break;
    }
  }
  bool any_in(std::uint64_t addr, std::uint64_t size) const {
    const auto it = blocks_.lower_bound(addr);
    return it != blocks_.end() && it->first < addr + size;
  }

 private:
  std::map<std::uint64_t, std::uint64_t> blocks_;
};

// The runs of one device, as indices into trace.events (only that device's events considered).
std::vector<std::size_t> runs_of_device(const Trace& trace, std::uint16_t device) {
  std::vector<std::size_t> starts;
  LiveBlocks live;
  std::vector<std::size_t> idx;  // this device's events, in order
  for (std::size_t i = 0; i < trace.events.size(); ++i)
    if (trace.events[i].device == device) idx.push_back(i);
  for (std::size_t k = 0; k < idx.size();) {
    const TraceEvent& e = trace.events[idx[k]];
    if (e.op != Op::segment_free) {
      live.apply(e);
      ++k;
      continue;
    }
    const bool oom_before = k > 0 && trace.events[idx[k - 1]].op == Op::oom;
    bool wholly_free = true;
    const std::size_t start = k;
    for (; k < idx.size() && trace.events[idx[k]].op == Op::segment_free; ++k) {
      const TraceEvent& f = trace.events[idx[k]];
      wholly_free = wholly_free && !live.any_in(f.addr, f.size);
    }
    const Op after = k < idx.size() ? trace.events[idx[k]].op : Op::alloc;
    const bool oom_after = after == Op::oom;
    const bool retried_malloc = after == Op::segment_alloc;  // freed to retry a failed cudaMalloc
    if (wholly_free && !oom_before && !oom_after && !retried_malloc) starts.push_back(idx[start]);
  }
  return starts;
}

}  // namespace

std::size_t mark_empty_cache_calls(Trace& trace) {
  std::vector<std::uint16_t> devices;
  for (const TraceEvent& e : trace.events) {
    if (e.op == Op::empty_cache) return 0;
    if (std::find(devices.begin(), devices.end(), e.device) == devices.end()) devices.push_back(e.device);
  }
  std::vector<std::size_t> starts;
  for (std::uint16_t d : devices) {
    const auto s = runs_of_device(trace, d);
    starts.insert(starts.end(), s.begin(), s.end());
  }
  if (starts.empty()) return 0;
  std::sort(starts.begin(), starts.end());
  std::vector<TraceEvent> out;
  out.reserve(trace.events.size() + starts.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    if (next < starts.size() && starts[next] == i) {
      TraceEvent call;
      call.op = Op::empty_cache;
      call.device = trace.events[i].device;
      call.stream = 0;
      call.time_us = trace.events[i].time_us;
      out.push_back(call);
      ++next;
    }
    out.push_back(trace.events[i]);
  }
  trace.events = std::move(out);
  return starts.size();
}

}  // namespace tensorpool::trace
