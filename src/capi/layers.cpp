// The optional layers every allocator of the registry and the C API gets from its settings and
// the environment, with no code change in the program that uses it: NVTX annotations (Config
// keys nvtx and nvtx_mem, tensorpool/cuda/nvtx.hpp; CUDA builds only) and live recording
// (TENSORPOOL_TRACE, tensorpool/record.hpp).
#include <memory>
#include <string>

#include "capi/device_allocator.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/record.hpp"

#ifndef TENSORPOOL_WITH_CUDA
#define TENSORPOOL_WITH_CUDA 0
#endif
#if TENSORPOOL_WITH_CUDA
#include "tensorpool/cuda/nvtx.hpp"
#endif

namespace tensorpool::capi {

void check_layers_available(const Config& config, std::string_view origin) {
  if (TENSORPOOL_WITH_CUDA != 0 || (!config.nvtx && !config.nvtx_mem)) return;
  const std::string key = config.nvtx ? "nvtx" : "nvtx_mem";
  throw ConfigError(std::string(origin) + ": key '" + key + "' is on, but this tensorpool was built " +
                    "without the CUDA toolkit, whose NVTX headers the annotations need; remove " +
                    key + " (or set " + key + ":off)");
}

std::shared_ptr<DeviceBackend> with_layers(std::shared_ptr<DeviceBackend> backend, const Config& config) {
#if TENSORPOOL_WITH_CUDA
  return with_nvtx(std::move(backend), config);
#else
  (void)config;
  return backend;
#endif
}

void attach_layers(Allocator& allocator) {
#if TENSORPOOL_WITH_CUDA
  attach_nvtx(allocator);
#endif
  attach_recording_from_env(allocator);  // never throws: a bad path is logged once
}

}  // namespace tensorpool::capi
