// lock.hpp: the allocator's mutex: a three-state futex lock (via C++20 atomic wait/notify).
//
// Uncontended, lock is one compare-exchange and unlock one exchange, a little cheaper than
// pthread_mutex. Contended, a waiter backs off exponentially (looks at the lock after 1, 2, 4 ...
// up to 512 pauses, about 31 us in all on this project's machine), then naps (Linux: sleeps of
// 20 us, about 70 us with the timer's slack, up to 64 times, looking at the lock after each)
// without saying so, and only then sleeps in the kernel until woken, so a thread stuck behind a slow upstream call
// (cudaMalloc can take milliseconds) does not burn a core.
// Why: two threads on one shard (shards.hpp) doing cached pairs of tens of nanoseconds lose most
// of their time moving the lock's and the state's cache lines between cores when the waiter keeps
// looking (two threads got 0.2-0.5x of one thread's throughput with a plain 128-pause spin), and
// a waiter that spins beside the holder slows it too; a waiter that looks rarely lets the holder
// run many calls in a row. A napping waiter is not marked, so the holder's unlock stays one
// exchange with no system call: one that sleeps marked at once makes every unlock a system call.
// State: 0 unlocked, 1 locked, 2 locked and someone may be sleeping (marked).
#pragma once

#include <atomic>

#if defined(__linux__)
#include <time.h>
#endif

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
  static constexpr int kBackoffRounds = 10;  // looks at the lock before napping
  static constexpr int kLongestWait = 9;     // log2 of the most pauses between two looks
  static constexpr int kNaps = 64;           // unmarked naps before sleeping until woken
  static constexpr long kNapNanoseconds = 20'000;

  bool try_take() noexcept {
    int expected = 0;
    return state_.load(std::memory_order_relaxed) == 0 &&
           state_.compare_exchange_weak(expected, 1, std::memory_order_acquire);
  }

  // Sleeps kNapNanoseconds (plus the kernel's timer slack) while the lock is held. Not a futex
  // wait on state_: unlock's notify_one is for a marked sleeper, and a napper it woke instead
  // would take the lock unmarked and lose that sleeper's wake-up.
  void nap() noexcept {
#if defined(__linux__)
    if (state_.load(std::memory_order_relaxed) == 0) return;
    const timespec duration{0, kNapNanoseconds};
    nanosleep(&duration, nullptr);
#endif
  }

  void lock_slow() noexcept {
    for (int round = 0; round < kBackoffRounds; ++round) {
      for (int i = 0; i < (1 << (round < kLongestWait ? round : kLongestWait)); ++i) cpu_relax();
      if (try_take()) return;
    }
#if defined(__linux__)
    for (int i = 0; i < kNaps; ++i) {
      nap();
      if (try_take()) return;
    }
#endif
    // Mark the lock contended; whoever unlocks will wake one sleeper.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<int> state_{0};
};

}  // namespace tensorpool::detail
