// The PyTorch pluggable-allocator functions of libtensorpool_torch.so (declared, with the
// PyTorch signatures, in tensorpool/cuda/torch_allocator.h). Each catches everything: an
// exception must never unwind into PyTorch through a C function.
#include "tensorpool/cuda/torch_allocator.h"

#include <fmt/format.h>

#include <array>
#include <exception>
#include <mutex>
#include <optional>
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

// The tags bound to the MemPool slots (nullopt: free; an empty string: untagged).
struct PoolSlots {
  std::mutex mutex;
  std::array<std::optional<std::string>, TENSORPOOL_TORCH_POOL_SLOTS> tags;
};
PoolSlots& pool_slots() {
  static PoolSlots* const slots = new PoolSlots;  // never destroyed: PyTorch may free at exit
  return *slots;
}

// tensorpool_torch_malloc under the tag of `slot` (a MemPool asks for a segment rarely: the tag is
// looked up each time).
void* pool_malloc(int slot, size_t size, int device, cudaStream_t stream) {
  std::string tag;
  {
    PoolSlots& slots = pool_slots();
    const std::lock_guard lock(slots.mutex);
    if (!slots.tags[static_cast<std::size_t>(slot)]) {
      log_message(LogLevel::error, fmt::format("tensorpool_torch_pool_malloc_{}: the slot is not bound "
                                               "(tensorpool_torch_pool_bind)", slot));
      return nullptr;
    }
    tag = *slots.tags[static_cast<std::size_t>(slot)];
  }
  if (tag.empty()) return tensorpool_torch_malloc(size, device, stream);
  if (tensorpool_push_tag(tag.c_str()) != TENSORPOOL_OK) {
    log_message(LogLevel::error, tensorpool_last_error());
    return nullptr;
  }
  void* p = tensorpool_torch_malloc(size, device, stream);
  (void)tensorpool_pop_tag();
  return p;
}

}  // namespace

extern "C" {

tensorpool_status tensorpool_torch_pool_bind(const char* tag, int* slot) {
  if (slot == nullptr) return TENSORPOOL_ERROR_INVALID_ARGUMENT;
  PoolSlots& slots = pool_slots();
  const std::lock_guard lock(slots.mutex);
  const std::string name = tag == nullptr ? std::string() : std::string(tag);
  for (std::size_t k = 0; k < slots.tags.size(); ++k) {
    if (slots.tags[k] && *slots.tags[k] == name) {
      *slot = static_cast<int>(k);
      return TENSORPOOL_OK;
    }
  }
  for (std::size_t k = 0; k < slots.tags.size(); ++k) {
    if (!slots.tags[k]) {
      slots.tags[k] = name;
      *slot = static_cast<int>(k);
      return TENSORPOOL_OK;
    }
  }
  log_message(LogLevel::error, fmt::format("tensorpool_torch_pool_bind('{}'): all {} MemPool slots are bound "
                                           "to other tags", name, TENSORPOOL_TORCH_POOL_SLOTS));
  return TENSORPOOL_ERROR_USAGE;
}

#define TENSORPOOL_TORCH_POOL_MALLOC_DEF(k)                                              \
  void* tensorpool_torch_pool_malloc_##k(size_t size, int device, cudaStream_t stream) { \
    return pool_malloc(k, size, device, stream);                                         \
  }
TENSORPOOL_TORCH_EACH_POOL_SLOT(TENSORPOOL_TORCH_POOL_MALLOC_DEF)
#undef TENSORPOOL_TORCH_POOL_MALLOC_DEF


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
