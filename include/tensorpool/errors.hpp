// tensorpool/errors.hpp: every exception the library throws.
//
// Error (std::runtime_error) is the base of the library's own errors; OutOfMemoryError derives from
// std::bad_alloc instead so that code written for operator new handles it unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensorpool/types.hpp"

namespace tensorpool {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Misuse of the allocator: double free, a pointer it did not allocate, record_stream on a freed
/// pointer. Thrown before any state is changed: the allocator stays usable.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// A bad TENSORPOOL_CONF / Config key or value; the message names the key and what was expected.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// The device backend failed for a reason other than running out of memory.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// check_invariants() found the allocator's state inconsistent (a bug in tensorpool).
class InvariantError : public Error {
 public:
  using Error::Error;
};

/// Free bytes an allocator holds cached for one stream (reusable on that stream only, or on
/// another after an event wait).
struct StreamCachedBytes {
  Stream stream = kDefaultStream;
  std::size_t bytes = 0;
  friend bool operator==(const StreamCachedBytes&, const StreamCachedBytes&) = default;
};

/// Everything known at the moment an allocation could not be satisfied.
struct OutOfMemoryInfo {
  std::size_t requested = 0;        // bytes asked for
  std::size_t rounded = 0;          // after rounding
  Stream stream = kDefaultStream;
  int device = 0;
  std::size_t capacity = 0;         // device total memory
  std::size_t device_free = 0;      // free memory the device reported
  std::size_t reserved = 0;         // bytes held in segments by this allocator
  std::size_t allocated = 0;        // bytes in blocks handed out (rounded)
  std::size_t reserved_unallocated = 0;
  std::size_t largest_free_block = 0;
  std::size_t memory_limit = 0;     // 0: no limit
  /// Free cached bytes per stream, streams in ascending order, streams with none left out.
  /// Their sum is the reserved memory no live or pending block occupies.
  std::vector<StreamCachedBytes> cached_per_stream;
  /// The virtual-memory mode's page (memory is mapped, unmapped and moved in whole pages);
  /// 0: memory in segments (fixed mode, and the replay's models of other allocators).
  std::size_t page_size = 0;
};

class OutOfMemoryError : public std::bad_alloc {
 public:
  explicit OutOfMemoryError(const OutOfMemoryInfo& info);
  const char* what() const noexcept override { return message_.c_str(); }
  const OutOfMemoryInfo& info() const noexcept { return info_; }

 protected:
  OutOfMemoryError(const OutOfMemoryInfo& info, std::string message)
      : info_(info), message_(std::move(message)) {}

 private:
  OutOfMemoryInfo info_;
  std::string message_;
};

/// A request on a stream being captured into a CUDA graph that the graph's pool cannot serve:
/// during a capture the device is never asked for memory (Allocator::begin_capture). The message
/// says how much the pool holds and how much to reserve next time.
class GraphPoolExhaustedError : public OutOfMemoryError {
 public:
  GraphPoolExhaustedError(const OutOfMemoryInfo& info, std::string message, std::uint64_t pool,
                          std::size_t suggested_reserve)
      : OutOfMemoryError(info, std::move(message)), pool_(pool), suggested_reserve_(suggested_reserve) {}
  std::uint64_t pool() const noexcept { return pool_; }
  /// A reserve that serves this request whatever the pool's free space is cut into: the pool's
  /// reserve plus the request, rounded up to 2 MiB.
  std::size_t suggested_reserve() const noexcept { return suggested_reserve_; }

 private:
  std::uint64_t pool_;
  std::size_t suggested_reserve_;
};

}  // namespace tensorpool
