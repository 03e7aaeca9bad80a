// The driver's functions reached through the runtime (cuda/src/driver_api.hpp), in a process of
// its own: the lookup happens once per process, so this binary's first backend is the first
// lookup. Without a driver new enough, the vmm backend fails with a DeviceError that says why;
// the next construction tries again and works once the driver is there.
#include <catch2/catch.hpp>

#include <string>

#include "testing/control.hpp"
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/errors.hpp"

using namespace tensorpool;
namespace dbl = tensorpool::cuda_double;

namespace {

std::string construction_error() {
  try {
    CudaVmmBackend vmm(0);
  } catch (const DeviceError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the driver's functions come through the runtime, on first use, and say why they cannot",
          "[cuda][vmm][driver]") {
  dbl::Options old_driver;
  old_driver.driver_version = 12080;  // older than the toolkit the backends were compiled with
  dbl::reset(old_driver);
  const std::string too_old = construction_error();
  INFO(too_old);
  REQUIRE(too_old.find("the CUDA driver API is not available (cuGetErrorName: the driver is older than CUDA 13") !=
          std::string::npos);
  REQUIRE(too_old.find("libcuda.so.1") != std::string::npos);
  REQUIRE(dbl::mapped_bytes() == 0);

  dbl::reset();
  dbl::fail_nth("cudaGetDriverEntryPointByVersion", 3, cudaErrorInsufficientDriver);
  const std::string no_driver = construction_error();
  INFO(no_driver);
  REQUIRE(no_driver.find("cuDeviceGet: cudaErrorInsufficientDriver") != std::string::npos);

  // A later construction looks the functions up again, and works.
  dbl::reset();
  CudaVmmBackend vmm(0);
  void* p = vmm.allocate_segment(4 * MiB, 0);
  REQUIRE(dbl::mapped_bytes() == 4 * MiB);
  vmm.free_segment(p, 4 * MiB, 0);
  REQUIRE(dbl::mapped_bytes() == 0);
}
