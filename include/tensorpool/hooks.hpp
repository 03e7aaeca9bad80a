// tensorpool/hooks.hpp: observers of allocator events, OOM observers and free-memory callbacks.
//
// Observers see every event. They are called with the allocator's lock held, so they must be
// quick and must not call back into the allocator. With no observer attached the cost on the hot
// path is one predictable branch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tensorpool/errors.hpp"
#include "tensorpool/types.hpp"

namespace tensorpool {

enum class EventType : std::uint8_t {
  alloc,           // a block was handed out
  free_requested,  // the user freed a block
  free_completed,  // the block is reusable (its stream events completed)
  segment_alloc,   // a segment was obtained from the device
  segment_free,    // a segment was returned to the device
  segment_map,     // physical pages were mapped (virtual-memory mode)
  segment_unmap,   // physical pages were unmapped (virtual-memory mode)
  oom,             // an allocation failed
  empty_cache,     // empty_cache() ran
  record_stream,   // record_stream(): the block at `address` is also used on `stream`
  sleep,           // sleep() ran: `tag` (0: all), `requested` 1 when contents are kept, `size`
                   // the bytes released
  wake,            // wake() ran: `tag` (0: all), `size` the bytes mapped back
  capture_begin,   // begin_capture(): `address` the graph pool's id, `stream`, `size` the bytes
                   // reserved for it by this call
  capture_end,     // end_capture(): `address` the pool's id, `stream`
  graph_release,   // release_graph(): `address` the pool's id
};
const char* to_string(EventType type) noexcept;

struct AllocatorEvent {
  EventType type = EventType::alloc;
  Address address = 0;
  std::size_t requested = 0;  // bytes the user asked for (alloc/free/oom)
  std::size_t size = 0;       // rounded block size, or segment size
  Stream stream = kDefaultStream;
  std::uint64_t time_ns = 0;  // steady clock
  std::uint16_t tag = 0;      // alloc: the Tag the block was allocated under (a process-wide id,
                              // named by tag_name(); 0: none); sleep, wake: the tag they were for
};
/// The name of a tag id of AllocatorEvent::tag ("" for 0 or an unknown id).
std::string tag_name(std::uint16_t tag);

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_event(const AllocatorEvent& event) noexcept = 0;
};

/// Called (without the allocator's lock) just before OutOfMemoryError is thrown.
using OomObserver = std::function<void(const OutOfMemoryInfo&)>;
/// Called without the lock when an allocation of `bytes` cannot be served; returns true if it
/// released memory (typically by freeing blocks of this allocator), so the allocation is retried.
using FreeMemoryCallback = std::function<bool(std::size_t bytes)>;

using HookId = std::uint64_t;

}  // namespace tensorpool
