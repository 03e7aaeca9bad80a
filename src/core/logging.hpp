// The library's spdlog logger ("tensorpool"), its level taken from TENSORPOOL_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

namespace tensorpool::detail {

/// The shared logger. Throws ConfigError on first use if TENSORPOOL_LOG_LEVEL is not one of
/// trace, debug, info, warn, error, critical, off.
spdlog::logger& log();

}  // namespace tensorpool::detail
