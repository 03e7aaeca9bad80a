// step_finder.cpp: StepFinder's samples (step_finder.hpp), out of the fast path.
#include "core/step_finder.hpp"

#include <algorithm>

namespace tensorpool::detail {

void StepFinder::sample(std::uint64_t live) noexcept {
  ++samples_;
  const Sighting last = exchange_last_sighting();
  const std::uint64_t distance = last.at == 0 ? 0 : count_ - last.at;
  if (last.in_short_loop) {
    // A loop too short to be a step: sample it less and less often (the same way in every step,
    // so that the samples after it stay where they were). The distances the skipped samples make
    // say nothing, hence the mark on the hash.
    backoff_ = std::min(kMaxBackoff, std::max<std::uint64_t>(2, backoff_ * 2));
    next_sample_ = count_ + backoff_;
    return;
  }
  backoff_ = 0;
  if (distance != 0 && distance <= period_ / 2 && count_ - last_agreed_ <= period_) {
    // A loop inside the step (a model's layers in the optimizer's update, where the bytes in use
    // come back to the same count every layer): it neither confirms nor breaks the period, as
    // long as some sample agreed with it less than a period ago.
    return;
  }
  if (distance == 0 || distance != period_) {
    // A hash not seen before, or seen at another distance: the period under test fails, and this
    // distance is tested next.
    drop_period();
    period_ = distance;
    agreed_since_ = count_;
    last_agreed_ = count_;
    return;
  }
  last_agreed_ = count_;
  if (!confirmed_ && count_ - agreed_since_ >= period_ && period_ * kLiveBlocksPerAllocation >= live) {
    // The low point seen since agreed_since_ (a whole period) is the step's: the boundary goes
    // before that allocation, i.e. right after the one before it, a period later.
    confirmed_ = true;
    boundary_at_ = low_at_ - 1;
    while (boundary_at_ <= count_) boundary_at_ += period_;
  }
}

StepFinder::Sighting StepFinder::exchange_last_sighting() noexcept {
  // Linear probing from the hash's bits below the sampled ones (its low bits take only the last few
  // allocations' low bits, which sizes aligned to pages leave zero); a hash not found takes the
  // slot sampled longest ago (a forgotten sample breaks the period under test; kTableSize keeps
  // that rare).
  const std::size_t start = static_cast<std::size_t>(hash_ >> (64 - kSampleBits - kTableBits));
  Slot* oldest = nullptr;
  for (std::size_t i = 0; i < kProbe; ++i) {
    Slot& slot = table_[(start + i) & (kTableSize - 1)];
    if (slot.at != 0 && slot.hash == hash_) {
      const Sighting last{slot.at, slot.in_short_loop != 0 || count_ - slot.at < kMinPeriod};
      slot.at = count_ & Slot::kAtMask;
      slot.in_short_loop = last.in_short_loop;
      return last;
    }
    if (oldest == nullptr || slot.at < oldest->at) oldest = &slot;
  }
  oldest->hash = hash_;
  oldest->at = count_ & Slot::kAtMask;
  oldest->in_short_loop = 0;
  return {};
}

void StepFinder::drop_period() noexcept {
  period_ = 0;
  confirmed_ = false;
  boundary_at_ = 0;
  low_in_use_ = UINT64_MAX;
  low_at_ = 0;
}

}  // namespace tensorpool::detail
