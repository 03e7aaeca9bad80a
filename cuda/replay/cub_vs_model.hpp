// cub_vs_model.hpp: replays one trace through the real CUB CachingDeviceAllocator on the
// CUDA-runtime test double and through the "cub" replay model, with the same settings and
// device capacity, and returns both reports (header-only; needs tensorpool::cuda_double and
// tensorpool_cub_replay_objects). Used by tests/cuda/test_cub_vs_model.cpp and the table
// program tests/cuda/cub_vs_model_table.cpp.
//
// The double is reset for the replay: one simulated device per trace device, of `capacity`
// bytes, cudaMalloc taking whole 2 MiB pages from 2 MiB up and rounding to 512 B below (as the
// model's cudaMalloc does), stream work completing
// only when the trace synchronizes a stream or a cudaFree synchronizes the device.
#pragma once

#include <algorithm>
#include <string>

#include "cub_real_target.hpp"
#include "tensorpool/replay/replay.hpp"
#include "testing/control.hpp"

namespace tensorpool::cuda_replay {

struct CubComparison {
  replay::ReplayReport real;   // "cub-real"
  replay::ReplayReport model;  // "cub"
};

/// Resets the double for replays through "cub-real": `devices` simulated devices of `capacity`
/// bytes, cudaMalloc rounding to 512 B below 2 MiB, stream work completing only on a synchronization.
inline void reset_double_for_cub(int devices, std::size_t capacity) {
  cuda_double::Options o;
  o.device_count = devices;
  o.device.capacity = capacity;
  o.device.malloc_granularity = 512;
  o.event_mode = EventMode::manual;
  cuda_double::reset(o);
}

/// What "cub-real" reads from the double: the bytes held on a device, and the calls CUB made.
inline RealCubProbes double_probes() {
  RealCubProbes probes;
  probes.reserved = [](int d) { return cuda_double::used_bytes(d); };
  probes.upstream = [](int d) {
    const DeviceCounters c = cuda_double::simulated_device(d)->counters();
    // The syncs CUB made: cudaFree's device syncs (the trace's own stream syncs are not CUB's).
    return replay::UpstreamCounts{c.segment_allocs, c.segment_frees, 0, 0, c.device_syncs, c.modelled_ns};
  };
  return probes;
}

inline CubComparison compare_cub_with_model(const trace::Trace& t, std::size_t capacity,
                                            const std::string& conf = "") {
  int devices = 1;
  for (const auto& e : t.events) devices = std::max(devices, int{e.device} + 1);
  reset_double_for_cub(std::min(devices, 6), capacity);
  const RealCubProbes probes = double_probes();
  CubComparison out;
  replay::ReplayOptions ro;
  ro.target.capacity = capacity;
  ro.target.conf = conf;
  ro.allocator = "cub-real";
  ro.make_target = [&](const replay::TargetOptions& to) { return make_real_cub_target(to, probes); };
  {
    replay::TraceSource source(t);
    out.real = replay::replay(source, ro);
  }
  ro.make_target = nullptr;
  ro.allocator = "cub";
  replay::TraceSource source(t);
  out.model = replay::replay(source, ro);
  return out;
}

}  // namespace tensorpool::cuda_replay
