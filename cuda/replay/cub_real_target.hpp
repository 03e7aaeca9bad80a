// cub_real_target.hpp: the real CUB CachingDeviceAllocator (header-only, from the CUDA Toolkit's
// CCCL) as a replay target, "cub-real", over whatever CUDA runtime the binary links: the
// CUDA-runtime test double (tests: tests/cuda/test_cub_vs_model.cpp, which keeps the "cub" model
// in step with it) or the real libcudart on a GPU (scripts/gpu/).
//
// Not in the replay registry (the replay library has no CUDA): pass make_real_cub_target as
// ReplayOptions::make_target. real_cub_descriptor() says what it is and the settings it takes,
// as the registry's descriptors do (the "cub" model's keys, read by the same reader).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "tensorpool/replay/target.hpp"

namespace tensorpool::cuda_replay {

/// How a "cub-real" target reads the bytes held on its device and the calls made: the test
/// double knows them exactly; unset, reserved() is CUB's own total (live + cached bytes of the
/// device) and upstream() counts nothing.
struct RealCubProbes {
  std::function<std::size_t(int device)> reserved;
  std::function<replay::UpstreamCounts(int device)> upstream;
};

/// "cub-real", its description, and the "cub" model's settings keys.
const replay::TargetDescriptor& real_cub_descriptor();

/// A "cub-real" target for options.device. options.conf takes the "cub" model's keys
/// (bin_growth, min_bin, max_bin, max_cached_bytes), so the two run with the same settings.
/// Throws ConfigError for a bad conf.
std::unique_ptr<replay::ReplayTarget> make_real_cub_target(const replay::TargetOptions& options,
                                                           RealCubProbes probes = {});

}  // namespace tensorpool::cuda_replay
