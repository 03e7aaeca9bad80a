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
  synchronize_pending();
  const std::size_t released = source_->release(detail::ReleaseGoal::empty_cache);
  if (hooks.observed()) hooks.notify(EventType::empty_cache, 0, 0, released, kDefaultStream);
  debug_check();
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
