// The PyTorch pluggable-allocator functions of libtensorpool_torch.so (declared, with the
// PyTorch signatures, in tensorpool/cuda/torch_allocator.h). Each catches everything: an
// exception must never unwind into PyTorch through a C function.
#include "tensorpool/cuda/torch_allocator.h"

#include <fmt/format.h>

#include <exception>
#include <string>

#include "capi/device_allocator.hpp"
#include "tensorpool/cuda/interop.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/registry.hpp"

using tensorpool::capi::log_message;
using tensorpool::capi::LogLevel;

namespace {

void log_failure(const char* call, const std::exception& e) noexcept {
  try {
    log_message(LogLevel::error, fmt::format("{}: {}", call, e.what()));
  } catch (...) {
  }
}

/// Runs `body`; anything it throws (a log message that cannot be formatted, a vector that cannot
/// grow) is logged instead.
template <class Body>
void never_throws(const char* call, Body&& body) noexcept {
  try {
    body();
  } catch (const std::exception& e) {
    log_failure(call, e);
  } catch (...) {
  }
}

}  // namespace

extern "C" {

void* tensorpool_torch_malloc(size_t size, int device, cudaStream_t stream) {
  tensorpool_allocator* handle = nullptr;
  if (tensorpool_device_allocator(device, &handle) != TENSORPOOL_OK) {
    log_message(LogLevel::error, tensorpool_last_error());
    return nullptr;
  }
  void* p = nullptr;
  const tensorpool_status st = tensorpool_alloc(handle, size, tensorpool::to_stream(stream), &p);
  if (st != TENSORPOOL_OK) {
    log_message(st == TENSORPOOL_ERROR_OUT_OF_MEMORY ? LogLevel::warning : LogLevel::error,
                tensorpool_last_error());
    return nullptr;
  }
  return p;
}

void tensorpool_torch_free(void* ptr, size_t /*size*/, int device, cudaStream_t /*stream*/) {
  never_throws(__func__, [&] {
    tensorpool_allocator* handle = nullptr;
    tensorpool_existing_device_allocator(device, &handle);
    if (handle == nullptr) {
      if (ptr != nullptr) {
        log_message(LogLevel::error,
                    fmt::format("tensorpool_torch_free: {} on device {}, which has no tensorpool "
                                "allocator: not freed",
                                ptr, device));
      }
      return;
    }
    if (tensorpool_free(handle, ptr) != TENSORPOOL_OK)
      log_message(LogLevel::error, tensorpool_last_error());
  });
}

void tensorpool_torch_init(int /*device_count*/) {
  never_throws(__func__, [] { tensorpool::capi::registry::check_settings(); });
}

void tensorpool_torch_reset(void) {
  if (tensorpool_empty_cache_all() != TENSORPOOL_OK)
    log_message(LogLevel::error, tensorpool_last_error());
}

void tensorpool_torch_memory_fraction(double fraction, int device) {
  tensorpool_allocator* handle = nullptr;
  if (tensorpool_device_allocator(device, &handle) != TENSORPOOL_OK ||
      tensorpool_set_memory_fraction(handle, fraction) != TENSORPOOL_OK) {
    log_message(LogLevel::error, tensorpool_last_error());
  }
}

// PyTorch passes no device: the block belongs to whichever device allocator accepts it (a
// refusal leaves an allocator untouched). With one device this is one call.
void tensorpool_torch_record_stream(void* ptr, cudaStream_t stream) {
  never_throws(__func__, [&] {
    std::string refusal = "no tensorpool device allocator exists";
    for (int device : tensorpool::device_allocator_ordinals()) {
      tensorpool_allocator* handle = nullptr;
      tensorpool_existing_device_allocator(device, &handle);
      const tensorpool_status st =
          tensorpool_record_stream(handle, ptr, tensorpool::to_stream(stream));
      if (st == TENSORPOOL_OK) return;
      refusal = tensorpool_last_error();
      if (st != TENSORPOOL_ERROR_USAGE) break;
    }
    log_message(LogLevel::error,
                fmt::format("tensorpool_torch_record_stream({}): {}", ptr, refusal));
  });
}

}  // extern "C"
