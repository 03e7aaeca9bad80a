// Uses tensorpool built as a subproject: C++20 (designated initializers here, and in tensorpool's
// headers) must come from tensorpool's targets, since the parent project sets no standard.
#include <cstdio>
#include <memory>

#include "tensorpool/tensorpool.hpp"

static_assert(__cplusplus >= 202002L, "tensorpool::tensorpool must pass C++20 to its users");

int main() {
  using namespace tensorpool;
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * GiB});
  Allocator alloc(device, Config::parse("max_split_size:64MiB"));
  void* p = alloc.allocate(100 * MiB);
  alloc.deallocate(p);
  alloc.empty_cache();
  std::printf("parent: reserved after empty_cache: %zu\n", alloc.usage().reserved);
  return alloc.usage().reserved == 0 ? 0 : 1;
}
