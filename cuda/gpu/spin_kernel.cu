// spin_kernel.cu: a one-thread kernel that busy-waits for a number of GPU clock cycles, launched
// by gpu_replay between a trace's events so that the stream has work in flight (a synchronizing
// free then shows up as lost overlap, as it would in the recorded program).
#include <cuda_runtime_api.h>

#include "spin_kernel.hpp"

namespace {
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
}  // namespace

cudaError_t launch_spin(long long cycles, cudaStream_t stream) {
  spin<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}
