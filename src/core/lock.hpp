// lock.hpp: the allocator's mutex: a three-state futex lock (via C++20 atomic wait/notify).
//
// Uncontended, lock is one compare-exchange and unlock one exchange, a little cheaper than
// pthread_mutex. Contended, a waiter spins briefly (the critical sections of the hot paths are
// tens of nanoseconds) and then sleeps in the kernel, so a thread stuck behind a slow upstream
// call (cudaMalloc can take milliseconds) does not burn a core.
// State: 0 unlocked, 1 locked, 2 locked and someone may be sleeping.
#pragma once

#include <atomic>

namespace tensorpool::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class FutexLock {
 public:
  void lock() noexcept {
    int expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
    lock_slow();
  }

  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  void lock_slow() noexcept {
    for (int i = 0; i < 128; ++i) {
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire))
        return;
      cpu_relax();
    }
    // Mark the lock contended; whoever unlocks will wake one sleeper.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<int> state_{0};
};

}  // namespace tensorpool::detail
