// Size rounding and binning: exhaustive round trips over every size up to 64 MiB, sampled above.
#include <catch2/catch.hpp>

#include <random>

#include "tensorpool/size_classes.hpp"
#include "tensorpool/types.hpp"

using namespace tensorpool;

namespace {

void check_round(std::size_t n) {
  const std::size_t r = round_size(n);
  REQUIRE(r >= n);
  REQUIRE(r % kMinBlockSize == 0);
  REQUIRE(r - n < kMinBlockSize);  // worst case internal fragmentation: 511 bytes
  REQUIRE(round_size(r) == r);     // idempotent
}

void check_bins(std::size_t s) {  // s: a block size (multiple of 512)
  const bins::Bin b = bins::bin_of(s);
  REQUIRE(b.fl < bins::kFirstLevels);
  REQUIRE(b.sl < bins::kSub);
  const std::size_t lo = bins::bin_lower(b);
  const std::size_t hi = bins::bin_upper(b);
  REQUIRE(lo <= s);
  REQUIRE(s < hi);
  REQUIRE(bins::bin_of(lo) == b);            // size -> bin -> size -> same bin
  REQUIRE(bins::bin_of(hi - kMinBlockSize) == b);
  REQUIRE((hi - lo) * 32 <= lo + 31 * kMinBlockSize);  // relative width <= 1/32 (exact bins below 16 KiB)
  const bins::Bin c = bins::bin_ceil(s);
  REQUIRE(bins::bin_lower(c) >= s);          // every block in the ceiling bin fits
  if (bins::bin_lower(b) != s) REQUIRE(bins::bin_lower(c) == hi);  // and it is the first such bin
  else REQUIRE(c == b);
}

}  // namespace

TEST_CASE("round_size: every request size up to 64 MiB", "[size_classes]") {
  REQUIRE(round_size(1) == 512);
  REQUIRE(round_size(512) == 512);
  REQUIRE(round_size(513) == 1024);
  for (std::size_t n = 1; n <= 64 * MiB; ++n) {
    const std::size_t r = round_size(n);
    if (r < n || r - n >= kMinBlockSize || r % kMinBlockSize != 0) FAIL("round_size(" << n << ") = " << r);
  }
  check_round(kMaxAllocationSize);
}

TEST_CASE("bins: every block size up to 64 MiB round-trips", "[size_classes]") {
  std::size_t previous_lower = 0;
  bins::Bin previous{0, 0};
  for (std::size_t s = kMinBlockSize; s <= 64 * MiB; s += kMinBlockSize) {
    check_bins(s);
    const bins::Bin b = bins::bin_of(s);
    // Bins are monotone in size: a larger size never falls in an earlier bin.
    REQUIRE((b.fl > previous.fl || (b.fl == previous.fl && b.sl >= previous.sl)));
    REQUIRE(bins::bin_lower(b) >= previous_lower);
    previous = b;
    previous_lower = bins::bin_lower(b);
  }
}

TEST_CASE("bins: sampled sizes up to the largest allocation", "[size_classes]") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    const unsigned bits = 9 + static_cast<unsigned>(rng() % 42);  // 512 B .. 2 PiB
    std::size_t s = round_size(static_cast<std::size_t>(rng() & ((std::uint64_t{1} << bits) - 1)) + 1);
    if (s > kMaxAllocationSize) s = kMaxAllocationSize;
    check_bins(s);
  }
  check_bins(kMaxAllocationSize);
}
