// util.hpp: small helpers shared by the core's source files.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

#include "tensorpool/types.hpp"

/// For the few helpers of the hot path that must be inlined whatever the optimizer thinks.
#define TP_ALWAYS_INLINE inline __attribute__((always_inline))
/// For branches of the hot path into slow paths.
#define TP_UNLIKELY(x) __builtin_expect(!!(x), 0)

namespace tensorpool::detail {

/// "0x7e0000200000": how addresses appear in messages.
inline std::string hex(Address a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

}  // namespace tensorpool::detail
