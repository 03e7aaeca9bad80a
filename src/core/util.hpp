// util.hpp: two small helpers shared by the core's source files.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

#include "tensorpool/types.hpp"

namespace tensorpool::detail {

/// "0x7e0000200000": how addresses appear in messages.
inline std::string hex(Address a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

/// n rounded up to a multiple of `to` (to > 0).
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

}  // namespace tensorpool::detail
