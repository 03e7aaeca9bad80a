// trace_builder.hpp: appends the events of a synthetic trace (internal to tensorpool::workload,
// shared by every generator): fresh addresses, one time step per event, interned labels.
#pragma once

#include <cstdint>
#include <string_view>

#include "tensorpool/trace/event.hpp"

namespace tensorpool::workload {

inline constexpr std::uint64_t kComputeStream = 0;
inline constexpr std::uint64_t kCommStream = 0x5eed;  // a second stream's handle in the trace

class TraceBuilder {
 public:
  explicit TraceBuilder(trace::Trace& t) : t_(t) {}

  /// Events from now on are of `device`.
  void set_device(int device) { device_ = static_cast<std::uint16_t>(device); }

  /// A new block of `bytes`; its address is unique in the trace (never reused).
  std::uint64_t alloc(std::uint64_t bytes, std::string_view label, std::uint64_t stream = kComputeStream) {
    const std::uint64_t addr = next_addr_;
    next_addr_ += (bytes + 511) / 512 * 512 + 512;
    push(trace::Op::alloc, addr, bytes, stream, label);
    return addr;
  }
  /// free_requested then free_completed, on `stream` (the block's).
  void free(std::uint64_t addr, std::uint64_t stream = kComputeStream) {
    push(trace::Op::free_requested, addr, 0, stream, "");
    push(trace::Op::free_completed, addr, 0, stream, "");
  }
  void record_stream(std::uint64_t addr, std::uint64_t stream) {
    push(trace::Op::record_stream, addr, 0, stream, "");
  }
  void iteration(std::uint64_t n) { push(trace::Op::iteration, 0, n, kComputeStream, ""); }
  /// The program called torch.cuda.empty_cache().
  void empty_cache() { push(trace::Op::empty_cache, 0, 0, kComputeStream, ""); }
  /// The host waited for `stream`: its work (collectives, ...) has completed.
  void sync(std::uint64_t stream) { push(trace::Op::stream_sync, 0, 0, stream, ""); }

 private:
  void push(trace::Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
            std::string_view label) {
    t_.events.push_back({.op = op,
                         .device = device_,
                         .label = label.empty() ? 0 : t_.intern(label),
                         .stream = stream,
                         .addr = addr,
                         .size = size,
                         .time_us = static_cast<std::int64_t>(time_++)});
  }

  trace::Trace& t_;
  std::uint64_t next_addr_ = 0x7f0000000000;
  std::uint64_t time_ = 0;
  std::uint16_t device_ = 0;
};

}  // namespace tensorpool::workload
