# TENSORPOOL_SELF_CONTAINED (the Python wheel, pyproject.toml): fmt and spdlog compiled into the
# binaries from their headers, so the CLI and the shared libraries need only the C and C++
# runtimes wherever the wheel is installed. Defines fmt::fmt and spdlog::spdlog as header-only
# targets under the names the rest of the build links; included before find_package(fmt), which
# is then skipped. Incompatible with TENSORPOOL_INSTALL (these targets cannot be exported).
if(TENSORPOOL_INSTALL)
  message(FATAL_ERROR "TENSORPOOL_SELF_CONTAINED (the wheel) and TENSORPOOL_INSTALL cannot both be ON")
endif()
find_path(TENSORPOOL_FMT_INCLUDE_DIR fmt/format-inl.h)
find_path(TENSORPOOL_SPDLOG_INCLUDE_DIR spdlog/spdlog.h)
if(NOT TENSORPOOL_FMT_INCLUDE_DIR OR NOT TENSORPOOL_SPDLOG_INCLUDE_DIR)
  message(FATAL_ERROR "tensorpool needs the headers of fmt and spdlog (fmt/format-inl.h, spdlog/spdlog.h): "
    "on Debian, apt-get install libfmt-dev libspdlog-dev (scripts/install-deps.sh installs every dependency)")
endif()
add_library(fmt::fmt INTERFACE IMPORTED)
set_target_properties(fmt::fmt PROPERTIES
  INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1
  INTERFACE_INCLUDE_DIRECTORIES "${TENSORPOOL_FMT_INCLUDE_DIR}")
add_library(spdlog::spdlog INTERFACE IMPORTED)
set_target_properties(spdlog::spdlog PROPERTIES
  INTERFACE_COMPILE_DEFINITIONS SPDLOG_FMT_EXTERNAL=1
  INTERFACE_INCLUDE_DIRECTORIES "${TENSORPOOL_SPDLOG_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "fmt::fmt;Threads::Threads")
