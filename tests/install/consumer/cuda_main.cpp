// Links against the installed tensorpool::cuda (CUDA runtime and driver); not run by the test.
#include <cstdio>

#include "tensorpool/cuda/backends.hpp"

int main() {
  std::printf("%d CUDA devices\n", tensorpool::cuda_device_count());
  return 0;
}
