// fuzz/entry.cpp: the libFuzzer entry point of one fuzz target; TP_FUZZ_TARGET (set per
// executable by fuzz/CMakeLists.txt) names the harness function of fuzz/harness.hpp.
#include <cstddef>
#include <cstdint>

#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tensorpool::fuzz::TP_FUZZ_TARGET(data, size);
}
