// spin_kernel.hpp: launch_spin (spin_kernel.cu), a busy-waiting one-thread kernel.
#pragma once

#include <cuda_runtime_api.h>

/// Enqueues a kernel that spins for `cycles` GPU clock cycles on `stream`.
cudaError_t launch_spin(long long cycles, cudaStream_t stream);
