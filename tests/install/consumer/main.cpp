// Uses the installed allocator (virtual-memory mode on a simulated device), a live recording, and
// the workload and replay layers.
#include <cstdio>

#include "tensorpool/record.hpp"
#include "tensorpool/replay/replay.hpp"
#include "tensorpool/workload/setup.hpp"

static_assert(__cplusplus >= 202002L, "the installed tensorpool targets must pass C++20 to their users");
#include "tensorpool/tensorpool.hpp"

int main() {
  using namespace tensorpool;
  auto device = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 4 * GiB});
  Allocator alloc(device, Config::parse("mode:vmm"));
  Recording rec = start_recording(alloc, "/dev/null");  // a device: written in place
  void* p = alloc.allocate(100 * MiB);
  alloc.deallocate(p);
  if (!rec.stop() || rec.status().events_written == 0) return 1;
  alloc.empty_cache();
  if (alloc.usage().reserved != 0) return 1;

  workload::WorkloadSetup setup = workload::WorkloadSetup::for_model("custom");
  setup.apply("layers:2,micro_batch:4,seq:2048,steps:2", "consumer");
  const trace::Trace t = workload::generate_workload(setup);
  replay::TraceSource source(t);
  replay::ReplayOptions o;
  o.allocator = "tensorpool-vmm";
  const replay::ReplayReport r = replay::replay(source, o);
  std::printf("consumer: %zu events, utilization %.4f\n", static_cast<std::size_t>(r.total.events), r.total.utilization);
  return r.total.events == t.events.size() && r.total.utilization > 0.5 ? 0 : 1;
}
