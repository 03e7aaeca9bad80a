// cub_runtime_standin.hpp: counters of the host-only CUDA runtime stand-in that CUB runs on in
// bench_vs_cub.cpp (cub_runtime_standin.cpp).
#pragma once

#include <cstdint>

namespace cub_standin {
std::uint64_t mallocs() noexcept;  // cudaMalloc calls so far
std::uint64_t frees() noexcept;    // cudaFree calls so far
}  // namespace cub_standin
