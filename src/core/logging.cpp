// The library's logger: stderr, level from TENSORPOOL_LOG_LEVEL (default warn).
#include "core/logging.hpp"

#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tensorpool/errors.hpp"

namespace tensorpool::detail {

namespace {

spdlog::level::level_enum level_from_env() {
  const char* env = std::getenv("TENSORPOOL_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return spdlog::level::warn;
  const std::string v = env;
  for (int l = spdlog::level::trace; l <= spdlog::level::off; ++l) {
    const auto level = static_cast<spdlog::level::level_enum>(l);
    const auto name = spdlog::level::to_string_view(level);
    if (v == std::string(name.data(), name.size())) return level;
  }
  if (v == "warning") return spdlog::level::warn;
  throw ConfigError("TENSORPOOL_LOG_LEVEL: bad value '" + v +
                    "': expected trace, debug, info, warn, error, critical or off");
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto existing = spdlog::get("tensorpool");
  if (existing) return existing;
  auto logger = std::make_shared<spdlog::logger>(
      "tensorpool", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_level(level_from_env());
  logger->set_pattern("[tensorpool %l] %v");
  return logger;
}

spdlog::level::level_enum spdlog_level(Logger::Level level) {
  switch (level) {
    case Logger::Level::trace: return spdlog::level::trace;
    case Logger::Level::debug: return spdlog::level::debug;
    case Logger::Level::info: return spdlog::level::info;
    case Logger::Level::warn: return spdlog::level::warn;
    case Logger::Level::error: return spdlog::level::err;
    case Logger::Level::critical: return spdlog::level::critical;
  }
  return spdlog::level::err;
}

}  // namespace

spdlog::logger& Logger::spdlog_logger() {
  static std::shared_ptr<spdlog::logger> logger = make_logger();
  return *logger;
}

bool Logger::enabled(Level level) const { return spdlog_logger().should_log(spdlog_level(level)); }

void Logger::write(Level level, std::string_view message) { spdlog_logger().log(spdlog_level(level), message); }

Logger& log() {
  static Logger logger;
  (void)Logger::spdlog_logger();  // TENSORPOOL_LOG_LEVEL is read (and checked) on first use
  return logger;
}

}  // namespace tensorpool::detail
