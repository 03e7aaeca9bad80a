// record/event_ring.hpp (internal): the single-producer, single-consumer ring of observed events
// between one allocator and the recorder's writer thread.
//
// The producer is the allocator's observer, which runs under the allocator's lock: calls from
// different threads are serialized (and ordered) by that lock, so they form one producer. The
// consumer is the writer thread. Fixed capacity, no allocation after construction.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensorpool/hooks.hpp"

namespace tensorpool::detail {

/// An observed event and the thread that caused it (RMM's log names the thread).
struct ObservedEvent {
  AllocatorEvent event;
  std::uint64_t thread = 0;
};

class EventRing {
 public:
  /// Capacity: `min_capacity` rounded up to a power of two, at least 64.
  explicit EventRing(std::size_t min_capacity)
      : capacity_(std::bit_ceil(min_capacity < 64 ? std::size_t{64} : min_capacity)),
        slots_(std::make_unique<ObservedEvent[]>(capacity_)) {}

  std::size_t capacity() const noexcept { return capacity_; }

  /// Producer: appends `e`; false (nothing changed) when the ring is full.
  bool try_push(const ObservedEvent& e) noexcept {
    const std::uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - cached_tail_ == capacity_) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (head - cached_tail_ == capacity_) return false;
    }
    slots_[head & (capacity_ - 1)] = e;
    head_.store(head + 1, std::memory_order_release);
    return true;
  }

  /// Consumer: moves up to `max` events to `out`; returns how many.
  std::size_t pop(ObservedEvent* out, std::size_t max) noexcept {
    const std::uint64_t tail = tail_.load(std::memory_order_relaxed);
    const std::uint64_t head = head_.load(std::memory_order_acquire);
    const auto n = static_cast<std::size_t>(head - tail < max ? head - tail : max);
    for (std::size_t i = 0; i < n; ++i) out[i] = slots_[(tail + i) & (capacity_ - 1)];
    tail_.store(tail + n, std::memory_order_release);
    return n;
  }

  /// Events pushed so far (any thread; a snapshot).
  std::uint64_t pushed() const noexcept { return head_.load(std::memory_order_acquire); }

 private:
  const std::size_t capacity_;  // a power of two
  const std::unique_ptr<ObservedEvent[]> slots_;
  // Invariant: tail_ <= head_ <= tail_ + capacity_; slots [tail_, head_) hold unread events.
  alignas(64) std::atomic<std::uint64_t> head_{0};  // written by the producer only
  std::uint64_t cached_tail_ = 0;                   // the producer's last reading of tail_
  alignas(64) std::atomic<std::uint64_t> tail_{0};  // written by the consumer only
};

}  // namespace tensorpool::detail
