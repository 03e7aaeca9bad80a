// tests/cuda/cuda_info.cpp: prints, as one JSON object, what scripts/gpu-check.sh records about
// the machine's CUDA stack: driver and runtime versions and, per device, name, compute
// capability, memory, and support for memory pools and virtual memory management.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>

namespace {
int attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) (void)cudaGetLastError();
  return v;
}

int vmm_supported(int device) {
  CUdevice dev = 0;
  int v = 0;
  if (cuDeviceGet(&dev, device) != CUDA_SUCCESS) return -1;
  if (cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
      CUDA_SUCCESS)
    return -1;
  return v;
}
}  // namespace

int main() {
  int driver = 0;
  int runtime = 0;
  int count = 0;
  const cudaError_t d = cudaDriverGetVersion(&driver);
  const cudaError_t r = cudaRuntimeGetVersion(&runtime);
  const cudaError_t c = cudaGetDeviceCount(&count);
  std::printf("{\"driver_version\": %d, \"runtime_version\": %d, \"device_count\": %d, "
              "\"error\": \"%s\",\n",
              driver, runtime, c == cudaSuccess ? count : 0,
              cudaGetErrorName(d != cudaSuccess ? d : r != cudaSuccess ? r : c));
  std::printf(" \"devices\": [");
  for (int i = 0; c == cudaSuccess && i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    (void)cudaSetDevice(i);
    std::size_t free = 0;
    std::size_t total = 0;
    (void)cudaMemGetInfo(&free, &total);
    std::printf("%s\n  {\"ordinal\": %d, \"name\": \"%s\", \"compute_capability\": \"%d.%d\", "
                "\"total_bytes\": %zu, \"free_bytes\": %zu, \"memory_pools\": %d, \"vmm\": %d}",
                i == 0 ? "" : ",", i, p.name, p.major, p.minor, total, free,
                attribute(cudaDevAttrMemoryPoolsSupported, i), vmm_supported(i));
  }
  std::printf("]}\n");
  return c == cudaSuccess && count > 0 ? 0 : 1;
}
