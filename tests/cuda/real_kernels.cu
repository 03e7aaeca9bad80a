// tests/cuda/real_kernels.cu: the one kernel of the real-hardware tests: it proves the GPU's SMs
// (not only its copy engines) can read and write the memory a backend handed out.
#include <cuda_runtime.h>

#include <cstddef>

namespace {
__global__ void add_one(unsigned char* p, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = static_cast<unsigned char>(p[i] + 1);
}
}  // namespace

extern "C" cudaError_t tp_real_add_one(void* p, size_t n, cudaStream_t stream) {
  add_one<<<264, 256, 0, stream>>>(static_cast<unsigned char*>(p), n);
  return cudaGetLastError();
}
