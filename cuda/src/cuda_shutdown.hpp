// cuda_shutdown.hpp (internal): the process-wide "CUDA is shutting down" state behind
// cuda_runtime_alive(), for the backends and for the tests that simulate the driver going away.
// Not installed: no user of the library needs these.
#pragma once

namespace tensorpool::cuda_detail {

/// What the atexit hook does: from now on every backend's alive() is false.
void mark_cuda_shutdown() noexcept;
/// Tests only: forget a simulated shutdown.
void reset_cuda_shutdown_for_testing() noexcept;

}  // namespace tensorpool::cuda_detail
