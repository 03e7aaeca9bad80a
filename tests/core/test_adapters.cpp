// Tests of the C++ adapters over the Allocator: DeviceBuffer (owning, movable, stream aware) and
// PoolMemoryResource (std::pmr), on the simulated device, and a std::pmr::vector on a device whose
// segments are host memory.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <memory_resource>
#include <numeric>
#include <type_traits>
#include <vector>

#include "tensorpool/device_buffer.hpp"
#include "tensorpool/memory_resource.hpp"
#include "tensorpool/tensorpool.hpp"

using namespace tensorpool;

namespace {

std::shared_ptr<SimulatedDevice> make_device() {
  return std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 256 * MiB});
}

/// Segments of real host memory (so containers can touch their elements); streams and events
/// are the simulated device's; no virtual memory. Not thread-safe.
class HostMemoryDevice final : public DeviceBackend {
 public:
  HostMemoryDevice() : sim_(make_device()), props_(sim_->properties()) {}
  ~HostMemoryDevice() override {
    for (const auto& [p, bytes] : live_) std::free(p);
  }
  const DeviceProperties& properties() const noexcept override { return props_; }
  std::size_t free_memory() override { return props_.capacity - used_; }
  void* allocate_segment(std::size_t bytes, Stream) override {
    if (used_ + bytes > props_.capacity) return nullptr;
    void* p = std::aligned_alloc(props_.alignment, bytes);
    if (p == nullptr) return nullptr;
    live_[p] = bytes;
    used_ += bytes;
    return p;
  }
  void free_segment(void* ptr, std::size_t bytes, Stream) override {
    live_.erase(ptr);
    used_ -= bytes;
    std::free(ptr);
  }
  DeviceEvent create_event() override { return sim_->create_event(); }
  void destroy_event(DeviceEvent e) override { sim_->destroy_event(e); }
  void record_event(DeviceEvent e, Stream s) override { sim_->record_event(e, s); }
  bool query_event(DeviceEvent e) override { return sim_->query_event(e); }
  void synchronize_event(DeviceEvent e) override { sim_->synchronize_event(e); }
  void stream_wait_event(Stream s, DeviceEvent e) override { sim_->stream_wait_event(s, e); }
  void synchronize_stream(Stream s) override { sim_->synchronize_stream(s); }
  bool query_stream(Stream s) override { return sim_->query_stream(s); }
  void synchronize_device() override { sim_->synchronize_device(); }

 private:
  std::shared_ptr<SimulatedDevice> sim_;
  DeviceProperties props_;
  std::map<void*, std::size_t> live_;
  std::size_t used_ = 0;
};

}  // namespace

TEST_CASE("DeviceBuffer owns its block: moves, frees once, resets, releases", "[adapters]") {
  static_assert(!std::is_copy_constructible_v<DeviceBuffer> && std::is_nothrow_move_constructible_v<DeviceBuffer>);
  auto device = make_device();
  Allocator alloc(device, Config{});
  const Stream s = device->create_stream();
  {
    DeviceBuffer a(alloc, 3000, s);
    REQUIRE(a.data() != nullptr);
    CHECK(a.size() == 3000);
    CHECK(a.stream() == s);
    CHECK(a.allocator() == &alloc);
    CHECK(alloc.usage().requested == 3000);
    DeviceBuffer b(std::move(a));
    CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    CHECK(b.size() == 3000);
    DeviceBuffer c(alloc, 100, s);
    c = std::move(b);  // c's own block is freed first
    CHECK(alloc.usage().requested == 3000);
    CHECK(alloc.stats().free_calls == 1);
  }
  CHECK(alloc.usage().allocated == 0);  // every block freed exactly once
  CHECK(alloc.stats().free_calls == 2);

  DeviceBuffer d(alloc, MiB, s);
  d.reset();
  CHECK(d.empty());
  CHECK(alloc.usage().allocated == 0);
  DeviceBuffer e(alloc, MiB, s);
  void* raw = e.release();
  CHECK(e.empty());
  CHECK(alloc.usage().allocated == MiB);
  alloc.deallocate(raw);
  CHECK(DeviceBuffer(alloc, 0, s).empty());
  alloc.check_invariants();
}

TEST_CASE("DeviceBuffer::set_stream makes the free wait for the new stream's work", "[adapters]") {
  auto device = make_device();
  Allocator alloc(device, Config{});
  const Stream s = device->create_stream();
  const Stream other = device->create_stream();
  void* first = nullptr;
  {
    DeviceBuffer buf(alloc, 4096, s);
    first = buf.data();
    buf.set_stream(other);
    CHECK(buf.stream() == other);
  }
  // The block waits for `other`: a new request on s gets another block...
  void* second = alloc.allocate(4096, s);
  CHECK(second != first);
  alloc.deallocate(second);
  // ...until other's work completes.
  device->complete_stream(other);
  void* third = alloc.allocate(4096, s);
  CHECK(third == first);
  alloc.deallocate(third);
}

TEST_CASE("PoolMemoryResource allocates on its stream and refuses larger alignments", "[adapters]") {
  auto device = make_device();
  Allocator alloc(device, Config{});
  const Stream s = device->create_stream();
  PoolMemoryResource mr(alloc, s);
  CHECK(mr.alignment() == 512);
  std::pmr::memory_resource& base = mr;
  void* p = base.allocate(1000, 256);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 512 == 0);
  CHECK(alloc.usage().requested == 1000);
  void* z = base.allocate(0, 8);  // a distinct pointer even for 0 bytes
  CHECK(z != nullptr);
  CHECK(z != p);
  CHECK_THROWS_WITH(base.allocate(64, 4096), Catch::Contains("alignment 4096") && Catch::Contains("512"));
  base.deallocate(z, 0, 8);
  base.deallocate(p, 1000, 256);
  CHECK(alloc.usage().allocated == 0);
  // The block was cached for stream s: the same request on s reuses it.
  std::pmr::polymorphic_allocator<std::byte> pa(&mr);
  std::byte* q = pa.allocate(1000);
  CHECK(static_cast<void*>(q) == p);
  pa.deallocate(q, 1000);

  Allocator other_alloc(make_device(), Config{});
  PoolMemoryResource same_alloc(alloc, kDefaultStream);
  PoolMemoryResource other(other_alloc, s);
  CHECK(mr.is_equal(same_alloc));  // either frees the other's memory
  CHECK_FALSE(mr.is_equal(other));
  CHECK_FALSE(mr.is_equal(*std::pmr::new_delete_resource()));
  CHECK_THROWS_AS(base.deallocate(reinterpret_cast<void*>(0x1234), 8, 8), UsageError);  // foreign
}

TEST_CASE("a std::pmr::vector lives in blocks of a host-memory device", "[adapters]") {
  Allocator alloc(std::make_shared<HostMemoryDevice>(), Config{});
  PoolMemoryResource mr(alloc);
  {
    std::pmr::vector<int> v(&mr);
    for (int i = 0; i < 100000; ++i) v.push_back(i);  // grows through several blocks
    CHECK(std::accumulate(v.begin(), v.end(), 0LL) == 4999950000LL);
    CHECK(alloc.usage().requested == v.capacity() * sizeof(int));
    CHECK(alloc.stats().alloc_calls > 10);
  }
  CHECK(alloc.usage().allocated == 0);
  alloc.check_invariants();
}
