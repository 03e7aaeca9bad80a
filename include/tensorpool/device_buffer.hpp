// tensorpool/device_buffer.hpp: DeviceBuffer, an owning, movable block of device memory from an
// Allocator, tied to the stream it is used on (header-only).
//
//   tensorpool::DeviceBuffer buf(alloc, 64 << 20, stream);  // allocate(64 MiB, stream)
//   launch(buf.data(), stream);
//   buf.set_stream(other);   // used on `other` from now on: the free waits for its work too
//   // ~DeviceBuffer: deallocate(), reusable in stream order
//
// Like the allocator, the buffer never touches the memory (no copies, no fill): it owns it.
#pragma once

#include <cstddef>
#include <utility>

#include "tensorpool/allocator.hpp"

namespace tensorpool {

class DeviceBuffer {
 public:
  DeviceBuffer() noexcept = default;
  /// Allocates `bytes` for use on `stream` (0 bytes: an empty buffer). Throws OutOfMemoryError.
  DeviceBuffer(Allocator& alloc, std::size_t bytes, Stream stream = kDefaultStream)
      : alloc_(&alloc), data_(alloc.allocate(bytes, stream)), size_(bytes), stream_(stream) {}

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : alloc_(std::exchange(other.alloc_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        stream_(std::exchange(other.stream_, kDefaultStream)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      alloc_ = std::exchange(other.alloc_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      stream_ = std::exchange(other.stream_, kDefaultStream);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return data_ == nullptr; }
  Stream stream() const noexcept { return stream_; }
  /// The allocator the memory came from (nullptr for an empty buffer).
  Allocator* allocator() const noexcept { return alloc_; }

  /// The buffer is used on `stream` from now on (record_stream): its free also waits for the
  /// work submitted to `stream` before it, and stream() becomes `stream`.
  void set_stream(Stream stream) {
    if (data_ != nullptr) alloc_->record_stream(data_, stream);
    stream_ = stream;
  }
  /// Also used on `stream`, without changing stream().
  void record_stream(Stream stream) {
    if (data_ != nullptr) alloc_->record_stream(data_, stream);
  }

  /// Frees the memory now (reused in stream order, as Allocator::deallocate) and empties the
  /// buffer.
  void reset() noexcept {
    if (data_ != nullptr) alloc_->deallocate(data_);  // our own pointer: cannot be refused
    data_ = nullptr;
    size_ = 0;
  }
  /// Gives up ownership: the caller deallocates the returned pointer.
  [[nodiscard]] void* release() noexcept {
    size_ = 0;
    return std::exchange(data_, nullptr);
  }

 private:
  Allocator* alloc_ = nullptr;
  void* data_ = nullptr;  // invariant: non-null iff the buffer owns a block of alloc_
  std::size_t size_ = 0;  // bytes requested (the block may be larger)
  Stream stream_ = kDefaultStream;
};

}  // namespace tensorpool
