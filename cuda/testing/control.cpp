// testing/control.cpp: the control API of the CUDA-runtime test double (see control.hpp).
// Nothing here is counted as a CUDA call.
#include <stdexcept>

#include "testing/state.hpp"

namespace tensorpool::cuda_double {

using namespace detail;

namespace {
// Runs `f(State&)` under the double's lock.
template <class F>
auto locked(F&& f) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return f(s);
}

bool idle(SimulatedDevice& sim) { return sim.used_bytes() == 0; }
}  // namespace

void reset(const Options& o) {
  locked([&](State& s) { s.rebuild(o); });
}

Options options() {
  return locked([](State& s) { return s.options; });
}

void set_device_count(int count) {
  locked([&](State& s) {
    Options o = s.options;
    o.device_count = count;
    s.rebuild(o);
  });
}

void set_capacity(int dev, std::size_t bytes) {
  locked([&](State& s) {
    if (!valid_device(s, dev)) throw std::out_of_range("cuda_double::set_capacity: no such device");
    if (!idle(device(s, dev)))
      throw std::logic_error("cuda_double::set_capacity: device has memory in use");
    const auto i = static_cast<std::size_t>(dev);
    if (s.options.per_device.size() <= i) s.options.per_device.resize(i + 1, s.options.device);
    // Handles referring to the old device would dangle: only a device without any is replaced.
    for (const auto& [h, st] : s.streams)
      if (st.device == dev) throw std::logic_error("cuda_double::set_capacity: device has streams");
    for (const auto& [h, ev] : s.events)
      if (ev.device == dev) throw std::logic_error("cuda_double::set_capacity: device has events");
    s.options.per_device[i].capacity = bytes;
    std::erase_if(s.per_thread, [&](const auto& entry) { return entry.first.second == dev; });
    s.devices[i] = std::make_shared<SimulatedDevice>(sim_options(
        bytes, s.options.per_device[i].malloc_granularity, s.options.per_device[i].vm_granularity,
        s.options.event_mode));
  });
}

void set_external_usage(int dev, std::size_t bytes) {
  locked([&](State& s) { device(s, dev).set_external_usage(bytes); });
}

void set_event_mode(EventMode mode) {
  locked([&](State& s) {
    s.options.event_mode = mode;
    for (auto& d : s.devices) d->set_event_mode(mode);
    s.host->set_event_mode(mode);
  });
}

void complete_event(cudaEvent_t event) {
  locked([&](State& s) {
    auto it = s.events.find(reinterpret_cast<std::uintptr_t>(event));
    if (it == s.events.end()) throw std::invalid_argument("cuda_double::complete_event: unknown event");
    device(s, it->second.device).complete_event(it->second.sim);
  });
}

void complete_stream(cudaStream_t stream) {
  locked([&](State& s) {
    Resolved r{};
    if (!resolve_stream(s, stream, false, r))
      throw std::invalid_argument("cuda_double::complete_stream: unknown stream");
    device(s, r.device).complete_stream(r.sim);
  });
}

void complete_all() {
  locked([](State& s) {
    for (auto& d : s.devices) d->complete_all();
  });
}

std::size_t incomplete_events() {
  return locked([](State& s) {
    std::size_t n = 0;
    for (auto& d : s.devices) n += d->incomplete_events();
    return n;
  });
}

unsigned event_flags(cudaEvent_t event) {
  return locked([&](State& s) {
    auto it = s.events.find(reinterpret_cast<std::uintptr_t>(event));
    if (it == s.events.end()) throw std::invalid_argument("cuda_double::event_flags: unknown event");
    return it->second.flags;
  });
}

void fail_nth(std::string_view api, std::uint64_t n, int error) {
  locked([&](State& s) {
    if (n != 0) s.faults.push_back(Fault{std::string(api), n, error});
  });
}

void clear_faults() {
  locked([](State& s) { s.faults.clear(); });
}

void simulate_driver_shutdown(bool on) {
  locked([&](State& s) { s.shutdown = on; });
}

std::uint64_t calls(std::string_view api) {
  return locked([&](State& s) -> std::uint64_t {
    auto it = s.calls.find(api);
    return it == s.calls.end() ? 0 : it->second;
  });
}

std::uint64_t total_calls() {
  return locked([](State& s) { return s.total_calls; });
}

std::vector<Call> call_log() {
  return locked([](State& s) { return s.log; });
}

void clear_calls() {
  locked([](State& s) {
    s.calls.clear();
    s.log.clear();
    s.total_calls = 0;
  });
}

int current_device() {
  return locked([](State& s) { return detail::current_device(s); });
}

cudaError_t last_error() {
  return locked([](State& s) { return detail::last_error(s); });
}

std::size_t used_bytes(int dev) {
  return locked([&](State& s) { return device(s, dev).used_bytes(); });
}

std::size_t host_used_bytes() {
  return locked([](State& s) { return s.host->used_bytes(); });
}

std::size_t live_allocations() {
  return locked([](State& s) { return s.allocations.size(); });
}

std::size_t live_streams() {
  return locked([](State& s) { return s.streams.size(); });
}

std::size_t live_events() {
  return locked([](State& s) { return s.events.size(); });
}

std::size_t live_graphs() {
  return locked([](State& s) { return s.graphs.size(); });
}

std::size_t live_pools() {
  return locked([](State& s) { return s.pools.size(); });
}

std::size_t live_physical() {
  return locked([](State& s) { return s.physical.size(); });
}

std::size_t live_reservations() {
  return locked([](State& s) { return s.reservations.size(); });
}

std::size_t mapped_bytes() {
  return locked([](State& s) {
    std::size_t n = 0;
    for (const auto& [addr, m] : s.mappings) n += m.bytes;
    return n;
  });
}

std::uint64_t pool_release_threshold(cudaMemPool_t pool) {
  return locked([&](State& s) {
    auto it = s.pools.find(reinterpret_cast<std::uintptr_t>(pool));
    if (it == s.pools.end())
      throw std::invalid_argument("cuda_double::pool_release_threshold: unknown pool");
    return it->second.release_threshold;
  });
}

unsigned access_flags(CUdeviceptr ptr, int dev) {
  return locked([&](State& s) -> unsigned {
    const auto user = static_cast<Address>(ptr);
    auto it = s.mappings.upper_bound(user);
    if (it == s.mappings.begin() || !valid_device(s, dev)) return 0;
    --it;
    if (user >= it->first + it->second.bytes) return 0;
    return it->second.access[static_cast<std::size_t>(dev)];
  });
}

int stream_device(cudaStream_t stream) {
  return locked([&](State& s) {
    Resolved r{};
    if (!resolve_stream(s, stream, false, r))
      throw std::invalid_argument("cuda_double::stream_device: unknown stream");
    return r.device;
  });
}

std::shared_ptr<SimulatedDevice> simulated_device(int dev) {
  return locked([&](State& s) {
    device(s, dev);  // validates
    return dev == -1 ? s.host : s.devices[static_cast<std::size_t>(dev)];
  });
}

}  // namespace tensorpool::cuda_double
