// hooks.hpp (internal): the hooks attached to one allocator: observers of its events, OOM
// observers and free-memory callbacks (the public types are in tensorpool/hooks.hpp).
//
// Invariants: has_observers_ == !observers_.empty() (the hot path reads only the flag); ids are
// unique over the three lists and never reused (next_id_ only grows).
// Not locked itself: the allocator calls it with its mutex held, and runs OOM observers and
// free-memory callbacks from copies after releasing the mutex.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "tensorpool/hooks.hpp"

namespace tensorpool::detail {

class Hooks {
 public:
  template <class T>
  using List = std::vector<std::pair<HookId, T>>;

  /// Whether any observer is attached: the one branch the hot path pays for hooks.
  bool observed() const noexcept { return has_observers_; }
  /// Tells every observer (call only when observed(): it reads the clock).
  void notify(EventType type, Address addr, std::size_t requested, std::size_t size,
              Stream stream, std::uint16_t tag = 0) const;

  HookId add_observer(std::shared_ptr<Observer> observer);
  HookId add_oom_observer(OomObserver observer);
  HookId add_free_memory_callback(FreeMemoryCallback callback);
  /// False if no hook has this id.
  bool remove(HookId id);

  const List<OomObserver>& oom_observers() const noexcept { return oom_observers_; }
  const List<FreeMemoryCallback>& free_memory_callbacks() const noexcept { return free_callbacks_; }

 private:
  bool has_observers_ = false;
  HookId next_id_ = 1;
  List<std::shared_ptr<Observer>> observers_;
  List<OomObserver> oom_observers_;
  List<FreeMemoryCallback> free_callbacks_;
};

}  // namespace tensorpool::detail
