// The library's logger ("tensorpool": spdlog, to stderr, its level taken from
// TENSORPOOL_LOG_LEVEL), behind a small interface: a message is formatted (fmt) only when its
// level is enabled, and only logging.cpp includes spdlog, so the files that log do not compile
// it (which the wheel, with spdlog from its headers, would do in each of them).
#pragma once

#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <spdlog/fwd.h>

namespace tensorpool::detail {

class Logger {
 public:
  enum class Level : int { trace, debug, info, warn, error, critical };

  template <class... Args>
  void debug(fmt::format_string<Args...> format, Args&&... args) { at(Level::debug, format, std::forward<Args>(args)...); }
  template <class... Args>
  void info(fmt::format_string<Args...> format, Args&&... args) { at(Level::info, format, std::forward<Args>(args)...); }
  template <class... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) { at(Level::warn, format, std::forward<Args>(args)...); }
  template <class... Args>
  void error(fmt::format_string<Args...> format, Args&&... args) { at(Level::error, format, std::forward<Args>(args)...); }

  /// Whether messages of `level` reach the sinks.
  bool enabled(Level level) const;
  /// Logs `message` as it is.
  void write(Level level, std::string_view message);
  /// The spdlog logger behind it (its sinks, for tests); made on first use.
  static spdlog::logger& spdlog_logger();

 private:
  template <class... Args>
  void at(Level level, fmt::format_string<Args...> format, Args&&... args) {
    if (enabled(level)) write(level, fmt::format(format, std::forward<Args>(args)...));
  }
};

/// The shared logger. Throws ConfigError on first use if TENSORPOOL_LOG_LEVEL is not one of
/// trace, debug, info, warn, error, critical, off.
Logger& log();

}  // namespace tensorpool::detail
