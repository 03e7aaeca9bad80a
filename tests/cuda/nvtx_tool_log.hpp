// tests/cuda/nvtx_tool_log.hpp: the test side of the fake NVTX tool (nvtx_fake_tool.cpp): asks
// NVTX to load it (NVTX_INJECTION64_PATH, set before main, so before the first NVTX call) and
// reads back the calls it logged. The including target defines TP_NVTX_FAKE_TOOL (the tool's path).
#pragma once

#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tensorpool/cuda/nvtx.hpp"

namespace tensorpool::testing {

// NVTX reads the variable when it initializes, at its first call.
inline const bool g_tool_requested = [] { return setenv("NVTX_INJECTION64_PATH", TP_NVTX_FAKE_TOOL, 1) == 0; }();

/// The calls the fake tool saw since the last call, one per line.
inline std::vector<std::string> tool_calls() {
  REQUIRE(nvtx_tool_attached());  // makes NVTX load the tool if no call has yet
  void* lib = dlopen(TP_NVTX_FAKE_TOOL, RTLD_NOW | RTLD_NOLOAD);  // the copy NVTX loaded
  REQUIRE(lib != nullptr);
  const auto log = reinterpret_cast<const char* (*)(int)>(dlsym(lib, "tp_fake_nvtx_log"));
  REQUIRE(log != nullptr);
  std::istringstream in(log(1));
  dlclose(lib);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line != "attached mem") lines.push_back(line);  // the memory extension attaches lazily
  }
  return lines;
}

inline std::string hex(const void* p) {
  std::ostringstream out;
  out << "0x" << std::hex << reinterpret_cast<std::uintptr_t>(p);
  return out.str();
}

/// True if `expected` occur in `calls` in this order (other calls may come between).
inline bool in_order(const std::vector<std::string>& calls, const std::vector<std::string>& expected) {
  std::size_t i = 0;
  for (const auto& c : calls) {
    if (i < expected.size() && c == expected[i]) ++i;
  }
  return i == expected.size();
}

inline std::size_t count_prefix(const std::vector<std::string>& calls, const std::string& prefix) {
  std::size_t n = 0;
  for (const auto& c : calls) n += c.rfind(prefix, 0) == 0;
  return n;
}

}  // namespace tensorpool::testing
