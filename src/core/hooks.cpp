// hooks.cpp: the hook registry (core/hooks.hpp) and the allocator's hook API on top of it.
#include "core/hooks.hpp"

#include <algorithm>
#include <chrono>

#include "core/allocator_impl.hpp"

namespace tensorpool {

namespace detail {

void Hooks::notify(EventType type, Address addr, std::size_t requested, std::size_t size,
                   Stream stream, std::uint16_t tag) const {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  const AllocatorEvent e{type, addr, requested, size, stream,
                         static_cast<std::uint64_t>(
                             std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
                         tag};
  for (const auto& [id, observer] : observers_) observer->on_event(e);
}

HookId Hooks::add_observer(std::shared_ptr<Observer> observer) {
  observers_.emplace_back(next_id_, std::move(observer));
  has_observers_ = true;
  return next_id_++;
}

HookId Hooks::add_oom_observer(OomObserver observer) {
  oom_observers_.emplace_back(next_id_, std::move(observer));
  return next_id_++;
}

HookId Hooks::add_free_memory_callback(FreeMemoryCallback callback) {
  free_callbacks_.emplace_back(next_id_, std::move(callback));
  return next_id_++;
}

bool Hooks::remove(HookId id) {
  auto drop = [id](auto& list) {
    return std::erase_if(list, [id](const auto& entry) { return entry.first == id; }) != 0;
  };
  const bool removed = drop(observers_) || drop(oom_observers_) || drop(free_callbacks_);
  has_observers_ = !observers_.empty();
  return removed;
}

}  // namespace detail

// --- the allocator's hook API: checks, then registers under the lock -----------------------

HookId Allocator::Impl::add_observer(std::shared_ptr<Observer> observer) {
  if (!observer) throw UsageError("tensorpool: add_observer(nullptr)");
  Lock lock(shards);
  return hooks.add_observer(std::move(observer));
}

HookId Allocator::Impl::add_oom_observer(OomObserver observer) {
  if (!observer) throw UsageError("tensorpool: add_oom_observer with an empty function");
  Lock lock(shards);
  return hooks.add_oom_observer(std::move(observer));
}

HookId Allocator::Impl::add_free_memory_callback(FreeMemoryCallback callback) {
  if (!callback) throw UsageError("tensorpool: add_free_memory_callback with an empty function");
  Lock lock(shards);
  return hooks.add_free_memory_callback(std::move(callback));
}

bool Allocator::Impl::remove_hook(HookId id) {
  Lock lock(shards);
  return hooks.remove(id);
}

}  // namespace tensorpool
