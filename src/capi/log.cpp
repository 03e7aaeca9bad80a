// Logging for the layers that must never throw to their caller (the PyTorch hooks): tensorpool's
// logger (TENSORPOOL_LOG_LEVEL), or stderr when the logger itself cannot be had.
#include <cstdio>
#include <string>

#include "capi/device_allocator.hpp"
#include "core/logging.hpp"

namespace tensorpool::capi {

void log_message(LogLevel level, const std::string& message) noexcept {
  try {
    auto& logger = detail::log();
    if (level == LogLevel::warning) logger.warn("{}", message);
    else logger.error("{}", message);
  } catch (...) {
    std::fprintf(stderr, "[tensorpool %s] %s\n", level == LogLevel::warning ? "warning" : "error",
                 message.c_str());
  }
}

}  // namespace tensorpool::capi
