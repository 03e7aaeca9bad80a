// stream_events.cpp: stream-ordered reuse. A block used by streams other than its owner's
// (record_stream, or taken from another stream's cache) is freed in two steps: deallocate
// records an event on each of those streams and leaves the block pending_free; once every event
// has completed (collected on later allocations and frees of this kind, or waited for by the OOM
// ladder, empty_cache and teardown) the block becomes free. Events are recycled through
// event_pool_.
#include <algorithm>
#include <vector>

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
// reusable once all have completed. The free then collects the frees whose events have completed
// (queries, never a wait), as an allocation does: such a free is off the fast path already, and
// a heap whose last blocks wait only for events then empties in a free once their work is done,
// not at the program's next allocation, which may open another phase (the epoch's end, and the
// pages given back there, then belong to the work they follow). A free never waits: if an event
// cannot be made, the block waits in that stream's queue without one (PendingFree::event == 0)
// until an event recorded on the stream after it has completed (work on a stream completes in
// order), or until a path that may wait synchronizes the stream (the OOM ladder, empty_cache,
// teardown). A device fault never loses a block or throws from a free.
void Allocator::Impl::defer_free(Block* b) {
  b->state = BlockState::pending_free;
  for (const Stream s : *b->uses) {
    // No device call while a stream is captured: the free waits without an event, and
    // record_deferred_events() gives it one when the last capture ends.
    const DeviceEvent e = capture_underway() ? 0 : record_free_event(s);
    streams.get({s, 0}).pending.push_back({e, b});
    ++b->pending_events;
    ++pending_total_;
  }
  delete b->uses;
  b->uses = nullptr;
  if (b->pending_events == 0) release_block(b);  // no stream to wait for
  if (pending_total_ != 0 && !capture_underway()) process_events();  // queries: not during a capture
}

// An event recorded on `s` for a cross-stream free, or 0 (logged) when the device refuses one.
DeviceEvent Allocator::Impl::record_free_event(Stream s) {
  DeviceEvent e = 0;
  try {
    e = acquire_event();
    device->record_event(e, s);
    counters.count(&Stats::events_recorded);
    return e;
  } catch (const DeviceError& err) {
    if (e != 0) release_event(e);
    detail::log().warn("event for a cross-stream free failed ({}); the block waits for stream {} to be "
                       "synchronized or for a later event on it", err.what(), s);
    return 0;
  }
}

// `done` has left its stream's queue: recycle its event; the block is free after its last one.
void Allocator::Impl::pending_done(const PendingFree& done) {
  if (done.event != 0) release_event(done.event);
  --pending_total_;
  if (--done.block->pending_events == 0) release_block(done.block);
}

namespace {

// Whether q's first entry is done: its event has completed, or, without an event, one recorded
// on the stream after it has (work on a stream completes in order). A query the device refuses
// says not done (logged): the frees wait, for a later query or a path that may synchronize (the
// OOM ladder, empty_cache, teardown). So no allocation, free or step() fails for it, and nothing
// has changed when it is refused.
bool first_done(const std::deque<PendingFree>& q, DeviceBackend& device) {
  for (const PendingFree& f : q) {
    if (f.event == 0) continue;
    try {
      return device.query_event(f.event);
    } catch (const DeviceError& err) {
      detail::log().warn("querying the event of a cross-stream free failed ({}); the free waits", err.what());
      return false;
    }
  }
  return false;
}

}  // namespace

// Never throws a DeviceError (first_done()).
void Allocator::Impl::process_events() {
  for (auto& [key, ss] : streams) {
    auto& q = ss->pending;
    while (!q.empty() && first_done(q, *device)) {
      const PendingFree done = q.front();
      q.pop_front();
      pending_done(done);
    }
  }
}

void Allocator::Impl::record_deferred_events() {
  for (auto& [key, ss] : streams)
    for (PendingFree& f : ss->pending)
      if (f.event == 0) f.event = record_free_event(ss->stream);  // 0 again: it waits as before
}

// A block of ss waiting for other streams' events (its free pending), made free without a host
// synchronization: ss waits on the device for each of its events (what those streams queued
// before the free), so every later use of the block on ss runs after theirs; then the cached block
// that serves `size`, or nullptr when no pending block of ss and `pool` is large enough (of those
// that are, the smallest is taken). The OOM ladder asks where it would otherwise synchronize the
// host (oom_ladder.cpp). A block with a free still waiting without an event (a failed record) is
// left to those paths. A wait the device refuses leaves the block pending (logged), and the
// ladder goes on: allocate() raises no DeviceError for it.
Block* Allocator::Impl::reuse_pending(StreamState& ss, Pool pool, std::size_t size) {
  Block* best = nullptr;
  for (auto& [key, other] : streams)
    for (const PendingFree& f : other->pending) {
      const Block* b = f.block;
      if (b->segment->owner != &ss || b->segment->pool != pool || b->size < size) continue;
      if (best == nullptr || b->size < best->size) best = f.block;
    }
  if (best == nullptr) return nullptr;
  std::vector<DeviceEvent> events;  // one per stream that used it
  for (auto& [key, other] : streams)
    for (const PendingFree& f : other->pending) {
      if (f.block != best) continue;
      if (f.event == 0) return nullptr;  // its record failed: left to the paths that synchronize
      events.push_back(f.event);
    }
  try {
    for (const DeviceEvent e : events) device->stream_wait_event(ss.stream, e);
  } catch (const DeviceError& err) {  // the waits made only order ss later: harmless
    detail::log().warn("reusing a block whose free waits for other streams skipped: {}", err.what());
    return nullptr;
  }
  for (auto& [key, other] : streams) {
    auto& q = other->pending;
    for (auto it = q.begin(); it != q.end();) {
      if (it->block != best) {
        ++it;
        continue;
      }
      const PendingFree done = *it;
      it = q.erase(it);
      counters.count(&Stats::stream_waits);
      pending_done(done);  // the last one frees the block into ss's index
    }
  }
  return find_cached(ss, pool, size);
}

void Allocator::Impl::synchronize_pending() {
  for (auto& [key, ss] : streams) {
    auto& q = ss->pending;
    while (!q.empty()) {
      const PendingFree done = q.front();
      if (done.event != 0) {
        device->synchronize_event(done.event);
      } else {
        device->synchronize_stream(ss->stream);
      }
      counters.count(&Stats::syncs);
      q.pop_front();
      pending_done(done);
    }
  }
}

}  // namespace tensorpool
