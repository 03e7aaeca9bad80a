// lifecycle.cpp: an allocator's life: construction (where the segment source is chosen, by
// Config::mode, and nowhere else), teardown, empty_cache and the memory limit.
#include <exception>

#include "core/allocator_impl.hpp"
#include "core/logging.hpp"

namespace tensorpool {

using detail::Block;

detail::AllocatorState::AllocatorState(std::shared_ptr<DeviceBackend> device_backend, Config settings)
    : device(std::move(device_backend)), config(std::move(settings)) {
  if (!device) throw UsageError("tensorpool: Allocator needs a device backend (got nullptr)");
  config.validate();
  props = device->properties();
}

std::unique_ptr<detail::SegmentSource> detail::make_segment_source(AllocatorState& state) {
  if (state.config.mode == Mode::automatic)  // the mode taken is the one config() reports
    state.config.mode = state.device->virtual_memory() != nullptr ? Mode::vmm : Mode::fixed;
  switch (state.config.mode) {
    case Mode::fixed: return make_fixed_segments(state);
    case Mode::vmm: return make_vmm_heaps(state);
    case Mode::automatic: break;
  }
  throw ConfigError("tensorpool config: unknown mode");
}

Allocator::Impl::Impl(std::shared_ptr<DeviceBackend> device_backend, Config settings)
    : AllocatorState(std::move(device_backend), std::move(settings)),
      source_(detail::make_segment_source(*this)) {
  limit = config.effective_limit(props.capacity);
  streams.find_steps(config.mode == Mode::vmm && config.vmm_find_steps);
  detail::log().debug("allocator on {} ({}), config {}", props.name, format_bytes(props.capacity),
                      config.to_string());
}

Allocator::Impl::~Impl() {
  if (!device->alive()) return;  // process teardown: the driver reclaims everything
  try {
    synchronize_pending();
    std::size_t live = 0;
    for (const detail::Shard& shard : shards) live += shard.live.size();
    if (live != 0) detail::log().info("allocator on {} destroyed with {} blocks still allocated", props.name, live);
    source_->destroy();
    for (auto& [addr, seg] : segments) {
      for (Block* b = seg->first; b != nullptr;) {
        Block* next = b->next;
        blocks_of(seg.get()).release(b);
        b = next;
      }
    }
    segments.clear();
    for (DeviceEvent e : event_pool_) device->destroy_event(e);
  } catch (const std::exception& e) {
    detail::log().error("allocator teardown on {}: {}", props.name, e.what());
  }
}

void Allocator::Impl::empty_cache() {
  Lock lock(shards);
  refuse_while_capturing("empty_cache");
  synchronize_pending();
  const std::size_t released = source_->release(detail::ReleaseGoal::empty_cache);
  for (detail::Shard& shard : shards) shard.live.release_retired();  // host memory: not counted
  if (hooks.observed()) hooks.notify(EventType::empty_cache, 0, 0, released, kDefaultStream);
  debug_check();
}

void Allocator::Impl::step() {
  Lock lock(shards);
  // The program says where its steps end: nothing looks for them any more.
  streams.stop_finding_steps();
  stepping_ = nullptr;
  if (capture_underway()) return;  // no event query, and a capture's pool is not a step's
  if (pending_total_ != 0) process_events();  // frees whose work is done count as frees
  source_->step_boundary(detail::StepBoundary::called);
  debug_check();
}

// Before the allocation that follows the found boundary (in the exclusive mode, events already
// processed): what step() does. One stream's steps are the allocator's, the first stream's to
// find one: two streams that each find theirs would end every heap's step twice per step.
void Allocator::Impl::step_found(StreamState& ss) {
  ss.step_due = false;
  if (stepping_ == nullptr) stepping_ = &ss;
  if (stepping_ != &ss) {
    ss.step_finder.reset();
    return;
  }
  if (capture_underway()) return;
  counters.count(&Stats::steps_found);
  source_->step_boundary(detail::StepBoundary::found);
}

// --- sleep and wake (the vmm source does the work: vmm_sleep.cpp) ---------------------------

SleepReport Allocator::Impl::sleep(detail::Sleepers who, Contents contents) {
  Lock lock(shards);
  if (!source_->supports_sleep()) throw UsageError(detail::kSleepNeedsVmm);
  refuse_while_capturing("sleep");
  // Every stream's work is done before pages go, and every free waiting for an event completes
  // (no block is pending_free when the heaps sleep).
  device->synchronize_device();
  counters.count(&Stats::syncs);
  synchronize_pending();
  const SleepReport report = source_->sleep(who, contents);
  if (hooks.observed())
    hooks.notify(EventType::sleep, 0, contents == Contents::keep ? 1 : 0, report.released_bytes, kDefaultStream,
                 who.all ? 0 : who.tag);
  debug_check();
  return report;
}

void Allocator::Impl::wake(detail::Sleepers who) {
  Lock lock(shards);
  if (!source_->supports_sleep()) throw UsageError(detail::kSleepNeedsVmm);
  refuse_while_capturing("wake");
  const std::size_t asleep_before = source_->asleep().asleep_bytes;
  source_->wake(who);
  if (hooks.observed())
    hooks.notify(EventType::wake, 0, 0, asleep_before - source_->asleep().asleep_bytes, kDefaultStream,
                 who.all ? 0 : who.tag);
  debug_check();
}

SleepReport Allocator::Impl::asleep() const {
  Lock lock(shards);
  return source_->asleep();
}

bool Allocator::Impl::is_asleep(const void* ptr) const {
  Lock lock(shards);
  const auto addr = reinterpret_cast<Address>(ptr);
  if (const detail::GraphPoolRec* pool = graphs.empty() ? nullptr : graphs.owner_of(addr)) {
    if (!pool->live.contains(addr))
      throw UsageError("tensorpool: is_asleep of " + detail::hex(addr) + ": not a live block of graph pool " +
                       std::to_string(pool->id));
    return find_live(pool->space.range_of(addr)->first)->asleep;  // its range's
  }
  const Block* b = find_live(addr);
  if (b == nullptr) throw_bad_pointer(addr, "is_asleep");
  return b->asleep;
}

// Freed while asleep (the caller counted the free): no event is needed for the streams that
// used it (the device was synchronized when it fell asleep), and the source forgets it.
void Allocator::Impl::forget_asleep(Block* b) {
  delete b->uses;
  b->uses = nullptr;
  count_free_completed(b);
  source_->forget_asleep(b);
}

void Allocator::Impl::set_memory_limit(std::size_t bytes) {
  Lock lock(shards);
  limit = bytes;
}

std::size_t Allocator::Impl::memory_limit() const {
  Lock lock(shards);
  return limit;
}

}  // namespace tensorpool
