// summary.cpp: one pass over a trace's events for trace::summarize() (see summary.hpp).
#include "tensorpool/trace/summary.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

namespace tensorpool::trace {

namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

// A block's key across devices: addresses are per device.
std::uint64_t block_key(const TraceEvent& e) { return e.addr ^ (std::uint64_t{e.device} << 56); }

// The peak of live requested bytes of one device (the replay engine's rule, see summary.hpp).
class RequestedPeak {
 public:
  void apply(const TraceEvent& e) {
    switch (e.op) {
      case Op::seed_alloc:
      case Op::alloc:
        if (e.size == 0) break;
        if (auto it = live_.find(e.addr); it != live_.end()) requested_ -= it->second;
        live_[e.addr] = e.size;
        requested_ += e.size;
        peak_ = std::max(peak_, requested_);
        break;
      case Op::free_requested:
      case Op::free_completed:
        if (auto it = live_.find(e.addr); it != live_.end()) {
          requested_ -= it->second;
          live_.erase(it);
        }
        break;
      default: break;
    }
  }
  std::uint64_t peak() const noexcept { return peak_; }

 private:
  std::unordered_map<std::uint64_t, std::uint64_t> live_;  // addr -> requested bytes
  std::uint64_t requested_ = 0;
  std::uint64_t peak_ = 0;
};

}  // namespace

Histogram::Histogram(std::vector<std::uint64_t> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size() + 1), bytes(bounds.size() + 1) {}

void Histogram::add(std::uint64_t value, std::uint64_t weight) {
  const auto i = static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) -
                                          bounds.begin());
  ++counts[i];
  bytes[i] += weight;
}

TraceSummary summarize(const Trace& trace, std::size_t top) {
  TraceSummary s;
  s.sizes = Histogram({512, 4 * kKiB, 64 * kKiB, kMiB, 10 * kMiB, 100 * kMiB, kGiB});
  s.lifetimes = Histogram({1, 10, 100, 1000, 10000, 100000});
  std::set<std::uint16_t> devices;
  std::set<std::pair<std::uint16_t, std::uint64_t>> streams;
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::uint64_t>> born;  // -> (index, size)
  std::map<std::string, std::uint64_t> label_bytes;
  std::map<std::uint16_t, RequestedPeak> peaks;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    ++s.ops[static_cast<std::size_t>(e.op)];
    devices.insert(e.device);
    peaks[e.device].apply(e);
    if (e.op == Op::alloc || e.op == Op::seed_alloc) {
      streams.insert({e.device, e.stream});
      s.sizes.add(e.size, e.size);
      born[block_key(e)] = {i, e.size};
      if (e.label != 0) label_bytes[trace.labels[e.label]] += e.size;
    } else if (e.op == Op::free_requested) {
      if (auto it = born.find(block_key(e)); it != born.end()) {
        s.lifetimes.add(i - it->second.first, it->second.second);
        born.erase(it);
      }
    }
  }
  s.events = trace.events.size();
  s.devices.assign(devices.begin(), devices.end());
  s.streams = streams.size();
  s.never_freed = born.size();
  for (const auto& [device, peak] : peaks) s.peak_requested += peak.peak();
  std::vector<std::pair<std::uint64_t, std::string>> ranked;
  for (const auto& [label, bytes] : label_bytes) ranked.emplace_back(bytes, label);
  std::sort(ranked.rbegin(), ranked.rend());
  ranked.resize(std::min(ranked.size(), top));
  for (auto& [bytes, label] : ranked) s.top_labels.push_back({std::move(label), bytes});
  return s;
}

}  // namespace tensorpool::trace
