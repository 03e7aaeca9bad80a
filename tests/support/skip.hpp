// tests/support/skip.hpp: a test case that cannot run here (its data or hardware is absent) says
// why and is reported to CTest as skipped, never as passed.
//
// TP_SKIP(reason) ends the running test case (it returns from the TEST_CASE body: call it there,
// not in a helper). The test executable (tests/main.cpp) then exits with kSkipExitCode when every
// test case it ran was skipped and none failed, which tests/CMakeLists.txt declares to CTest as
// SKIP_RETURN_CODE for every test: CTest runs one test case per process, so that test shows as
// "Skipped", and `ctest` counts it apart from the passes.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <optional>

namespace tptest {

inline constexpr int kSkipExitCode = 77;

/// Marks the running test case as skipped (TP_SKIP does it).
void mark_skipped();

/// ../shared/traces beside the source tree (the real PyTorch snapshots), if it is there.
inline std::optional<std::filesystem::path> shared_traces() {
  const std::filesystem::path dir = TENSORPOOL_SHARED_TRACES;
  if (!std::filesystem::is_directory(dir)) return std::nullopt;
  return dir;
}

}  // namespace tptest

#define TP_SKIP(reason)                   \
  do {                                    \
    WARN("skipped: " << reason);          \
    ::tptest::mark_skipped();             \
    return;                               \
  } while (false)

/// Skips the test case unless ../shared/traces is there; `dir` then names it.
#define TP_REQUIRE_SHARED_TRACES(dir)                                                   \
  const std::optional<std::filesystem::path> dir##_found = ::tptest::shared_traces();  \
  if (!dir##_found) TP_SKIP("no shared traces at " << TENSORPOOL_SHARED_TRACES);        \
  [[maybe_unused]] const std::filesystem::path& dir = *dir##_found
