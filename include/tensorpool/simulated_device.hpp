// tensorpool/simulated_device.hpp: a device of any capacity that exists only as bookkeeping.
//
// Addresses are virtual numbers that are never touched and never backed by host memory, so an
// 80 GiB device fits on a laptop. Streams and events are deterministic: work on a stream completes
// only when the test (or the replay engine) says so (EventMode::manual), or at once
// (EventMode::immediate). Every upstream call is counted, and faults can be injected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "tensorpool/cost_model.hpp"
#include "tensorpool/device.hpp"

namespace tensorpool {

enum class EventMode : std::uint8_t {
  manual,     // recorded work completes when complete_*() or a synchronize call says so
  immediate,  // recorded work is complete at once (an infinitely fast device)
};

struct SimulatedDeviceOptions {
  std::string name = "sim0";
  int ordinal = 0;
  std::size_t capacity = 80 * GiB;
  std::size_t segment_granularity = 2 * MiB;
  std::size_t alignment = DeviceProperties::kDefaultAlignment;
  bool supports_virtual_memory = true;  // false: virtual_memory() is nullptr
  std::size_t vm_page_size = 2 * MiB;
  EventMode event_mode = EventMode::manual;
  /// Modelled host cost of each upstream call, reported in counters().modelled_ns
  /// (tensorpool/cost_model.hpp; `tensorpool replay --cost-model FILE`). Null: the default
  /// model (CostModel::standard(), which grows with bytes).
  std::shared_ptr<const CostModel> cost_model = nullptr;
  /// Physical pages hold bytes (host memory, made on first write) that copy_to_host and
  /// copy_to_device read and write through the mappings: for tests of contents. Off: bookkeeping
  /// only, and holds_contents() is false.
  bool back_memory = false;
};

/// What the device has been asked to do.
struct DeviceCounters {
  std::uint64_t segment_allocs = 0;        // successful
  std::uint64_t segment_alloc_failures = 0;  // out of memory (real or injected)
  std::uint64_t segment_frees = 0;
  std::uint64_t events_created = 0;
  std::uint64_t events_destroyed = 0;
  std::uint64_t events_recorded = 0;
  std::uint64_t event_queries = 0;
  std::uint64_t stream_queries = 0;
  std::uint64_t event_syncs = 0;
  std::uint64_t stream_waits = 0;
  std::uint64_t stream_syncs = 0;
  std::uint64_t device_syncs = 0;
  std::uint64_t address_reserves = 0;
  std::uint64_t address_releases = 0;
  std::uint64_t physical_creates = 0;
  std::uint64_t physical_releases = 0;
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t faults_injected = 0;
  std::uint64_t modelled_ns = 0;           // sum of the modelled cost of upstream calls

  /// All host synchronizations (event, stream and device).
  std::uint64_t syncs() const noexcept { return event_syncs + stream_syncs + device_syncs; }
};

/// Which upstream call a fault is injected into.
enum class FaultSite : std::uint8_t { segment_alloc, physical_create, map, event_create, stream_query, event_query };
/// How many fault sites there are (arrays indexed by FaultSite).
inline constexpr std::size_t kFaultSiteCount = 6;

class SimulatedDevice final : public DeviceBackend, public VirtualMemory {
 public:
  explicit SimulatedDevice(SimulatedDeviceOptions options = {});
  ~SimulatedDevice() override;

  const DeviceProperties& properties() const noexcept override { return props_; }
  std::size_t free_memory() override;

  void* allocate_segment(std::size_t bytes, Stream stream) override;
  void free_segment(void* ptr, std::size_t bytes, Stream stream) override;

  DeviceEvent create_event() override;
  void destroy_event(DeviceEvent event) override;
  void record_event(DeviceEvent event, Stream stream) override;
  bool query_event(DeviceEvent event) override;
  void synchronize_event(DeviceEvent event) override;
  void stream_wait_event(Stream stream, DeviceEvent event) override;
  void synchronize_stream(Stream stream) override;
  bool query_stream(Stream stream) override;
  void synchronize_device() override;

  /// this, unless options.supports_virtual_memory is false (then the calls below throw).
  VirtualMemory* virtual_memory() noexcept override;
  std::size_t page_size() const noexcept override { return options_.vm_page_size; }
  Address reserve_address_range(std::size_t bytes, std::size_t alignment) override;
  void release_address_range(Address base, std::size_t bytes) override;
  PhysicalHandle create_physical(std::size_t bytes) override;
  void release_physical(PhysicalHandle handle) override;
  void map(Address addr, std::size_t bytes, PhysicalHandle handle) override;
  void unmap(Address addr, std::size_t bytes) override;
  bool maps_parts() const noexcept override { return true; }
  void map_part(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset) override;

  // --- test and replay controls ------------------------------------------------------------
  /// A new stream handle (never 0; 0 is the default stream, which always exists).
  Stream create_stream();
  /// Completes the work captured by `event` and everything before it on its stream.
  void complete_event(DeviceEvent event);
  /// Completes everything submitted to `stream` so far.
  void complete_stream(Stream stream);
  void complete_all();
  /// Recorded events whose work has not completed.
  std::size_t incomplete_events() const;
  void set_event_mode(EventMode mode);

  /// Memory used by someone else (another process, the CUDA context): lowers free_memory().
  void set_external_usage(std::size_t bytes);
  /// Marks `stream` as captured into a CUDA graph, or no longer (is_capturing() says so; the
  /// simulated device refuses nothing meanwhile: its counters show what was called).
  void set_capturing(Stream stream, bool capturing);
  bool is_capturing(Stream stream) override;
  /// Fails the n-th call (1 = the next one) at `site` from now on; 0 cancels.
  void fail_nth(FaultSite site, std::uint64_t n);
  /// Fails every segment allocation and physical creation larger than `bytes` (0 = off).
  void fail_allocations_above(std::size_t bytes);

  DeviceCounters counters() const;
  /// Bytes of device memory in use by segments and physical pages (external usage excluded).
  std::size_t used_bytes() const;
  /// Bytes currently mapped through map().
  std::size_t mapped_bytes() const;

  bool holds_contents() const noexcept override { return options_.back_memory; }
  /// Through the mappings only (segments hold no bytes); DeviceError for an unmapped byte.
  void copy_to_host(void* dst, Address src, std::size_t bytes) override;
  void copy_to_device(Address dst, const void* src, std::size_t bytes) override;

 private:
  /// Calls f(handle bytes, offset in them, length) for each mapped piece of [addr, addr + bytes).
  template <class F>
  void for_each_mapped(Address addr, std::size_t bytes, F&& f);
  struct StreamState {
    std::uint64_t submitted = 0;  // sequence number of the last recorded event
    std::uint64_t completed = 0;  // every event with seq <= completed is done
    // Waits on other streams: before this stream passes `at`, `stream` must reach `seq`.
    struct Wait {
      std::uint64_t at;
      Stream stream;
      std::uint64_t seq;
    };
    std::vector<Wait> waits;
  };
  struct EventState {
    Stream stream = 0;
    std::uint64_t seq = 0;  // 0: never recorded
  };
  struct Mapping {
    std::size_t bytes;
    PhysicalHandle handle;
    std::size_t offset;  // into the handle's bytes
  };

  /// map() and map_part() once their arguments are checked: DeviceError if the range is not in
  /// a reserved range or meets another mapping.
  void add_mapping(Address addr, std::size_t bytes, PhysicalHandle handle, std::size_t offset);
  bool take_fault(FaultSite site, std::size_t bytes);
  void charge(CostedCall call, std::size_t bytes);
  StreamState& stream_state(Stream stream);
  void complete_to(Stream stream, std::uint64_t seq);
  bool event_done(const EventState& e) const;
  EventState& event_state(DeviceEvent event, const char* what);
  Address bump(std::size_t bytes, std::size_t alignment);
  std::size_t available() const;

  DeviceProperties props_;
  SimulatedDeviceOptions options_;
  mutable std::mutex mutex_;
  DeviceCounters counters_;
  std::size_t used_ = 0;
  std::size_t external_ = 0;
  std::size_t mapped_ = 0;
  Address next_address_;
  Stream next_stream_ = 1;
  DeviceEvent next_event_ = 1;
  std::unordered_map<Stream, StreamState> streams_;
  std::unordered_map<DeviceEvent, EventState> events_;
  std::map<Address, std::size_t> segments_;          // live segments
  std::map<Address, std::size_t> ranges_;            // reserved address ranges
  std::unordered_map<PhysicalHandle, std::size_t> physical_;
  std::unordered_map<PhysicalHandle, std::vector<unsigned char>> contents_;  // back_memory
  std::map<Address, Mapping> mappings_;
  std::unordered_multimap<PhysicalHandle, Address> mapped_handles_;  // where each handle is mapped
  PhysicalHandle next_physical_ = 1;
  std::uint64_t fault_countdown_[kFaultSiteCount] = {};
  std::size_t fail_above_ = 0;
  std::set<Stream> capturing_;
};

}  // namespace tensorpool
