// The byte-level pieces of the trace formats: CRC-32 (slicing-by-8), buffered input with offsets,
// and buffered output to a temporary file that is renamed into place on commit.
#include "trace/format_io.hpp"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

#if __has_include(<unistd.h>)
#include <unistd.h>
#define TENSORPOOL_HAVE_FSYNC 1
#endif

#include "tensorpool/errors.hpp"

namespace tensorpool::trace::detail {

namespace {

constexpr std::size_t kReadChunk = std::size_t{1} << 16;

// kCrcTables[0] is the classic byte-at-a-time table of the reflected polynomial 0xEDB88320;
// kCrcTables[k][b] is the CRC of byte b followed by k zero bytes, which lets crc32_update fold
// eight bytes per step.
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}
constexpr CrcTables kCrcTables = make_crc_tables();

std::uint32_t load_le32(const std::uint8_t* p) noexcept {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

std::string os_error(int err) { return std::generic_category().message(err); }

}  // namespace

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) noexcept {
  const auto* p = static_cast<const std::uint8_t*>(data);
  const auto& t = kCrcTables;
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = load_le32(p) ^ crc;
    const std::uint32_t hi = load_le32(p + 4);
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// ---------------------------------------------------------------------------------------------
// FileSource

FileSource::FileSource(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "rb");
  if (file_ == nullptr) {
    throw Error(fmt::format("cannot open trace file '{}': {}", path, os_error(errno)));
  }
  buffer_ = std::make_unique<std::uint8_t[]>(kReadChunk);
  pos_ = end_ = crc_mark_ = buffer_.get();
}

FileSource::~FileSource() {
  if (file_ != nullptr) std::fclose(file_);
}

bool FileSource::refill() {
  if (pos_ != end_) return true;
  // The buffer is about to be reused: fold its consumed bytes into the CRC first.
  crc_ = crc32_update(crc_, crc_mark_, static_cast<std::size_t>(end_ - crc_mark_));
  base_ += static_cast<std::uint64_t>(end_ - buffer_.get());
  const std::size_t n = std::fread(buffer_.get(), 1, kReadChunk, file_);
  pos_ = crc_mark_ = buffer_.get();
  end_ = pos_ + n;
  if (n == 0 && std::ferror(file_) != 0) {
    throw Error(fmt::format("cannot read trace file '{}' at byte {}: {}", path_, base_,
                            os_error(errno)));
  }
  return n != 0;
}

std::uint32_t FileSource::crc() noexcept {
  crc_ = crc32_update(crc_, crc_mark_, static_cast<std::size_t>(pos_ - crc_mark_));
  crc_mark_ = pos_;
  return crc_;
}

// ---------------------------------------------------------------------------------------------
// FileSink

namespace {

/// A name next to `target` that no other writer (thread or process) picks: a random suffix.
std::string temp_name(const std::string& target) {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  const auto now = static_cast<std::uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  const std::uint64_t r = (std::uint64_t{rd()} << 32 ^ rd()) ^ now ^ (counter++ << 48);
  return fmt::format("{}.tmp-{:016x}", target, r);
}

/// True if `path` exists and is not a regular file (a device, a FIFO, a socket).
bool is_special_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  return !ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
         !std::filesystem::is_directory(status);
}

}  // namespace

FileSink::FileSink(std::string target, std::string temp) : target_(std::move(target)) {
  int err = 0;
  if (is_special_file(target_)) {
    in_place_ = true;
    temp_ = target_;
    file_ = std::fopen(target_.c_str(), "wb");
    err = errno;
  }
  // "x": fail if the name exists, so a temporary never truncates someone else's file.
  for (int attempt = 0; attempt < 16 && file_ == nullptr && !in_place_; ++attempt) {
    temp_ = temp.empty() ? temp_name(target_) : temp;
    file_ = std::fopen(temp_.c_str(), "wbx");
    err = errno;
    if (file_ == nullptr && (err != EEXIST || !temp.empty())) break;
  }
  if (file_ == nullptr) {
    throw Error(fmt::format("cannot create trace file {}: {}", describe(),
                            os_error(err)));
  }
  buffer_ = std::make_unique<std::uint8_t[]>(kBufferBytes);
}

FileSink::~FileSink() { discard(); }

std::string FileSink::describe() const {
  return in_place_ ? fmt::format("'{}'", target_) : fmt::format("'{}' (temporary '{}')", target_, temp_);
}

std::uint8_t* FileSink::reserve(std::size_t n) {
  if (kBufferBytes - used_ < n) flush();
  return buffer_.get() + used_;
}

void FileSink::put(const void* data, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (n > 0) {
    if (used_ == kBufferBytes) flush();
    const std::size_t k = std::min(n, kBufferBytes - used_);
    std::memcpy(buffer_.get() + used_, p, k);
    used_ += k;
    p += k;
    n -= k;
  }
}

std::uint32_t FileSink::crc() noexcept {
  crc_ = crc32_update(crc_, buffer_.get() + crc_mark_, used_ - crc_mark_);
  crc_mark_ = used_;
  return crc_;
}

void FileSink::flush() {
  if (file_ == nullptr) throw Error(fmt::format("trace file '{}' is closed", target_));
  crc();
  if (used_ != 0 && std::fwrite(buffer_.get(), 1, used_, file_) != used_) {
    throw Error(fmt::format("cannot write trace file {}: {}", describe(),
                            os_error(errno)));
  }
  flushed_ += used_;
  used_ = crc_mark_ = 0;
}

void FileSink::flush_to_os() {
  flush();
  if (std::fflush(file_) != 0) {
    throw Error(fmt::format("cannot write trace file {}: {}", describe(),
                            os_error(errno)));
  }
}

void FileSink::commit() {
  try {
    flush();
    int failed = std::fflush(file_);
#ifdef TENSORPOOL_HAVE_FSYNC
    // Data on disk before the rename, so a crash never leaves an empty file under the target.
    if (failed == 0 && !in_place_) failed = ::fsync(::fileno(file_));
#endif
    const int err = errno;
    failed |= std::fclose(file_);
    file_ = nullptr;
    if (failed != 0) {
      throw Error(fmt::format("cannot write trace file {}: {}", describe(),
                              os_error(err)));
    }
    std::error_code ec;
    if (!in_place_) std::filesystem::rename(temp_, target_, ec);
    if (ec) {
      throw Error(fmt::format("cannot rename '{}' to trace file '{}': {}", temp_, target_,
                              ec.message()));
    }
    committed_ = true;
  } catch (...) {
    discard();
    throw;
  }
}

void FileSink::discard() noexcept {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (!committed_ && !in_place_ && !temp_.empty()) {
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
    temp_.clear();
  }
}

}  // namespace tensorpool::trace::detail
