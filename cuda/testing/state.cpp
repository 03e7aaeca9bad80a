// testing/state.cpp: the test double's state, call accounting, fault matching, stream
// resolution, and the bodies of the stream-ordered functions shared by their plain and _ptsz
// exports.
#include "testing/state.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace tensorpool::cuda_double::detail {

namespace {

struct ThreadState {
  std::uint64_t generation = 0;
  int device = 0;
  cudaError_t error = cudaSuccess;
};
thread_local ThreadState t_state;

ThreadState& thread_state(State& s) {
  if (t_state.generation != s.generation) t_state = ThreadState{s.generation, 0, cudaSuccess};
  return t_state;
}

// "cudaEventRecord_ptsz" -> "cudaEventRecord"; "cudaEventCreateWithFlags" -> "cudaEventCreate".
std::string_view family(std::string_view name) {
  for (std::string_view suffix : {"_ptsz", "_ptds"})
    if (name.ends_with(suffix)) name.remove_suffix(suffix.size());
  if (name.ends_with("WithFlags")) name.remove_suffix(9);
  return name;
}

}  // namespace

SimulatedDeviceOptions sim_options(std::size_t capacity, std::size_t granularity,
                                   std::size_t page, EventMode mode) {
  return {.name = "cuda-double",
          .ordinal = 0,  // every simulated device starts at the same base; to_user() separates them
          .capacity = capacity,
          .segment_granularity = granularity,
          .supports_virtual_memory = true,
          .vm_page_size = page,
          .event_mode = mode};
}

State::State() { rebuild(Options{}); }

void State::rebuild(const Options& o) {
  if (o.device_count < 0 || o.device_count > kMaxDevices)
    throw std::invalid_argument("cuda_double: device_count must be 0.." + std::to_string(kMaxDevices));
  options = o;
  ++generation;
  devices.clear();
  for (int d = 0; d < o.device_count; ++d) {
    const DeviceOptions& dev = device_options(o, d);
    if (dev.vm_granularity == 0 || dev.vm_granularity % kSegmentGranularity != 0)
      throw std::invalid_argument("cuda_double: vm_granularity must be a multiple of 2 MiB");
    const std::size_t g = dev.malloc_granularity;
    if (g < 512 || g > kSegmentGranularity || (g & (g - 1)) != 0)
      throw std::invalid_argument("cuda_double: malloc_granularity must be a power of two from 512 B to 2 MiB");
    devices.push_back(std::make_shared<SimulatedDevice>(
        sim_options(dev.capacity, g, dev.vm_granularity, o.event_mode)));
  }
  host = std::make_shared<SimulatedDevice>(
      sim_options(o.host_capacity, 4 * KiB, 4 * KiB, o.event_mode));
  va = std::make_shared<SimulatedDevice>(
      sim_options(TiB, kSegmentGranularity, kSegmentGranularity, o.event_mode));
  allocations.clear();
  streams.clear();
  per_thread.clear();
  events.clear();
  pools.clear();
  physical.clear();
  reservations.clear();
  mappings.clear();
  captures.clear();
  graphs.clear();
  shutdown = false;
  faults.clear();
  calls.clear();
  log.clear();
  total_calls = 0;
}

State& state() {
  // Never destroyed: code running during process exit may still call in.
  static State* s = new State();
  return *s;
}

int& current_device(State& s) { return thread_state(s).device; }
cudaError_t& last_error(State& s) { return thread_state(s).error; }

void record_call(State& s, const char* name) {
  auto it = s.calls.find(std::string_view(name));
  if (it == s.calls.end()) it = s.calls.emplace(name, 0).first;
  ++it->second;
  ++s.total_calls;
  s.log.push_back(Call{name, current_device(s)});
}

bool take_fault(State& s, const char* name, bool driver, int& error) {
  const std::string_view n(name);
  for (auto it = s.faults.begin(); it != s.faults.end(); ++it) {
    if (it->key != n && it->key != family(n)) continue;
    if (--it->countdown != 0) continue;
    error = it->error != 0 ? it->error
            : driver       ? static_cast<int>(CUDA_ERROR_OUT_OF_MEMORY)
                           : static_cast<int>(cudaErrorMemoryAllocation);
    s.faults.erase(it);
    return true;
  }
  return false;
}

const DeviceOptions& device_options(const Options& o, int d) {
  const auto i = static_cast<std::size_t>(d);
  return i < o.per_device.size() ? o.per_device[i] : o.device;
}

bool valid_device(const State& s, int device) noexcept {
  return device >= 0 && device < static_cast<int>(s.devices.size());
}

SimulatedDevice& device(State& s, int d) {
  if (d == -1) return *s.host;
  if (!valid_device(s, d)) throw std::out_of_range("cuda_double: no device " + std::to_string(d));
  return *s.devices[static_cast<std::size_t>(d)];
}

// Each simulated device gets 16 TiB of address space of its own above its (shared) base.
Address to_user(int region, Address sim) noexcept {
  return sim + (static_cast<Address>(region) << 44);
}
Address to_sim(int region, Address user) noexcept {
  return user - (static_cast<Address>(region) << 44);
}


std::uintptr_t new_handle(State& s, std::uintptr_t tag) noexcept { return tag | s.next_id++; }

bool resolve_stream(State& s, cudaStream_t stream, bool per_thread_api, Resolved& out) {
  const int dev = current_device(s);
  const bool per_thread =
      stream == cudaStreamPerThread || (stream == nullptr && per_thread_api);
  if (per_thread || stream == nullptr || stream == cudaStreamLegacy) {
    if (!valid_device(s, dev)) return false;
    if (!per_thread) {
      out = Resolved{dev, kDefaultStream};
      return true;
    }
    const auto key = std::make_pair(std::this_thread::get_id(), dev);
    auto it = s.per_thread.find(key);
    if (it == s.per_thread.end()) it = s.per_thread.emplace(key, device(s, dev).create_stream()).first;
    out = Resolved{dev, it->second};
    return true;
  }
  auto it = s.streams.find(reinterpret_cast<std::uintptr_t>(stream));
  if (it == s.streams.end()) return false;
  out = Resolved{it->second.device, it->second.sim};
  return true;
}

// --- stream-ordered bodies ------------------------------------------------------------------

cudaError_t malloc_from_pool(State& s, void** ptr, std::size_t size, cudaMemPool_t pool,
                             cudaStream_t stream, bool per_thread_api) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  auto p = s.pools.find(reinterpret_cast<std::uintptr_t>(pool));
  if (p == s.pools.end()) return cudaErrorInvalidValue;
  Resolved r{};
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  if (r.device != p->second.device) return cudaErrorInvalidValue;  // stricter than CUDA
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  const std::size_t bytes = round_up(size, kSegmentGranularity);
  void* sim = device(s, r.device).allocate_segment(bytes, r.sim);
  if (sim == nullptr) return cudaErrorMemoryAllocation;
  const Address user = to_user(r.device, reinterpret_cast<Address>(sim));
  s.allocations.emplace(user, Allocation{r.device, bytes, AllocKind::pool});
  *ptr = reinterpret_cast<void*>(user);
  return cudaSuccess;
}

cudaError_t free_async(State& s, void* ptr, cudaStream_t stream, bool per_thread_api) {
  Resolved r{};
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  if (ptr == nullptr) return cudaSuccess;
  auto it = s.allocations.find(reinterpret_cast<Address>(ptr));
  if (it == s.allocations.end() || it->second.kind == AllocKind::host) return cudaErrorInvalidValue;
  const Allocation a = it->second;
  device(s, a.device).free_segment(reinterpret_cast<void*>(to_sim(a.device, it->first)), a.bytes, 0);
  s.allocations.erase(it);
  return cudaSuccess;
}

cudaError_t event_record(State& s, cudaEvent_t event, cudaStream_t stream, bool per_thread_api) {
  auto e = s.events.find(reinterpret_cast<std::uintptr_t>(event));
  Resolved r{};
  if (e == s.events.end() || !resolve_stream(s, stream, per_thread_api, r))
    return cudaErrorInvalidResourceHandle;
  if (e->second.device != r.device) return cudaErrorInvalidResourceHandle;
  if (capture_of(s, r) != nullptr) return cudaSuccess;  // a node of the graph: no work is submitted
  device(s, r.device).record_event(e->second.sim, r.sim);
  return cudaSuccess;
}

cudaError_t stream_wait_event(State& s, cudaStream_t stream, cudaEvent_t event,
                              bool per_thread_api) {
  auto e = s.events.find(reinterpret_cast<std::uintptr_t>(event));
  Resolved r{};
  if (e == s.events.end() || !resolve_stream(s, stream, per_thread_api, r))
    return cudaErrorInvalidResourceHandle;
  if (e->second.device == r.device) {
    device(s, r.device).stream_wait_event(r.sim, e->second.sim);
    return cudaSuccess;
  }
  // Cross-device waits are not modelled: fine only when there is nothing to wait for.
  return device(s, e->second.device).query_event(e->second.sim) ? cudaSuccess : cudaErrorNotSupported;
}

cudaError_t stream_synchronize(State& s, cudaStream_t stream, bool per_thread_api) {
  Resolved r{};
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  if (CaptureRec* c = capture_of(s, r)) {  // in every mode: a captured stream has no work to wait for
    c->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  device(s, r.device).synchronize_stream(r.sim);
  return cudaSuccess;
}

// cudaSuccess once the stream's recorded work has completed, else cudaErrorNotReady. Querying a
// captured stream fails and invalidates its capture (in every mode, as synchronizing it).
cudaError_t stream_query(State& s, cudaStream_t stream, bool per_thread_api) {
  Resolved r{};
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  if (CaptureRec* c = capture_of(s, r)) {
    c->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  return device(s, r.device).query_stream(r.sim) ? cudaSuccess : cudaErrorNotReady;
}

// --- stream capture -------------------------------------------------------------------------

bool capture_forbids(State& s, const char* name) {
  if (s.captures.empty()) return false;
  static const std::set<std::string_view> forbidden = {
      "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "cudaMemcpy",
      "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaEventQuery", "cudaMemPoolTrimTo",
      "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
      "cuMemAddressReserve", "cuMemAddressFree"};
  if (!forbidden.contains(family(name))) return false;
  bool applies = false;
  for (auto& [key, c] : s.captures) {
    if (c.mode == cudaStreamCaptureModeGlobal ||
        (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id())) {
      c.invalidated = true;
      applies = true;
    }
  }
  return applies;
}

CaptureRec* capture_of(State& s, const Resolved& r) {
  auto it = s.captures.find({r.device, r.sim});
  return it == s.captures.end() ? nullptr : &it->second;
}

cudaError_t begin_capture(State& s, cudaStream_t stream, cudaStreamCaptureMode mode, bool per_thread_api) {
  Resolved r{};
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  if (r.sim == kDefaultStream) return cudaErrorStreamCaptureUnsupported;  // the legacy stream
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return cudaErrorInvalidValue;
  if (capture_of(s, r) != nullptr) return cudaErrorIllegalState;
  s.captures.emplace(std::make_pair(r.device, r.sim), CaptureRec{mode, std::this_thread::get_id()});
  return cudaSuccess;
}

cudaError_t end_capture(State& s, cudaStream_t stream, cudaGraph_t* graph, bool per_thread_api) {
  Resolved r{};
  if (graph == nullptr) return cudaErrorInvalidValue;
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  auto it = s.captures.find({r.device, r.sim});
  if (it == s.captures.end()) return cudaErrorIllegalState;
  if (it->second.mode == cudaStreamCaptureModeThreadLocal && it->second.thread != std::this_thread::get_id())
    return cudaErrorStreamCaptureWrongThread;
  const bool invalidated = it->second.invalidated;
  s.captures.erase(it);
  *graph = nullptr;
  if (invalidated) return cudaErrorStreamCaptureInvalidated;
  const std::uintptr_t h = new_handle(s, kGraphTag);
  s.graphs.insert(h);
  *graph = reinterpret_cast<cudaGraph_t>(h);
  return cudaSuccess;
}

cudaError_t is_capturing(State& s, cudaStream_t stream, cudaStreamCaptureStatus* status, bool per_thread_api) {
  Resolved r{};
  if (status == nullptr) return cudaErrorInvalidValue;
  if (!resolve_stream(s, stream, per_thread_api, r)) return cudaErrorInvalidResourceHandle;
  const CaptureRec* c = capture_of(s, r);
  *status = c == nullptr       ? cudaStreamCaptureStatusNone
            : c->invalidated   ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

// cudaMemcpy between host memory (the process's, or the double's cudaHostAlloc allocations,
// whose bytes live in State::host_contents) and pages mapped with cuMemMap (whose bytes live
// with their physical handle, so they survive an unmap and follow the handle): enough for the
// allocator's copies of kept contents. Other device memory is refused.
cudaError_t memcpy_sync(State& s, void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  {
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost) return cudaErrorInvalidValue;
    const bool to_device = kind == cudaMemcpyHostToDevice;
    const auto device_at = reinterpret_cast<Address>(to_device ? dst : src);
    void* host = to_device ? const_cast<void*>(src) : dst;
    // The host side: a double allocation's bytes, or the caller's own memory.
    unsigned char* host_bytes = static_cast<unsigned char*>(host);
    auto alloc = s.allocations.upper_bound(reinterpret_cast<Address>(host));
    if (alloc != s.allocations.begin()) {
      --alloc;
      const Address base = alloc->first;
      if (alloc->second.kind == AllocKind::host && reinterpret_cast<Address>(host) < base + alloc->second.bytes) {
        std::vector<unsigned char>& bytes = s.host_contents[base];
        if (bytes.empty()) bytes.assign(alloc->second.bytes, 0);
        const std::size_t offset = reinterpret_cast<Address>(host) - base;
        if (offset + count > bytes.size()) return cudaErrorInvalidValue;
        host_bytes = bytes.data() + offset;
      }
    }
    for (std::size_t done = 0; done < count;) {
      const Address at = device_at + done;
      auto m = s.mappings.upper_bound(at);
      if (m == s.mappings.begin() || (--m)->first + m->second.bytes <= at) return cudaErrorInvalidValue;
      PhysicalRec& ph = s.physical.at(m->second.handle);
      if (ph.contents.empty()) ph.contents.assign(ph.bytes, 0);
      const std::size_t into_mapping = at - m->first;
      const std::size_t offset = m->second.offset + into_mapping;  // into the handle's bytes
      const std::size_t n = std::min(count - done, m->second.bytes - into_mapping);
      if (to_device) {
        std::memcpy(ph.contents.data() + offset, host_bytes + done, n);
      } else {
        std::memcpy(host_bytes + done, ph.contents.data() + offset, n);
      }
      done += n;
    }
    return cudaSuccess;
  }
}


}  // namespace tensorpool::cuda_double::detail
