// libtensorpool_torch.so as PyTorch uses it: the library is dlopen()ed and its functions looked up
// by name, then stored in std::function objects of exactly the types of PyTorch's
// CUDAPluggableAllocator (torch/csrc/cuda/CUDAPluggableAllocator.h):
//   alloc_fn_        std::function<void*(size_t, int, cudaStream_t)>
//   free_fn_         std::function<void(void*, size_t, int, cudaStream_t)>
//   init_fn_         std::function<void(int)>
//   reset_fn_        std::function<void()>            (torch.cuda.empty_cache())
//   memory_fraction_fn_ std::function<void(double, int)>
//   record_stream_fn_   std::function<void(void*, cudaStream_t)>
// The library under test is libtensorpool_torch_double.so: the same code on the CUDA-runtime
// test double. This binary links neither tensorpool nor the double: everything, the statistics
// and the double's controls included, comes through dlsym(), so there is one copy of each.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include "tensorpool/cuda/torch_allocator.h"  // types only: the functions come from dlsym()
#include "tensorpool/tensorpool.h"

using Catch::Matchers::Contains;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

class TorchLibrary {
 public:
  TorchLibrary() {
    handle_ = dlopen(TENSORPOOL_TORCH_DOUBLE_LIBRARY, RTLD_NOW | RTLD_LOCAL);  // as ctypes.CDLL
    REQUIRE(handle_ != nullptr);
    alloc = sym<void*(size_t, int, cudaStream_t)>("tensorpool_torch_malloc");
    free = sym<void(void*, size_t, int, cudaStream_t)>("tensorpool_torch_free");
    init = sym<void(int)>("tensorpool_torch_init");
    reset = sym<void()>("tensorpool_torch_reset");
    memory_fraction = sym<void(double, int)>("tensorpool_torch_memory_fraction");
    record_stream = sym<void(void*, cudaStream_t)>("tensorpool_torch_record_stream");
    existing = sym<decltype(tensorpool_existing_device_allocator)>("tensorpool_existing_device_allocator");
    get_stats = sym<decltype(tensorpool_get_stats)>("tensorpool_get_stats");
    check_invariants = sym<decltype(tensorpool_check_invariants)>("tensorpool_check_invariants");
    last_error = sym<decltype(tensorpool_last_error)>("tensorpool_last_error");
    reset_double = sym<void(int, size_t, int)>("tensorpool_testing_reset");
    create_stream = sym<void*(int)>("tensorpool_testing_create_stream");
    complete_all = sym<void()>("tensorpool_testing_complete_all");
    incomplete_events = sym<size_t()>("tensorpool_testing_incomplete_events");
    used_bytes = sym<size_t(int)>("tensorpool_testing_used_bytes");
  }
  ~TorchLibrary() { dlclose(handle_); }

  // PyTorch's types.
  std::function<void*(size_t, int, cudaStream_t)> alloc;
  std::function<void(void*, size_t, int, cudaStream_t)> free;
  std::function<void(int)> init;
  std::function<void()> reset;
  std::function<void(double, int)> memory_fraction;
  std::function<void(void*, cudaStream_t)> record_stream;
  // The C API and the double's controls.
  decltype(&tensorpool_existing_device_allocator) existing = nullptr;
  decltype(&tensorpool_get_stats) get_stats = nullptr;
  decltype(&tensorpool_check_invariants) check_invariants = nullptr;
  decltype(&tensorpool_last_error) last_error = nullptr;
  void (*reset_double)(int, size_t, int) = nullptr;
  void* (*create_stream)(int) = nullptr;
  void (*complete_all)() = nullptr;
  size_t (*incomplete_events)() = nullptr;
  size_t (*used_bytes)(int) = nullptr;

  tensorpool_stats stats(int device) const {
    tensorpool_allocator* a = nullptr;
    REQUIRE(existing(device, &a) == TENSORPOOL_OK);
    REQUIRE(a != nullptr);
    tensorpool_stats s{};
    REQUIRE(get_stats(a, &s) == TENSORPOOL_OK);
    return s;
  }
  void intact(int device) const {
    tensorpool_allocator* a = nullptr;
    REQUIRE(existing(device, &a) == TENSORPOOL_OK);
    REQUIRE(check_invariants(a) == TENSORPOOL_OK);
  }

  template <class F>
  F* symbol(const char* name) {
    return sym<F>(name);
  }

 private:
  template <class F>
  F* sym(const char* name) {
    void* p = dlsym(handle_, name);
    INFO(name);
    REQUIRE(p != nullptr);
    return reinterpret_cast<F*>(p);
  }
  void* handle_ = nullptr;
};

// What the test has allocated per device, to check the statistics against.
struct Live {
  std::map<void*, std::size_t> requested;
  std::int64_t total() const {
    std::int64_t t = 0;
    for (const auto& [p, n] : requested) t += static_cast<std::int64_t>(n);
    return t;
  }
};

}  // namespace

TEST_CASE("libtensorpool_torch: a multi-stream workload through PyTorch's hooks", "[torch]") {
  TorchLibrary lib;
  lib.reset_double(2, 8 * GiB, 0);  // manual: stream work completes when the test says
  ::setenv("TENSORPOOL_CONF", "backend:async", 1);
  ::setenv("TENSORPOOL_LOG_LEVEL", "off", 1);
  lib.init(2);
  auto* s1 = static_cast<cudaStream_t>(lib.create_stream(0));
  auto* s2 = static_cast<cudaStream_t>(lib.create_stream(0));
  REQUIRE(s1 != nullptr);
  REQUIRE(s2 != nullptr);
  std::map<int, Live> live;
  auto step = [&](int device) {
    const tensorpool_stats s = lib.stats(device);
    CHECK(s.all.requested_bytes.current == live[device].total());
    CHECK(s.all.allocations.current == static_cast<std::int64_t>(live[device].requested.size()));
    CHECK(s.all.reserved_bytes.current >= s.all.active_bytes.current);
    CHECK(s.all.active_bytes.current >= s.all.allocated_bytes.current);
    CHECK(s.all.allocated_bytes.current >= s.all.requested_bytes.current);
    lib.intact(device);
  };

  // Allocations on two streams, small and large pools.
  std::vector<void*> blocks;
  for (int i = 0; i < 20; ++i) {
    const std::size_t bytes = i % 4 == 0 ? 4096 * (i + 1) : (i + 1) * 5 * MiB + 17;
    void* p = lib.alloc(bytes, 0, i % 2 ? s2 : s1);
    REQUIRE(p != nullptr);
    blocks.push_back(p);
    live[0].requested[p] = bytes;
    step(0);
  }

  // record_stream: the freed block stays active until s2's work completes.
  const std::size_t big = live[0].requested[blocks[1]];
  lib.record_stream(blocks[1], s1);
  lib.free(blocks[1], big, 0, s2);
  live[0].requested.erase(blocks[1]);
  step(0);
  tensorpool_stats s = lib.stats(0);
  CHECK(s.all.active_bytes.current > s.all.allocated_bytes.current);
  CHECK(lib.incomplete_events() > 0);
  const std::int64_t reserved = s.all.reserved_bytes.current;
  lib.complete_all();
  void* again = lib.alloc(big, 0, s2);  // reuses the block: nothing new reserved
  REQUIRE(again != nullptr);
  live[0].requested[again] = big;
  CHECK(lib.stats(0).all.reserved_bytes.current == reserved);
  step(0);

  // A memory fraction caps device 0; an OOM returns nullptr and explains itself.
  lib.memory_fraction(0.25, 0);
  CHECK(lib.stats(0).memory_limit == 2 * GiB);
  CHECK(lib.alloc(3 * GiB, 0, s1) == nullptr);
  const std::string why = lib.last_error();
  CHECK_THAT(why, Contains("out of memory") && Contains("reserved") && Contains("allocated") &&
                      Contains("largest free block") && Contains("by stream"));
  CHECK(lib.stats(0).ooms == 1);
  step(0);
  lib.memory_fraction(1.0, 0);

  // reset (torch.cuda.empty_cache()): cached segments go back to the double.
  for (std::size_t i = 2; i < blocks.size(); i += 2) {
    lib.free(blocks[i], live[0].requested[blocks[i]], 0, i % 2 ? s2 : s1);
    live[0].requested.erase(blocks[i]);
  }
  const std::size_t used_before = lib.used_bytes(0);
  lib.reset();
  s = lib.stats(0);
  CHECK(lib.used_bytes(0) < used_before);
  CHECK(static_cast<std::size_t>(s.all.reserved_bytes.current) <= lib.used_bytes(0));
  step(0);

  // Device 1: its own allocator; record_stream finds the owner of the pointer.
  auto* d1 = static_cast<cudaStream_t>(lib.create_stream(1));
  void* q = lib.alloc(10 * MiB, 1, nullptr);
  REQUIRE(q != nullptr);
  live[1].requested[q] = 10 * MiB;
  step(1);
  lib.record_stream(q, d1);
  lib.free(q, 10 * MiB, 1, nullptr);
  live[1].requested.erase(q);
  CHECK(lib.stats(1).all.active_bytes.current > 0);  // waits for d1
  step(1);

  // Misuse: a foreign pointer and a double free are refused, nothing changes.
  int foreign = 0;
  const tensorpool_stats before = lib.stats(0);
  lib.free(&foreign, 4, 0, s1);
  lib.free(blocks[2], 0, 0, s1);  // freed before the reset, not allocated since
  lib.record_stream(&foreign, s1);
  const tensorpool_stats after = lib.stats(0);
  CHECK(after.free_calls == before.free_calls);
  CHECK(after.all.allocated_bytes.current == before.all.allocated_bytes.current);
  step(0);

  // Everything back: nothing left on either device.
  for (const auto& [p, n] : std::map<void*, std::size_t>(live[0].requested)) lib.free(p, n, 0, s1);
  live[0].requested.clear();
  lib.complete_all();
  lib.reset();
  CHECK(lib.stats(0).all.reserved_bytes.current == 0);
  CHECK(lib.stats(1).all.reserved_bytes.current == 0);
  CHECK(lib.used_bytes(0) == 0);
  CHECK(lib.used_bytes(1) == 0);
  step(0);
  step(1);
}

TEST_CASE("libtensorpool_torch: a bad TENSORPOOL_CONF makes malloc return nullptr, saying why", "[torch]") {
  TorchLibrary lib;
  lib.reset_double(1, 4 * GiB, 1);
  ::setenv("TENSORPOOL_CONF", "backend:async,max_spilt_size:1GiB", 1);
  ::setenv("TENSORPOOL_LOG_LEVEL", "off", 1);
  lib.init(1);  // logs; never throws into PyTorch
  CHECK(lib.alloc(MiB, 0, nullptr) == nullptr);
  CHECK_THAT(std::string(lib.last_error()), Contains("max_spilt_size") && Contains("TENSORPOOL_CONF"));
  lib.free(nullptr, 0, 0, nullptr);  // no allocator: ignored
  lib.reset();
  ::setenv("TENSORPOOL_CONF", "backend:vmm,mode:vmm", 1);  // fixed: the next call creates it
  void* p = lib.alloc(MiB, 0, nullptr);
  REQUIRE(p != nullptr);
  lib.free(p, MiB, 0, nullptr);
  lib.intact(0);
}

TEST_CASE("libtensorpool_torch: a MemPool slot allocates under its tag, and its segments sleep alone",
          "[torch][mempool]") {
  TorchLibrary lib;
  lib.reset_double(1, 8 * GiB, 1);
  ::setenv("TENSORPOOL_CONF", "backend:vmm", 1);
  ::setenv("TENSORPOOL_LOG_LEVEL", "off", 1);
  lib.init(1);
  auto bind = lib.symbol<decltype(tensorpool_torch_pool_bind)>("tensorpool_torch_pool_bind");
  auto sleep = lib.symbol<decltype(tensorpool_sleep)>("tensorpool_sleep");
  auto wake = lib.symbol<decltype(tensorpool_wake)>("tensorpool_wake");
  auto is_asleep = lib.symbol<decltype(tensorpool_is_asleep)>("tensorpool_is_asleep");
  int kv = -1, again = -1, plain = -1;
  REQUIRE(bind("test.kv_cache", &kv) == TENSORPOOL_OK);
  REQUIRE(bind("test.kv_cache", &again) == TENSORPOOL_OK);
  REQUIRE(again == kv);  // one slot per tag
  REQUIRE(bind(nullptr, &plain) == TENSORPOOL_OK);
  REQUIRE(plain != kv);
  REQUIRE(bind("x", nullptr) == TENSORPOOL_ERROR_INVALID_ARGUMENT);
  // PyTorch's type for a MemPool's allocator function, looked up by the slot's name.
  const std::function<void*(size_t, int, cudaStream_t)> kv_malloc =
      lib.symbol<void*(size_t, int, cudaStream_t)>(("tensorpool_torch_pool_malloc_" + std::to_string(kv)).c_str());
  const std::function<void*(size_t, int, cudaStream_t)> plain_malloc =
      lib.symbol<void*(size_t, int, cudaStream_t)>(("tensorpool_torch_pool_malloc_" + std::to_string(plain)).c_str());
  const std::function<void*(size_t, int, cudaStream_t)> unbound_malloc =
      lib.symbol<void*(size_t, int, cudaStream_t)>("tensorpool_torch_pool_malloc_15");
  void* segment = kv_malloc(20 * MiB, 0, nullptr);
  void* other = plain_malloc(20 * MiB, 0, nullptr);
  REQUIRE(segment != nullptr);
  REQUIRE(other != nullptr);
  REQUIRE(unbound_malloc(MiB, 0, nullptr) == nullptr);  // slot 15 was never bound
  tensorpool_allocator* a = nullptr;
  REQUIRE(lib.existing(0, &a) == TENSORPOOL_OK);
  REQUIRE(sleep(a, "test.kv_cache", 0, nullptr) == TENSORPOOL_OK);
  int asleep = -1;
  REQUIRE(is_asleep(a, segment, &asleep) == TENSORPOOL_OK);
  REQUIRE(asleep == 1);
  REQUIRE(is_asleep(a, other, &asleep) == TENSORPOOL_OK);
  REQUIRE(asleep == 0);
  REQUIRE(wake(a, "test.kv_cache") == TENSORPOOL_OK);
  lib.free(segment, 20 * MiB, 0, nullptr);
  lib.free(other, 20 * MiB, 0, nullptr);
  lib.intact(0);
}
