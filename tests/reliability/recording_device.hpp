// recording_device.hpp: a DeviceBackend for the reliability tests that forwards every call to a
// SimulatedDevice and remembers what a reference model needs to judge the allocator from the
// outside:
//  - per stream, the sequence number of the last recorded event (the simulated device numbers
//    the events of a stream 1, 2, 3, ... in record order, and every record goes through here, so
//    submitted(s) equals the device's own counter);
//  - the stream waits enqueued (waited(t, s): the highest sequence of stream s that work
//    submitted to stream t from now on is ordered after; transitively, as on a device: an event
//    recorded on s carries what s itself waited for before it, so a stream that waits for it is
//    ordered after those streams' work too);
//  - how many calls each fault site received (to tell which injected fault fired when);
//  - the device memory that is live: segments (fixed mode) and mappings (vmm mode), so a test
//    can check that a block has memory behind it.
// A hook (before_release) runs before memory leaves the allocator's hands (free_segment, unmap):
// the model checks there that nothing still in use is being released.
//
// Not thread-safe: it serves the single-threaded differential and fault tests.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "tensorpool/simulated_device.hpp"

namespace tensorpool::reliability {

/// Streams are small integers on the simulated device (0, then 1, 2, ... from create_stream()).
inline constexpr std::size_t kMaxStreams = 8;
inline constexpr int kNumFaultSites = static_cast<int>(kFaultSiteCount);

class RecordingDevice final : public DeviceBackend, public VirtualMemory {
 public:
  explicit RecordingDevice(std::shared_ptr<SimulatedDevice> sim) : sim_(std::move(sim)) {}

  SimulatedDevice& sim() const noexcept { return *sim_; }

  // --- what the model reads ------------------------------------------------------------------
  std::uint64_t submitted(Stream s) const { return submitted_.at(index(s)); }
  std::uint64_t waited(Stream t, Stream s) const { return waited_.at(index(t)).at(index(s)); }
  std::uint64_t calls(FaultSite site) const noexcept { return calls_[static_cast<int>(site)]; }
  /// True when [addr, addr + bytes) lies in one live segment or in contiguous live mappings.
  bool covered(Address addr, std::size_t bytes) const {
    return inside(segments_, addr, bytes) || inside(mappings_, addr, bytes);
  }
  /// Called with [addr, addr + bytes) before a segment is freed or a mapping is removed.
  std::function<void(Address, std::size_t, bool unmap)> before_release;

  // --- DeviceBackend: forwarded --------------------------------------------------------------
  const DeviceProperties& properties() const noexcept override { return sim_->properties(); }
  std::size_t free_memory() override { return sim_->free_memory(); }

  void* allocate_segment(std::size_t bytes, Stream stream) override {
    ++calls_[static_cast<int>(FaultSite::segment_alloc)];
    void* p = sim_->allocate_segment(bytes, stream);
    if (p != nullptr) segments_[reinterpret_cast<Address>(p)] = bytes;
    return p;
  }
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override {
    if (before_release) before_release(reinterpret_cast<Address>(ptr), bytes, false);
    sim_->free_segment(ptr, bytes, stream);
    segments_.erase(reinterpret_cast<Address>(ptr));
  }

  DeviceEvent create_event() override {
    ++calls_[static_cast<int>(FaultSite::event_create)];
    return sim_->create_event();
  }
  void destroy_event(DeviceEvent event) override { sim_->destroy_event(event); }
  void record_event(DeviceEvent event, Stream stream) override {
    sim_->record_event(event, stream);
    const std::uint64_t seq = ++submitted_.at(index(stream));
    recorded_[event] = {stream, seq, waited_.at(index(stream))};
  }
  bool query_event(DeviceEvent event) override {
    ++calls_[static_cast<int>(FaultSite::event_query)];
    return sim_->query_event(event);
  }
  void synchronize_event(DeviceEvent event) override { sim_->synchronize_event(event); }
  void stream_wait_event(Stream stream, DeviceEvent event) override {
    sim_->stream_wait_event(stream, event);
    auto it = recorded_.find(event);
    if (it == recorded_.end()) return;  // never recorded: complete, orders nothing
    const Recorded& r = it->second;
    auto& w = waited_.at(index(stream));
    w[index(r.stream)] = std::max(w[index(r.stream)], r.seq);
    for (std::size_t s = 0; s < kMaxStreams; ++s) w[s] = std::max(w[s], r.waited[s]);
  }
  void synchronize_stream(Stream stream) override { sim_->synchronize_stream(stream); }
  bool query_stream(Stream stream) override {
    ++calls_[static_cast<int>(FaultSite::stream_query)];
    return sim_->query_stream(stream);
  }
  void synchronize_device() override { sim_->synchronize_device(); }

  // --- VirtualMemory: forwarded, when the simulated device has it ----------------------------
  VirtualMemory* virtual_memory() noexcept override {
    return sim_->virtual_memory() != nullptr ? this : nullptr;
  }
  std::size_t page_size() const noexcept override { return sim_->page_size(); }
  Address reserve_address_range(std::size_t bytes, std::size_t alignment) override {
    return sim_->reserve_address_range(bytes, alignment);
  }
  void release_address_range(Address base, std::size_t bytes) override {
    sim_->release_address_range(base, bytes);
  }
  PhysicalHandle create_physical(std::size_t bytes) override {
    ++calls_[static_cast<int>(FaultSite::physical_create)];
    return sim_->create_physical(bytes);
  }
  void release_physical(PhysicalHandle handle) override { sim_->release_physical(handle); }
  void map(Address addr, std::size_t bytes, PhysicalHandle handle) override {
    ++calls_[static_cast<int>(FaultSite::map)];
    sim_->map(addr, bytes, handle);
    mappings_[addr] = bytes;
  }
  void unmap(Address addr, std::size_t bytes) override {
    if (before_release) before_release(addr, bytes, true);
    sim_->unmap(addr, bytes);
    mappings_.erase(addr);
  }
  bool maps_parts() const noexcept override { return sim_->maps_parts(); }
  void map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) override {
    ++calls_[static_cast<int>(FaultSite::map)];
    sim_->map_part(addr, bytes, handle, offset);
    mappings_[addr] = bytes;
  }

 private:
  static std::size_t index(Stream s) {
    if (s >= kMaxStreams) throw std::out_of_range("RecordingDevice: stream beyond kMaxStreams");
    return static_cast<std::size_t>(s);
  }
  // [addr, addr + bytes) inside ranges that are contiguous (each starting where the last ended).
  static bool inside(const std::map<Address, std::size_t>& ranges, Address addr, std::size_t bytes) {
    auto it = ranges.upper_bound(addr);
    if (it == ranges.begin()) return false;
    --it;
    Address covered_to = it->first + it->second;
    if (covered_to <= addr) return false;
    while (covered_to < addr + bytes) {
      ++it;
      if (it == ranges.end() || it->first != covered_to) return false;
      covered_to += it->second;
    }
    return true;
  }

  std::shared_ptr<SimulatedDevice> sim_;
  std::array<std::uint64_t, kMaxStreams> submitted_{};
  std::array<std::array<std::uint64_t, kMaxStreams>, kMaxStreams> waited_{};
  std::array<std::uint64_t, kNumFaultSites> calls_{};
  /// An event's last record: its stream and sequence, and what that stream was ordered after then.
  struct Recorded {
    Stream stream;
    std::uint64_t seq;
    std::array<std::uint64_t, kMaxStreams> waited;
  };
  std::unordered_map<DeviceEvent, Recorded> recorded_;
  std::map<Address, std::size_t> segments_;
  std::map<Address, std::size_t> mappings_;
};

}  // namespace tensorpool::reliability
