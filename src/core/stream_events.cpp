// stream_events.cpp: stream-ordered reuse. A block used by streams other than its owner's
// (record_stream, or taken from another stream's cache) is freed in two steps: deallocate
// records an event on each of those streams and leaves the block pending_free; once every event
// has completed (collected on later allocations, or waited for by the OOM ladder, empty_cache
// and teardown) the block becomes free. Events are recycled through event_pool_.
#include <algorithm>

#include "core/allocator_impl.hpp"
#include "core/logging.hpp"

namespace tensorpool {

using detail::Block;
using detail::PendingFree;

void Allocator::Impl::add_use(Block* b, Stream stream) {
  if (stream == b->segment->owner->stream) return;
  if (b->uses == nullptr) b->uses = new std::vector<Stream>();
  if (std::find(b->uses->begin(), b->uses->end(), stream) == b->uses->end())
    b->uses->push_back(stream);
}

DeviceEvent Allocator::Impl::acquire_event() {
  if (!event_pool_.empty()) {
    const DeviceEvent e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  return device->create_event();
}

// b was freed by its user but other streams used it: record an event on each; the block is
// reusable once all have completed. If an event cannot be made, fall back to synchronizing that
// stream, so a device fault never loses a block or throws from a free.
void Allocator::Impl::defer_free(Block* b) {
  b->state = BlockState::pending_free;
  for (const Stream s : *b->uses) {
    try {
      const DeviceEvent e = acquire_event();
      try {
        device->record_event(e, s);
      } catch (...) {
        release_event(e);
        throw;
      }
      counters.count(&Stats::events_recorded);
      streams.get(s).pending.push_back({e, b});
      ++b->pending_events;
      ++pending_total_;
    } catch (const DeviceError& err) {
      detail::log().warn("event for a cross-stream free failed ({}); synchronizing stream {}",
                         err.what(), s);
      device->synchronize_stream(s);
      counters.count(&Stats::syncs);
    }
  }
  delete b->uses;
  b->uses = nullptr;
  if (b->pending_events == 0) release_block(b);
}

// `done` has left its stream's queue: recycle its event; the block is free after its last one.
void Allocator::Impl::pending_done(const PendingFree& done) {
  release_event(done.event);
  --pending_total_;
  if (--done.block->pending_events == 0) release_block(done.block);
}

void Allocator::Impl::process_events() {
  for (auto& [stream, ss] : streams) {
    auto& q = ss->pending;
    while (!q.empty() && device->query_event(q.front().event)) {
      const PendingFree done = q.front();
      q.pop_front();
      pending_done(done);
    }
  }
}

void Allocator::Impl::synchronize_pending() {
  for (auto& [stream, ss] : streams) {
    auto& q = ss->pending;
    while (!q.empty()) {
      const PendingFree done = q.front();
      device->synchronize_event(done.event);
      counters.count(&Stats::syncs);
      q.pop_front();
      pending_done(done);
    }
  }
}

}  // namespace tensorpool
