// lock.hpp: the allocator's mutex: a three-state futex lock (via C++20 atomic wait/notify).
//
// Uncontended, lock is one compare-exchange and unlock one exchange, a little cheaper than
// pthread_mutex. Contended, a waiter backs off exponentially (looks at the lock after 1, 2, 4 ...
// up to 512 pauses, about 31 us in all on this project's machine) and then sleeps in the kernel,
// so a thread stuck behind a slow upstream call (cudaMalloc can take milliseconds) does not burn
// a core. Why back off: two threads on one shard (shards.hpp) doing cached pairs of tens of
// nanoseconds lose most of their time moving the lock's and the state's cache lines between
// cores when the waiter keeps looking (two threads got 0.2-0.5x of one thread's throughput with a
// plain 128-pause spin); a waiter that looks rarely lets the holder run many calls in a row, and
// one that sleeps at once makes every unlock a system call. A waiter so notices a free lock
// within 512 pauses (15 us here).
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
  static constexpr int kBackoffRounds = 10;  // looks at the lock before sleeping
  static constexpr int kLongestWait = 9;     // log2 of the most pauses between two looks
  void lock_slow() noexcept {
    for (int round = 0; round < kBackoffRounds; ++round) {
      for (int i = 0; i < (1 << (round < kLongestWait ? round : kLongestWait)); ++i) cpu_relax();
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire))
        return;
    }
    // Mark the lock contended; whoever unlocks will wake one sleeper.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<int> state_{0};
};

}  // namespace tensorpool::detail
